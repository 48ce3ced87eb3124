//! A VM's links to the node beyond its first tap: its further network
//! interfaces (`spec.interfaces`) and its IPv4 egress.
//!
//! - **Further interfaces** are more of the same: interface `n` (1-based,
//!   in spec order) is a tap `tapN` in the VM's namespace, bridged (`brN`)
//!   to a veth `ethN` whose node end is named after `vm/NS/NAME#IFACE`, with
//!   the address IPAM wrote in `status.interfaces.IFACE` routed to it. The
//!   guest's NIC `n` has a MAC derived from the VM's uid and the name, and
//!   learns its address from `corral.addrN=ADDR/128` on its kernel command
//!   line. Nothing but the node routes between the links.
//! - **IPv4 egress** is a pod's: an address of the node-local range kept in
//!   the VM's record, the range's gateway and a /32 route on the first
//!   link's node end, and `corral.ipv4=ADDR/32 corral.gw4=GATEWAY` for the
//!   guest, whose packets the node masquerades out of its uplink.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::Path;

use corral_api::kinds::VirtualMachineSpec;
use corral_net::datapath::VmLink;
use corral_runtime::vm::{self, process};

use super::workload::VmWorkload;

/// The tap device of further interface `index` (1-based).
pub fn tap_name(index: usize) -> String {
    format!("tap{index}")
}

/// The addresses of the VM's further interfaces in `status.interfaces`.
fn interface_addresses(object: &corral_api::Object) -> BTreeMap<String, Ipv6Addr> {
    object
        .status
        .get("interfaces")
        .and_then(serde_json::Value::as_object)
        .map(|map| {
            map.iter()
                .filter_map(|(name, a)| Some((name.clone(), a.as_str()?.parse().ok()?)))
                .collect()
        })
        .unwrap_or_default()
}

/// The kernel command line the guest learns its further addresses and
/// its IPv4 egress from.
pub fn guest_cmdline(
    spec: &VirtualMachineSpec,
    addresses: &BTreeMap<String, Ipv6Addr>,
    ipv4: Option<(Ipv4Addr, Ipv4Addr)>,
) -> String {
    let mut cmdline = String::new();
    for (index, interface) in spec.interfaces.iter().enumerate() {
        if let Some(address) = addresses.get(&interface.name) {
            cmdline.push_str(&format!(" corral.addr{}={address}/128", index + 1));
        }
    }
    if let Some((address, gateway)) = ipv4 {
        cmdline.push_str(&format!(" corral.ipv4={address}/32 corral.gw4={gateway}"));
    }
    cmdline
}

impl VmWorkload {
    /// The node end's key of further interface `name` (its own veth).
    fn interface_owner(&self, name: &str) -> String {
        format!("{}#{name}", self.network_owner())
    }

    /// The further interfaces' addresses (asking the API once when our
    /// copy predates what IPAM wrote).
    async fn further_addresses(
        &self,
        spec: &VirtualMachineSpec,
    ) -> Result<BTreeMap<String, Ipv6Addr>, String> {
        let addresses = interface_addresses(&self.desired);
        let missing = spec
            .interfaces
            .iter()
            .any(|i| !addresses.contains_key(&i.name));
        match (&self.ctx.agent.client, missing) {
            (Some(client), true) => {
                let fresh = client
                    .get(&self.key())
                    .await
                    .map_err(|e| crate::chain(&e))?;
                Ok(interface_addresses(&fresh))
            }
            _ => Ok(addresses),
        }
    }

    /// The VM's IPv4 egress address: the one in its record, else the one
    /// its uid prefers on every node when free here (so a live migration's
    /// target gives the guest the address it booted with), else a free one
    /// of the node's range (recorded before it is used); `None` when the
    /// node gives no IPv4 egress.
    pub(super) fn egress_address(
        &mut self,
        network: &crate::network::PodNetwork,
    ) -> Result<Option<Ipv4Addr>, String> {
        if self.record.egress_ipv4.is_some() {
            return Ok(self.record.egress_ipv4);
        }
        let taken = super::state::egress_addresses_taken(
            &self.ctx.agent.state,
            &self.ctx.state,
            &self.key(),
        )
        .map_err(|e| {
            format!(
                "cannot choose a free IPv4 egress address: {}",
                crate::chain(&e)
            )
        })?;
        let preferred = network
            .config()
            .egress_range
            .preferred(self.uid().as_bytes());
        self.record.egress_ipv4 = network
            .allocate_egress_preferring(&taken, Some(preferred))
            .map_err(|e| crate::chain(&e))?;
        self.save();
        Ok(self.record.egress_ipv4)
    }

    /// `node/create-tap`, after the first link: a tap per further
    /// interface, each wired to the node with its address. Returns notes.
    pub(super) async fn wire_further_links(&mut self, netns: &Path) -> Result<Vec<String>, String> {
        let spec =
            super::workload::typed_spec(&self.desired).ok_or("the VM's spec does not decode")?;
        if spec.interfaces.is_empty() {
            return Ok(Vec::new());
        }
        let taps: Vec<String> = (1..=spec.interfaces.len()).map(tap_name).collect();
        let path = netns.to_path_buf();
        let created = taps.clone();
        tokio::task::spawn_blocking(move || {
            for tap in &created {
                process::create_tap(&path, tap).map_err(|e| crate::chain(&e))?;
            }
            Ok::<_, String>(())
        })
        .await
        .map_err(|e| e.to_string())??;
        let Some(network) = self.ctx.agent.network.clone() else {
            return Ok(vec![format!("{} (no pod network)", taps.join(", "))]);
        };
        let addresses = self.further_addresses(&spec).await?;
        let mut notes = Vec::new();
        for ((index, interface), tap) in spec.interfaces.iter().enumerate().zip(&taps) {
            let address = addresses.get(&interface.name).ok_or_else(|| {
                format!(
                    "interface {} has no address in status.interfaces yet (ipam/assign-address)",
                    interface.name
                )
            })?;
            let wired = network
                .wire_vm(
                    &self.interface_owner(&interface.name),
                    netns,
                    *address,
                    None,
                    &VmLink::nth(index + 1, tap),
                )
                .await
                .map_err(|e| crate::chain(&e))?;
            notes.push(format!("{}: {wired}", interface.name));
        }
        Ok(notes)
    }

    /// What QEMU gets for the further interfaces (tap and MAC, in order)
    /// and what the guest's command line gets for them and for IPv4.
    pub(super) async fn further_nics(
        &self,
        spec: &VirtualMachineSpec,
    ) -> Result<(Vec<(String, String)>, String), String> {
        if self.record.netns.is_none() {
            return Ok((Vec::new(), String::new()));
        }
        let nics = spec
            .interfaces
            .iter()
            .enumerate()
            .map(|(index, interface)| {
                let seed = format!("{}/{}", self.uid(), interface.name);
                (tap_name(index + 1), vm::mac_for(&seed))
            })
            .collect();
        let addresses = match (&self.ctx.agent.network, spec.interfaces.is_empty()) {
            (Some(_), false) => self.further_addresses(spec).await?,
            _ => BTreeMap::new(),
        };
        let ipv4 = match (&self.ctx.agent.network, self.record.egress_ipv4) {
            (Some(network), Some(address)) => {
                Some((address, network.config().egress_range.gateway()))
            }
            _ => None,
        };
        Ok((nics, guest_cmdline(spec, &addresses, ipv4)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_guest_learns_each_further_address_and_its_ipv4() {
        let spec: VirtualMachineSpec = serde_json::from_value(json!({
            "cpus": 1, "memory": "256Mi", "boot": {"kernel": "k"},
            "interfaces": [{"name": "backend"}, {"name": "storage"}]
        }))
        .unwrap();
        let mut object = corral_api::Object::new(
            corral_api::Kind::VirtualMachine,
            Some("default"),
            "vm",
            json!({}),
        );
        object.status = json!({"interfaces": {"storage": "fd00::b", "backend": "fd00::a"}});
        let addresses = interface_addresses(&object);
        let ipv4 = Some(("10.87.0.7".parse().unwrap(), "10.87.0.1".parse().unwrap()));
        assert_eq!(
            guest_cmdline(&spec, &addresses, ipv4),
            " corral.addr1=fd00::a/128 corral.addr2=fd00::b/128 corral.ipv4=10.87.0.7/32 corral.gw4=10.87.0.1"
        );
        assert_eq!(guest_cmdline(&spec, &BTreeMap::new(), None), "");
    }
}

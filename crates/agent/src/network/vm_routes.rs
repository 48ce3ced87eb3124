//! Routes that follow a live-migrated VM (design
//! `0039-migrated-vm-addresses`): a VM keeps the addresses IPAM gave it
//! from its first node's /64 wherever it runs, so every node other than
//! the one running its guest routes each such address as a `/128` to
//! that node — longest prefix wins over the route to the /64 of the
//! node the address came from (which, there, is its own /64). The node
//! running the guest needs nothing more: `node/create-tap` put the host
//! route to the VM's link there.
//!
//! Pure: which node runs a VM's guest ([`VmPlace::of`]) and which routes
//! follow from that ([`vm_routes`]). The agent follows every VM through
//! an informer that keeps only its [`VmPlace`].

use std::collections::BTreeMap;
use std::net::Ipv6Addr;

use corral_api::Object;
use corral_api::kinds::NodeStatus;
use corral_api::workflow::{StepState, StoredWorkflows, WorkflowOutcome};
use corral_net::datapath::{NextHop, NodeRoute};
use corral_workflow::VmStep;
use ipnet::Ipv6Net;

/// The migrate workflow's first step, which binds the VM to the target.
const REBIND_STEP: &str = "scheduler/rebind";

/// Where a VM's guest runs and the addresses it holds: what routing needs
/// of a VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmPlace {
    /// The node whose QEMU runs the guest.
    pub node: String,
    /// `status.address` and every further interface's address.
    pub addresses: Vec<Ipv6Addr>,
}

impl VmPlace {
    /// The node running `vm`'s guest and its addresses; `None` for a VM
    /// not bound to a node or without an address yet.
    ///
    /// The guest runs on `status.node`, except while a live migration is
    /// under way: from its `scheduler/rebind` (which binds the VM to the
    /// target) until the target's `node/switch-over` is done, the guest
    /// still runs on the source (`status.migration.from`) — and stays
    /// there when the migration failed before the switch-over. So the
    /// routes move with the guest, not with the binding.
    pub fn of(vm: &Object) -> Option<VmPlace> {
        let text = |value: Option<&serde_json::Value>| {
            value
                .and_then(serde_json::Value::as_str)
                .map(str::to_string)
        };
        let bound = text(vm.status.get("node"))?;
        let node = match text(vm.status.pointer("/migration/from")) {
            Some(source) if migrating(vm) => source,
            _ => bound,
        };
        let address: Ipv6Addr = text(vm.status.get("address"))?.parse().ok()?;
        let mut addresses = vec![address];
        if let Some(interfaces) = vm
            .status
            .get("interfaces")
            .and_then(serde_json::Value::as_object)
        {
            addresses.extend(
                interfaces
                    .values()
                    .filter_map(|a| a.as_str()?.parse::<Ipv6Addr>().ok()),
            );
        }
        addresses.sort();
        addresses.dedup();
        Some(VmPlace { node, addresses })
    }
}

/// Whether `vm`'s newest `migrate` instance has bound it to the target
/// but not switched the guest over there (running, or failed between).
fn migrating(vm: &Object) -> bool {
    let Ok(workflows) = StoredWorkflows::of(&vm.status) else {
        return false;
    };
    let Some(instance) = workflows
        .instances
        .iter()
        .rev()
        .find(|i| i.workflow == "migrate")
    else {
        return false;
    };
    let done = |step: &str| {
        instance
            .steps
            .get(step)
            .is_some_and(|s| matches!(s.state, StepState::Done { .. }))
    };
    matches!(
        instance.outcome,
        WorkflowOutcome::Running | WorkflowOutcome::Failed
    ) && done(REBIND_STEP)
        && !done(VmStep::SwitchOver.as_str())
}

/// How to reach a node: its /64 (if it has one yet) and the next hop.
struct Reach {
    prefix: Option<Ipv6Net>,
    next_hop: NextHop,
}

/// The `/128` routes node `own` wants for VMs running away from the node
/// whose /64 their addresses came from: one per address that is not in
/// the /64 of the node running the guest, to that node — via its address,
/// or through `tunnel` (this node's WireGuard interface) when that node
/// publishes a tunnel too. None for a VM running on `own` (its host route
/// serves it) or on a node without an address.
pub fn vm_routes(
    own: &str,
    nodes: &[Object],
    vms: &[VmPlace],
    tunnel: Option<&str>,
) -> Vec<NodeRoute> {
    let reach: BTreeMap<&str, Reach> = nodes
        .iter()
        .filter_map(|node| {
            let status: NodeStatus = node.typed_status().ok()?;
            let gateway: Ipv6Addr = status.address.as_deref()?.parse().ok()?;
            let next_hop = match tunnel {
                Some(interface) if crate::tunnel::has_tunnel(node) => {
                    NextHop::Interface(interface.to_string())
                }
                _ => NextHop::Gateway(gateway),
            };
            let prefix = status.prefix.as_deref().and_then(|p| p.parse().ok());
            Some((node.metadata.name.as_str(), Reach { prefix, next_hop }))
        })
        .collect();
    let mut routes: Vec<NodeRoute> = vms
        .iter()
        .filter(|vm| vm.node != own)
        .filter_map(|vm| Some((vm, reach.get(vm.node.as_str())?)))
        .flat_map(|(vm, reach)| {
            vm.addresses
                .iter()
                .filter(|address| !reach.prefix.is_some_and(|p| p.contains(*address)))
                .map(|address| NodeRoute {
                    destination: Ipv6Net::from(*address),
                    next_hop: reach.next_hop.clone(),
                })
                .collect::<Vec<_>>()
        })
        .collect();
    routes.sort();
    routes.dedup_by(|a, b| a.destination == b.destination);
    routes
}

/// The `/128`s each node must be allowed in its WireGuard peer, besides
/// its /64: the addresses of the VMs whose guests it runs away from their
/// first node (what [`vm_routes`] sends through the tunnel).
pub fn moved_addresses(nodes: &[Object], vms: &[VmPlace]) -> BTreeMap<String, Vec<Ipv6Net>> {
    let prefixes: BTreeMap<&str, Option<Ipv6Net>> = nodes
        .iter()
        .map(|node| {
            let prefix = node
                .typed_status::<NodeStatus>()
                .ok()
                .and_then(|s| s.prefix?.parse().ok());
            (node.metadata.name.as_str(), prefix)
        })
        .collect();
    let mut moved: BTreeMap<String, Vec<Ipv6Net>> = BTreeMap::new();
    for vm in vms {
        let Some(prefix) = prefixes.get(vm.node.as_str()) else {
            continue;
        };
        for address in &vm.addresses {
            if !prefix.is_some_and(|p| p.contains(address)) {
                moved
                    .entry(vm.node.clone())
                    .or_default()
                    .push(Ipv6Net::from(*address));
            }
        }
    }
    for list in moved.values_mut() {
        list.sort();
        list.dedup();
    }
    moved
}

#[cfg(test)]
mod tests;

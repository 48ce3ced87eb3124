//! The node data path: a veth per pod, plain routes between nodes.
//!
//! Shape (no overlay, no bridge on the node):
//!
//! ```text
//!  pod netns                         node netns
//!  eth0  fd..:node64:<random>/128    crl<hash>  fe80::1/64, 10.87.0.1/32
//!        10.87.0.N/32                route  <pod>/128 dev crl<hash>
//!  default via fe80::1 dev eth0      route  10.87.0.N/32 dev crl<hash>
//!  default via 10.87.0.1 dev eth0    route  <other node /64> via <other node addr>
//!        onlink                              (or dev <wg interface>)
//! ```
//!
//! Every host-side veth carries the same link-local gateway `fe80::1` (valid
//! because link-local addresses are per link) and the same IPv4 gateway
//! (the egress range's `.1`), so a pod's routes never depend on its node.
//! DAD is switched off on both ends so addresses work at once.
//!
//! Routes corral installs are tagged with their own routing protocol numbers
//! ([`ROUTE_PROTOCOL_NODE`], [`ROUTE_PROTOCOL_POD`]) so listing them back
//! never confuses them with the operator's routes. Host veths carry the pod's
//! key as their interface alias (`corral-pod:<owner>`), so listing pod
//! interfaces needs no local state.
//!
//! A VM's namespace gets the same veth, but its end is bridged to the VM's
//! tap device ([`NetworkOps::ensure_vm_interface`]): the guest is on the
//! link to the node and holds the address itself.
//!
//! Operations are behind [`NetworkOps`]; [`Netlink`] is the real
//! implementation, [`FakeNetworkOps`] an in-memory one for the agent's tests.

mod fake;
pub(crate) mod netlink;

pub use fake::FakeNetworkOps;
pub use netlink::{Netlink, connect};

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use ipnet::Ipv6Net;
use sha2::{Digest, Sha256};

use crate::netns::NetnsError;

/// The pod's default IPv6 gateway: on every host-side veth.
pub const POD_GATEWAY_V6: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1);
/// The pod's interface name inside its namespace.
pub const POD_INTERFACE: &str = "eth0";
/// Routing protocol number on routes to other nodes' /64s.
pub const ROUTE_PROTOCOL_NODE: u8 = 87;
/// Routing protocol number on host routes to pods.
pub const ROUTE_PROTOCOL_POD: u8 = 88;
/// The metric of a node route to a single address (a live-migrated VM's
/// `/128`, to the node running its guest), above the kernel's default
/// 1024 of host routes to pods and VMs: where both exist for one address
/// (the source of a migration, until its VM's veth goes) they coexist and
/// the host route wins.
pub const MOVED_ADDRESS_METRIC: u32 = 2048;
/// Prefix of host-side veth names (see [`host_interface_name`]).
pub const HOST_INTERFACE_PREFIX: &str = "crl";
/// Prefix of the alias on host-side veths; the pod's owner key follows.
pub const POD_ALIAS_PREFIX: &str = "corral-pod:";
/// The bridge in a VM's namespace joining its (first) veth and tap device.
pub const VM_BRIDGE: &str = "br0";
/// Longest Linux interface name.
pub const MAX_INTERFACE_NAME: usize = 15;

/// Whether `name` can name an interface corral configures: 1 to
/// [`MAX_INTERFACE_NAME`] characters of ASCII letters, digits, `.`, `_`, `-`.
pub fn is_interface_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_INTERFACE_NAME
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// Why a data-path operation failed.
#[derive(Debug, thiserror::Error)]
pub enum DatapathError {
    #[error("open a netlink socket")]
    Connect {
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error("netlink: {operation}")]
    Netlink {
        operation: String,
        #[source]
        source: rtnetlink::Error,
    },
    #[error("write sysctl {path}")]
    Sysctl {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("interface name {name:?} is invalid: expected 1 to {max} characters without '/', ':' or whitespace", max = MAX_INTERFACE_NAME - 1)]
    InterfaceName { name: String },
    #[error("interface {name} not found{}", in_netns(.netns))]
    MissingInterface {
        name: String,
        netns: Option<PathBuf>,
    },
}

fn in_netns(netns: &Option<PathBuf>) -> String {
    netns
        .as_ref()
        .map(|p| format!(" in network namespace {}", p.display()))
        .unwrap_or_default()
}

/// The IPv4 egress side of a pod interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodEgress {
    /// The pod's address from the node-local egress range.
    pub address: Ipv4Addr,
    /// The range's gateway (`.1`), put on the host-side veth.
    pub gateway: Ipv4Addr,
}

/// Everything needed to wire one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodInterface {
    /// The pod's key (e.g. `default/web`), stored as the host veth's alias.
    pub owner: String,
    /// Host-side veth name, at most 14 characters (see [`host_interface_name`]).
    pub host_interface: String,
    /// The pod's persistent network namespace.
    pub netns: PathBuf,
    /// The pod's one IPv6 address (from its node's /64).
    pub ipv6: Ipv6Addr,
    /// IPv4 egress, when the node offers it.
    pub egress: Option<PodEgress>,
}

/// One of a VM's links inside its namespace: the veth end `inner` and the
/// tap device `port` are the ports of `bridge`. The first is
/// `eth0`/`br0`; a VM's further network interface `n` is `ethN`/`brN`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmLink {
    pub inner: String,
    pub bridge: String,
    pub port: String,
}

impl VmLink {
    /// Link `index` of a VM (0 for its first), bridged to tap `port`.
    pub fn nth(index: usize, port: &str) -> Self {
        VmLink {
            inner: format!("eth{index}"),
            bridge: format!("br{index}"),
            port: port.to_string(),
        }
    }
}

/// A pod interface found on the node.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct PodInterfaceInfo {
    pub host_interface: String,
    pub owner: String,
}

/// How traffic for another node's /64 leaves this node.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NextHop {
    /// Plain routing: via the other node's address on a shared link.
    Gateway(Ipv6Addr),
    /// Through an interface such as a WireGuard tunnel.
    Interface(String),
}

/// A route to another node's pod subnet.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeRoute {
    pub destination: Ipv6Net,
    pub next_hop: NextHop,
}

/// What [`plan_node_routes`] decided.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoutePlan {
    /// Routes to add or replace (missing, or with another next hop).
    pub ensure: Vec<NodeRoute>,
    /// Destinations no longer wanted.
    pub remove: Vec<Ipv6Net>,
}

impl RoutePlan {
    pub fn is_empty(&self) -> bool {
        self.ensure.is_empty() && self.remove.is_empty()
    }
}

/// Node data-path operations. `ensure_*` are safe to repeat; `remove_*`
/// tolerate absence.
#[async_trait]
pub trait NetworkOps: Send + Sync {
    /// Turns on IPv6 and IPv4 forwarding on the node.
    async fn enable_forwarding(&self) -> Result<(), DatapathError>;
    /// Creates (or repairs) the pod's veth, addresses and routes.
    async fn ensure_pod_interface(&self, pod: &PodInterface) -> Result<(), DatapathError>;
    /// Wires a VM's namespace like a pod's on the node side (veth, gateway,
    /// host route to `vm.ipv6`), but puts nothing on the namespace's end:
    /// it and `port` (the VM's tap device, which must exist) become ports
    /// of the bridge [`VM_BRIDGE`] there, so the guest itself holds the
    /// address on the link to the node. The namespace takes no part in
    /// IPv6 on those links. With `vm.egress` the node side also gets the
    /// IPv4 gateway and a route to the guest's IPv4 address, as a pod's.
    /// `link` names the veth end, the bridge and the tap in the namespace
    /// ([`VmLink::nth`]: a VM may have several such links, each its own).
    async fn ensure_vm_interface(
        &self,
        vm: &PodInterface,
        link: &VmLink,
    ) -> Result<(), DatapathError>;
    /// Makes a veth for a pod not known yet (the agent's pool of spare
    /// sandboxes): node end `host_interface`, down, without address or
    /// alias; its peer moved into `netns` as `eth0`.
    async fn create_spare_interface(
        &self,
        host_interface: &str,
        netns: &Path,
    ) -> Result<(), DatapathError>;
    /// Renames the node end of a veth that is down (a spare given to a pod).
    async fn rename_interface(&self, from: &str, to: &str) -> Result<(), DatapathError>;
    /// Deletes the pod's host veth (its peer and routes go with it).
    async fn remove_pod_interface(&self, host_interface: &str) -> Result<(), DatapathError>;
    /// Lists pod interfaces on the node.
    async fn list_pod_interfaces(&self) -> Result<Vec<PodInterfaceInfo>, DatapathError>;
    /// Adds or replaces a route to another node's /64.
    async fn ensure_node_route(&self, route: &NodeRoute) -> Result<(), DatapathError>;
    /// Removes the route to `destination`, if any.
    async fn remove_node_route(&self, destination: Ipv6Net) -> Result<(), DatapathError>;
    /// Lists routes to other nodes that corral installed.
    async fn list_node_routes(&self) -> Result<Vec<NodeRoute>, DatapathError>;
    /// Adds a node service address (e.g. the DNS server's `<node /64>::1`)
    /// as a /128 on a pod's host veth, so it lives and dies with corral's
    /// own links.
    async fn add_host_address(
        &self,
        host_interface: &str,
        address: Ipv6Addr,
    ) -> Result<(), DatapathError>;
}

/// The EUI-64 link-local address the kernel gives an interface with the
/// Ethernet address `mac` (`fe80::` + the MAC with `ff:fe` in the middle
/// and the universal/local bit flipped); `None` for another length.
pub fn eui64_link_local(mac: &[u8]) -> Option<Ipv6Addr> {
    let mac: [u8; 6] = mac.try_into().ok()?;
    let mut octets = [0u8; 16];
    octets[0] = 0xfe;
    octets[1] = 0x80;
    octets[8..16].copy_from_slice(&[
        mac[0] ^ 0x02,
        mac[1],
        mac[2],
        0xff,
        0xfe,
        mac[3],
        mac[4],
        mac[5],
    ]);
    Some(Ipv6Addr::from(octets))
}

/// Compares wanted and installed node routes. The last wanted route for a
/// destination wins.
pub fn plan_node_routes(desired: &[NodeRoute], existing: &[NodeRoute]) -> RoutePlan {
    let wanted: BTreeMap<Ipv6Net, &NodeRoute> =
        desired.iter().map(|r| (r.destination, r)).collect();
    let have: BTreeMap<Ipv6Net, &NodeRoute> = existing.iter().map(|r| (r.destination, r)).collect();
    RoutePlan {
        ensure: wanted
            .iter()
            .filter(|(dst, route)| have.get(dst) != Some(route))
            .map(|(_, route)| (*route).clone())
            .collect(),
        remove: have
            .keys()
            .filter(|dst| !wanted.contains_key(dst))
            .copied()
            .collect(),
    }
}

/// Brings installed node routes to `desired`, returning what changed.
pub async fn reconcile_node_routes(
    ops: &dyn NetworkOps,
    desired: &[NodeRoute],
) -> Result<RoutePlan, DatapathError> {
    let existing = ops.list_node_routes().await?;
    let plan = plan_node_routes(desired, &existing);
    for destination in &plan.remove {
        ops.remove_node_route(*destination).await?;
    }
    for route in &plan.ensure {
        ops.ensure_node_route(route).await?;
    }
    Ok(plan)
}

/// A stable host-side veth name for a pod: `crl` + 11 hex digits of the
/// SHA-256 of its key (14 characters, leaving one for a temporary peer name).
pub fn host_interface_name(owner: &str) -> String {
    let digest = Sha256::digest(owner.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("{HOST_INTERFACE_PREFIX}{}", &hex[..11])
}

/// The Ethernet address of a VM link's node end: locally administered,
/// unicast, from the SHA-256 of its name (itself from the VM's key), so
/// the same on every node — a live-migrated guest's neighbour entry for
/// its gateway stays right.
pub fn gateway_mac(host_interface: &str) -> [u8; 6] {
    let digest = Sha256::digest(format!("corral-gateway:{host_interface}").as_bytes());
    [
        (digest[0] & 0xfe) | 0x02,
        digest[1],
        digest[2],
        digest[3],
        digest[4],
        digest[5],
    ]
}

/// Checks a host-side interface name: at most 14 characters, so a
/// temporary peer name fits, and none of the characters Linux refuses.
pub fn validate_host_interface(name: &str) -> Result<(), DatapathError> {
    let ok = !name.is_empty()
        && name.len() < MAX_INTERFACE_NAME
        && name != "."
        && name != ".."
        && !name
            .chars()
            .any(|c| c == '/' || c == ':' || c.is_whitespace());
    if ok {
        Ok(())
    } else {
        Err(DatapathError::InterfaceName {
            name: name.to_string(),
        })
    }
}

#[cfg(test)]
mod tests;

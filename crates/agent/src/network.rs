//! The node's pod network (design idea 6), driven from the agent: a veth
//! per pod (and per VM link, bridged to its tap) with the address IPAM chose,
//! IPv4 egress from a node-local range, forwarding, and routes to every
//! other node's /64, reconciled from `Node` objects: plain (via the node's
//! address), or through the node's WireGuard tunnel ([`crate::tunnel`])
//! when both ends have one.
//!
//! The mechanics live in `corral-net`; this module decides *what* the
//! node should have (pure functions, unit-tested) and applies it through
//! [`NetworkOps`]. It touches only links and routes corral made (host
//! veths `crl…`, routes tagged with corral's protocol numbers, the
//! `ip corral` nftables table), plus the forwarding switches chosen by
//! [`Forwarding`].

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::Path;
use std::sync::Arc;

use corral_api::Object;
use corral_api::kinds::NodeStatus;
use corral_net::datapath::{
    self, DatapathError, NetworkOps, NextHop, NodeRoute, PodEgress, PodInterface, RoutePlan, VmLink,
};
use corral_net::dns::DnsTable;
use corral_net::egress::{self, EgressConfig, EgressError};
use corral_net::ipam::{EgressRange, IpamError};
use ipnet::Ipv6Net;

use crate::tunnel::{NodePeer, PeerPlan, Tunnel, TunnelConfig, TunnelError};

pub mod vm_routes;

pub use vm_routes::VmPlace;

/// How much forwarding the agent switches on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Forwarding {
    /// Node-wide IPv6 and IPv4 forwarding: what a node of a multi-node
    /// cluster (and IPv4 egress) needs. Changes the node's own sysctls.
    Node,
    /// Only on the pods' own host veths (`force_forwarding` for IPv6,
    /// per-interface IPv4 forwarding): pods on this node reach each other
    /// and the node, and the host's own switches stay as they are. The
    /// default of `corral up`, which runs in the machine's own namespace.
    #[default]
    PodLinks,
}

/// The node-local network settings (never in the API).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkConfig {
    pub forwarding: Forwarding,
    /// The interface IPv4 egress leaves through; `None` gives pods no IPv4.
    pub egress_uplink: Option<String>,
    /// The pods' IPv4 range, the same on every node.
    pub egress_range: EgressRange,
    /// WireGuard between nodes (`--wireguard`); `None` routes plainly.
    pub wireguard: Option<TunnelConfig>,
}

/// Why the pod network could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum NetworkError {
    #[error(transparent)]
    Datapath(#[from] DatapathError),
    #[error(transparent)]
    Egress(#[from] EgressError),
    #[error("no IPv4 egress address left")]
    EgressRange(#[source] IpamError),
    #[error("the pod has no IPv6 address in its status yet (ipam/assign-address)")]
    NoAddress,
    #[error("the pod's address {0:?} is not an IPv6 address")]
    BadAddress(String),
    #[error("write sysctl {path}")]
    Sysctl {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot serve DNS on [{address}]:53")]
    Dns {
        address: Ipv6Addr,
        #[source]
        source: std::io::Error,
    },
    #[error("the egress task failed: {0}")]
    Task(String),
    #[error("cannot set up the wireguard tunnel")]
    Tunnel(#[source] Box<TunnelError>),
}

impl From<TunnelError> for NetworkError {
    fn from(error: TunnelError) -> Self {
        NetworkError::Tunnel(Box::new(error))
    }
}

/// The pod network of this node.
pub struct PodNetwork {
    ops: Arc<dyn NetworkOps>,
    config: NetworkConfig,
    /// Where the node's DNS server listens, once started.
    dns: std::sync::OnceLock<Ipv6Addr>,
    /// The names it answers.
    table: Arc<std::sync::RwLock<DnsTable>>,
    /// Stops the DNS server.
    stop: tokio_util::sync::CancellationToken,
    /// Whether per-link sysctls are written (false with a fake data path).
    sysctls: bool,
    /// The WireGuard tunnel, with `--wireguard`.
    tunnel: Option<Tunnel>,
    /// Held while a pod or VM is wired: the kernel takes those changes one
    /// at a time anyway (the RTNL lock), and in turn the first pods of a
    /// burst are wired first instead of all of them last.
    wiring: tokio::sync::Mutex<()>,
    /// Egress addresses handed out lately, held back from others until
    /// the record of whoever got one shows it (pods and VMs choose apart).
    handed_out: std::sync::Mutex<std::collections::HashMap<Ipv4Addr, std::time::Instant>>,
}

/// How long a handed-out egress address is held back without a record.
const HANDED_OUT_FOR: std::time::Duration = std::time::Duration::from_secs(60);

impl std::fmt::Debug for PodNetwork {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodNetwork")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl PodNetwork {
    /// The real data path in the agent's own network namespace.
    /// With `config.wireguard` it brings the tunnel up (or adopts it).
    pub async fn connect(config: NetworkConfig) -> Result<Self, NetworkError> {
        let ops = datapath::Netlink::connect(None).await?;
        let tunnel = match &config.wireguard {
            Some(wireguard) => Some(Tunnel::start(wireguard).await?),
            None => None,
        };
        Ok(PodNetwork {
            tunnel,
            ops: Arc::new(ops),
            config,
            dns: std::sync::OnceLock::new(),
            table: Arc::default(),
            stop: tokio_util::sync::CancellationToken::new(),
            sysctls: true,
            wiring: tokio::sync::Mutex::new(()),
            handed_out: Default::default(),
        })
    }

    /// Any data path (tests pass a fake); no sysctls are written.
    pub fn with_ops(ops: Arc<dyn NetworkOps>, config: NetworkConfig) -> Self {
        PodNetwork {
            ops,
            config,
            dns: std::sync::OnceLock::new(),
            table: Arc::default(),
            stop: tokio_util::sync::CancellationToken::new(),
            sysctls: false,
            tunnel: None,
            wiring: tokio::sync::Mutex::new(()),
            handed_out: Default::default(),
        }
    }

    /// Routes through `tunnel` (tests pass one over a fake).
    pub fn with_tunnel(mut self, tunnel: Tunnel) -> Self {
        self.tunnel = Some(tunnel);
        self
    }

    /// The WireGuard tunnel, with `--wireguard`.
    pub fn tunnel(&self) -> Option<&Tunnel> {
        self.tunnel.as_ref()
    }

    /// Brings the tunnel's peers in line with `nodes`; `None` without a
    /// tunnel.
    pub async fn reconcile_tunnel(
        &self,
        own: &str,
        nodes: &[Object],
        vms: &[VmPlace],
    ) -> Result<Option<(Vec<NodePeer>, PeerPlan)>, NetworkError> {
        match &self.tunnel {
            Some(tunnel) => {
                let moved = vm_routes::moved_addresses(nodes, vms);
                Ok(Some(tunnel.reconcile(own, nodes, &moved).await?))
            }
            None => Ok(None),
        }
    }

    pub fn config(&self) -> &NetworkConfig {
        &self.config
    }

    /// Whether pods get IPv4 egress (the node has an uplink for it).
    pub fn gives_egress(&self) -> bool {
        self.config.egress_uplink.is_some()
    }

    /// A free egress address, given those the node's pods and VMs already
    /// hold (and those handed out in the last minute, which their records
    /// may not show yet); `None` when the node gives pods no IPv4.
    pub fn allocate_egress(
        &self,
        taken: &BTreeSet<Ipv4Addr>,
    ) -> Result<Option<Ipv4Addr>, NetworkError> {
        self.allocate_egress_preferring(taken, None)
    }

    /// [`PodNetwork::allocate_egress`], `preferred` when it is free (a VM's
    /// address from its uid, the same on every node).
    pub fn allocate_egress_preferring(
        &self,
        taken: &BTreeSet<Ipv4Addr>,
        preferred: Option<Ipv4Addr>,
    ) -> Result<Option<Ipv4Addr>, NetworkError> {
        if self.config.egress_uplink.is_none() {
            return Ok(None);
        }
        let mut handed_out = self
            .handed_out
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        handed_out.retain(|_, at| at.elapsed() < HANDED_OUT_FOR);
        let mut taken = taken.clone();
        taken.extend(handed_out.keys().copied());
        let address = self
            .config
            .egress_range
            .allocate_preferring(&taken, preferred)
            .map_err(NetworkError::EgressRange)?;
        handed_out.insert(address, std::time::Instant::now());
        Ok(Some(address))
    }

    /// Wires the pod: veth into its namespace, its addresses and routes.
    /// Safe to repeat. Returns a note for the step.
    pub async fn wire_pod(
        &self,
        owner: &str,
        netns: &Path,
        ipv6: Ipv6Addr,
        ipv4: Option<Ipv4Addr>,
    ) -> Result<String, NetworkError> {
        let pod = PodInterface {
            owner: owner.to_string(),
            host_interface: datapath::host_interface_name(owner),
            netns: netns.to_path_buf(),
            ipv6,
            egress: ipv4.map(|address| PodEgress {
                address,
                gateway: self.config.egress_range.gateway(),
            }),
        };
        {
            let _wiring = self.wiring.lock().await;
            self.ops.ensure_pod_interface(&pod).await?;
            self.after_wiring(&pod.host_interface).await?;
        }
        Ok(match ipv4 {
            Some(v4) => format!("{ipv6} and {v4} on {}", pod.host_interface),
            None => format!("{ipv6} on {}", pod.host_interface),
        })
    }

    /// Wires one link of a VM's namespace: the node side as for a pod
    /// (with IPv4 egress when `ipv4` is given); inside, the veth end and
    /// the VM's tap device are bridged (`link`), so the guest holds `ipv6`
    /// (and `ipv4`) itself. Each link has its own `owner` (its own host
    /// veth). Safe to repeat.
    pub async fn wire_vm(
        &self,
        owner: &str,
        netns: &Path,
        ipv6: Ipv6Addr,
        ipv4: Option<Ipv4Addr>,
        link: &VmLink,
    ) -> Result<String, NetworkError> {
        let vm = PodInterface {
            owner: owner.to_string(),
            host_interface: datapath::host_interface_name(owner),
            netns: netns.to_path_buf(),
            ipv6,
            egress: ipv4.map(|address| PodEgress {
                address,
                gateway: self.config.egress_range.gateway(),
            }),
        };
        {
            let _wiring = self.wiring.lock().await;
            self.ops.ensure_vm_interface(&vm, link).await?;
            self.after_wiring(&vm.host_interface).await?;
        }
        let addresses = match ipv4 {
            Some(v4) => format!("{ipv6} and {v4}"),
            None => ipv6.to_string(),
        };
        Ok(format!(
            "{addresses} on {}, bridged to {} in {}",
            vm.host_interface, link.port, link.bridge
        ))
    }

    /// What every wired host veth gets: the DNS address and, with per-link
    /// forwarding, its forwarding switches.
    async fn after_wiring(&self, link: &str) -> Result<(), NetworkError> {
        if let Some(dns) = self.dns_address() {
            self.ops.add_host_address(link, dns).await?;
        }
        if self.sysctls && self.config.forwarding == Forwarding::PodLinks {
            write_sysctl(&format!("/proc/sys/net/ipv6/conf/{link}/force_forwarding"))?;
            write_sysctl(&format!("/proc/sys/net/ipv4/conf/{link}/forwarding"))?;
        }
        Ok(())
    }

    /// Where the node's DNS server listens, once started.
    pub fn dns_address(&self) -> Option<Ipv6Addr> {
        self.dns.get().copied()
    }

    /// Starts the node's DNS server on `<prefix>::1` (once; later calls
    /// return the address). Pods reach it through their veths, which carry
    /// that address.
    pub fn start_dns(&self, prefix: Ipv6Net) -> Result<Ipv6Addr, NetworkError> {
        if let Some(address) = self.dns_address() {
            return Ok(address);
        }
        let address = corral_net::ipam::node_gateway_address(prefix);
        let socket = crate::dns::bind_udp(address)
            .map_err(|source| NetworkError::Dns { address, source })?;
        let upstream = crate::dns::node_upstream();
        tokio::spawn(corral_net::dns::serve(
            socket,
            self.table.clone(),
            upstream,
            self.stop.clone(),
        ));
        let _ = self.dns.set(address);
        tracing::info!(%address, ?upstream, "serving DNS to pods");
        Ok(address)
    }

    /// Stops the DNS server (the agent is stopping).
    pub fn stop(&self) {
        self.stop.cancel();
    }

    /// Replaces the names the DNS server answers.
    pub fn set_dns_table(&self, table: DnsTable) {
        *self.table.write().unwrap_or_else(|p| p.into_inner()) = table;
    }

    /// Makes a spare veth for the sandbox pool: node end `host_interface`
    /// (down), its peer `eth0` in `netns`.
    pub async fn make_spare_interface(
        &self,
        host_interface: &str,
        netns: &Path,
    ) -> Result<(), NetworkError> {
        self.ops
            .create_spare_interface(host_interface, netns)
            .await?;
        Ok(())
    }

    /// Renames spare veth `spare` to the node end of `owner`'s pod.
    pub async fn claim_spare_interface(
        &self,
        spare: &str,
        owner: &str,
    ) -> Result<(), NetworkError> {
        self.ops
            .rename_interface(spare, &datapath::host_interface_name(owner))
            .await?;
        Ok(())
    }

    /// Removes the veth whose node end is `host_interface`; absent is fine.
    pub async fn remove_interface(&self, host_interface: &str) -> Result<(), NetworkError> {
        self.ops.remove_pod_interface(host_interface).await?;
        Ok(())
    }

    /// Removes the pod's (or VM's) veth; absent is fine.
    pub async fn unwire_pod(&self, owner: &str) -> Result<(), NetworkError> {
        self.ops
            .remove_pod_interface(&datapath::host_interface_name(owner))
            .await?;
        Ok(())
    }

    /// Node-wide setup for the join step `node/configure-egress`:
    /// forwarding (when node-wide) and the masquerade.
    pub async fn configure_node(&self) -> Result<String, NetworkError> {
        let mut notes = Vec::new();
        if self.config.forwarding == Forwarding::Node {
            self.ops.enable_forwarding().await?;
            notes.push("forwarding on".to_string());
        } else {
            notes.push("forwarding only on pod links".to_string());
        }
        match &self.config.egress_uplink {
            Some(uplink) if self.sysctls => {
                let config = EgressConfig {
                    range: self.config.egress_range,
                    uplink: uplink.clone(),
                };
                tokio::task::spawn_blocking(move || {
                    // The agent reaps orphans; hold the lock so nft is ours to wait for.
                    let _spawning = corral_runtime::oci::reap::spawn_lock();
                    egress::apply(None, &config)
                })
                .await
                .map_err(|e| NetworkError::Task(e.to_string()))??;
                notes.push(format!(
                    "IPv4 {} masqueraded out of {uplink}",
                    self.config.egress_range
                ));
            }
            Some(uplink) => notes.push(format!("IPv4 egress out of {uplink} (not applied)")),
            None => notes.push("no IPv4 egress (no --egress-uplink)".to_string()),
        }
        Ok(notes.join("; "))
    }

    /// Brings the routes to other nodes' /64s in line with `nodes`, and
    /// the `/128`s of live-migrated VMs in line with `vms`
    /// ([`vm_routes::vm_routes`]).
    pub async fn reconcile_routes(
        &self,
        own: &str,
        nodes: &[Object],
        vms: &[VmPlace],
    ) -> Result<(Vec<NodeRoute>, RoutePlan), NetworkError> {
        let tunnel = self.tunnel.as_ref().map(Tunnel::interface);
        let mut desired = desired_routes(own, nodes, tunnel);
        desired.extend(vm_routes::vm_routes(own, nodes, vms, tunnel));
        let plan = datapath::reconcile_node_routes(self.ops.as_ref(), &desired).await?;
        Ok((desired, plan))
    }
}

fn write_sysctl(path: &str) -> Result<(), NetworkError> {
    match std::fs::write(path, "1") {
        Ok(()) => Ok(()),
        // Kernels before 6.17 have no per-interface IPv6 forwarding switch.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            tracing::warn!(
                path,
                "no such sysctl; pod-to-pod traffic needs node forwarding"
            );
            Ok(())
        }
        Err(source) => Err(NetworkError::Sysctl {
            path: path.to_string(),
            source,
        }),
    }
}

/// The routes this node wants: one per other node that has both a /64
/// and an IPv6 address, via that address, or through `tunnel` (this
/// node's WireGuard interface) when the other node publishes a tunnel too.
pub fn desired_routes(own: &str, nodes: &[Object], tunnel: Option<&str>) -> Vec<NodeRoute> {
    let mut routes: Vec<NodeRoute> = nodes
        .iter()
        .filter(|node| node.metadata.name != own)
        .filter_map(|node| {
            let status: NodeStatus = node.typed_status().ok()?;
            let destination: Ipv6Net = status.prefix?.parse().ok()?;
            let gateway: Ipv6Addr = status.address?.parse().ok()?;
            let next_hop = match tunnel {
                Some(interface) if crate::tunnel::has_tunnel(node) => {
                    NextHop::Interface(interface.to_string())
                }
                _ => NextHop::Gateway(gateway),
            };
            Some(NodeRoute {
                destination,
                next_hop,
            })
        })
        .collect();
    routes.sort();
    routes
}

/// The pod's IPv6 address from its status.
pub fn pod_address(pod: &Object) -> Result<Ipv6Addr, NetworkError> {
    let text = pod
        .status
        .get("address")
        .and_then(|a| a.as_str())
        .ok_or(NetworkError::NoAddress)?;
    text.parse()
        .map_err(|_| NetworkError::BadAddress(text.to_string()))
}

/// A human summary of a route plan, e.g. `+fd00:0:0:2::/64 -fd00:0:0:3::/64`.
pub fn describe(routes: &[NodeRoute]) -> String {
    if routes.is_empty() {
        return "no other node has a /64 yet".to_string();
    }
    routes
        .iter()
        .map(|r| match &r.next_hop {
            NextHop::Gateway(gw) => format!("{} via {gw}", r.destination),
            NextHop::Interface(dev) => format!("{} dev {dev}", r.destination),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests;

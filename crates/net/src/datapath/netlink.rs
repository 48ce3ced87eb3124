//! The real [`NetworkOps`]: rtnetlink sockets opened inside the right
//! namespaces (the node's, and each pod's while wiring it).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use futures::TryStreamExt;
use ipnet::Ipv6Net;
use rtnetlink::packet_route::link::{InfoData, InfoVeth, LinkAttribute, LinkMessage};
use rtnetlink::packet_route::route::{
    RouteAddress, RouteAttribute, RouteMessage, RouteProtocol, RouteScope,
};
use rtnetlink::{Handle, LinkBridge, LinkUnspec, LinkVeth, RouteMessageBuilder};

use super::{
    DatapathError, MOVED_ADDRESS_METRIC, NetworkOps, NextHop, NodeRoute, POD_ALIAS_PREFIX,
    POD_GATEWAY_V6, POD_INTERFACE, PodInterface, PodInterfaceInfo, ROUTE_PROTOCOL_NODE,
    ROUTE_PROTOCOL_POD, VmLink, validate_host_interface,
};
use crate::netns;

mod calls;
pub use calls::connect;
pub(crate) use calls::{
    add_address, errno, find_link, link_index, netlink_error, set_up, write_sysctl,
};
use calls::{link_alias, link_name};

const MAIN_TABLE: u8 = 254;
const ENODEV: i32 = 19;
const ESRCH: i32 = 3;
const ENOENT: i32 = 2;

/// The real data path, operating in one node namespace.
#[derive(Debug, Clone)]
pub struct Netlink {
    netns: Option<PathBuf>,
    handle: Handle,
}

impl Netlink {
    /// Operates in the namespace at `netns`, or the caller's for `None`.
    pub async fn connect(netns: Option<&Path>) -> Result<Self, DatapathError> {
        Ok(Netlink {
            netns: netns.map(Path::to_path_buf),
            handle: connect(netns).await?,
        })
    }

    fn netns(&self) -> Option<&Path> {
        self.netns.as_deref()
    }

    async fn node_route_messages(&self) -> Result<Vec<RouteMessage>, DatapathError> {
        let routes: Vec<RouteMessage> = self
            .handle
            .route()
            .get(RouteMessageBuilder::<Ipv6Addr>::new().build())
            .execute()
            .try_collect()
            .await
            .map_err(netlink_error("list IPv6 routes"))?;
        Ok(routes
            .into_iter()
            .filter(|r| r.header.protocol == RouteProtocol::Other(ROUTE_PROTOCOL_NODE))
            .filter(|r| r.header.table == MAIN_TABLE)
            .collect())
    }

    /// Creates the veth pair with the pod end made in the pod namespace as
    /// `inner` (`eth0` for a pod); returns the host end's index.
    async fn create_veth(&self, pod: &PodInterface, inner: &str) -> Result<u32, DatapathError> {
        let host = pod.host_interface.as_str();
        // A peer an agent before this one left on the node, half-made.
        let peer = format!("{host}p");
        if let Some(stale) = find_link(&self.handle, &peer).await? {
            self.delete_link(stale.header.index, &peer).await?;
        }
        // One request makes both ends, the pod's already in its namespace
        // under its final name: a process killed at any moment leaves
        // either no veth or a whole one, never a pair on the node.
        let pod_ns = netns::open(&pod.netns)?;
        let pod_end = LinkUnspec::new_with_name(inner)
            .setns_by_fd(pod_ns.as_raw_fd())
            .build();
        self.handle
            .link()
            .add(
                LinkVeth::new(host, inner)
                    .set_info_data(InfoData::Veth(InfoVeth::Peer(pod_end)))
                    .build(),
            )
            .execute()
            .await
            .map_err(netlink_error(format!(
                "add veth {host} with peer {inner} in {}",
                pod.netns.display()
            )))?;
        drop(pod_ns);
        link_index(&self.handle, host, self.netns()).await
    }

    /// The veth between the node and `pod.netns` (made when absent or
    /// half-made); returns the host end's index.
    async fn ensure_veth(
        &self,
        pod: &PodInterface,
        pod_handle: &Handle,
        inner: &str,
    ) -> Result<u32, DatapathError> {
        let host = find_link(&self.handle, &pod.host_interface).await?;
        let pod_end = find_link(pod_handle, inner).await?;
        match (host, pod_end) {
            (Some(host), Some(_)) => Ok(host.header.index),
            (host, _) => {
                // Half-made (a crash between steps) or absent: start over.
                if let Some(host) = host {
                    self.delete_link(host.header.index, &pod.host_interface)
                        .await?;
                }
                self.create_veth(pod, inner).await
            }
        }
    }

    async fn delete_link(&self, index: u32, name: &str) -> Result<(), DatapathError> {
        match self.handle.link().del(index).execute().await {
            Ok(()) => Ok(()),
            Err(e) if errno(&e) == Some(ENODEV) => Ok(()),
            Err(e) => Err(netlink_error(format!("delete link {name}"))(e)),
        }
    }

    async fn configure_host_side(
        &self,
        pod: &PodInterface,
        index: u32,
    ) -> Result<(), DatapathError> {
        let host = pod.host_interface.as_str();
        self.handle
            .link()
            .set(
                LinkUnspec::new_with_index(index)
                    .alias(format!("{POD_ALIAS_PREFIX}{}", pod.owner))
                    .build(),
            )
            .execute()
            .await
            .map_err(netlink_error(format!("set alias of {host}")))?;
        write_sysctl(
            self.netns(),
            &format!("/proc/sys/net/ipv6/conf/{host}/accept_dad"),
            "0",
        )?;
        set_up(&self.handle, index, host).await?;
        add_address(&self.handle, index, IpAddr::V6(POD_GATEWAY_V6), 64, host).await?;
        let route = RouteMessageBuilder::<Ipv6Addr>::new()
            .destination_prefix(pod.ipv6, 128)
            .output_interface(index)
            .protocol(RouteProtocol::Other(ROUTE_PROTOCOL_POD))
            .build();
        self.handle
            .route()
            .add(route)
            .replace()
            .execute()
            .await
            .map_err(netlink_error(format!(
                "add route {}/128 dev {host}",
                pod.ipv6
            )))?;
        if let Some(egress) = pod.egress {
            add_address(&self.handle, index, IpAddr::V4(egress.gateway), 32, host).await?;
            let route = RouteMessageBuilder::<Ipv4Addr>::new()
                .destination_prefix(egress.address, 32)
                .output_interface(index)
                .scope(RouteScope::Link)
                .protocol(RouteProtocol::Other(ROUTE_PROTOCOL_POD))
                .build();
            self.handle
                .route()
                .add(route)
                .replace()
                .execute()
                .await
                .map_err(netlink_error(format!(
                    "add route {}/32 dev {host}",
                    egress.address
                )))?;
        }
        Ok(())
    }
}

async fn configure_pod_side(pod: &PodInterface, handle: &Handle) -> Result<(), DatapathError> {
    let ns = Some(pod.netns.as_path());
    let lo = link_index(handle, "lo", ns).await?;
    set_up(handle, lo, "lo").await?;
    let link =
        find_link(handle, POD_INTERFACE)
            .await?
            .ok_or_else(|| DatapathError::MissingInterface {
                name: POD_INTERFACE.to_string(),
                netns: ns.map(Path::to_path_buf),
            })?;
    let eth = link.header.index;
    write_sysctl(
        ns,
        &format!("/proc/sys/net/ipv6/conf/{POD_INTERFACE}/accept_dad"),
        "0",
    )?;
    set_up(handle, eth, POD_INTERFACE).await?;
    // The link-local address the kernel makes when the link comes up, made
    // here too: a gVisor sandbox takes every address off `eth0` when it
    // starts and the kernel does not make it again, but the next sandbox
    // needs one to reach its gateway `fe80::1`. Wiring again restores it.
    if let Some(local) = link
        .attributes
        .iter()
        .find_map(|attribute| match attribute {
            LinkAttribute::Address(mac) => super::eui64_link_local(mac),
            _ => None,
        })
    {
        add_address(handle, eth, IpAddr::V6(local), 64, POD_INTERFACE).await?;
    }
    add_address(handle, eth, IpAddr::V6(pod.ipv6), 128, POD_INTERFACE).await?;
    let default_v6 = RouteMessageBuilder::<Ipv6Addr>::new()
        .gateway(POD_GATEWAY_V6)
        .output_interface(eth)
        .build();
    handle
        .route()
        .add(default_v6)
        .replace()
        .execute()
        .await
        .map_err(netlink_error(format!(
            "add default route via {POD_GATEWAY_V6} in pod"
        )))?;
    if let Some(egress) = pod.egress {
        add_address(handle, eth, IpAddr::V4(egress.address), 32, POD_INTERFACE).await?;
        let default_v4 = RouteMessageBuilder::<Ipv4Addr>::new()
            .gateway(egress.gateway)
            .output_interface(eth)
            .onlink()
            .build();
        handle
            .route()
            .add(default_v4)
            .replace()
            .execute()
            .await
            .map_err(netlink_error(format!(
                "add default route via {} in pod",
                egress.gateway
            )))?;
    }
    Ok(())
}

/// A VM's namespace: the bridge `link.bridge` with the veth end and
/// `link.port` (the tap) as its ports, all up, none of them with IPv6 of
/// its own (the namespace must not answer for, or route, the guest's
/// traffic; it has no IPv4 address either, so it only bridges ARP).
async fn configure_bridge_side(
    vm: &PodInterface,
    link: &VmLink,
    handle: &Handle,
) -> Result<(), DatapathError> {
    let ns = Some(vm.netns.as_path());
    let lo = link_index(handle, "lo", ns).await?;
    set_up(handle, lo, "lo").await?;
    let bridge_name = link.bridge.as_str();
    let bridge = match find_link(handle, bridge_name).await? {
        Some(link) => link.header.index,
        None => {
            handle
                .link()
                .add(
                    LinkBridge::new(bridge_name)
                        .mcast_snooping(false)
                        .forward_delay(0)
                        .build(),
                )
                .execute()
                .await
                .map_err(netlink_error(format!("add bridge {bridge_name}")))?;
            link_index(handle, bridge_name, ns).await?
        }
    };
    let (inner, port) = (link.inner.as_str(), link.port.as_str());
    for name in [bridge_name, inner, port] {
        write_sysctl(
            ns,
            &format!("/proc/sys/net/ipv6/conf/{name}/disable_ipv6"),
            "1",
        )?;
    }
    for name in [inner, port] {
        let index = link_index(handle, name, ns).await?;
        handle
            .link()
            .set(
                LinkUnspec::new_with_index(index)
                    .controller(bridge)
                    .up()
                    .build(),
            )
            .execute()
            .await
            .map_err(netlink_error(format!("add {name} to {bridge_name}")))?;
    }
    set_up(handle, bridge, bridge_name).await
}

#[async_trait]
impl NetworkOps for Netlink {
    async fn enable_forwarding(&self) -> Result<(), DatapathError> {
        write_sysctl(self.netns(), "/proc/sys/net/ipv6/conf/all/forwarding", "1")?;
        write_sysctl(self.netns(), "/proc/sys/net/ipv4/ip_forward", "1")
    }

    async fn ensure_pod_interface(&self, pod: &PodInterface) -> Result<(), DatapathError> {
        validate_host_interface(&pod.host_interface)?;
        let pod_handle = connect(Some(&pod.netns)).await?;
        let index = self.ensure_veth(pod, &pod_handle, POD_INTERFACE).await?;
        self.configure_host_side(pod, index).await?;
        configure_pod_side(pod, &pod_handle).await
    }

    async fn ensure_vm_interface(
        &self,
        vm: &PodInterface,
        link: &VmLink,
    ) -> Result<(), DatapathError> {
        validate_host_interface(&vm.host_interface)?;
        let vm_handle = connect(Some(&vm.netns)).await?;
        let index = self.ensure_veth(vm, &vm_handle, &link.inner).await?;
        // The guest's gateway has the same MAC on every node, so a guest
        // live-migrated here finds `fe80::1` (and the IPv4 gateway) where
        // its neighbour cache says.
        let host = vm.host_interface.as_str();
        self.handle
            .link()
            .set(
                LinkUnspec::new_with_index(index)
                    .address(super::gateway_mac(host).to_vec())
                    .build(),
            )
            .execute()
            .await
            .map_err(netlink_error(format!("set the address of {host}")))?;
        self.configure_host_side(vm, index).await?;
        configure_bridge_side(vm, link, &vm_handle).await
    }

    async fn create_spare_interface(
        &self,
        host_interface: &str,
        netns: &Path,
    ) -> Result<(), DatapathError> {
        validate_host_interface(host_interface)?;
        let spare = PodInterface {
            owner: String::new(),
            host_interface: host_interface.to_string(),
            netns: netns.to_path_buf(),
            ipv6: Ipv6Addr::UNSPECIFIED,
            egress: None,
        };
        self.create_veth(&spare, POD_INTERFACE).await.map(drop)
    }

    async fn rename_interface(&self, from: &str, to: &str) -> Result<(), DatapathError> {
        validate_host_interface(to)?;
        let index = link_index(&self.handle, from, self.netns()).await?;
        self.handle
            .link()
            .set(LinkUnspec::new_with_index(index).name(to).build())
            .execute()
            .await
            .map_err(netlink_error(format!("rename {from} to {to}")))
    }

    async fn remove_pod_interface(&self, host_interface: &str) -> Result<(), DatapathError> {
        match find_link(&self.handle, host_interface).await? {
            Some(link) => self.delete_link(link.header.index, host_interface).await,
            None => Ok(()),
        }
    }

    async fn list_pod_interfaces(&self) -> Result<Vec<PodInterfaceInfo>, DatapathError> {
        let links: Vec<LinkMessage> = self
            .handle
            .link()
            .get()
            .execute()
            .try_collect()
            .await
            .map_err(netlink_error("list links"))?;
        let mut found: Vec<PodInterfaceInfo> = links
            .iter()
            .filter_map(|link| {
                let owner = link_alias(link)?.strip_prefix(POD_ALIAS_PREFIX)?;
                Some(PodInterfaceInfo {
                    host_interface: link_name(link)?.to_string(),
                    owner: owner.to_string(),
                })
            })
            .collect();
        found.sort();
        Ok(found)
    }

    async fn ensure_node_route(&self, route: &NodeRoute) -> Result<(), DatapathError> {
        let mut builder = RouteMessageBuilder::<Ipv6Addr>::new()
            .destination_prefix(route.destination.network(), route.destination.prefix_len())
            .protocol(RouteProtocol::Other(ROUTE_PROTOCOL_NODE));
        if route.destination.prefix_len() == 128 {
            // Below a host route to the same address (a VM whose guest
            // still runs here during its migration): they coexist, and
            // the host route wins until it goes with the VM's veth.
            builder = builder.priority(MOVED_ADDRESS_METRIC);
        }
        let message = match &route.next_hop {
            NextHop::Gateway(gateway) => builder.gateway(*gateway).build(),
            NextHop::Interface(name) => {
                let index = link_index(&self.handle, name, self.netns()).await?;
                builder.output_interface(index).build()
            }
        };
        self.handle
            .route()
            .add(message)
            .replace()
            .execute()
            .await
            .map_err(netlink_error(format!(
                "add route {} {:?}",
                route.destination, route.next_hop
            )))
    }

    async fn remove_node_route(&self, destination: Ipv6Net) -> Result<(), DatapathError> {
        for message in self.node_route_messages().await? {
            if route_destination(&message) != Some(destination) {
                continue;
            }
            match self.handle.route().del(message).execute().await {
                Ok(()) => {}
                Err(e) if matches!(errno(&e), Some(ESRCH) | Some(ENOENT)) => {}
                Err(e) => return Err(netlink_error(format!("delete route {destination}"))(e)),
            }
        }
        Ok(())
    }

    async fn add_host_address(
        &self,
        host_interface: &str,
        address: Ipv6Addr,
    ) -> Result<(), DatapathError> {
        let index = link_index(&self.handle, host_interface, self.netns()).await?;
        add_address(
            &self.handle,
            index,
            IpAddr::V6(address),
            128,
            host_interface,
        )
        .await
    }

    async fn list_node_routes(&self) -> Result<Vec<NodeRoute>, DatapathError> {
        let messages = self.node_route_messages().await?;
        let mut names = std::collections::BTreeMap::new();
        let mut routes = Vec::new();
        for message in messages {
            let Some(destination) = route_destination(&message) else {
                continue;
            };
            let gateway = message.attributes.iter().find_map(|a| match a {
                RouteAttribute::Gateway(RouteAddress::Inet6(gw)) => Some(*gw),
                _ => None,
            });
            let next_hop = match gateway {
                Some(gateway) => NextHop::Gateway(gateway),
                None => {
                    let Some(index) = message.attributes.iter().find_map(|a| match a {
                        RouteAttribute::Oif(index) => Some(*index),
                        _ => None,
                    }) else {
                        continue;
                    };
                    let name = match names.get(&index) {
                        Some(name) => String::clone(name),
                        None => {
                            let name = self.link_name_by_index(index).await?;
                            names.insert(index, name.clone());
                            name
                        }
                    };
                    NextHop::Interface(name)
                }
            };
            routes.push(NodeRoute {
                destination,
                next_hop,
            });
        }
        routes.sort();
        Ok(routes)
    }
}

impl Netlink {
    async fn link_name_by_index(&self, index: u32) -> Result<String, DatapathError> {
        let link = self
            .handle
            .link()
            .get()
            .match_index(index)
            .execute()
            .try_next()
            .await
            .map_err(netlink_error(format!("get link {index}")))?;
        Ok(link
            .as_ref()
            .and_then(link_name)
            .map(str::to_string)
            .unwrap_or_else(|| format!("#{index}")))
    }
}

fn route_destination(message: &RouteMessage) -> Option<Ipv6Net> {
    let address = message.attributes.iter().find_map(|a| match a {
        RouteAttribute::Destination(RouteAddress::Inet6(address)) => Some(*address),
        _ => None,
    });
    Ipv6Net::new(
        address.unwrap_or(Ipv6Addr::UNSPECIFIED),
        message.header.destination_prefix_length,
    )
    .ok()
}

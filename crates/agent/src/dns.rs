//! The node's DNS server for its pods (see `corral_net::dns`): where it
//! listens (`<node /64>::1`, port 53), and the name table built from the
//! API's pods and PinnedDeployments.

use std::net::{Ipv6Addr, SocketAddr, SocketAddrV6};
use std::os::fd::OwnedFd;

use corral_api::Object;
use corral_api::kinds::{PinnedDeploymentSpec, PodStatus};
use corral_net::dns::DnsTable;
use nix::sys::socket::{
    AddressFamily, SockFlag, SockType, SockaddrIn6, bind, setsockopt, socket, sockopt,
};

/// The DNS port pods query.
pub const PORT: u16 = 53;

/// The table for these pods and PinnedDeployments: every pod with an
/// address by name, and each PinnedDeployment's ready pods (those in its
/// namespace whose labels match its selector).
pub fn build_table(pods: &[Object], deployments: &[Object]) -> DnsTable {
    let mut table = DnsTable::new();
    let addressed: Vec<(&Object, PodStatus, Ipv6Addr)> = pods
        .iter()
        .filter_map(|pod| {
            let status: PodStatus = pod.typed_status().ok()?;
            let address = status.address.as_deref()?.parse().ok()?;
            Some((pod, status, address))
        })
        .collect();
    for (pod, _, address) in &addressed {
        table.add_pod(&pod.key().namespace, &pod.metadata.name, *address);
    }
    for deployment in deployments {
        let Ok(spec) = deployment.typed_spec::<PinnedDeploymentSpec>() else {
            continue;
        };
        let (namespace, name) = (deployment.key().namespace, &deployment.metadata.name);
        table.add_deployment(&namespace, name);
        for (pod, status, address) in &addressed {
            let matches = pod.key().namespace == namespace
                && !spec.selector.is_empty()
                && spec
                    .selector
                    .iter()
                    .all(|(k, v)| pod.metadata.labels.get(k) == Some(v));
            if matches && status.is_ready() {
                table.add_deployment_pod(&namespace, name, *address);
            }
        }
    }
    table
}

/// A UDP socket on `[address]:53` that binds even before the address is
/// on any link (`IP_FREEBIND`): it appears with the first pod's veth.
pub fn bind_udp(address: Ipv6Addr) -> std::io::Result<tokio::net::UdpSocket> {
    let fd: OwnedFd = socket(
        AddressFamily::Inet6,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    )?;
    setsockopt(&fd, sockopt::IpFreebind, &true)?;
    setsockopt(&fd, sockopt::Ipv6V6Only, &true)?;
    bind(
        std::os::fd::AsRawFd::as_raw_fd(&fd),
        &SockaddrIn6::from(SocketAddrV6::new(address, PORT, 0, 0)),
    )?;
    tokio::net::UdpSocket::from_std(std::net::UdpSocket::from(fd))
}

/// The node's resolver, for names outside `corral.`.
pub fn node_upstream() -> Option<SocketAddr> {
    let text = std::fs::read_to_string("/etc/resolv.conf").ok()?;
    corral_net::dns::upstream_from_resolv_conf(&text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use corral_api::Kind;

    fn pod(name: &str, labels: &[(&str, &str)], status: serde_json::Value) -> Object {
        let mut object = Object::new(Kind::Pod, Some("default"), name, serde_json::json!({}));
        for (k, v) in labels {
            object.metadata.labels.insert(k.to_string(), v.to_string());
        }
        object.status = status;
        object
    }

    #[test]
    fn pods_by_name_and_deployments_by_ready_pods() {
        let ready = serde_json::json!({"phase": "Running", "address": "fd00::1",
            "containers": [{"name": "c", "state": "running", "restarts": 0, "ready": true}]});
        let unready = serde_json::json!({"phase": "Running", "address": "fd00::2",
            "containers": [{"name": "c", "state": "running", "restarts": 0, "ready": false}]});
        let pods = vec![
            pod("a", &[("app", "web")], ready),
            pod("b", &[("app", "web")], unready),
            pod(
                "c",
                &[("app", "db")],
                serde_json::json!({"phase": "Pending"}),
            ),
        ];
        let deployment = Object::new(
            Kind::PinnedDeployment,
            Some("default"),
            "web",
            serde_json::json!({"replicas": 2, "selector": {"app": "web"},
                "templates": {"previous": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": []}},
                              "next": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": []}}}}),
        );
        let table = build_table(&pods, &[deployment]);
        assert_eq!(
            table.lookup("a.default.pod.corral."),
            Some(&["fd00::1".parse().unwrap()][..])
        );
        assert!(table.lookup("b.default.pod.corral.").is_some());
        assert!(table.lookup("c.default.pod.corral.").is_none());
        assert_eq!(
            table.lookup("web.default.pd.corral."),
            Some(&["fd00::1".parse().unwrap()][..])
        );
    }
}

//! The pure engine of the LB controller: from the LoadBalancers and pods
//! it is served, which backends each frontend port forwards to and what
//! each LoadBalancer's status says. No I/O; every rule is tested here.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV6};

use corral_api::kinds::{LoadBalancerSpec, LoadBalancerStatus, PodStatus};
use corral_api::{Object, ObjectKey};

/// The addresses the proxy listens on; every served LoadBalancer gets
/// each of them as a frontend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frontends {
    pub ipv4: Option<Ipv4Addr>,
    pub ipv6: Option<Ipv6Addr>,
}

impl Frontends {
    /// As written in `status.addresses`: IPv4 first.
    pub fn addresses(&self) -> Vec<String> {
        let mut addresses = Vec::new();
        addresses.extend(self.ipv4.map(|a| a.to_string()));
        addresses.extend(self.ipv6.map(|a| a.to_string()));
        addresses
    }
}

/// Where connections to one frontend port go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// The LoadBalancer the port belongs to.
    pub load_balancer: ObjectKey,
    /// Ready backends, `[pod address]:targetPort`, sorted.
    pub backends: Vec<SocketAddrV6>,
}

/// What one round should make true.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Frontend port → its route.
    pub routes: BTreeMap<u16, Route>,
    /// The status every served LoadBalancer should have.
    pub statuses: BTreeMap<ObjectKey, LoadBalancerStatus>,
}

/// The ready pods' addresses a LoadBalancer with `spec` in `namespace`
/// sends traffic to, sorted and without duplicates: pods of its namespace
/// carrying every selector label, ready ([`PodStatus::is_ready`], the
/// notion DNS uses), with an IPv6 address.
pub fn ready_backends(namespace: &str, spec: &LoadBalancerSpec, pods: &[Object]) -> Vec<Ipv6Addr> {
    if spec.selector.is_empty() {
        return Vec::new();
    }
    let mut addresses: Vec<Ipv6Addr> = pods
        .iter()
        .filter(|pod| pod.key().namespace == namespace)
        .filter(|pod| {
            spec.selector
                .iter()
                .all(|(k, v)| pod.metadata.labels.get(k) == Some(v))
        })
        .filter_map(|pod| {
            let status: PodStatus = pod.typed_status().ok()?;
            if !status.is_ready() {
                return None;
            }
            status.address.as_deref()?.parse().ok()
        })
        .collect();
    addresses.sort();
    addresses.dedup();
    addresses
}

/// Plans a round for the controller `owner` serving `class` on
/// `frontends`. LoadBalancers of another class, or whose spec does not
/// decode, are left alone. A frontend port belongs to the oldest
/// LoadBalancer asking for it (then by namespace and name); a younger one
/// is served on its other ports and its status names the conflict.
pub fn plan(
    owner: &str,
    class: &str,
    frontends: &Frontends,
    load_balancers: &[Object],
    pods: &[Object],
) -> Plan {
    let mut served: Vec<(&Object, LoadBalancerSpec)> = load_balancers
        .iter()
        .filter_map(|lb| Some((lb, lb.typed_spec::<LoadBalancerSpec>().ok()?)))
        .filter(|(_, spec)| spec.class() == class)
        .collect();
    served.sort_by_key(|(lb, _)| (lb.metadata.created_at, lb.key()));
    let mut plan = Plan::default();
    for (lb, spec) in served {
        let key = lb.key();
        let backends = ready_backends(&key.namespace, &spec, pods);
        let mut conflicts = Vec::new();
        for port in &spec.ports {
            if let Some(holder) = plan.routes.get(&port.port) {
                conflicts.push(format!(
                    "port {} is served for loadbalancer {}/{} already",
                    port.port, holder.load_balancer.namespace, holder.load_balancer.name
                ));
                continue;
            }
            let route = Route {
                load_balancer: key.clone(),
                backends: backends
                    .iter()
                    .map(|address| SocketAddrV6::new(*address, port.target_port, 0, 0))
                    .collect(),
            };
            plan.routes.insert(port.port, route);
        }
        let status = LoadBalancerStatus {
            owner: Some(owner.to_string()),
            addresses: frontends.addresses(),
            backends: backends.iter().map(ToString::to_string).collect(),
            ready: u32::try_from(backends.len()).unwrap_or(u32::MAX),
            message: (!conflicts.is_empty()).then(|| conflicts.join("; ")),
        };
        plan.statuses.insert(key, status);
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{TimeZone, Utc};
    use corral_api::Kind;
    use serde_json::json;

    const FRONT: Frontends = Frontends {
        ipv4: Some(Ipv4Addr::new(192, 168, 87, 2)),
        ipv6: Some(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 2)),
    };

    fn pod(name: &str, namespace: &str, app: &str, address: &str, ready: bool) -> Object {
        let mut pod = Object::new(Kind::Pod, Some(namespace), name, json!({}));
        pod.metadata.labels.insert("app".into(), app.into());
        pod.status = json!({"phase": "Running", "address": address,
            "containers": [{"name": "c", "state": "running", "restarts": 0, "ready": ready}]});
        pod
    }

    fn lb(name: &str, created: i64, spec: serde_json::Value) -> Object {
        let mut lb = Object::new(Kind::LoadBalancer, Some("default"), name, spec);
        lb.metadata.created_at = Utc.timestamp_opt(created, 0).single();
        lb
    }

    fn web_lb(name: &str, created: i64, port: u16) -> Object {
        lb(
            name,
            created,
            json!({"selector": {"app": "web"}, "ports": [{"port": port, "targetPort": 8080}]}),
        )
    }

    fn key(name: &str) -> ObjectKey {
        ObjectKey::new(Kind::LoadBalancer, Some("default"), name)
    }

    fn addr(text: &str) -> Ipv6Addr {
        text.parse().unwrap()
    }

    #[test]
    fn backends_are_the_ready_matching_pods_of_the_namespace() {
        let mut pending = pod("pending", "default", "web", "fd00::5", true);
        pending.status["phase"] = json!("Pending");
        let mut no_address = pod("fresh", "default", "web", "", true);
        no_address.status.as_object_mut().unwrap().remove("address");
        let pods = [
            pod("b", "default", "web", "fd00::2", true),
            pod("a", "default", "web", "fd00::1", true),
            pod("unready", "default", "web", "fd00::3", false),
            pod("other-app", "default", "db", "fd00::4", true),
            pod("other-ns", "team", "web", "fd00::6", true),
            pending,
            no_address,
        ];
        let spec: LoadBalancerSpec = web_lb("front", 0, 80).typed_spec().unwrap();
        assert_eq!(
            ready_backends("default", &spec, &pods),
            vec![addr("fd00::1"), addr("fd00::2")]
        );
        assert_eq!(ready_backends("team", &spec, &pods), vec![addr("fd00::6")]);
    }

    #[test]
    fn a_plan_routes_each_port_to_the_backends_target_port() {
        let pods = [
            pod("a", "default", "web", "fd00::1", true),
            pod("b", "default", "web", "fd00::2", false),
        ];
        let front = lb(
            "front",
            0,
            json!({"selector": {"app": "web"}, "ports": [
                {"port": 80, "targetPort": 8080}, {"name": "admin", "port": 81, "targetPort": 9090}
            ]}),
        );
        let plan = plan("lb-l4-proxy", "l4-proxy", &FRONT, &[front], &pods);
        assert_eq!(plan.routes.len(), 2);
        assert_eq!(
            plan.routes[&80].backends,
            vec![SocketAddrV6::new(addr("fd00::1"), 8080, 0, 0)]
        );
        assert_eq!(
            plan.routes[&81].backends,
            vec![SocketAddrV6::new(addr("fd00::1"), 9090, 0, 0)]
        );
        assert_eq!(plan.routes[&80].load_balancer, key("front"));
        assert_eq!(
            plan.statuses[&key("front")],
            LoadBalancerStatus {
                owner: Some("lb-l4-proxy".into()),
                addresses: vec!["192.168.87.2".into(), "fd00::2".into()],
                backends: vec!["fd00::1".into()],
                ready: 1,
                message: None,
            }
        );
    }

    #[test]
    fn a_pod_turning_unready_leaves_the_backends() {
        let front = web_lb("front", 0, 80);
        let mut pods = vec![
            pod("a", "default", "web", "fd00::1", true),
            pod("b", "default", "web", "fd00::2", true),
        ];
        let before = plan("o", "l4-proxy", &FRONT, std::slice::from_ref(&front), &pods);
        assert_eq!(before.statuses[&key("front")].ready, 2);
        pods[0].status["containers"][0]["ready"] = json!(false);
        let after = plan("o", "l4-proxy", &FRONT, std::slice::from_ref(&front), &pods);
        assert_eq!(after.statuses[&key("front")].backends, vec!["fd00::2"]);
        assert_eq!(after.statuses[&key("front")].ready, 1);
        assert_eq!(after.routes[&80].backends.len(), 1);
        pods[1].status["phase"] = json!("Failed");
        let none = plan("o", "l4-proxy", &FRONT, &[front], &pods);
        assert!(
            none.routes[&80].backends.is_empty(),
            "the port stays, empty"
        );
        assert_eq!(none.statuses[&key("front")].ready, 0);
    }

    #[test]
    fn the_oldest_load_balancer_keeps_a_contested_port() {
        let pods = [pod("a", "default", "web", "fd00::1", true)];
        let young = lb(
            "young",
            20,
            json!({"selector": {"app": "web"}, "ports": [
                {"port": 80, "targetPort": 8080}, {"port": 443, "targetPort": 8443}
            ]}),
        );
        let old = web_lb("old", 10, 80);
        let plan = plan("o", "l4-proxy", &FRONT, &[young, old], &pods);
        assert_eq!(plan.routes[&80].load_balancer, key("old"));
        assert_eq!(plan.routes[&443].load_balancer, key("young"));
        assert_eq!(plan.statuses[&key("old")].message, None);
        assert_eq!(
            plan.statuses[&key("young")].message.as_deref(),
            Some("port 80 is served for loadbalancer default/old already")
        );
    }

    #[test]
    fn other_classes_and_undecodable_specs_are_left_alone() {
        let other = lb(
            "other",
            0,
            json!({"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}], "class": "metal"}),
        );
        let broken = lb("broken", 0, json!({"selector": "nope"}));
        let plan = plan("o", "l4-proxy", &FRONT, &[other.clone(), broken], &[]);
        assert_eq!(plan, Plan::default());
        let metal = super::plan("m", "metal", &FRONT, &[other], &[]);
        assert!(metal.statuses.contains_key(&key("other")));
    }

    #[test]
    fn frontends_list_ipv4_first_and_only_what_is_configured() {
        assert_eq!(FRONT.addresses(), vec!["192.168.87.2", "fd00::2"]);
        let v6_only = Frontends {
            ipv4: None,
            ipv6: FRONT.ipv6,
        };
        assert_eq!(v6_only.addresses(), vec!["fd00::2"]);
    }
}

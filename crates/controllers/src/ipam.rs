//! The IPAM controller: a /64 of the cluster prefix for every joining node
//! (`status.prefix`), and one random address of its node's /64 for every
//! pod and VM (`status.address`), unique on that node and kept across
//! in-place updates because the object, and so its status, stays. A VM's
//! further network interfaces (`spec.interfaces`) get one more address
//! each, in the same /64 and the same request (`status.interfaces`, by
//! interface name).
//!
//! It follows nodes, pods and VMs through informers that keep only the
//! addresses (filed by the /64 they lie in, so a live-migrated VM's
//! addresses stay taken in its first node's /64), and answers a ready step with one
//! request that claims it, writes the address and completes it. A deleted
//! pod's `ipam/release-address` (after its node removed the sandbox)
//! clears the address, which frees it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::Ipv6Addr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use corral_api::{Kind, Object, ObjectKey};
use corral_client::runtime::{self, Action, Cache, Change, Index, Informer, Scope, WorkQueue};
use corral_client::{Client, ClientError};
use corral_ipam::{ClusterPrefix, allocate_pod_address};
use ipnet::Ipv6Net;
use tokio_util::sync::CancellationToken;

use crate::steps::{ReadyStep, ready_instances};

pub const PREFIX_STEP: &str = "ipam/assign-prefix";
pub const ADDRESS_STEP: &str = "ipam/assign-address";
/// A deleted pod's `stop` step: its address is free again.
pub const RELEASE_STEP: &str = "ipam/release-address";

/// Objects answered at once: choices are made one at a time, the writes
/// that carry them go out together (and share the store's commits).
const WORKERS: usize = 16;

/// How long an address or prefix handed out is held back from others
/// before the caches show it.
const PENDING_FOR: Duration = Duration::from_secs(60);

/// What IPAM keeps of a node, pod or VM: its block or address, where it
/// is, and the instance whose IPAM step is ready.
#[derive(Debug, Clone)]
pub struct Addressing {
    node: Option<String>,
    /// A node's `status.prefix`.
    prefix: Option<Ipv6Net>,
    /// A pod's or VM's `status.address`.
    address: Option<Ipv6Addr>,
    /// A VM's further interfaces (`spec.interfaces`), by name.
    interfaces_wanted: Vec<String>,
    /// Their addresses (`status.interfaces`).
    interfaces: BTreeMap<String, Ipv6Addr>,
    /// The instance whose IPAM step is ready.
    ready: Option<String>,
    /// The instance whose `ipam/release-address` is ready.
    releasing: Option<String>,
}

fn status_text(object: &Object, field: &str) -> Option<String> {
    object
        .status
        .get(field)
        .and_then(serde_json::Value::as_str)
        .map(str::to_string)
}

fn project(object: &Object) -> Addressing {
    let step = if object.kind == Kind::Node {
        PREFIX_STEP
    } else {
        ADDRESS_STEP
    };
    let [ready, releasing] = ready_instances(object, [step, RELEASE_STEP]);
    Addressing {
        node: status_text(object, "node"),
        prefix: status_text(object, "prefix").and_then(|p| p.parse().ok()),
        address: status_text(object, "address").and_then(|a| a.parse().ok()),
        interfaces_wanted: object
            .spec
            .get("interfaces")
            .and_then(serde_json::Value::as_array)
            .map(|list| {
                list.iter()
                    .filter_map(|i| i.get("name")?.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default(),
        interfaces: object
            .status
            .get("interfaces")
            .and_then(serde_json::Value::as_object)
            .map(|map| {
                map.iter()
                    .filter_map(|(name, a)| Some((name.clone(), a.as_str()?.parse().ok()?)))
                    .collect()
            })
            .unwrap_or_default(),
        ready,
        releasing,
    }
}

/// What IPAM handed out that its caches do not show yet: kept until the
/// object's change arrives (or [`PENDING_FOR`] passed, if the write was
/// lost), so two objects never get the same value in between.
#[derive(Debug, Default)]
struct Pending {
    prefixes: HashMap<Ipv6Net, Instant>,
    /// Per node.
    addresses: HashMap<String, HashMap<Ipv6Addr, Instant>>,
}

impl Pending {
    fn prefixes(&mut self) -> impl Iterator<Item = Ipv6Net> + '_ {
        self.prefixes.retain(|_, at| at.elapsed() < PENDING_FOR);
        self.prefixes.keys().copied()
    }

    fn addresses(&mut self, node: &str) -> Vec<Ipv6Addr> {
        let Some(held) = self.addresses.get_mut(node) else {
            return Vec::new();
        };
        held.retain(|_, at| at.elapsed() < PENDING_FOR);
        held.keys().copied().collect()
    }

    /// The caches show `addressing`: what it holds is no longer pending.
    fn seen(&mut self, addressing: &Addressing) {
        if let Some(prefix) = addressing.prefix {
            self.prefixes.remove(&prefix);
        }
        if let Some(node) = &addressing.node
            && let Some(held) = self.addresses.get_mut(node)
        {
            for address in addressing.all_addresses() {
                held.remove(&address);
            }
            if held.is_empty() {
                self.addresses.remove(node);
            }
        }
    }
}

impl Addressing {
    /// Every address it holds: `status.address` and its interfaces'.
    fn all_addresses(&self) -> impl Iterator<Item = Ipv6Addr> + '_ {
        self.address
            .into_iter()
            .chain(self.interfaces.values().copied())
    }
}

/// The /64s its addresses lie in (node blocks are /64s). A live-migrated
/// VM keeps its addresses from its first node's /64 ([`workload_address`]
/// keeps them, the migration never runs this step), so the addresses
/// taken in a node's /64 are those filed under it here, wherever their
/// pod or VM is bound now.
fn by_subnet(addressing: &Addressing) -> Vec<String> {
    let mut subnets: Vec<String> = addressing
        .all_addresses()
        .filter_map(|address| Ipv6Net::new(address, 64).ok())
        .map(|net| net.trunc().to_string())
        .collect();
    subnets.sort();
    subnets.dedup();
    subnets
}

const BY_SUBNET: &str = "subnet";

struct Shared {
    client: Client,
    cluster: ClusterPrefix,
    nodes: Cache<Addressing>,
    pods: Cache<Addressing>,
    vms: Cache<Addressing>,
    /// Blocks and addresses handed out that the caches do not show yet.
    pending: Mutex<Pending>,
    /// Held while a block or address is chosen: workers write at once, but
    /// choose one after another.
    choosing: Mutex<()>,
}

impl Shared {
    fn cache(&self, kind: Kind) -> &Cache<Addressing> {
        match kind {
            Kind::Node => &self.nodes,
            Kind::VirtualMachine => &self.vms,
            _ => &self.pods,
        }
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Hands out blocks and addresses until `shutdown`.
pub async fn run(client: Client, cluster: ClusterPrefix, shutdown: CancellationToken) {
    let follow = |kind| {
        Informer::start_projected(
            client.clone(),
            Scope::all(kind),
            project,
            vec![Index {
                name: BY_SUBNET,
                values: by_subnet,
            }],
            shutdown.clone(),
        )
    };
    let (nodes, pods, vms) = (
        follow(Kind::Node),
        follow(Kind::Pod),
        follow(Kind::VirtualMachine),
    );
    for informer in [&nodes, &pods, &vms] {
        informer.synced().await;
    }
    let shared = Arc::new(Shared {
        client: client.clone(),
        cluster,
        nodes: nodes.cache().clone(),
        pods: pods.cache().clone(),
        vms: vms.cache().clone(),
        pending: Mutex::new(Pending::default()),
        choosing: Mutex::new(()),
    });
    let queue = WorkQueue::new();
    for informer in [&nodes, &pods, &vms] {
        let (existing, changed, shared) = (queue.clone(), queue.clone(), shared.clone());
        informer.on_change(
            move |key, addressing| {
                if addressing.ready.is_some() || addressing.releasing.is_some() {
                    existing.add(key.clone());
                }
            },
            move |change| {
                if let Change::Applied { key, new, .. } = change {
                    shared.pending().seen(new);
                    if new.ready.is_some() || new.releasing.is_some() {
                        changed.add((*key).clone());
                    }
                }
            },
        );
    }
    runtime::run("ipam", queue, WORKERS, shutdown, move |key: ObjectKey| {
        let shared = shared.clone();
        async move { reconcile(&shared, &key).await }
    })
    .await;
}

async fn reconcile(shared: &Shared, key: &ObjectKey) -> Result<Action, ClientError> {
    let Some(addressing) = shared.cache(key.kind).get(key) else {
        return Ok(Action::Done);
    };
    if let Some(workflow) = &addressing.releasing {
        // `status.address` cleared in the same write: the address leaves
        // the caches, so it can be handed out again.
        let step = ReadyStep {
            key,
            step: RELEASE_STEP,
            workflow,
        };
        let held: Vec<String> = addressing.all_addresses().map(|a| a.to_string()).collect();
        let note = match held.as_slice() {
            [] => "it had no address".to_string(),
            [one] => format!("{one} is free again"),
            several => format!("{} are free again", several.join(", ")),
        };
        let mut status = BTreeMap::from([("address".to_string(), serde_json::Value::Null)]);
        if !addressing.interfaces.is_empty() {
            status.insert("interfaces".to_string(), serde_json::Value::Null);
        }
        step.finish(&shared.client, Ok(note), status).await?;
        return Ok(Action::Done);
    }
    let Some(workflow) = &addressing.ready else {
        return Ok(Action::Done);
    };
    if key.kind == Kind::Node {
        let step = ReadyStep {
            key,
            step: PREFIX_STEP,
            workflow,
        };
        let (outcome, status) = {
            let _choosing = shared
                .choosing
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            node_prefix(shared, &addressing)
        };
        step.finish(&shared.client, outcome, status).await?;
    } else {
        let step = ReadyStep {
            key,
            step: ADDRESS_STEP,
            workflow,
        };
        let (outcome, status) = {
            let _choosing = shared
                .choosing
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            workload_address(shared, &addressing)
        };
        step.finish(&shared.client, outcome, status).await?;
    }
    Ok(Action::Done)
}

type Decided = (Result<String, String>, BTreeMap<String, serde_json::Value>);

/// The node's /64: the one it has, or a free one of the cluster prefix.
fn node_prefix(shared: &Shared, node: &Addressing) -> Decided {
    if let Some(existing) = node.prefix {
        return (Ok(existing.to_string()), BTreeMap::new());
    }
    let mut taken: BTreeSet<Ipv6Net> = shared
        .nodes
        .list()
        .into_iter()
        .filter_map(|(_, node)| node.prefix)
        .collect();
    let mut pending = shared.pending();
    taken.extend(pending.prefixes());
    match shared
        .cluster
        .allocate_node_subnet(&taken, &mut rand::rng())
    {
        Ok(subnet) => {
            pending.prefixes.insert(subnet, Instant::now());
            let subnet = subnet.to_string();
            let status = BTreeMap::from([("prefix".to_string(), subnet.clone().into())]);
            (Ok(subnet), status)
        }
        Err(error) => (Err(error.to_string()), BTreeMap::new()),
    }
}

/// The workload's address, and a VM's further interfaces' addresses: the
/// ones it has if they are in its node's /64 (an in-place update keeps
/// them), else free ones there.
fn workload_address(shared: &Shared, workload: &Addressing) -> Decided {
    let node = workload.node.as_deref().unwrap_or("?");
    let node_prefix = shared
        .nodes
        .get(&ObjectKey::new(Kind::Node, None, node))
        .and_then(|facts| facts.prefix);
    let fits = |address: &Ipv6Addr| node_prefix.is_none_or(|prefix| prefix.contains(address));
    let kept_interfaces = workload
        .interfaces_wanted
        .iter()
        .all(|name| workload.interfaces.get(name).is_some_and(fits));
    if let Some(address) = workload.address
        && fits(&address)
        && kept_interfaces
    {
        return (Ok(describe(address, workload)), BTreeMap::new());
    }
    let Some(subnet) = node_prefix else {
        let error =
            format!("node {node} has no /64 yet (its join workflow's {PREFIX_STEP} is not done)");
        return (Err(error), BTreeMap::new());
    };
    // Every address in the /64, also a migrated VM's bound elsewhere now.
    let filed = subnet.trunc().to_string();
    let mut taken: BTreeSet<Ipv6Addr> = shared
        .pods
        .by_index(BY_SUBNET, &filed)
        .into_iter()
        .chain(shared.vms.by_index(BY_SUBNET, &filed))
        .flat_map(|(_, workload)| workload.all_addresses().collect::<Vec<_>>())
        .collect();
    let mut pending = shared.pending();
    taken.extend(pending.addresses(node));
    let mut chosen = Vec::new();
    let mut choose = |kept: Option<Ipv6Addr>, taken: &mut BTreeSet<Ipv6Addr>| {
        if let Some(address) = kept.filter(|a| subnet.contains(a)) {
            return Ok(address);
        }
        let address = allocate_pod_address(subnet, taken, &mut rand::rng())?;
        taken.insert(address);
        chosen.push(address);
        Ok::<_, corral_ipam::IpamError>(address)
    };
    let decided = choose(workload.address, &mut taken).and_then(|address| {
        let interfaces = workload
            .interfaces_wanted
            .iter()
            .map(|name| {
                let kept = workload.interfaces.get(name).copied();
                choose(kept, &mut taken).map(|a| (name.clone(), a))
            })
            .collect::<Result<BTreeMap<_, _>, _>>()?;
        Ok((address, interfaces))
    });
    match decided {
        Ok((address, interfaces)) => {
            let held = pending.addresses.entry(node.to_string()).or_default();
            for address in chosen {
                held.insert(address, Instant::now());
            }
            let mut status = BTreeMap::from([("address".to_string(), address.to_string().into())]);
            if !interfaces.is_empty() {
                let map: serde_json::Map<String, serde_json::Value> = interfaces
                    .iter()
                    .map(|(name, a)| (name.clone(), a.to_string().into()))
                    .collect();
                status.insert("interfaces".to_string(), map.into());
            }
            let described = Addressing {
                interfaces,
                ..workload.clone()
            };
            (Ok(describe(address, &described)), status)
        }
        Err(error) => (Err(error.to_string()), BTreeMap::new()),
    }
}

/// The step's note: the address, and each further interface's.
fn describe(address: Ipv6Addr, workload: &Addressing) -> String {
    let mut note = address.to_string();
    for (name, address) in &workload.interfaces {
        note.push_str(&format!(", {name} {address}"));
    }
    note
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addressing(node: &str, address: &str, interfaces: &[(&str, &str)]) -> Addressing {
        Addressing {
            node: Some(node.to_string()),
            prefix: None,
            address: Some(address.parse().unwrap()),
            interfaces_wanted: interfaces.iter().map(|(n, _)| n.to_string()).collect(),
            interfaces: interfaces
                .iter()
                .map(|(n, a)| (n.to_string(), a.parse().unwrap()))
                .collect(),
            ready: None,
            releasing: None,
        }
    }

    #[test]
    fn addresses_are_filed_by_their_64_not_by_the_node_bound_now() {
        // A VM from node a's /64 live-migrated to node b: its addresses
        // stay taken in a's /64.
        let moved = addressing(
            "b",
            "fd00:0:0:1::10",
            &[("backend", "fd00:0:0:1::11"), ("other", "fd00:0:0:2::12")],
        );
        assert_eq!(
            by_subnet(&moved),
            vec!["fd00:0:0:1::/64".to_string(), "fd00:0:0:2::/64".to_string()]
        );
        let unaddressed = Addressing {
            address: None,
            ..addressing("a", "fd00::1", &[])
        };
        assert!(by_subnet(&unaddressed).is_empty());
    }
}

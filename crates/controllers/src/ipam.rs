//! The IPAM controller: a /64 of the cluster prefix for every joining node
//! (`status.prefix`), and one random address of its node's /64 for every
//! pod and VM (`status.address`), unique on that node and kept across
//! in-place updates because the object, and so its status, stays.
//!
//! It follows nodes, pods and VMs through informers that keep only the
//! addresses (pods filed by node), and answers a ready step with one
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

use crate::steps::{ReadyStep, ready_instance};

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
    Addressing {
        node: status_text(object, "node"),
        prefix: status_text(object, "prefix").and_then(|p| p.parse().ok()),
        address: status_text(object, "address").and_then(|a| a.parse().ok()),
        ready: ready_instance(object, step),
        releasing: ready_instance(object, RELEASE_STEP),
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
        if let (Some(node), Some(address)) = (&addressing.node, addressing.address)
            && let Some(held) = self.addresses.get_mut(node)
        {
            held.remove(&address);
            if held.is_empty() {
                self.addresses.remove(node);
            }
        }
    }
}

fn by_node(addressing: &Addressing) -> Vec<String> {
    addressing.node.clone().into_iter().collect()
}

const BY_NODE: &str = "node";

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
                name: BY_NODE,
                values: by_node,
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
        let note = match addressing.address {
            Some(address) => format!("{address} is free again"),
            None => "it had no address".to_string(),
        };
        let status = BTreeMap::from([("address".to_string(), serde_json::Value::Null)]);
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

/// The workload's address: the one it has if it is in its node's /64 (an
/// in-place update keeps it), else a free one there.
fn workload_address(shared: &Shared, workload: &Addressing) -> Decided {
    let node = workload.node.as_deref().unwrap_or("?");
    let node_prefix = shared
        .nodes
        .get(&ObjectKey::new(Kind::Node, None, node))
        .and_then(|facts| facts.prefix);
    if let Some(address) = workload.address
        && node_prefix.is_none_or(|prefix| prefix.contains(&address))
    {
        return (Ok(address.to_string()), BTreeMap::new());
    }
    let Some(subnet) = node_prefix else {
        let error =
            format!("node {node} has no /64 yet (its join workflow's {PREFIX_STEP} is not done)");
        return (Err(error), BTreeMap::new());
    };
    let mut taken: BTreeSet<Ipv6Addr> = shared
        .pods
        .by_index(BY_NODE, node)
        .into_iter()
        .chain(shared.vms.by_index(BY_NODE, node))
        .filter_map(|(_, workload)| workload.address)
        .collect();
    let mut pending = shared.pending();
    taken.extend(pending.addresses(node));
    match allocate_pod_address(subnet, &taken, &mut rand::rng()) {
        Ok(address) => {
            pending
                .addresses
                .entry(node.to_string())
                .or_default()
                .insert(address, Instant::now());
            let address = address.to_string();
            let status = BTreeMap::from([("address".to_string(), address.clone().into())]);
            (Ok(address), status)
        }
        Err(error) => (Err(error.to_string()), BTreeMap::new()),
    }
}

//! One hollow node: registers its status (capacity, the `runc` runtime,
//! an address, features) as the agent does, executes the node-owned steps
//! of its join workflow by completing them, then heartbeats and follows its
//! pods until dropped.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use corral_agent::steps::{instance_for, is_running, node_steps};
use corral_api::Object;
use corral_api::kinds::{NodeCapacity, NodePhase, NodeStatus, RuntimeClass};
use corral_api::quantity::{Cpu, Memory};
use corral_api::workflow::WorkflowOutcome;

use super::Counters;
use super::pods::PodFollower;
use super::protocol::NodeApi;

/// How often the join workflow is looked at until it is over (the agent's
/// `JOIN_TICK`), and how soon a failed heartbeat is tried again.
const JOIN_TICK: Duration = Duration::from_millis(500);

/// How long joining may take before the node gives up.
const JOIN_TIMEOUT: Duration = Duration::from_secs(300);

/// What one hollow node offers and how it behaves.
#[derive(Debug, Clone)]
pub struct NodeSettings {
    /// The node's number in its cluster (its address is derived from it).
    pub index: usize,
    /// Pods the node accepts at most.
    pub pod_capacity: u32,
    /// Time between heartbeats (the agent's default is 5 s).
    pub heartbeat: Duration,
    /// Pods the node works on at once; 0: none at all (its pods wait at
    /// their first node step, as on a node busy elsewhere).
    pub parallel_pods: usize,
}

/// The status a hollow node reports: far more CPU and memory than the
/// benchmark's tiny pods need, so only pod slots limit placement.
pub fn hollow_status(settings: &NodeSettings) -> NodeStatus {
    let features = BTreeMap::from([
        ("kvm".to_string(), "absent (hollow node)".to_string()),
        (
            "apparmor".to_string(),
            "unavailable: hollow node".to_string(),
        ),
    ]);
    NodeStatus {
        phase: NodePhase::Ready,
        address: Some(format!("fd00:ffff::{:x}", settings.index + 1)),
        capacity: NodeCapacity {
            cpu: Cpu { millis: 64_000 },
            memory: Memory { bytes: 256 << 30 },
            pods: settings.pod_capacity,
        },
        runtimes: vec![RuntimeClass::Runc],
        features,
        heartbeat: Some(Utc::now()),
        ..NodeStatus::default()
    }
}

/// Runs the node until dropped: register, then heartbeat while joining
/// and, once joined, following pods.
pub async fn run(api: NodeApi, settings: NodeSettings, counters: Arc<Counters>) {
    let status = hollow_status(&settings);
    loop {
        match api.register(&status).await {
            Ok(_) => break,
            Err(_) => {
                Counters::add(&counters.heartbeat_failures);
                tokio::time::sleep(JOIN_TICK).await;
            }
        }
    }
    Counters::add(&counters.heartbeats);
    let work = async {
        if join(&api, &counters).await {
            Counters::add(&counters.joined);
        }
        if settings.parallel_pods > 0 {
            PodFollower::new(api.clone(), counters.clone(), settings.parallel_pods)
                .run()
                .await;
        }
    };
    tokio::join!(heartbeat_loop(&api, settings.heartbeat, &counters), work,);
}

/// Completes the node-owned steps of the node's join workflow as they
/// become ready, until the workflow is over; whether it succeeded.
async fn join(api: &NodeApi, counters: &Counters) -> bool {
    let started = Instant::now();
    while started.elapsed() < JOIN_TIMEOUT {
        let Ok(node) = api.node().await else {
            Counters::add(&counters.errors);
            tokio::time::sleep(JOIN_TICK).await;
            continue;
        };
        if let Some(outcome) = run_join_steps(api, &node, counters).await {
            return outcome == WorkflowOutcome::Succeeded;
        }
        tokio::time::sleep(JOIN_TICK).await;
    }
    false
}

/// One round over the join workflow: every ready node step, following the
/// instance after each. The outcome once the workflow is over.
async fn run_join_steps(
    api: &NodeApi,
    node: &Object,
    counters: &Counters,
) -> Option<WorkflowOutcome> {
    let mut instance = instance_for(api.steps(), node, node.metadata.revision).await?;
    let key = node.key();
    while is_running(&instance) {
        let steps = node_steps(&instance, "ready");
        if steps.is_empty() {
            return None;
        }
        match api
            .run_steps(&key, &instance.id, &steps, Default::default())
            .await
        {
            Ok(fresh) => {
                Counters::add_n(&counters.steps, steps.len());
                instance = fresh;
            }
            Err(_) => {
                Counters::add(&counters.stale_claims);
                return None;
            }
        }
    }
    Some(instance.outcome)
}

/// Heartbeats every `every` (the first one came with the registration),
/// trying again soon after a failed one.
async fn heartbeat_loop(api: &NodeApi, every: Duration, counters: &Counters) {
    let mut wait = every;
    loop {
        tokio::time::sleep(wait).await;
        wait = match api.heartbeat().await {
            Ok(()) => {
                Counters::add(&counters.heartbeats);
                every
            }
            Err(_) => {
                Counters::add(&counters.heartbeat_failures);
                JOIN_TICK
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_offers_pod_slots_and_runc() {
        let settings = NodeSettings {
            index: 9,
            pod_capacity: 120,
            heartbeat: Duration::from_secs(5),
            parallel_pods: 4,
        };
        let status = hollow_status(&settings);
        assert_eq!(status.capacity.pods, 120);
        assert_eq!(status.runtimes, [RuntimeClass::Runc]);
        assert_eq!(status.address.as_deref(), Some("fd00:ffff::a"));
        let address: std::net::Ipv6Addr = status
            .address
            .as_deref()
            .unwrap_or_default()
            .parse()
            .expect("an IPv6 address");
        assert!(!address.is_unspecified());
    }
}

//! Hollow nodes, like Kubernetes' kubemark: node agents that speak the
//! real node protocol through the real API — join with a join token,
//! register, heartbeat, claim and complete their workflow steps, report
//! their pods' containers running — without running anything, so a
//! hundred nodes and thousands of pods fit in one process on a small
//! machine and the control plane can be measured at scale.
//!
//! - [`protocol`]: every call a hollow node makes, one method per thing an
//!   agent does (the place to change when the API changes);
//! - `node`: one node's registration, join steps and heartbeat;
//! - `pods`: one node's pods, followed by watch, one worker each.
//!
//! What they leave out: containers, images, volumes, networking, probes,
//! restarts, fencing, the logs and exec endpoint.

mod node;
mod pods;
pub mod protocol;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use corral_api::kinds::{NodePhase, NodeStatus};
use corral_api::{Kind, Role};
use corral_client::{Client, ClientConfig};
use futures::{StreamExt, TryStreamExt};
use tokio::task::JoinSet;

pub use node::NodeSettings;
use protocol::NodeApi;

/// Nodes joining at once when a cluster starts.
const JOINS_AT_ONCE: usize = 8;

/// What hollow nodes did so far, added up over a cluster's nodes.
#[derive(Debug, Default)]
pub struct Counters {
    /// Nodes whose join workflow succeeded.
    pub joined: AtomicU64,
    /// Heartbeats written (registrations included).
    pub heartbeats: AtomicU64,
    /// Steps claimed and completed (join and pod steps).
    pub steps: AtomicU64,
    /// Claims refused because the node's view was stale.
    pub stale_claims: AtomicU64,
    /// Pod statuses reported running.
    pub status_reports: AtomicU64,
    /// Failed heartbeats and registrations (a conflict with the
    /// node-lifecycle controller's write of the phase, or an API away).
    pub heartbeat_failures: AtomicU64,
    /// Failed step completions, status reports and node reads.
    pub errors: AtomicU64,
    /// Pod lists (at start and after a watch broke).
    pub watch_restarts: AtomicU64,
    /// Pods being worked on right now.
    pub busy_pods: AtomicU64,
}

impl Counters {
    fn add(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn add_n(counter: &AtomicU64, n: usize) {
        counter.fetch_add(u64::try_from(n).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    fn sub(counter: &AtomicU64) {
        counter.fetch_sub(1, Ordering::Relaxed);
    }

    /// One line for a benchmark's progress output.
    pub fn describe(&self) -> String {
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        format!(
            "joined {}, heartbeats {} ({} failed), steps {}, stale claims {}, pods reported running {}, errors {}, pod lists {}",
            get(&self.joined),
            get(&self.heartbeats),
            get(&self.heartbeat_failures),
            get(&self.steps),
            get(&self.stale_claims),
            get(&self.status_reports),
            get(&self.errors),
            get(&self.watch_restarts),
        )
    }
}

/// How a cluster of hollow nodes is made.
#[derive(Debug, Clone)]
pub struct HollowOptions {
    pub nodes: usize,
    /// Node names are `PREFIX-000`, `PREFIX-001`, …
    pub name_prefix: String,
    /// Every node's settings but its index.
    pub node: NodeSettings,
}

/// N hollow nodes running as tokio tasks of this process; dropping it
/// stops them all (their pods' workers too).
#[derive(Debug)]
pub struct HollowCluster {
    names: Vec<String>,
    counters: Arc<Counters>,
    _tasks: JoinSet<()>,
}

impl HollowCluster {
    /// Mints one join token with the operator client `admin` (whose
    /// config is `admin_config`), joins every node with it and starts them.
    pub async fn start(
        admin: &Client,
        admin_config: &ClientConfig,
        options: &HollowOptions,
    ) -> anyhow::Result<Self> {
        let joiner = admin
            .create_token(
                &format!("{}-join", options.name_prefix),
                Role::Joiner,
                &[],
                Some(24 * 3600),
                false,
            )
            .await
            .context("cannot mint a join token")?;
        let join = ClientConfig {
            token: joiner.token,
            ..admin_config.clone()
        };
        let names: Vec<String> = (0..options.nodes)
            .map(|index| format!("{}-{index:03}", options.name_prefix))
            .collect();
        let apis: Vec<NodeApi> = futures::stream::iter(names.iter())
            .map(|name| {
                let join = &join;
                async move {
                    NodeApi::join(join, name)
                        .await
                        .with_context(|| format!("hollow node {name} cannot join"))
                }
            })
            .buffered(JOINS_AT_ONCE)
            .try_collect()
            .await?;
        let counters = Arc::new(Counters::default());
        let mut tasks = JoinSet::new();
        for (index, api) in apis.into_iter().enumerate() {
            let settings = NodeSettings {
                index,
                ..options.node.clone()
            };
            tasks.spawn(node::run(api, settings, counters.clone()));
        }
        Ok(HollowCluster {
            names,
            counters,
            _tasks: tasks,
        })
    }

    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Waits until every node is Ready (as node-lifecycle decides, seen
    /// with `admin`); returns how long that took.
    pub async fn wait_ready(&self, admin: &Client, timeout: Duration) -> anyhow::Result<Duration> {
        let started = Instant::now();
        loop {
            let nodes = admin.list(Kind::Node, None, None).await?.items;
            let phases: Vec<NodePhase> = nodes
                .iter()
                .filter(|node| self.names.contains(&node.metadata.name))
                .map(|node| node.typed_status::<NodeStatus>().unwrap_or_default().phase)
                .collect();
            let ready = phases.iter().filter(|p| **p == NodePhase::Ready).count();
            if ready == self.names.len() {
                return Ok(started.elapsed());
            }
            if started.elapsed() > timeout {
                bail!(
                    "{ready} of {} hollow nodes Ready after {timeout:?} ({} registered); hollow nodes: {}",
                    self.names.len(),
                    phases.len(),
                    self.counters.describe()
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Waits until no pod has been worked on for a second, or `timeout`
    /// passed; whether the nodes went idle.
    pub async fn wait_idle(&self, timeout: Duration) -> bool {
        let started = Instant::now();
        let mut idle_since: Option<Instant> = None;
        while started.elapsed() < timeout {
            if self.counters.busy_pods.load(Ordering::Relaxed) == 0 {
                let since = *idle_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= Duration::from_secs(1) {
                    return true;
                }
            } else {
                idle_since = None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }
}

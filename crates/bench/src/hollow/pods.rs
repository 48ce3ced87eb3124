//! The pods of one hollow node: a follower routes each pod bound to the
//! node (list, then watch; list again after a break) to a worker of its
//! own, as the agent's manager does; a worker claims and completes every
//! ready node step of the pod's current workflow instance without doing
//! anything, and reports the pod's containers running once the instance's
//! container start step is done. A deleted pod, or one bound elsewhere, is
//! forgotten.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use corral_agent::steps::{instance_for, is_running, node_steps};
use corral_api::watch::EventType;
use corral_api::workflow::{StepState, WorkflowInstance};
use corral_api::{Object, ObjectKey};
use futures::StreamExt;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;

use super::Counters;
use super::protocol::{NodeApi, StepError, bound_to, running_status};

/// How long to wait before listing again after the API failed.
const RETRY: Duration = Duration::from_secs(1);

/// The steps after which the pod's containers are running (start, update).
const STARTS_CONTAINERS: [&str; 2] = ["node/start-containers", "node/start-changed-containers"];

/// A step attempt this node has claimed: (instance, step, attempts before
/// the claim). A stale view of the pod still shows it ready; it is not
/// claimed twice.
type Attempt = (String, String, u32);

/// Routes the pods bound to one node to their workers.
pub struct PodFollower {
    api: NodeApi,
    counters: Arc<Counters>,
    /// Pods in progress at once on this node.
    parallel: Arc<Semaphore>,
    /// Each pod's uid and the channel holding its latest object.
    workers: HashMap<ObjectKey, (String, watch::Sender<Object>)>,
    tasks: JoinSet<()>,
}

impl std::fmt::Debug for PodFollower {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodFollower")
            .field("node", &self.api.name())
            .field("pods", &self.workers.len())
            .finish_non_exhaustive()
    }
}

impl PodFollower {
    pub fn new(api: NodeApi, counters: Arc<Counters>, parallel: usize) -> Self {
        PodFollower {
            api,
            counters,
            parallel: Arc::new(Semaphore::new(parallel.max(1))),
            workers: HashMap::new(),
            tasks: JoinSet::new(),
        }
    }

    /// Follows the API until dropped (which stops every worker).
    pub async fn run(mut self) {
        loop {
            let (pods, after) = match self.api.bound_pods().await {
                Ok(listed) => listed,
                Err(_) => {
                    Counters::add(&self.counters.watch_restarts);
                    tokio::time::sleep(RETRY).await;
                    continue;
                }
            };
            let listed: HashSet<ObjectKey> = pods.iter().map(Object::key).collect();
            self.workers.retain(|key, _| listed.contains(key));
            for pod in pods {
                self.route(pod);
            }
            let Ok(mut events) = self.api.watch_pods(after).await else {
                Counters::add(&self.counters.watch_restarts);
                tokio::time::sleep(RETRY).await;
                continue;
            };
            while let Some(Ok(event)) = events.next().await {
                match event.event_type {
                    EventType::Deleted => self.forget(&event.object.key()),
                    _ => self.route(event.object),
                }
                while self.tasks.try_join_next().is_some() {}
            }
            // The stream ended or broke: list again.
            Counters::add(&self.counters.watch_restarts);
        }
    }

    fn forget(&mut self, key: &ObjectKey) {
        // Dropping the sender ends the worker after its current round.
        self.workers.remove(key);
    }

    fn route(&mut self, pod: Object) {
        let key = pod.key();
        if bound_to(&pod) != Some(self.api.name()) {
            self.forget(&key);
            return;
        }
        if let Some((uid, sender)) = self.workers.get(&key)
            && *uid == pod.metadata.uid
            && !sender.is_closed()
        {
            sender.send_replace(pod);
            return;
        }
        let uid = pod.metadata.uid.clone();
        let (sender, receiver) = watch::channel(pod);
        let worker = PodWorker {
            api: self.api.clone(),
            counters: self.counters.clone(),
            claimed: HashSet::new(),
            reported: None,
        };
        self.tasks
            .spawn(worker.run(receiver, self.parallel.clone()));
        self.workers.insert(key, (uid, sender));
    }
}

/// One pod on a hollow node.
struct PodWorker {
    api: NodeApi,
    counters: Arc<Counters>,
    claimed: HashSet<Attempt>,
    /// The spec revision last reported running.
    reported: Option<u64>,
}

impl PodWorker {
    /// Works on the newest view of the pod each time it changes, until the
    /// follower forgets the pod.
    async fn run(mut self, mut pod: watch::Receiver<Object>, parallel: Arc<Semaphore>) {
        loop {
            let current = pod.borrow_and_update().clone();
            {
                let Ok(_permit) = parallel.acquire().await else {
                    return;
                };
                Counters::add(&self.counters.busy_pods);
                self.advance(&current).await;
                Counters::sub(&self.counters.busy_pods);
            }
            if pod.changed().await.is_err() {
                return;
            }
        }
    }

    /// Moves the pod's current workflow instance as far as the node can:
    /// every ready node step, one after another, following the instance the
    /// API returns after each, and reports the containers running once
    /// they would be.
    async fn advance(&mut self, pod: &Object) {
        let key = pod.key();
        let revision = pod.metadata.revision;
        let Some(mut instance) = instance_for(self.api.steps(), pod, revision).await else {
            // No workflow recorded for this revision: the agent admits it directly.
            self.report(&key, revision).await;
            return;
        };
        while is_running(&instance) {
            // Every node step that is ready, and every one its completion
            // makes ready (a hollow node's steps take no time), at once in
            // one request; the containers are reported running in the
            // request that starts them.
            let ready = chain(&instance, &self.claimed, self.api.name());
            if ready.is_empty() {
                break;
            }
            for (step, attempts) in &ready {
                self.claimed
                    .insert((instance.id.clone(), step.clone(), *attempts));
            }
            let steps: Vec<String> = ready.into_iter().map(|(step, _)| step).collect();
            let starts = steps
                .iter()
                .any(|step| STARTS_CONTAINERS.contains(&step.as_str()));
            let status = if starts && self.reported != Some(instance.revision) {
                running_fields(pod, instance.revision)
            } else {
                BTreeMap::new()
            };
            match self.api.run_steps(&key, &instance.id, &steps, status).await {
                Ok(fresh) => {
                    Counters::add_n(&self.counters.steps, steps.len());
                    if starts {
                        self.reported = Some(fresh.revision);
                        Counters::add(&self.counters.status_reports);
                    }
                    instance = fresh;
                }
                Err(StepError::Refused { .. }) => {
                    // A stale view: the next event brings the news.
                    Counters::add(&self.counters.stale_claims);
                    break;
                }
                Err(StepError::Failed { .. }) => {
                    Counters::add(&self.counters.errors);
                    break;
                }
            }
        }
        if containers_started(&instance) {
            self.report(&key, instance.revision).await;
        }
    }

    /// Reports the containers running `revision`, once per revision.
    async fn report(&mut self, key: &ObjectKey, revision: u64) {
        if self.reported == Some(revision) {
            return;
        }
        match self.api.report_running(key, revision).await {
            Ok(()) => {
                self.reported = Some(revision);
                Counters::add(&self.counters.status_reports);
            }
            Err(_) => Counters::add(&self.counters.errors),
        }
    }
}

/// The ready steps the node executes that it has not claimed yet, with
/// the attempts made before each.
fn next_steps(instance: &WorkflowInstance, claimed: &HashSet<Attempt>) -> Vec<(String, u32)> {
    node_steps(instance, "ready")
        .into_iter()
        .filter_map(|step| {
            let attempts = instance.step(&step).map_or(0, |s| s.attempts);
            let attempt = (instance.id.clone(), step.clone(), attempts);
            (!claimed.contains(&attempt)).then_some((step, attempts))
        })
        .collect()
}

/// The ready node steps, then those their completion makes ready, and so
/// on: what one request moves for a node whose steps take no time. Worked
/// out on a copy of the instance with the engine's own transitions, so the
/// server accepts them in this order.
fn chain(
    instance: &WorkflowInstance,
    claimed: &HashSet<Attempt>,
    node: &str,
) -> Vec<(String, u32)> {
    let actor = corral_api::Identity::new(node, corral_api::Role::Node);
    let mut simulated = instance.clone();
    let mut taken = claimed.clone();
    let mut chained = Vec::new();
    let now = chrono::Utc::now();
    loop {
        let ready = next_steps(&simulated, &taken);
        if ready.is_empty() {
            return chained;
        }
        for (step, attempts) in ready {
            let moved = corral_workflow::claim(&mut simulated, &step, &actor, Some(node), now)
                .and_then(|_| {
                    corral_workflow::complete(&mut simulated, &step, &actor, Some(node), now, None)
                });
            if moved.is_err() {
                return chained;
            }
            taken.insert((simulated.id.clone(), step.clone(), attempts));
            chained.push((step, attempts));
        }
    }
}

/// The node-owned status fields of `pod` once its containers run
/// `revision`.
fn running_fields(pod: &Object, revision: u64) -> BTreeMap<String, serde_json::Value> {
    let status = running_status(pod, revision);
    ["phase", "containers", "observedRevision"]
        .into_iter()
        .filter_map(|field| Some((field.to_string(), status.get(field)?.clone())))
        .collect()
}

/// Whether the instance's container start step is done (its containers
/// would run from then on).
fn containers_started(instance: &WorkflowInstance) -> bool {
    STARTS_CONTAINERS.iter().any(|name| {
        instance
            .step(name)
            .is_some_and(|step| matches!(step.state, StepState::Done { .. }))
    })
}

#[cfg(test)]
mod tests {
    use chrono::Utc;
    use corral_api::Kind;

    use super::*;

    /// The pod start workflow as the server instantiates it, with
    /// `scheduler/place` and `ipam/assign-address` done.
    fn placed_instance() -> WorkflowInstance {
        let definition =
            corral_workflow::builtin(Kind::Pod, "start").expect("the pod start workflow");
        let now = Utc::now();
        let (mut instance, _) = corral_workflow::instantiate(&definition, "start-1", "u", 1, now);
        for step in &mut instance.steps {
            if step.definition.owner != "node" && step.definition.kind == Default::default() {
                step.state = StepState::Done {
                    started: now,
                    finished: now,
                    attempt: 1,
                    note: None,
                };
            }
        }
        corral_workflow::tick(&mut instance, now);
        instance
    }

    #[test]
    fn ready_node_steps_are_claimed_once_per_attempt() {
        let instance = placed_instance();
        let mut claimed = HashSet::new();
        let order: Vec<String> = next_steps(&instance, &claimed)
            .into_iter()
            .map(|(step, attempts)| {
                assert_eq!(attempts, 0);
                claimed.insert((instance.id.clone(), step.clone(), attempts));
                step
            })
            .collect();
        assert!(next_steps(&instance, &claimed).is_empty(), "claimed once");
        assert!(
            order.contains(&"node/create-sandbox".to_string()),
            "{order:?}"
        );
        assert!(order.contains(&"node/pull-image".to_string()), "{order:?}");
        assert!(
            !order.contains(&"node/start-containers".to_string()),
            "not ready before its targets: {order:?}"
        );
        assert!(!containers_started(&instance));
    }
}

//! Routes pods to their executors: restores one from local state for every
//! pod at start, then follows the pods bound to this node (a node-scoped
//! informer, [`crate::bound`]) and sends each executor its pod, or tells it
//! to remove the pod. It follows Secrets and Configs too
//! ([`crate::pod_data::follow`]) and tells only the pods that read one of
//! its new revision.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use corral_api::kinds::{DataRef, PodSpec, PodStatus};
use corral_api::{Kind, Object, ObjectKey};
use corral_client::runtime::Scope;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::AgentContext;
use crate::bound::Bound;
use crate::executor::{Executor, Message as PodMessage};
use crate::pod_data::follow::DataChange;
use crate::pods::PodWorkload;
use crate::state::PodRecord;

/// How long fencing waits for one pod's worker to stop it.
const FENCE_STOP: Duration = Duration::from_secs(60);

/// A request to stop every pod no longer bound to this node (fencing, see
/// [`Manager::fence`]); answered with how many were stopped.
pub type FenceRequest = tokio::sync::oneshot::Sender<usize>;

/// A request to end the node's self-fence ([`crate::fencing`]) once it is
/// back: the pods moved away meanwhile are stopped for good first;
/// answered with the fence lifted (`None`: none was in force).
pub type LiftRequest = tokio::sync::oneshot::Sender<Option<corral_api::fencing::SelfFence>>;

#[derive(Debug)]
pub struct Manager {
    ctx: Arc<AgentContext>,
    /// Each pod's worker and the uid of the pod it runs.
    workers: BTreeMap<ObjectKey, (String, mpsc::Sender<PodMessage>)>,
    fences: Option<mpsc::Receiver<FenceRequest>>,
    lifts: Option<mpsc::Receiver<LiftRequest>>,
    /// The Secrets and Configs each pod reads (its admitted or desired
    /// spec): a data change goes only to the pods that read it.
    reads: BTreeMap<ObjectKey, BTreeSet<DataRef>>,
}

/// What `pod` reads of Secrets and Configs.
fn reads_of(pod: &Object) -> BTreeSet<DataRef> {
    pod.typed_spec::<PodSpec>()
        .map(|spec| spec.data_refs())
        .unwrap_or_default()
}

impl Manager {
    pub fn new(ctx: Arc<AgentContext>) -> Self {
        Manager {
            ctx,
            workers: BTreeMap::new(),
            fences: None,
            lifts: None,
            reads: BTreeMap::new(),
        }
    }

    /// Answers fence requests (from the heartbeat of a returning node).
    pub fn with_fences(mut self, fences: mpsc::Receiver<FenceRequest>) -> Self {
        self.fences = Some(fences);
        self
    }

    /// Answers lift requests (from the heartbeat of a node back from a
    /// self-fence).
    pub fn with_lifts(mut self, lifts: mpsc::Receiver<LiftRequest>) -> Self {
        self.lifts = Some(lifts);
        self
    }

    /// Ends the self-fence against `listed` (the pods bound here now):
    /// the fenced pods no longer bound here are removed, and the fence is
    /// lifted, so those still bound start again.
    async fn lift(&mut self, listed: &[Object]) -> Option<corral_api::fencing::SelfFence> {
        self.fence(listed).await;
        // Stopped by the fence and no longer run here: moved (or deleted)
        // meanwhile, removed now or by the return-path fence before.
        let here: BTreeSet<String> = self
            .workers
            .keys()
            .map(|key| format!("{}/{}", key.namespace, key.name))
            .collect();
        let moved: Vec<String> = self
            .ctx
            .fence
            .active()
            .map(|fence| fence.pods)
            .unwrap_or_default()
            .into_iter()
            .filter(|pod| !here.contains(pod))
            .collect();
        self.ctx.fence.lift(&moved)
    }

    /// Fencing: stops, and waits until stopped, every pod this node runs
    /// that the API no longer binds here (moved away while the node was
    /// silent, or deleted); returns them. A returning node does this before
    /// it reports Ready, so an ha pod never runs twice past the grace.
    async fn fence(&mut self, listed: &[Object]) -> Vec<ObjectKey> {
        let stale: Vec<ObjectKey> = self
            .workers
            .iter()
            .filter(|(key, (uid, _))| {
                !listed.iter().any(|pod| {
                    pod.key() == **key && pod.metadata.uid == *uid && self.bound_here(pod)
                })
            })
            .map(|(key, _)| key.clone())
            .collect();
        for key in &stale {
            self.reads.remove(key);
            if let Some((_, sender)) = self.workers.remove(key) {
                let _ = sender.send(PodMessage::Remove).await;
                // The worker ends once the pod is stopped and removed.
                if tokio::time::timeout(FENCE_STOP, sender.closed())
                    .await
                    .is_err()
                {
                    tracing::warn!(pod = %key, "fencing: the pod did not stop in time");
                }
                tracing::info!(pod = %key, "fenced: no longer bound to this node");
            }
        }
        stale
    }

    /// Starts a worker for every pod in local state: they keep running (or
    /// start again) without any word from the API. No spare sandbox is
    /// made until each has checked (or recovered) its sandbox.
    pub fn restore(&mut self) -> Result<usize, crate::state::StateError> {
        let records = self.ctx.state.load_all()?;
        let count = records.len();
        for record in records {
            let hold = self.ctx.sandbox_pool.hold();
            self.spawn(record, Some(hold));
        }
        Ok(count)
    }

    fn spawn(
        &mut self,
        record: PodRecord,
        hold: Option<crate::sandbox_pool::PoolHold>,
    ) -> mpsc::Sender<PodMessage> {
        let key = record.pod.key();
        let record_uid = record.pod.metadata.uid.clone();
        let (sender, receiver) = mpsc::channel(16);
        self.reads.insert(key.clone(), reads_of(&record.pod));
        let workload = PodWorkload::new(self.ctx.clone(), record).holding(hold);
        tokio::spawn(Executor::new(workload, self.ctx.steps.clone()).run(receiver));
        self.workers.insert(key, (record_uid, sender.clone()));
        sender
    }

    fn bound_here(&self, pod: &Object) -> bool {
        pod.typed_status::<PodStatus>()
            .ok()
            .and_then(|s| s.node)
            .is_some_and(|node| node == self.ctx.node)
    }

    async fn route(&mut self, pod: Object) {
        let key = pod.key();
        if !self.bound_here(&pod) {
            self.remove(&key).await;
            return;
        }
        // The same name with another uid is another pod: the old one goes.
        if self
            .workers
            .get(&key)
            .is_some_and(|(uid, _)| *uid != pod.metadata.uid)
        {
            self.remove(&key).await;
        }
        let sender = match self.workers.get(&key) {
            Some((_, sender)) if !sender.is_closed() => sender.clone(),
            _ => {
                // A worker that died leaves its record on disk: resume from
                // it (its file alone is read).
                let record = match self.ctx.state.load(&key) {
                    Ok(record) => record,
                    Err(error) => {
                        tracing::warn!(pod = %key, error = %crate::chain(&error), "its record is unreadable: the pod starts from the API's view");
                        None
                    }
                };
                let record = record
                    .filter(|record| record.pod.metadata.uid == pod.metadata.uid)
                    .unwrap_or_else(|| PodRecord::new(pod.clone()));
                self.spawn(record, None)
            }
        };
        // A new revision may read more; the admitted one's reads stay
        // until the worker reports them gone (kept: a superset is harmless).
        self.reads.entry(key).or_default().extend(reads_of(&pod));
        let _ = sender.send(PodMessage::Desired(Box::new(pod))).await;
    }

    /// Tells the pods that read a changed Secret or Config.
    async fn data_changed(&mut self, change: DataChange) {
        let readers: Vec<ObjectKey> = self
            .reads
            .iter()
            .filter(|(key, reads)| {
                key.namespace == change.namespace && reads.contains(&change.source)
            })
            .map(|(key, _)| key.clone())
            .collect();
        for key in readers {
            if let Some((_, sender)) = self.workers.get(&key) {
                tracing::debug!(pod = %key, source = %change.source, revision = change.revision, "data changed");
                let _ = sender.send(PodMessage::Data(change.clone())).await;
            }
        }
    }

    async fn remove(&mut self, key: &ObjectKey) {
        self.reads.remove(key);
        if let Some((_, sender)) = self.workers.remove(key) {
            let _ = sender.send(PodMessage::Remove).await;
        }
    }

    /// Follows the pods bound to this node until cancelled. With the API
    /// unreachable the informer keeps retrying; the workers carry on
    /// meanwhile.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let Some(client) = self.ctx.client.clone() else {
            shutdown.cancelled().await;
            return;
        };
        let mut changes = crate::bound::follow(
            client.clone(),
            Kind::Pod,
            &self.ctx.node,
            shutdown.child_token(),
        );
        let mut data_changes =
            crate::pod_data::follow::follow(client.clone(), shutdown.child_token());
        // Keys the API named since the agent started; before the first list
        // is in, a restored worker may be for a pod deleted meanwhile.
        let mut seen: Option<BTreeSet<ObjectKey>> = Some(BTreeSet::new());
        let (mut fences, mut lifts) = (self.fences.take(), self.lifts.take());
        loop {
            let fence = async {
                match fences.as_mut() {
                    Some(fences) => fences.recv().await,
                    None => std::future::pending().await,
                }
            };
            let lift = async {
                match lifts.as_mut() {
                    Some(lifts) => lifts.recv().await,
                    None => std::future::pending().await,
                }
            };
            let change = tokio::select! {
                change = changes.recv() => change,
                Some(reply) = fence => {
                    // Fence against a fresh list, not the watch's backlog.
                    let scope = Scope::on_node(Kind::Pod, &self.ctx.node);
                    match client.list_scope_all(&scope).await {
                        Ok(list) => {
                            let stopped = self.fence(&list.items).await;
                            let _ = reply.send(stopped.len());
                        }
                        Err(error) => {
                            tracing::debug!(error = %crate::chain(&error), "fencing: cannot list pods");
                        }
                    }
                    continue;
                }
                Some(reply) = lift => {
                    let scope = Scope::on_node(Kind::Pod, &self.ctx.node);
                    match client.list_scope_all(&scope).await {
                        Ok(list) => {
                            let lifted = self.lift(&list.items).await;
                            let _ = reply.send(lifted);
                        }
                        Err(error) => {
                            tracing::debug!(error = %crate::chain(&error), "lifting the fence: cannot list pods");
                        }
                    }
                    continue;
                }
                Some(change) = data_changes.recv() => {
                    self.data_changed(change).await;
                    continue;
                }
                () = shutdown.cancelled() => return,
            };
            match change {
                Some(Bound::Desired(pod)) => {
                    if let Some(seen) = seen.as_mut() {
                        seen.insert(pod.key());
                    }
                    self.route(*pod).await;
                }
                Some(Bound::Gone(key)) => self.remove(&key).await,
                Some(Bound::Synced) => {
                    let seen = seen.take().unwrap_or_default();
                    let gone: Vec<ObjectKey> = self
                        .workers
                        .keys()
                        .filter(|key| !seen.contains(key))
                        .cloned()
                        .collect();
                    for key in gone {
                        self.remove(&key).await;
                    }
                }
                None => return,
            }
        }
    }
}

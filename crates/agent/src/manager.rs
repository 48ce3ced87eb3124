//! Routes pods to their workers: restores workers from local state at
//! start, then follows the API (list, then watch; list again after any
//! break) and sends each worker its pod, or tells it to remove the pod.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use corral_api::kinds::PodStatus;
use corral_api::watch::EventType;
use corral_api::{Kind, Object, ObjectKey};
use futures::StreamExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::AgentContext;
use crate::state::PodRecord;
use crate::worker::{PodMessage, PodWorker};

/// How long to wait before listing again after the API failed.
const RETRY: Duration = Duration::from_secs(2);

/// How long fencing waits for one pod's worker to stop it.
const FENCE_STOP: Duration = Duration::from_secs(60);

/// A request to stop every pod no longer bound to this node (fencing, see
/// [`Manager::fence`]); answered with how many were stopped.
pub type FenceRequest = tokio::sync::oneshot::Sender<usize>;

#[derive(Debug)]
pub struct Manager {
    ctx: Arc<AgentContext>,
    /// Each pod's worker and the uid of the pod it runs.
    workers: BTreeMap<ObjectKey, (String, mpsc::Sender<PodMessage>)>,
    fences: Option<mpsc::Receiver<FenceRequest>>,
}

impl Manager {
    pub fn new(ctx: Arc<AgentContext>) -> Self {
        Manager {
            ctx,
            workers: BTreeMap::new(),
            fences: None,
        }
    }

    /// Answers fence requests (from the heartbeat of a returning node).
    pub fn with_fences(mut self, fences: mpsc::Receiver<FenceRequest>) -> Self {
        self.fences = Some(fences);
        self
    }

    /// Fencing: stops, and waits until stopped, every pod this node runs
    /// that the API no longer binds here (moved away while the node was
    /// silent, or deleted). A returning node does this before it reports
    /// Ready, so an ha pod never runs twice past the grace.
    async fn fence(&mut self, listed: &[Object]) -> usize {
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
        stale.len()
    }

    /// Starts a worker for every pod in local state: they keep running (or
    /// start again) without any word from the API.
    pub fn restore(&mut self) -> Result<usize, crate::state::StateError> {
        let records = self.ctx.state.load_all()?;
        let count = records.len();
        for record in records {
            self.spawn(record);
        }
        Ok(count)
    }

    fn spawn(&mut self, record: PodRecord) -> mpsc::Sender<PodMessage> {
        let key = record.pod.key();
        let record_uid = record.pod.metadata.uid.clone();
        let (sender, receiver) = mpsc::channel(16);
        tokio::spawn(PodWorker::new(self.ctx.clone(), record).run(receiver));
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
                // A worker that died leaves its record on disk: resume from it.
                let record = self
                    .ctx
                    .state
                    .load_all()
                    .unwrap_or_default()
                    .into_iter()
                    .find(|record| {
                        record.pod.key() == key && record.pod.metadata.uid == pod.metadata.uid
                    })
                    .unwrap_or_else(|| PodRecord {
                        pod: pod.clone(),
                        admitted_revision: 0,
                        recent_images: Vec::new(),
                        pulling: Vec::new(),
                        containers: BTreeMap::new(),
                        generations: BTreeMap::new(),
                        netns: None,
                        egress_ipv4: None,
                    });
                self.spawn(record)
            }
        };
        let _ = sender.send(PodMessage::Desired(Box::new(pod))).await;
    }

    async fn remove(&mut self, key: &ObjectKey) {
        if let Some((_, sender)) = self.workers.remove(key) {
            let _ = sender.send(PodMessage::Remove).await;
        }
    }

    /// Follows the API until cancelled. With the API unreachable it keeps
    /// retrying; the workers carry on meanwhile.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let Some(client) = self.ctx.client.clone() else {
            shutdown.cancelled().await;
            return;
        };
        while !shutdown.is_cancelled() {
            let list = tokio::select! {
                list = client.list(Kind::Pod, None, None) => list,
                () = shutdown.cancelled() => return,
            };
            let list = match list {
                Ok(list) => list,
                Err(error) => {
                    tracing::debug!(error = %crate::chain(&error), "cannot list pods; retrying");
                    tokio::select! {
                        () = tokio::time::sleep(RETRY) => continue,
                        () = shutdown.cancelled() => return,
                    }
                }
            };
            let listed: Vec<ObjectKey> = list.items.iter().map(Object::key).collect();
            let gone: Vec<ObjectKey> = self
                .workers
                .keys()
                .filter(|key| !listed.contains(key))
                .cloned()
                .collect();
            for key in gone {
                self.remove(&key).await;
            }
            for pod in list.items {
                self.route(pod).await;
            }
            let events = match client
                .watch(Kind::Pod, None, None, list.resource_version)
                .await
            {
                Ok(events) => events,
                Err(error) => {
                    tracing::debug!(error = %crate::chain(&error), "cannot watch pods; listing again");
                    continue;
                }
            };
            futures::pin_mut!(events);
            loop {
                let fence = async {
                    match self.fences.as_mut() {
                        Some(fences) => fences.recv().await,
                        None => std::future::pending().await,
                    }
                };
                let event = tokio::select! {
                    event = events.next() => event,
                    Some(reply) = fence => {
                        // Fence against a fresh list, not the watch's backlog.
                        match client.list(Kind::Pod, None, None).await {
                            Ok(list) => {
                                let stopped = self.fence(&list.items).await;
                                let _ = reply.send(stopped);
                            }
                            Err(error) => {
                                tracing::debug!(error = %crate::chain(&error), "fencing: cannot list pods");
                            }
                        }
                        continue;
                    }
                    () = shutdown.cancelled() => return,
                };
                match event {
                    Some(Ok(event)) => match event.event_type {
                        EventType::Deleted => self.remove(&event.object.key()).await,
                        EventType::Added | EventType::Modified => self.route(event.object).await,
                    },
                    Some(Err(error)) => {
                        tracing::debug!(error = %crate::chain(&error), "watch broke; listing again");
                        break;
                    }
                    None => break,
                }
            }
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(200)) => {}
                () = shutdown.cancelled() => return,
            }
        }
    }
}

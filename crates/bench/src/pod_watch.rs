//! Watching pods come up: one watch on the namespace's pods, started before
//! the first apply, notes the instant each pod (by name, uid and the spec
//! revision the node reports running) is first seen running. Waiters then
//! read that instant, so latencies end when the event arrived, not when a
//! waiter happened to look.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use corral_api::kinds::{ContainerState, PodPhase, PodStatus};
use corral_api::watch::EventType;
use corral_api::{Kind, Object};
use corral_client::Client;
use futures::StreamExt;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A pod running a given revision: `(name, uid, observed revision)`.
type RunningKey = (String, String, u64);

#[derive(Debug, Default)]
struct Seen {
    /// When each (name, uid, revision) was first seen running.
    running: HashMap<RunningKey, Instant>,
    /// The latest status of each pod, for error messages.
    last: HashMap<String, serde_json::Value>,
    /// The uids of pods seen deleted (removed from the store).
    gone: std::collections::HashSet<String>,
}

/// A background watch of pods in one namespace; stopped when dropped.
#[derive(Debug)]
pub struct PodWatch {
    seen: Arc<Mutex<Seen>>,
    changed: watch::Receiver<u64>,
    task: JoinHandle<()>,
}

impl Drop for PodWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Whether the node reports the pod running: phase `Running`, at least one
/// container and every container `running`.
pub fn is_running(status: &PodStatus) -> bool {
    status.phase == PodPhase::Running
        && !status.containers.is_empty()
        && status
            .containers
            .iter()
            .all(|container| container.state == ContainerState::Running)
}

impl PodWatch {
    /// Starts watching pods in `namespace` from the current store revision;
    /// returns once the watch is established. A broken watch is resumed
    /// from the last revision seen.
    pub async fn start(client: &Client, namespace: &str) -> anyhow::Result<Self> {
        let after = client
            .list(Kind::Pod, Some(namespace), None)
            .await
            .context("cannot list pods")?
            .resource_version;
        let first = client
            .watch(Kind::Pod, Some(namespace), None, after)
            .await
            .context("cannot watch pods")?;
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (notify, changed) = watch::channel(0u64);
        let task = tokio::spawn(follow(
            client.clone(),
            namespace.to_string(),
            after,
            Box::pin(first),
            seen.clone(),
            notify,
        ));
        Ok(PodWatch {
            seen,
            changed,
            task,
        })
    }

    /// The instant pod `name` with `uid` was first seen running spec
    /// `revision`; waits up to `timeout` for it.
    pub async fn running_at(
        &self,
        name: &str,
        uid: &str,
        revision: u64,
        timeout: Duration,
    ) -> anyhow::Result<Instant> {
        let key = (name.to_string(), uid.to_string(), revision);
        let mut changed = self.changed.clone();
        let wait = async {
            loop {
                changed.borrow_and_update();
                if let Some(at) = self.lock().running.get(&key) {
                    return Ok(*at);
                }
                if changed.changed().await.is_err() {
                    anyhow::bail!("the pod watch ended");
                }
            }
        };
        match tokio::time::timeout(timeout, wait).await {
            Ok(result) => result,
            Err(_) => {
                let last = self.lock().last.get(name).cloned();
                anyhow::bail!(
                    "pod {name} (uid {uid}) not seen running revision {revision} within \
                     {timeout:?}; its last status: {}",
                    last.map_or_else(|| "none seen".into(), |status| status.to_string())
                )
            }
        }
    }

    /// Waits up to `timeout` until the pod with `uid` is removed from the
    /// store (its stop workflow finished).
    pub async fn gone(&self, uid: &str, timeout: Duration) -> anyhow::Result<()> {
        let mut changed = self.changed.clone();
        let wait = async {
            loop {
                changed.borrow_and_update();
                if self.lock().gone.contains(uid) {
                    return Ok(());
                }
                if changed.changed().await.is_err() {
                    anyhow::bail!("the pod watch ended");
                }
            }
        };
        tokio::time::timeout(timeout, wait)
            .await
            .with_context(|| format!("pod {uid} not removed within {timeout:?}"))?
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Seen> {
        // A panic while holding the lock cannot leave `Seen` inconsistent
        // (single inserts), so a poisoned lock is still usable.
        self.seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

type EventStream = std::pin::Pin<
    Box<
        dyn futures::Stream<
                Item = Result<corral_api::watch::WatchEvent, corral_client::ClientError>,
            > + Send,
    >,
>;

async fn follow(
    client: Client,
    namespace: String,
    mut after: u64,
    mut events: EventStream,
    seen: Arc<Mutex<Seen>>,
    notify: watch::Sender<u64>,
) {
    loop {
        while let Some(Ok(event)) = events.next().await {
            let at = Instant::now();
            after = after.max(event.resource_version());
            if event.event_type == EventType::Deleted {
                seen.lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .gone
                    .insert(event.object.metadata.uid.clone());
            } else {
                record(&seen, &event.object, at);
            }
            notify.send_modify(|generation| *generation += 1);
        }
        // The stream ended or broke: resume from the last revision seen.
        loop {
            tokio::time::sleep(Duration::from_millis(50)).await;
            if let Ok(stream) = client.watch(Kind::Pod, Some(&namespace), None, after).await {
                events = Box::pin(stream);
                break;
            }
        }
    }
}

fn record(seen: &Mutex<Seen>, pod: &Object, at: Instant) {
    let mut seen = seen
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let name = pod.metadata.name.clone();
    seen.last.insert(name.clone(), pod.status.clone());
    let Ok(status) = pod.typed_status::<PodStatus>() else {
        return;
    };
    if let (true, Some(revision)) = (is_running(&status), status.observed_revision) {
        seen.running
            .entry((name, pod.metadata.uid.clone(), revision))
            .or_insert(at);
    }
}

#[cfg(test)]
mod tests {
    use corral_api::kinds::ContainerStatus;

    use super::*;

    fn container(state: ContainerState) -> ContainerStatus {
        ContainerStatus {
            name: "c".into(),
            state,
            restarts: 0,
            started_at: None,
            container_id: None,
            exit_code: None,
            ready: true,
            reason: None,
            message: None,
            last_exit: None,
            next_restart_at: None,
        }
    }

    #[test]
    fn running_needs_the_phase_and_every_container() {
        let mut status = PodStatus {
            phase: PodPhase::Running,
            containers: vec![container(ContainerState::Running)],
            ..PodStatus::default()
        };
        assert!(is_running(&status));
        status.containers.push(container(ContainerState::Waiting));
        assert!(!is_running(&status));
        status.containers.clear();
        assert!(!is_running(&status));
        status.containers.push(container(ContainerState::Running));
        status.phase = PodPhase::Pending;
        assert!(!is_running(&status));
    }

    #[test]
    fn the_first_sighting_of_a_revision_counts() {
        let seen = Mutex::new(Seen::default());
        let mut pod = Object::new(Kind::Pod, Some("default"), "p", serde_json::json!({}));
        pod.metadata.uid = "u1".into();
        pod.status = serde_json::json!({
            "phase": "Running",
            "observedRevision": 2,
            "containers": [{"name": "c", "state": "running"}],
        });
        let first = Instant::now();
        record(&seen, &pod, first);
        record(&seen, &pod, first + Duration::from_secs(1));
        let seen = seen.lock().unwrap();
        let key = ("p".to_string(), "u1".to_string(), 2);
        assert_eq!(seen.running.get(&key), Some(&first));
        assert_eq!(seen.running.len(), 1);
    }
}

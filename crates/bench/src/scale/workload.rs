//! The pods of `corral-bench scale`: tiny pods created by concurrent
//! clients, and one watch that notes the instant each pod is first seen
//! running (as its hollow node reported it).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use corral_api::kinds::PodStatus;
use corral_api::watch::EventType;
use corral_api::{Kind, Object};
use corral_client::Client;
use futures::StreamExt;
use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::pod_watch::is_running;

/// The namespace of the benchmark's pods (the one `corral get pods` lists).
pub const NAMESPACE: &str = "default";

/// How often one pod's create is tried before the run fails.
const CREATE_ATTEMPTS: u32 = 3;

/// The benchmark's pod spec: one container asking for 1m CPU and 1Mi
/// memory, so only pod slots limit how many a node takes. Its image is
/// never pulled.
pub fn pod_spec() -> serde_json::Value {
    json!({
        "terminationGraceSeconds": 0,
        "containers": [{
            "name": "app",
            "image": "registry.example.com/hollow/app:1",
            "resources": {"cpu": "1m", "memory": "1Mi"},
        }],
    })
}

/// Pod number `index`.
pub fn pod(index: usize) -> Object {
    let name = format!("scale-{index:05}");
    Object::new(Kind::Pod, Some(NAMESPACE), &name, pod_spec())
}

/// Creates pods `range` with `clients` requests in flight, until done or
/// `deadline`; returns how many were created. A create refused because
/// the pod exists (an earlier try that timed out) counts as created.
pub async fn create_pods(
    client: &Client,
    range: std::ops::Range<usize>,
    clients: usize,
    deadline: Instant,
) -> anyhow::Result<usize> {
    let results: Vec<anyhow::Result<bool>> = futures::stream::iter(range)
        .map(|index| async move {
            if Instant::now() > deadline {
                return Ok(false);
            }
            let object = pod(index);
            let mut attempt = 0;
            loop {
                attempt += 1;
                match client.create(&object, Some("scale benchmark")).await {
                    Ok(_) => return Ok(true),
                    Err(error) if error.status() == Some(409) => return Ok(true),
                    Err(error) if attempt < CREATE_ATTEMPTS => {
                        let _ = error;
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                    Err(error) => {
                        return Err(error).with_context(|| {
                            format!("cannot create pod {}", object.metadata.name)
                        });
                    }
                }
            }
        })
        .buffer_unordered(clients.max(1))
        .collect()
        .await;
    let mut created = 0;
    for result in results {
        created += usize::from(result?);
    }
    Ok(created)
}

#[derive(Debug, Default)]
struct Seen {
    /// Pods (uid) seen running.
    running: HashSet<String>,
    /// When the n-th pod was first seen running, in order.
    times: Vec<Instant>,
}

/// A background watch of the namespace's pods; stopped when dropped.
#[derive(Debug)]
pub struct RunningPods {
    seen: Arc<Mutex<Seen>>,
    count: watch::Receiver<usize>,
    task: JoinHandle<()>,
}

impl Drop for RunningPods {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl RunningPods {
    /// Lists the namespace's pods, then watches them.
    pub async fn start(client: &Client) -> anyhow::Result<Self> {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (notify, count) = watch::channel(0);
        let task = tokio::spawn(follow(client.clone(), seen.clone(), notify));
        Ok(RunningPods { seen, count, task })
    }

    /// How many pods have been seen running.
    pub fn count(&self) -> usize {
        *self.count.borrow()
    }

    /// Waits until `target` pods have been seen running or `deadline`;
    /// the instant the `target`-th was seen, or `None` at the deadline.
    pub async fn reached(&self, target: usize, deadline: Instant) -> Option<Instant> {
        let mut count = self.count.clone();
        let wait = count.wait_for(|count| *count >= target);
        let deadline = tokio::time::Instant::from_std(deadline);
        match tokio::time::timeout_at(deadline, wait).await {
            Ok(Ok(_)) => self.lock().times.get(target.checked_sub(1)?).copied(),
            _ => None,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Notes pod `pod` running at `at` if it is and was not seen running
/// before; then returns how many pods have been seen running.
fn record(seen: &Mutex<Seen>, pod: &Object, at: Instant) -> Option<usize> {
    let running = pod
        .typed_status::<PodStatus>()
        .is_ok_and(|status| is_running(&status));
    if !running {
        return None;
    }
    let mut seen = seen
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if !seen.running.insert(pod.metadata.uid.clone()) {
        return None;
    }
    seen.times.push(at);
    Some(seen.running.len())
}

async fn follow(client: Client, seen: Arc<Mutex<Seen>>, notify: watch::Sender<usize>) {
    loop {
        let Ok(list) = client.list(Kind::Pod, Some(NAMESPACE), None).await else {
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        };
        let at = Instant::now();
        for pod in &list.items {
            record(&seen, pod, at);
        }
        let count = seen.lock().map_or(0, |seen| seen.running.len());
        notify.send_replace(count);
        let Ok(events) = client
            .watch(Kind::Pod, Some(NAMESPACE), None, list.resource_version)
            .await
        else {
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        };
        let mut events = std::pin::pin!(events);
        while let Some(Ok(event)) = events.next().await {
            if event.event_type != EventType::Deleted
                && let Some(count) = record(&seen, &event.object, Instant::now())
            {
                notify.send_replace(count);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_counts_once_and_only_running() {
        let seen = Mutex::new(Seen::default());
        let mut object = pod(7);
        object.metadata.uid = "u7".into();
        assert_eq!(object.metadata.name, "scale-00007");
        let at = Instant::now();
        assert_eq!(record(&seen, &object, at), None, "pending");
        object.status = json!({
            "phase": "Running",
            "observedRevision": 1,
            "containers": [{"name": "app", "state": "running", "ready": true}],
        });
        assert_eq!(record(&seen, &object, at), Some(1));
        assert_eq!(record(&seen, &object, at + Duration::from_secs(1)), None);
        let seen = seen.lock().unwrap();
        assert_eq!(seen.times, [at]);
    }
}

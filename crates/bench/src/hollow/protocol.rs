//! Everything a hollow node says to the API, in one place. Each method is
//! one thing a node agent does, made of today's calls; when the API grows a
//! cheaper way (a lease for heartbeats, a node filter on pod watches, a
//! batch step call) the change is local to the method.
//!
//! Where the real agent's own function exists (`corral_agent::node`), it is
//! called rather than copied, so hollow nodes speak the protocol the agent
//! speaks.

use std::pin::Pin;

use chrono::Utc;
use corral_api::kinds::{ContainerState, ContainerStatus, NodeStatus, PodPhase, PodSpec};
use corral_api::watch::WatchEvent;
use corral_api::workflow::{StepActionKind, WorkflowInstance};
use corral_api::{Kind, Object, ObjectKey};
use corral_client::{Client, ClientConfig, ClientError};
use futures::Stream;

/// The note a hollow node leaves on every step it completes.
pub const NOTE: &str = "hollow";

/// How often a status write is retried when the pod changed between its
/// read and its write (compare-and-swap).
const STATUS_ATTEMPTS: usize = 5;

/// Pod watch events as the client decodes them.
pub type PodEvents = Pin<Box<dyn Stream<Item = Result<WatchEvent, ClientError>> + Send>>;

/// A step action that did not happen.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    /// The claim was refused: the step was not ready any more (our view of
    /// the pod was stale) or is not ours. Nothing to undo.
    #[error("claim of {step} refused")]
    Claim {
        step: String,
        #[source]
        source: ClientError,
    },
    /// The step was claimed but not completed; the engine's timeout will
    /// make it ready again.
    #[error("completion of {step} failed")]
    Complete {
        step: String,
        #[source]
        source: ClientError,
    },
}

/// One hollow node's connection: the API client holding the node's own
/// token, and the node's name.
#[derive(Debug, Clone)]
pub struct NodeApi {
    client: Client,
    node: String,
}

impl NodeApi {
    /// Joins as `node` through the real join path: `POST /v1/join` with
    /// the join token in `join`, which creates the Node and mints the
    /// node's own token; returns the connection using that token.
    pub async fn join(join: &ClientConfig, node: &str) -> Result<Self, ClientError> {
        let joined = Client::new(join)?.join(node).await?;
        let client = Client::new(&ClientConfig {
            token: joined.token,
            ..join.clone()
        })?;
        Ok(NodeApi {
            client,
            node: node.to_string(),
        })
    }

    pub fn name(&self) -> &str {
        &self.node
    }

    /// The node's object as stored.
    pub async fn node(&self) -> Result<Object, ClientError> {
        let key = ObjectKey::new(Kind::Node, None, &self.node);
        self.client.get(&key).await
    }

    /// Reports what the node offers, as the agent does at start (the
    /// Node exists since the join; this writes its status).
    pub async fn register(&self, status: &NodeStatus) -> Result<Object, ClientError> {
        corral_agent::node::register(&self.client, &self.node, status).await
    }

    /// One heartbeat. Today: the agent's status write with a fresh time
    /// (a GET and a compare-and-swap PUT of the whole Node status).
    pub async fn heartbeat(
        &self,
        node: &mut Object,
        status: &NodeStatus,
    ) -> Result<(), ClientError> {
        corral_agent::node::heartbeat(&self.client, node, status).await
    }

    /// The pods bound to this node and the store revision to watch from.
    /// Today: a list of every pod, filtered here by `status.node`.
    pub async fn bound_pods(&self) -> Result<(Vec<Object>, u64), ClientError> {
        let list = self.client.list(Kind::Pod, None, None).await?;
        let pods = list
            .items
            .into_iter()
            .filter(|pod| bound_to(pod) == Some(self.node.as_str()))
            .collect();
        Ok((pods, list.resource_version))
    }

    /// Changes to pods after store revision `after`. Today the server
    /// sends every pod's changes; the caller drops the pods not bound here
    /// (and must, to notice a pod moved away).
    pub async fn watch_pods(&self, after: u64) -> Result<PodEvents, ClientError> {
        let events = self.client.watch(Kind::Pod, None, None, after).await?;
        Ok(Box::pin(events))
    }

    /// Claims a ready step of workflow instance `workflow` of the object
    /// at `key` and completes it at once, doing nothing in between.
    /// Returns the instance as stored afterwards. Today: two requests.
    pub async fn run_step(
        &self,
        key: &ObjectKey,
        workflow: &str,
        step: &str,
    ) -> Result<WorkflowInstance, StepError> {
        let claim = corral_agent::steps::request(StepActionKind::Claim, step, workflow);
        self.client
            .step_action(key, &claim)
            .await
            .map_err(|source| StepError::Claim {
                step: step.to_string(),
                source,
            })?;
        let mut complete = corral_agent::steps::request(StepActionKind::Complete, step, workflow);
        complete.note = Some(NOTE.to_string());
        self.client
            .step_action(key, &complete)
            .await
            .map_err(|source| StepError::Complete {
                step: step.to_string(),
                source,
            })
    }

    /// Reports the pod's containers running spec revision `revision`: the
    /// node-owned status fields a real agent writes once its containers
    /// run (phase, containers, observedRevision, message), merged into the
    /// stored status with a compare-and-swap write, retried on conflict.
    pub async fn report_running(&self, key: &ObjectKey, revision: u64) -> Result<(), ClientError> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let mut current = self.client.get(key).await?;
            let status = running_status(&current, revision);
            let mut merged = current.status.as_object().cloned().unwrap_or_default();
            for field in ["phase", "containers", "observedRevision", "message"] {
                match status.get(field) {
                    Some(value) if !value.is_null() => {
                        merged.insert(field.to_string(), value.clone())
                    }
                    _ => merged.remove(field),
                };
            }
            current.status = serde_json::Value::Object(merged);
            match self.client.put_status(&current).await {
                Err(error) if error.status() == Some(409) && attempt < STATUS_ATTEMPTS => continue,
                result => return result.map(|_| ()),
            }
        }
    }
}

/// The node a pod is bound to (`status.node`).
pub fn bound_to(pod: &Object) -> Option<&str> {
    pod.status.get("node").and_then(|node| node.as_str())
}

/// The node-owned part of the status of `pod` once every container of its
/// spec runs revision `revision`, as the agent reports it: phase Running,
/// each container running and ready (no probes run here), started now.
pub fn running_status(pod: &Object, revision: u64) -> serde_json::Value {
    let now = Utc::now();
    let uid_prefix: String = pod.metadata.uid.chars().take(8).collect();
    let containers: Vec<ContainerStatus> = pod
        .typed_spec::<PodSpec>()
        .map(|spec| spec.containers)
        .unwrap_or_default()
        .into_iter()
        .map(|container| ContainerStatus {
            container_id: Some(format!("hollow-{uid_prefix}-{}", container.name)),
            name: container.name,
            state: ContainerState::Running,
            restarts: 0,
            started_at: Some(now),
            exit_code: None,
            ready: true,
        })
        .collect();
    serde_json::json!({
        "phase": PodPhase::Running,
        "containers": containers,
        "observedRevision": revision,
    })
}

#[cfg(test)]
mod tests {
    use corral_api::kinds::PodStatus;

    use super::*;

    #[test]
    fn running_status_covers_every_container_and_reads_as_running() {
        let mut pod = Object::new(
            Kind::Pod,
            Some("default"),
            "p",
            serde_json::json!({"containers": [
                {"name": "a", "image": "x"},
                {"name": "b", "image": "y"},
            ]}),
        );
        pod.metadata.uid = "0123456789abcdef".into();
        let value = running_status(&pod, 3);
        let status: PodStatus = serde_json::from_value(value).expect("a pod status");
        assert!(crate::pod_watch::is_running(&status));
        assert!(status.is_ready());
        assert_eq!(status.observed_revision, Some(3));
        let names: Vec<&str> = status.containers.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(
            status.containers[0].container_id.as_deref(),
            Some("hollow-01234567-a")
        );
    }

    #[test]
    fn bound_to_reads_status_node() {
        let mut pod = Object::new(Kind::Pod, Some("default"), "p", serde_json::json!({}));
        assert_eq!(bound_to(&pod), None);
        pod.status = serde_json::json!({"node": "hollow-001"});
        assert_eq!(bound_to(&pod), Some("hollow-001"));
    }
}

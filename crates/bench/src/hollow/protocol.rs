//! Everything a hollow node says to the API, in one place. Each method is
//! one thing a node agent does: a lease renewal for a heartbeat, a
//! node-scoped list and watch of its pods, one batch request for the steps
//! it moves together.
//!
//! Where the real agent's own function exists (`corral_agent::node`), it is
//! called rather than copied, so hollow nodes speak the protocol the agent
//! speaks.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;

use chrono::Utc;
use corral_agent::steps::ClientSteps;
use corral_api::kinds::{
    ContainerReason, ContainerState, ContainerStatus, NodeStatus, PodPhase, PodSpec,
};
use corral_api::watch::WatchEvent;
use corral_api::workflow::{StepActionKind, StepBatchRequest, WorkflowInstance};
use corral_api::{Kind, Object, ObjectKey};
use corral_client::runtime::Scope;
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
    /// The batch was refused (409): a step was not ready any more (our
    /// view of the pod was stale). Nothing happened.
    #[error("steps {steps} refused")]
    Refused {
        steps: String,
        #[source]
        source: ClientError,
    },
    /// The batch failed otherwise; nothing happened, and the next change
    /// of the pod brings the steps back.
    #[error("steps {steps} failed")]
    Failed {
        steps: String,
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
    /// The workflow definitions fetched so far, as the agent keeps them.
    steps: Arc<ClientSteps>,
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
            steps: Arc::new(ClientSteps::new(client.clone())),
            client,
            node: node.to_string(),
        })
    }

    /// The step API as the agent holds it (definitions cached).
    pub fn steps(&self) -> &ClientSteps {
        &self.steps
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

    /// One heartbeat: the node's lease renewal, as the agent sends it
    /// (no object is written).
    pub async fn heartbeat(&self) -> Result<(), ClientError> {
        self.client.renew_lease(&self.node).await.map(|_| ())
    }

    /// The pods bound to this node and the store revision to watch from
    /// (a node-scoped list, as the agent's informer makes it).
    pub async fn bound_pods(&self) -> Result<(Vec<Object>, u64), ClientError> {
        let list = self
            .client
            .list_scope_all(&Scope::on_node(Kind::Pod, &self.node))
            .await?;
        Ok((list.items, list.resource_version))
    }

    /// Changes to the pods bound here after store revision `after`; a pod
    /// taken away arrives as a deletion.
    pub async fn watch_pods(&self, after: u64) -> Result<PodEvents, ClientError> {
        let scope = Scope::on_node(Kind::Pod, &self.node);
        let events = self.client.watch_scope(&scope, after).await?;
        Ok(Box::pin(events))
    }

    /// Claims the ready `steps` of workflow instance `workflow` of the
    /// object at `key` and completes them at once, doing nothing in
    /// between, with the node-owned `status` fields given: one request.
    /// Returns the instance as stored afterwards.
    pub async fn run_steps(
        &self,
        key: &ObjectKey,
        workflow: &str,
        steps: &[String],
        status: BTreeMap<String, serde_json::Value>,
    ) -> Result<WorkflowInstance, StepError> {
        let mut actions = Vec::with_capacity(steps.len() * 2);
        for step in steps {
            actions.push(corral_agent::steps::request(
                StepActionKind::Claim,
                step,
                workflow,
            ));
            let mut complete =
                corral_agent::steps::request(StepActionKind::Complete, step, workflow);
            complete.note = Some(NOTE.to_string());
            actions.push(complete);
        }
        let batch = StepBatchRequest { actions, status };
        self.client.step_batch(key, &batch).await.map_err(|source| {
            let steps = steps.join(", ");
            if source.status() == Some(409) {
                StepError::Refused { steps, source }
            } else {
                StepError::Failed { steps, source }
            }
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
            reason: Some(ContainerReason::Running),
            message: None,
            last_exit: None,
            next_restart_at: None,
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

//! `kind: Node` — a machine running the corral agent.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::kinds::RuntimeClass;
use crate::quantity::{Cpu, Memory};

/// What operators may set on a node; labels live in `metadata.labels`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeSpec {
    /// No new pods are placed on an unschedulable node.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unschedulable: bool,
    /// An operator declared the node gone (`corral node forget NAME`): it
    /// is Lost, and every pod on it that is not pinned there moves.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub forgotten: bool,
}

/// What the node agent and the node-lifecycle controller report.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeStatus {
    #[serde(default)]
    pub phase: NodePhase,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// The node's /64 of the cluster prefix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    #[serde(default)]
    pub capacity: NodeCapacity,
    #[serde(default)]
    pub runtimes: Vec<RuntimeClass>,
    /// Kernel and host features (`kvm`, `apparmor`, …) and whether each is usable.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub features: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub silent_since: Option<DateTime<Utc>>,
    /// While Silent: when the node has surely stopped its `availability:
    /// ha` pods itself (its last lease renewal + the fencing period it was
    /// granted + margins, [`crate::fencing::replace_after`]); they are
    /// placed elsewhere only after it (node-lifecycle writes it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fenced_by: Option<DateTime<Utc>>,
    /// The last time the node fenced itself (cut off from the control
    /// plane for its fencing period), as it reported on return.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_fence: Option<crate::fencing::SelfFence>,
    /// Where the node agent serves container logs and exec
    /// (`http://HOST:PORT`); the API server proxies to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_endpoint: Option<String>,
    /// The node's WireGuard tunnel (`corral agent --wireguard`): what the
    /// other nodes need to make it a peer. Absent: plain routing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wireguard: Option<NodeWireguard>,
}

/// A node's WireGuard identity, published by its agent.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeWireguard {
    /// The tunnel's public key (base64, as `wg` prints it).
    pub public_key: String,
    /// Where peers send to: the node's address and listen port,
    /// e.g. `[fd00:99::2]:51820`.
    pub endpoint: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeCapacity {
    #[serde(default)]
    pub cpu: Cpu,
    #[serde(default)]
    pub memory: Memory,
    #[serde(default)]
    pub pods: u32,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum NodePhase {
    /// Registered, join workflow not finished.
    #[default]
    Joining,
    Ready,
    /// Missed heartbeats; pods stay bound (ha pods move after the grace).
    Silent,
    /// Declared gone by an operator or after `lost_after`.
    Lost,
}

/// What a node's image collection removed (`POST /v1/nodes/{name}/images/prune`,
/// done by the node's agent, which owns its image store).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImagePruneReport {
    /// The images deleted, by name.
    pub removed_images: Vec<String>,
    /// How many blobs (manifests, configs, compressed layers) went with them.
    pub removed_blobs: usize,
    /// How many unpacked layers went with them.
    pub removed_layers: usize,
}

/// The TLS name in the serving certificate the cluster CA issues to node
/// `node`'s agent (`NAME.node.corral`): the API server checks it against
/// the node a pod or VM is bound to before it sends anything.
pub fn node_tls_name(node: &str) -> String {
    format!("{node}.node.corral")
}

/// The TLS name in the client certificate every API server presents to
/// node agents; agents accept no other client.
pub const SERVER_TLS_NAME: &str = "server.corral";

/// `POST /v1/nodes/{name}/certificate`: a node's certificate signing
/// request (PEM), sent with the node's own token. The key stays on the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeCertificateRequest {
    /// A PKCS#10 certificate signing request, PEM. Only its public key is
    /// used: the server fixes the names and the validity.
    pub csr: String,
}

/// The serving certificate the cluster CA issued to a node's agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeCertificate {
    /// The certificate, PEM, for [`node_tls_name`] of the node.
    pub certificate: String,
    /// The cluster CA, PEM, that signed it (and the API servers' client
    /// certificates).
    pub ca: String,
    pub not_before: DateTime<Utc>,
    pub not_after: DateTime<Utc>,
}

impl NodeStatus {
    /// Why the node cannot vouch for its pods now, in a sentence for `why`
    /// of a pod bound to it (`name` is the node's); `None` when it is Ready.
    pub fn unhealthy(&self, name: &str, now: DateTime<Utc>) -> Option<String> {
        self.problem(now)
            .map(|problem| format!("its node {name} is {problem}"))
    }

    /// What is wrong with the node now ("silent since …"), for `why` of the
    /// node itself and of what runs on it; `None` when it is Ready.
    pub fn problem(&self, now: DateTime<Utc>) -> Option<String> {
        let since = |at: Option<DateTime<Utc>>| {
            at.map(|at| {
                format!(
                    " since {} ({}s ago)",
                    at.format("%H:%M:%S UTC"),
                    (now - at).num_seconds().max(0)
                )
            })
            .unwrap_or_default()
        };
        match self.phase {
            NodePhase::Ready => None,
            NodePhase::Joining => Some("still joining".to_string()),
            NodePhase::Silent => Some(format!(
                "silent{} (no heartbeat): what it last reported may be stale{}",
                since(self.silent_since),
                self.fenced_by
                    .map(|by| {
                        let when = if by <= now { "has stopped" } else { "stops" };
                        format!(
                            "; it {when} its availability: ha pods itself by {} (self-fencing)",
                            by.format("%H:%M:%S UTC")
                        )
                    })
                    .unwrap_or_default()
            )),
            NodePhase::Lost => Some("lost: its containers are gone or unreachable".to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeDelta;

    #[test]
    fn a_node_that_is_not_ready_says_why_for_its_pods() {
        let now = Utc::now();
        let ready = NodeStatus {
            phase: NodePhase::Ready,
            ..NodeStatus::default()
        };
        assert_eq!(ready.unhealthy("node-1", now), None);
        let at = now - TimeDelta::seconds(45);
        let silent = NodeStatus {
            phase: NodePhase::Silent,
            silent_since: Some(at),
            ..NodeStatus::default()
        };
        assert_eq!(
            silent.unhealthy("node-1", now).unwrap(),
            format!(
                "its node node-1 is silent since {} (45s ago) (no heartbeat): what it last reported may be stale",
                at.format("%H:%M:%S UTC")
            )
        );
        let lost = NodeStatus {
            phase: NodePhase::Lost,
            ..NodeStatus::default()
        };
        assert!(lost.unhealthy("node-1", now).unwrap().contains("is lost"));
    }
}

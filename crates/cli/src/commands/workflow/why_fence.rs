//! The self-fencing part of `corral why`: what a node did when it was cut
//! off from the control plane (`Node:status.lastFence`), and, for a pod,
//! whether its node fenced it and where it runs since.

use corral_api::fencing::SelfFence;
use corral_api::kinds::{NodeStatus, PodStatus};
use corral_api::{Kind, Object, ObjectKey};
use corral_client::Client;

/// The node named in a move's history message (`moved off NODE: …`).
fn moved_off(message: &str) -> Option<&str> {
    let rest = message.strip_prefix("moved off ")?;
    Some(rest.split_once(':').map_or(rest, |(node, _)| node))
}

/// What `fence` says about pod `pod` (`namespace/name`) of node `node`,
/// bound to `bound` now. Pure.
pub fn pod_line(node: &str, fence: &SelfFence, pod: &str, bound: Option<&str>) -> Option<String> {
    if !fence.pods.iter().any(|p| p == pod) {
        return None;
    }
    let mut line = format!(
        "fenced by its node {node} at {} after losing contact for {}s (fencing period {}s)",
        fence.at.format("%H:%M:%S UTC"),
        fence.silent_seconds,
        fence.fence_after_seconds
    );
    match bound {
        Some(bound) if bound != node => line.push_str(&format!("; replaced on {bound}")),
        _ if fence.restarted.iter().any(|p| p == pod) => {
            line.push_str("; started again there on its return (it had not been moved)");
        }
        _ => {}
    }
    Some(line)
}

async fn last_fence(client: &Client, node: &str) -> Option<SelfFence> {
    let object = client
        .get(&ObjectKey::new(Kind::Node, None, node))
        .await
        .ok()?;
    object.typed_status::<NodeStatus>().ok()?.last_fence
}

/// The lines `why` prints under "Self-fencing:" for `object`.
pub async fn lines(client: &Client, object: &Object) -> Vec<String> {
    match object.kind {
        Kind::Node => object
            .typed_status::<NodeStatus>()
            .ok()
            .and_then(|status| status.last_fence)
            .map(|fence| vec![fence.summary()])
            .unwrap_or_default(),
        Kind::Pod => {
            let key = object.key();
            let pod = format!("{}/{}", key.namespace, key.name);
            let bound = object
                .typed_status::<PodStatus>()
                .ok()
                .and_then(|status| status.node);
            let history = client.history(&key).await.unwrap_or_default();
            let moved = history
                .iter()
                .rev()
                .find(|record| moved_off(&record.message).is_some());
            let mut lines = Vec::new();
            let mut nodes: Vec<String> = moved
                .and_then(|record| moved_off(&record.message))
                .map(str::to_string)
                .into_iter()
                .collect();
            nodes.extend(bound.clone().filter(|b| !nodes.contains(b)));
            for node in &nodes {
                if let Some(fence) = last_fence(client, node).await
                    && let Some(line) = pod_line(node, &fence, &pod, bound.as_deref())
                {
                    lines.push(line);
                }
            }
            if let Some(record) = moved {
                lines.push(format!(
                    "revision {} by {}: {}",
                    record.revision, record.author, record.message
                ));
            }
            lines
        }
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fence(restarted: &[&str], moved: &[&str]) -> SelfFence {
        SelfFence {
            at: chrono::DateTime::from_timestamp(1_767_225_625, 0).unwrap(),
            silent_seconds: 21,
            fence_after_seconds: 20,
            pods: vec!["default/ha".into(), "default/db".into()],
            returned_at: None,
            restarted: restarted.iter().map(|p| p.to_string()).collect(),
            moved: moved.iter().map(|p| p.to_string()).collect(),
        }
    }

    #[test]
    fn a_pod_line_says_who_fenced_it_and_where_it_runs() {
        assert_eq!(
            pod_line(
                "node-1",
                &fence(&[], &["default/ha"]),
                "default/ha",
                Some("node-2")
            )
            .unwrap(),
            "fenced by its node node-1 at 00:00:25 UTC after losing contact for 21s (fencing period 20s); replaced on node-2"
        );
        assert_eq!(
            pod_line(
                "node-1",
                &fence(&["default/db"], &[]),
                "default/db",
                Some("node-1")
            )
            .unwrap(),
            "fenced by its node node-1 at 00:00:25 UTC after losing contact for 21s (fencing period 20s); started again there on its return (it had not been moved)"
        );
        assert_eq!(
            pod_line("node-1", &fence(&[], &[]), "default/web", Some("node-1")),
            None
        );
        assert_eq!(
            moved_off("moved off node-1: the node is silent"),
            Some("node-1")
        );
        assert_eq!(moved_off("hello"), None);
    }
}

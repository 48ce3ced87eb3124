//! `corral why pnd/NAME`: a PerNodeDeployment has no workflow of its own;
//! it is healthy when every matching node runs its pod, current and ready.
//! The verdict names a halted rollout's reason, then each pod that is not
//! healthy, as `why pod/…` would answer.

use chrono::Utc;
use corral_api::kinds::{PerNodeDeploymentStatus, PodStatus};
use corral_api::{Kind, ObjectKey};
use corral_client::Client;
use serde_json::json;

use super::display_name;
use super::why::unhealthy_now;
use crate::output::{Format, print_structured};

pub(super) async fn why_pnd(
    client: &Client,
    key: &ObjectKey,
    output: Format,
) -> anyhow::Result<()> {
    let object = client.get(key).await?;
    let status: PerNodeDeploymentStatus = object.typed_status().unwrap_or_default();
    let name = display_name(key);
    let revision = object.metadata.revision;
    let selector = format!(
        "{}={}",
        corral_controllers::per_node::DEPLOYMENT_LABEL,
        key.name
    );
    let listed = client
        .list(Kind::Pod, Some(&key.namespace), Some(&selector))
        .await?
        .items;
    let now = Utc::now();
    let mut pods = Vec::new();
    for pod in &listed {
        let pod_status: PodStatus = pod.typed_status().unwrap_or_default();
        let current = pod_status.observed_revision == Some(pod.metadata.revision);
        let answer = match unhealthy_now(client, pod, now).await {
            Some(problem) => Some(problem),
            None if !current => Some("its node has not started its revision yet".to_string()),
            None if !pod_status.is_ready() => Some(format!("it is {:?}", pod_status.phase)),
            None => None,
        };
        if let Some(answer) = answer {
            pods.push((display_name(&pod.key()), answer));
        }
    }
    let counts = format!(
        "{}/{} nodes run it ready ({} current)",
        status.ready, status.desired, status.current
    );
    let observed = status.observed_revision == Some(revision);
    let healthy = observed
        && status.ready == status.desired
        && status.current == status.desired
        && pods.is_empty();
    let halted = status.halted.as_ref().filter(|h| h.revision == revision);
    let line = if let Some(halt) = halted {
        format!(
            "{name} (revision {revision}) rollout halted: {}; {counts}",
            halt.reason
        )
    } else if healthy {
        format!("{name} (revision {revision}) is healthy: {counts}")
    } else if !observed {
        format!(
            "{name} (revision {revision}) is rolling out: its controller has not acted on this revision yet; {counts}"
        )
    } else {
        let first = pods
            .first()
            .map(|(pod, why)| format!("; {pod}: {why}"))
            .unwrap_or_default();
        format!("{name} (revision {revision}) is not healthy: {counts}{first}")
    };
    let state = if halted.is_some() {
        "halted"
    } else if healthy {
        "healthy"
    } else {
        "unhealthy"
    };
    let report = json!({
        "object": name,
        "revision": revision,
        "verdict": {"state": state, "line": line},
        "pods": pods.iter().map(|(pod, why)| json!({"pod": pod, "why": why})).collect::<Vec<_>>(),
    });
    if print_structured(output, &report)? {
        return Ok(());
    }
    println!("{line}");
    for (pod, why) in &pods {
        println!("  {pod}: {why}");
    }
    Ok(())
}

//! `corral why pd/NAME`: a PinnedDeployment has no workflow of its own; it
//! is healthy when every version has its desired pods current and ready.
//! The verdict names what is missing and, for each pod that is not
//! healthy, why (its operation, or its health as `why pod/…` says it).

use chrono::Utc;
use corral_api::kinds::{PinnedDeploymentSpec, PinnedDeploymentStatus, VersionStatus};
use corral_api::workflow::{StoredWorkflows, WorkflowOutcome};
use corral_api::{Kind, ObjectKey};
use corral_client::Client;
use serde_json::json;

use super::display_name;
use super::why::unhealthy_now;
use crate::output::{Format, print_structured};

pub(super) async fn why_pd(client: &Client, key: &ObjectKey, output: Format) -> anyhow::Result<()> {
    let object = client.get(key).await?;
    let spec: PinnedDeploymentSpec = object.typed_spec()?;
    let status: PinnedDeploymentStatus = object.typed_status().unwrap_or_default();
    let now = Utc::now();
    let name = display_name(key);
    let counts = |label: &str, version: &VersionStatus| {
        format!(
            "{label} {}/{} ready ({} current)",
            version.ready, version.desired, version.current
        )
    };
    let settled_version = |v: &VersionStatus| v.current == v.desired && v.ready == v.desired;
    let observed = status.observed_revision == Some(object.metadata.revision);
    // Each pod's own answer, in order; only those that are not healthy.
    let mut pods = Vec::new();
    for index in 0..spec.replicas {
        let pod_key = ObjectKey::new(
            Kind::Pod,
            Some(&key.namespace),
            &format!("{}-{index}", key.name),
        );
        let answer = match client.get(&pod_key).await {
            Err(error) if error.status() == Some(404) => Some("not created yet".to_string()),
            Err(error) => return Err(error.into()),
            Ok(pod) => {
                let operation = StoredWorkflows::of(&pod.status)
                    .ok()
                    .and_then(|w| w.latest().map(|i| (i.id.clone(), i.outcome)));
                match operation {
                    Some((id, outcome)) if outcome != WorkflowOutcome::Succeeded => Some(format!(
                        "its workflow {id} is {} (`corral why {}`)",
                        outcome.as_str(),
                        display_name(&pod_key)
                    )),
                    _ => unhealthy_now(client, &pod, now).await,
                }
            }
        };
        if let Some(answer) = answer {
            pods.push((display_name(&pod_key), answer));
        }
    }
    let healthy = observed
        && settled_version(&status.previous)
        && settled_version(&status.next)
        && pods.is_empty();
    let versions = format!(
        "{}, {}",
        counts("previous", &status.previous),
        counts("next", &status.next)
    );
    let halted = status
        .halted
        .as_ref()
        .filter(|halt| halt.revision == object.metadata.revision);
    let line = if let Some(halt) = halted {
        format!(
            "{name} (revision {}) rollout halted: {}; {versions} (fix the template, or `corral rollout {name} --percent` back)",
            object.metadata.revision, halt.reason
        )
    } else if spec.paused && !healthy {
        format!(
            "{name} (revision {}) rollout is paused (`corral rollout resume {name}`): {versions}",
            object.metadata.revision
        )
    } else if healthy {
        format!(
            "{name} (revision {}) is healthy: {versions}",
            object.metadata.revision
        )
    } else if !observed {
        format!(
            "{name} (revision {}) is rolling out: its controller has not acted on this revision yet; {versions}",
            object.metadata.revision
        )
    } else {
        let first = pods
            .first()
            .map(|(pod, why)| format!("; {pod}: {why}"))
            .unwrap_or_default();
        format!(
            "{name} (revision {}) is not healthy: {versions}{first}",
            object.metadata.revision
        )
    };
    let report = json!({
        "object": name,
        "revision": object.metadata.revision,
        "verdict": {
            "state": if halted.is_some() { "halted" } else if healthy { "healthy" } else { "unhealthy" },
            "line": line,
        },
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

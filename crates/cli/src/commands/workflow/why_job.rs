//! `corral why job/NAME`: a Job has no workflow of its own; its verdict is
//! its phase and the reason its controller gave (the failed pod and exit
//! code, the backoff limit, the deadline), then a line per pod: finished
//! pods by their phase, the others as `why pod/…` would answer.

use chrono::Utc;
use corral_api::kinds::{JobPhase, JobSpec, JobStatus, PodPhase, PodStatus};
use corral_api::{Kind, ObjectKey};
use corral_client::Client;
use serde_json::json;

use super::display_name;
use super::why::unhealthy_now;
use crate::output::{Format, print_structured};

pub(super) async fn why_job(
    client: &Client,
    key: &ObjectKey,
    output: Format,
) -> anyhow::Result<()> {
    let object = client.get(key).await?;
    let spec: JobSpec = object.typed_spec()?;
    let status: JobStatus = object.typed_status().unwrap_or_default();
    let now = Utc::now();
    let name = display_name(key);
    let revision = object.metadata.revision;
    let counts = format!(
        "{}/{} succeeded, {} active, {} failed (backoff limit {})",
        status.succeeded, spec.completions, status.active, status.failed, spec.backoff_limit
    );
    let reason = status.reason.clone().unwrap_or_default();
    let line = match status.phase {
        JobPhase::Complete => format!("{name} (revision {revision}) is complete: {reason}"),
        JobPhase::Failed => format!("{name} (revision {revision}) failed: {reason}"),
        JobPhase::Running => format!("{name} (revision {revision}) is running: {counts}"),
        JobPhase::Pending => format!(
            "{name} (revision {revision}) has not started: its controller has not acted on it yet"
        ),
        JobPhase::Scheduled => {
            let next = status.next_schedule_at.map_or("none".to_string(), |at| {
                at.format("%Y-%m-%dT%H:%M:%SZ").to_string()
            });
            let last = status
                .last_run
                .as_deref()
                .map_or("none yet".to_string(), |run| format!("job/{run}"));
            let mut line = format!(
                "{name} (revision {revision}) is scheduled ({}): next run at {next}; last run {last}; {} active, {} complete and {} failed of the runs kept",
                spec.schedule.as_deref().unwrap_or_default(),
                status.active,
                status.succeeded,
                status.failed
            );
            if !reason.is_empty() {
                line.push_str(&format!("; {reason}"));
            }
            line
        }
    };
    let selector = format!("{}={}", corral_controllers::job::JOB_LABEL, key.name);
    let mut listed = client
        .list(Kind::Pod, Some(&key.namespace), Some(&selector))
        .await?
        .items;
    listed.sort_by_key(|pod| {
        pod.metadata
            .name
            .rsplit('-')
            .next()
            .and_then(|i| i.parse::<u32>().ok())
            .unwrap_or(u32::MAX)
    });
    let mut pods = Vec::new();
    for pod in &listed {
        let pod_status: PodStatus = pod.typed_status().unwrap_or_default();
        let answer = match pod_status.phase {
            PodPhase::Succeeded => "succeeded".to_string(),
            PodPhase::Failed => pod_status
                .containers
                .iter()
                .find(|c| c.exit_code.is_some_and(|code| code != 0))
                .map_or_else(
                    || "failed".to_string(),
                    |c| {
                        format!(
                            "failed: container {} exited {}",
                            c.name,
                            c.exit_code.unwrap_or_default()
                        )
                    },
                ),
            _ => match unhealthy_now(client, pod, now).await {
                Some(problem) => format!("{:?}: {problem}", pod_status.phase),
                None => format!("{:?}", pod_status.phase).to_lowercase(),
            },
        };
        pods.push((display_name(&pod.key()), answer));
    }
    let state = match status.phase {
        JobPhase::Failed => "failed",
        JobPhase::Complete => "complete",
        _ => "progressing",
    };
    let report = json!({
        "object": name,
        "revision": revision,
        "verdict": {"state": state, "line": line},
        "status": status,
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

//! The scheduler's projection of a workload and its retry rule.

use std::collections::BTreeMap;

use chrono::{TimeZone, Utc};
use corral_api::workflow::{
    StepState, StoredInstance, StoredStep, StoredWorkflows, WorkflowOutcome,
};
use serde_json::json;

use super::*;

fn workload(placing: bool, retrying: bool) -> Workload {
    let spec = serde_json::json!({"containers": [{"name": "c", "image": "img:1"}]});
    let pod = Object::new(Kind::Pod, Some("default"), "web", spec);
    let request = Request::from_object(&pod).expect("a request");
    Workload {
        bound: None,
        placing: placing.then(|| ("start-1".to_string(), Ok(request.clone()))),
        retrying: retrying.then(|| ("start-1".to_string(), request)),
        releasing: None,
        rebinding: None,
        node: None,
        leaving: None,
    }
}

#[test]
fn a_placement_is_tried_once_more_right_after_it_failed() {
    // Ready, then failed and waiting for its retry: once more now.
    assert!(just_failed(
        Some(&workload(true, false)),
        &workload(false, true)
    ));
    // Still waiting (another field changed): node changes and the
    // backoff bring it back, not every write.
    assert!(!just_failed(
        Some(&workload(false, true)),
        &workload(false, true)
    ));
    // Placed: nothing to try.
    assert!(!just_failed(
        Some(&workload(true, false)),
        &workload(false, false)
    ));
    assert!(!just_failed(None, &workload(true, false)));
}

/// A pod bound to `node` whose newest instance, of `workflow` at
/// `revision`, has `steps` in the given states.
fn pod_with(workflow: &str, revision: u64, steps: &[(&str, StepState)]) -> Object {
    let spec = json!({
        "containers": [{"name": "c", "image": "img:1", "resources": {"cpu": "250m"}}],
        "placement": {"node": "n1"},
    });
    let mut pod = Object::new(Kind::Pod, Some("default"), "web", spec);
    pod.metadata.revision = revision;
    let at = Utc.with_ymd_and_hms(2030, 1, 1, 0, 0, 0).unwrap();
    let instance = StoredInstance {
        id: format!("{workflow}-{revision}"),
        workflow: workflow.to_string(),
        definition: format!("pod-{workflow}-v1"),
        revision,
        started_at: at,
        finished_at: None,
        outcome: WorkflowOutcome::Running,
        steps: steps
            .iter()
            .map(|(name, state)| {
                let step = StoredStep {
                    state: state.clone(),
                    attempts: 0,
                    retry_base: 0,
                    first_started_at: None,
                };
                (name.to_string(), step)
            })
            .collect::<BTreeMap<_, _>>(),
    };
    let stored = StoredWorkflows {
        instances: vec![instance],
    };
    pod.status = json!({"node": "n1", "workflow": stored});
    pod
}

/// One decode of the spec and of the newest instance answers every
/// question the scheduler asks of a pod event.
#[test]
fn a_pod_is_projected_from_one_decode() {
    let at = Utc.with_ymd_and_hms(2030, 1, 1, 0, 0, 0).unwrap();
    let ready = StepState::Ready { since: at };
    let pod = pod_with("start", 1, &[(STEP, ready.clone()), (RELEASE_STEP, ready)]);
    let projected = project_workload(&pod);
    let (id, request) = projected.placing.expect("place is ready");
    assert_eq!(id, "start-1");
    let request = request.expect("the request decodes");
    assert_eq!(request.cpu.millis, 250);
    assert_eq!(projected.releasing.as_deref(), Some("start-1"));
    assert!(projected.retrying.is_none() && projected.rebinding.is_none());
    let bound = projected.bound.expect("bound to n1");
    assert_eq!(bound.node, "n1");
    assert_eq!(projected.node.as_deref(), Some("n1"));
    let leaving = projected.leaving.expect("a live pod's departure facts");
    assert_eq!(leaving.pinned.as_deref(), Some("n1"));
    assert!(leaving.refused.is_none(), "no failed update");

    // A failed update of the current revision is a refusal, with the
    // request of that revision.
    let mut refused = pod_with("update", 2, &[]);
    let mut status = refused.status.clone();
    status["workflow"]["instances"][0]["outcome"] = json!("failed");
    refused.status = status;
    let leaving = project_workload(&refused).leaving.expect("departure facts");
    assert_eq!(leaving.refused.map(|r| r.cpu.millis), Some(250));

    // Not a pod's spec: nothing to place, bind or move.
    let mut broken = pod_with("start", 1, &[]);
    broken.spec = json!({"containers": "none"});
    let projected = project_workload(&broken);
    assert!(projected.bound.is_none() && projected.leaving.is_none());
}

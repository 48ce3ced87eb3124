//! Serialization of the workflow types: flat steps, tagged states.

use super::*;

#[test]
fn step_instance_serializes_flat_with_a_tagged_state() {
    let since = DateTime::parse_from_rfc3339("2026-01-01T00:00:02Z")
        .expect("valid time")
        .with_timezone(&Utc);
    let step = StepInstance {
        definition: StepDefinition {
            name: "acme/slow-mount".into(),
            owner: "acme-storage".into(),
            executor: None,
            kind: StepKind::Step,
            description: None,
            after: vec!["scheduled".into()],
            before: vec!["storage".into()],
            requires: Vec::new(),
            wanted_by: None,
            timeout_ms: Some(600_000),
            retry: RetryPolicy::default(),
        },
        state: StepState::Running {
            claimed_by: "acme-storage".into(),
            since,
            attempt: 1,
            deadline: None,
        },
        attempts: 1,
        retry_base: 0,
        first_started_at: Some(since),
    };
    let json = serde_json::to_value(&step).expect("serializes");
    assert_eq!(json["name"], "acme/slow-mount");
    assert_eq!(json["timeoutMs"], 600_000);
    assert_eq!(json["retry"]["maxAttempts"], 1);
    assert_eq!(json["state"]["phase"], "running");
    assert_eq!(json["state"]["claimedBy"], "acme-storage");
    let back: StepInstance = serde_json::from_value(json).expect("deserializes");
    assert_eq!(back, step);
}

#[test]
fn status_has_a_schema() {
    let schema = schemars::schema_for!(WorkflowStatus);
    let text = serde_json::to_string(&schema).expect("schema serializes");
    assert!(
        text.contains("timedOut") && text.contains("claimedBy"),
        "{text}"
    );
}

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

#[test]
fn the_latest_instance_is_read_alone_and_as_the_whole_status_reads_it() {
    let instance = |id: &str, revision: u64| {
        serde_json::json!({"id": id, "workflow": "update", "definition": "pod-update-1",
                           "revision": revision, "outcome": "running",
                           "startedAt": "2026-12-02T10:00:00Z"})
    };
    let status = serde_json::json!({"node": "n1", "workflow": {"instances": [
        // An older instance the newest does not need: not even decoded.
        {"id": "start-1", "garbage": true},
        instance("update-2", 2),
        instance("update-3", 3),
    ]}});
    let latest = StoredWorkflows::latest_of(&status)
        .expect("decodes")
        .expect("has one");
    assert_eq!(latest.id, "update-3");
    assert!(
        StoredWorkflows::of(&status).is_err(),
        "the whole status has a bad instance"
    );

    let fine = serde_json::json!({"workflow": {"instances": [instance("update-2", 2), instance("update-3", 3)]}});
    assert_eq!(
        StoredWorkflows::latest_of(&fine).expect("decodes"),
        StoredWorkflows::of(&fine)
            .expect("decodes")
            .latest()
            .cloned()
    );
    for empty in [
        serde_json::json!(null),
        serde_json::json!({}),
        serde_json::json!({"workflow": null}),
        serde_json::json!({"workflow": {}}),
        serde_json::json!({"workflow": {"instances": []}}),
    ] {
        assert_eq!(
            StoredWorkflows::latest_of(&empty).expect("decodes"),
            None,
            "{empty}"
        );
    }
    let not_a_list = serde_json::json!({"workflow": {"instances": {"id": "x"}}});
    assert!(StoredWorkflows::latest_of(&not_a_list).is_err());
}

#[test]
fn running_instances_are_read_alone_as_the_whole_status_reads_them() {
    let instance = |id: &str, outcome: Option<&str>| {
        let mut instance = serde_json::json!({"id": id, "workflow": "update",
            "definition": "pod-update-1", "revision": 2, "startedAt": "2026-12-02T10:00:00Z"});
        if let Some(outcome) = outcome {
            instance["outcome"] = outcome.into();
        }
        instance
    };
    let status = serde_json::json!({"workflow": {"instances": [
        instance("start-1", Some("succeeded")),
        instance("update-2", Some("cancelled")),
        instance("update-3", Some("failed")),
        // No outcome: running, as decoding the whole status says.
        instance("update-4", None),
        instance("update-5", Some("running")),
    ]}});
    let whole = StoredWorkflows::of(&status).expect("decodes");
    let running = StoredWorkflows::running_of(&status).expect("decodes");
    let expected: Vec<(usize, StoredInstance)> = whole
        .instances
        .into_iter()
        .enumerate()
        .filter(|(_, i)| i.outcome == WorkflowOutcome::Running)
        .collect();
    assert_eq!(running, expected);
    assert_eq!(
        running.iter().map(|(index, _)| *index).collect::<Vec<_>>(),
        [3, 4]
    );

    // A finished instance is not decoded; a running one that does not
    // decode, or an outcome that is none, is refused as the whole read is.
    let finished_junk = serde_json::json!({"workflow": {"instances": [
        {"id": "start-1", "outcome": "cancelled", "junk": true},
        instance("update-2", None),
    ]}});
    assert_eq!(
        StoredWorkflows::running_of(&finished_junk)
            .expect("decodes")
            .len(),
        1
    );
    for bad in [
        serde_json::json!({"workflow": {"instances": [{"id": "start-1", "outcome": "running"}]}}),
        serde_json::json!({"workflow": {"instances": [instance("start-1", Some("paused"))]}}),
        serde_json::json!({"workflow": {"instances": [7]}}),
        serde_json::json!({"workflow": {"instances": {"id": "x"}}}),
        serde_json::json!({"workflow": "running"}),
    ] {
        assert!(StoredWorkflows::running_of(&bad).is_err(), "{bad}");
        assert!(StoredWorkflows::of(&bad).is_err(), "{bad}");
    }
    for empty in [
        serde_json::json!(null),
        serde_json::json!({"workflow": null}),
        serde_json::json!({"workflow": {}}),
        serde_json::json!({"workflow": {"instances": null}}),
        serde_json::json!({"workflow": {"instances": []}}),
    ] {
        assert_eq!(
            StoredWorkflows::running_of(&empty).expect("decodes"),
            [],
            "{empty}"
        );
    }
}

/// What `StoredStep` decoded as when it was derived: the state flattened
/// beside the step's own fields.
#[derive(Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
struct DerivedStep {
    #[serde(flatten)]
    state: StepState,
    #[serde(default)]
    attempts: u32,
    #[serde(default)]
    retry_base: u32,
    #[serde(default)]
    first_started_at: Option<DateTime<Utc>>,
}

#[test]
fn a_stored_step_decodes_in_one_pass_as_the_flattened_form_did() {
    let t = |seconds: i64| DateTime::<Utc>::from_timestamp(1_767_225_600 + seconds, 0).unwrap();
    let states = [
        StepState::Waiting { on: Vec::new() },
        StepState::Waiting {
            on: vec!["scheduler/place".into(), "network".into()],
        },
        StepState::Ready { since: t(1) },
        StepState::Running {
            claimed_by: "node-1".into(),
            since: t(2),
            attempt: 2,
            deadline: Some(t(30)),
        },
        StepState::Running {
            claimed_by: "ipam".into(),
            since: t(2),
            attempt: 1,
            deadline: None,
        },
        StepState::Done {
            started: t(2),
            finished: t(3),
            attempt: 1,
            note: Some("node-1".into()),
        },
        StepState::Failed {
            error: "image not found".into(),
            started: t(2),
            at: t(4),
            attempt: 1,
            next_retry_at: Some(t(5)),
        },
        StepState::Failed {
            error: "no space left".into(),
            started: t(2),
            at: t(4),
            attempt: 2,
            next_retry_at: None,
        },
        StepState::TimedOut {
            started: t(2),
            at: t(32),
            attempt: 3,
            next_retry_at: Some(t(40)),
        },
        StepState::TimedOut {
            started: t(2),
            at: t(32),
            attempt: 3,
            next_retry_at: None,
        },
        StepState::Blocked {
            dependency: "image".into(),
            cause: "node/pull-image".into(),
            at: t(4),
        },
    ];
    for state in states {
        for (attempts, retry_base, first_started_at) in [(0, 0, None), (3, 1, Some(t(0)))] {
            let step = StoredStep {
                state: state.clone(),
                attempts,
                retry_base,
                first_started_at,
            };
            let json = serde_json::to_value(&step).expect("serializes");
            let derived = DerivedStep::deserialize(&json).expect("the derived form decodes");
            let decoded = StoredStep::deserialize(&json).expect("decodes");
            assert_eq!(decoded, step, "{json}");
            assert_eq!(
                (
                    decoded.state,
                    decoded.attempts,
                    decoded.retry_base,
                    decoded.first_started_at
                ),
                (
                    derived.state,
                    derived.attempts,
                    derived.retry_base,
                    derived.first_started_at
                ),
                "{json}"
            );
        }
    }
    // Accepted and refused alike: fields it does not know, nulls for
    // what is optional; a missing field the phase needs, an unknown phase,
    // no phase, a field of the wrong type.
    let cases = [
        (
            serde_json::json!({"phase": "ready", "since": "2026-01-01T00:00:01Z", "claimedBy": "x", "later": 1}),
            true,
        ),
        (
            serde_json::json!({"phase": "running", "claimedBy": "x", "since": "2026-01-01T00:00:01Z", "attempt": 1, "deadline": null}),
            true,
        ),
        (serde_json::json!({"phase": "waiting"}), true),
        (serde_json::json!({"phase": "ready"}), false),
        (
            serde_json::json!({"phase": "running", "since": "2026-01-01T00:00:01Z", "attempt": 1}),
            false,
        ),
        (
            serde_json::json!({"phase": "blocked", "dependency": "a", "at": "2026-01-01T00:00:01Z"}),
            false,
        ),
        (
            serde_json::json!({"phase": "paused", "since": "2026-01-01T00:00:01Z"}),
            false,
        ),
        (serde_json::json!({"since": "2026-01-01T00:00:01Z"}), false),
        (
            serde_json::json!({"phase": "ready", "since": "yesterday"}),
            false,
        ),
        (
            serde_json::json!({"phase": "done", "started": "2026-01-01T00:00:01Z", "finished": "2026-01-01T00:00:02Z", "attempt": "one"}),
            false,
        ),
    ];
    for (json, accepted) in cases {
        let derived = DerivedStep::deserialize(&json).ok();
        let decoded = StoredStep::deserialize(&json).ok();
        assert_eq!(derived.is_some(), accepted, "the derived form: {json}");
        assert_eq!(decoded.is_some(), accepted, "{json}");
        if let (Some(derived), Some(decoded)) = (derived, decoded) {
            assert_eq!(decoded.state, derived.state, "{json}");
        }
    }
}

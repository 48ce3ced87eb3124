//! Workflow instances, the step API, the driver's tick and step logs, driven
//! through the router in-process on an in-memory store with a manual clock.

mod workflow_harness;

use axum::http::StatusCode;
use chrono::TimeDelta;
use corral_api::Role;
use corral_api::workflow::{StoredWorkflows, WorkflowStatus};
use serde_json::{Value, json};
use workflow_harness::{Harness, PODS, phase, pod};

#[tokio::test]
async fn creating_a_pod_creates_its_start_instance_in_the_same_write() {
    let h = Harness::new().await;
    let created = h.create_pod("web", "img:1").await;
    // Stored: the definition's name and the steps past waiting, by name.
    let stored = StoredWorkflows::of(&created.status).expect("status.workflow");
    let [kept] = stored.instances.as_slice() else {
        panic!("one instance expected: {stored:?}");
    };
    assert!(kept.definition.starts_with("pod-start-"), "{kept:?}");
    let kept: Vec<&str> = kept.steps.keys().map(String::as_str).collect();
    assert_eq!(kept, ["scheduler/place"], "only the ready step is stored");
    let definition = h
        .ok(
            "GET",
            &format!("/v1/workflowdefinitions/{}", stored.instances[0].definition),
            None,
        )
        .await;
    assert_eq!(definition["spec"]["goal"], "running");
    // Whole, through the API.
    let status = h.workflows("web").await;
    let [instance] = status.instances.as_slice() else {
        panic!("one instance expected: {status:?}");
    };
    assert_eq!(instance.id, "start-1");
    assert_eq!(instance.workflow, "start");
    assert_eq!(instance.revision, 1);
    assert_eq!(instance.object_uid, created.metadata.uid);
    assert_eq!(phase(instance, "scheduler/place"), "ready");
    assert_eq!(phase(instance, "node/start-containers"), "waiting");
    // The creation's transitions are in the step log.
    let logs = h.logs("web", "?step=scheduler/place").await;
    assert!(logs.iter().any(|e| e.message == "ready"), "{logs:?}");

    // A new node gets a join instance; a Policy gets none.
    let node = h
        .ok(
            "POST",
            "/v1/nodes",
            Some(json!({"kind": "Node", "metadata": {"name": "node-1"}, "spec": {}})),
        )
        .await;
    assert_eq!(node["status"]["workflow"]["instances"][0]["id"], "join-1");
}

#[tokio::test]
async fn a_spec_change_adds_an_update_instance_and_cancels_the_running_start() {
    let h = Harness::new().await;
    h.create_pod("web", "img:1").await;
    h.claim_placement("web").await;
    h.bind("web", "node-1").await;
    h.clock.advance(TimeDelta::seconds(5));
    h.ok("PUT", &format!("{PODS}/web"), Some(pod("web", "img:2")))
        .await;
    let status = h.workflows("web").await;
    let ids: Vec<&str> = status.instances.iter().map(|i| i.id.as_str()).collect();
    assert_eq!(ids, ["start-1", "update-2"]);
    assert_eq!(status.instances[0].outcome.as_str(), "cancelled");
    assert_eq!(status.instances[1].outcome.as_str(), "running");
    // Same spec again: no new instance.
    h.ok("PUT", &format!("{PODS}/web"), Some(pod("web", "img:2")))
        .await;
    assert_eq!(h.workflows("web").await.instances.len(), 2);
    // A rollback is a new revision, so a new update instance.
    h.ok(
        "POST",
        &format!("{PODS}/web/rollback"),
        Some(json!({"to": 1})),
    )
    .await;
    let status = h.workflows("web").await;
    assert_eq!(status.latest().map(|i| i.id.as_str()), Some("update-3"));
}

#[tokio::test]
async fn new_instances_keep_the_newest_few_and_leave_finished_ones_as_stored() {
    let h = Harness::new().await;
    h.create_pod("web", "img:0").await;
    h.bind("web", "node-1").await;
    let instances = |pod: &Value| pod["status"]["workflow"]["instances"].clone();
    let node = h.token("node-1", Role::Node).await;
    let mut before = Value::Null;
    for image in 1..=6 {
        h.clock.advance(TimeDelta::seconds(5));
        if image > 1 {
            // The node begins each update before the next supersedes it.
            h.step_ok(
                "web",
                &node,
                json!({"action": "claim", "step": "node/pull-image"}),
            )
            .await;
        }
        before = h.ok("GET", &format!("{PODS}/web"), None).await;
        h.ok(
            "PUT",
            &format!("{PODS}/web"),
            Some(pod("web", &format!("img:{image}"))),
        )
        .await;
    }
    let after = h.ok("GET", &format!("{PODS}/web"), None).await;
    let kept = instances(&after);
    let ids: Vec<&str> = kept
        .as_array()
        .expect("a list")
        .iter()
        .map(|i| i["id"].as_str().expect("an id"))
        .collect();
    assert_eq!(
        ids,
        ["update-3", "update-4", "update-5", "update-6", "update-7"]
    );
    // The last write cancelled update-6 and added update-7; the finished
    // ones it kept are the very JSON they were.
    let (old, new) = (instances(&before), instances(&after));
    assert_eq!(old[0]["id"], "update-2", "{before}");
    let (old, new) = (
        old.as_array().expect("a list"),
        new.as_array().expect("a list"),
    );
    assert_eq!(new[..3], old[1..4], "{before}\n{after}");
    assert_eq!(old[4]["outcome"], "running");
    assert_eq!(new[3]["outcome"], "cancelled");
    assert_eq!(new[3]["startedAt"], old[4]["startedAt"]);
    assert_eq!(new[4]["outcome"], "running");
    let cancelled = h.logs("web", "?workflow=update-6").await;
    assert!(
        cancelled
            .iter()
            .any(|entry| entry.message.contains("cancelled: superseded by update-7")),
        "{cancelled:?}"
    );
}

#[tokio::test]
async fn an_instance_superseded_before_it_began_leaves_status_and_its_log_says_so() {
    let h = Harness::new().await;
    h.create_pod("web", "img:0").await;
    h.claim_placement("web").await;
    h.bind("web", "node-1").await;
    let node = h.token("node-1", Role::Node).await;
    // start-1 began (the scheduler claimed its step) and update-2 begins
    // (the node claims a step); update-3 and update-4 are superseded
    // before anyone claimed any of theirs.
    h.ok("PUT", &format!("{PODS}/web"), Some(pod("web", "img:1")))
        .await;
    let claim = |workflow: &str| json!({"action": "claim", "step": "node/pull-image", "workflow": workflow});
    h.step_ok("web", &node, claim("update-2")).await;
    for image in 2..=4 {
        h.ok(
            "PUT",
            &format!("{PODS}/web"),
            Some(pod("web", &format!("img:{image}"))),
        )
        .await;
    }
    let status = h.workflows("web").await;
    let kept: Vec<(&str, &str)> = status
        .instances
        .iter()
        .map(|i| (i.id.as_str(), i.outcome.as_str()))
        .collect();
    assert_eq!(
        kept,
        [
            ("start-1", "cancelled"),
            ("update-2", "cancelled"),
            ("update-5", "running")
        ]
    );
    // The step log still tells what happened to the ones that left.
    for (left, by) in [("update-3", "update-4"), ("update-4", "update-5")] {
        let logs = h.logs("web", &format!("?workflow={left}")).await;
        assert!(
            logs.iter().any(|entry| entry
                .message
                .contains(&format!("cancelled: superseded by {by}"))),
            "{left}: {logs:?}"
        );
    }
    // A step of one that left is refused as finished, not as unknown.
    let (code, answer) = h.step("web", &node, claim("update-3")).await;
    assert_eq!(code, StatusCode::CONFLICT, "{answer}");
    assert!(
        answer.to_string().contains("superseded by update-5"),
        "{answer}"
    );
    let (code, answer) = h.step("web", &node, claim("update-9")).await;
    assert_eq!(code, StatusCode::NOT_FOUND, "{answer}");
}

#[tokio::test]
async fn a_spec_change_of_a_pod_on_no_node_starts_it_again_from_placement() {
    // A pod waiting for a node (too big for every node, say) whose spec is
    // fixed: an update's node steps would wait for a node nobody chose.
    let h = Harness::new().await;
    h.create_pod("web", "img:1").await;
    h.clock.advance(TimeDelta::seconds(5));
    h.ok("PUT", &format!("{PODS}/web"), Some(pod("web", "img:2")))
        .await;
    let status = h.workflows("web").await;
    // The first start never began (no node took it): it left.
    let ids: Vec<&str> = status.instances.iter().map(|i| i.id.as_str()).collect();
    assert_eq!(ids, ["start-2"]);
    let latest = &status.instances[0];
    assert_eq!(latest.revision, 2);
    assert_eq!(phase(latest, "scheduler/place"), "ready");
    assert_eq!(phase(latest, "node/pull-image"), "waiting");
    // Once bound, a change is an update in place again.
    h.bind("web", "node-1").await;
    h.ok("PUT", &format!("{PODS}/web"), Some(pod("web", "img:3")))
        .await;
    let status = h.workflows("web").await;
    assert_eq!(status.latest().map(|i| i.id.as_str()), Some("update-3"));
}

#[tokio::test]
async fn registered_steps_join_new_instances_only_and_leave_with_the_registration() {
    let h = Harness::new().await;
    h.create_pod("before", "img:1").await;
    h.register_slow_mount().await;
    h.create_pod("during", "img:1").await;
    h.ok("DELETE", "/v1/controllers/acme-storage", None).await;
    h.create_pod("after", "img:1").await;

    let has_step = |status: &WorkflowStatus| {
        status
            .latest()
            .and_then(|i| i.step("acme/slow-mount"))
            .is_some()
    };
    assert!(
        !has_step(&h.workflows("before").await),
        "existing instances keep their steps"
    );
    let during = h.workflows("during").await;
    assert!(
        has_step(&during),
        "a new instance includes the registered step"
    );
    let instance = during.latest().expect("an instance");
    let step = instance.step("acme/slow-mount").expect("step");
    assert_eq!(step.definition.owner, "acme-storage");
    assert_eq!(step.definition.timeout_ms, Some(600_000));
    assert_eq!(phase(instance, "acme/slow-mount"), "ready");
    assert_eq!(phase(instance, "storage"), "waiting");
    assert!(
        !has_step(&h.workflows("after").await),
        "removing the registration removes the step"
    );
}

#[tokio::test]
async fn a_registration_that_breaks_a_workflow_is_refused() {
    let h = Harness::new().await;
    let body = json!({
        "kind": "Controller",
        "metadata": {"name": "loopy"},
        "spec": {"steps": [{
            "name": "loopy/spin", "kind": "Pod", "workflow": "start",
            "after": ["containers"], "before": ["network"]
        }]}
    });
    let (status, value) = h
        .call("PUT", "/v1/controllers/loopy", &h.admin.clone(), Some(body))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{value}");
    let message = value["message"].as_str().unwrap_or_default();
    assert!(message.contains("ordering cycle"), "{message}");
    assert_eq!(value["fields"][0]["path"], "spec.steps");
}

#[tokio::test]
async fn only_the_owner_moves_a_step_and_failure_blocks_its_dependents() {
    let h = Harness::new().await;
    h.register_slow_mount().await;
    h.create_pod("web", "img:1").await;
    let owner = h.token("acme-storage", Role::Controller).await;
    let other = h.token("scheduler", Role::Controller).await;
    let claim = json!({"action": "claim", "step": "acme/slow-mount"});

    for token in [&other, &h.admin] {
        let (status, value) = h.step("web", token, claim.clone()).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{value}");
        let message = value["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("it belongs to controller acme-storage"),
            "{message}"
        );
    }
    // Completing before claiming is a state conflict.
    let (status, value) = h
        .step(
            "web",
            &owner,
            json!({"action": "complete", "step": "acme/slow-mount"}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{value}");
    // A malformed request names what is missing.
    let (status, value) = h
        .step(
            "web",
            &owner,
            json!({"action": "fail", "step": "acme/slow-mount"}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{value}");
    assert!(
        value["message"]
            .as_str()
            .unwrap_or_default()
            .starts_with("error:"),
        "{value}"
    );
    // An unknown step is not found.
    let (status, _) = h
        .step(
            "web",
            &owner,
            json!({"action": "claim", "step": "acme/nothing"}),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    let instance = h.step_ok("web", &owner, claim.clone()).await;
    assert_eq!(phase(&instance, "acme/slow-mount"), "running");
    let (status, _) = h.step("web", &owner, claim).await;
    assert_eq!(
        status,
        StatusCode::CONFLICT,
        "a running step cannot be claimed again"
    );

    h.clock.advance(TimeDelta::seconds(30));
    let log = json!({"action": "log", "step": "acme/slow-mount", "level": "warn",
        "message": "nfs server slow to answer", "fields": {"server": "nfs-1"}});
    h.step_ok("web", &owner, log.clone()).await;
    let (status, _) = h.step("web", &other, log).await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "only the owner logs for a step"
    );

    h.clock.advance(TimeDelta::seconds(30));
    let failed = h
        .step_ok(
            "web",
            &owner,
            json!({"action": "fail", "step": "acme/slow-mount",
            "error": "mount: connection refused"}),
        )
        .await;
    assert_eq!(phase(&failed, "acme/slow-mount"), "failed");
    assert_eq!(phase(&failed, "storage"), "blocked");
    assert_eq!(phase(&failed, "containers"), "blocked");
    assert_eq!(phase(&failed, "running"), "blocked");
    assert_eq!(failed.outcome.as_str(), "failed");
    let stored = h.workflows("web").await;
    assert_eq!(
        stored.latest(),
        Some(&failed),
        "the returned instance is the stored one"
    );

    // Everything is in the log, with owners, in order.
    let logs = h.logs("web", "?step=acme/slow-mount").await;
    let messages: Vec<&str> = logs.iter().map(|e| e.message.as_str()).collect();
    assert_eq!(
        messages,
        [
            "ready",
            "claimed by acme-storage (attempt 1)",
            "nfs server slow to answer",
            "failed (attempt 1, the last): mount: connection refused"
        ]
    );
    assert!(
        logs.iter()
            .all(|e| e.owner == "acme-storage" && e.workflow_id == "start-1")
    );
    assert_eq!(logs[2].level.as_str(), "warn");
    assert_eq!(logs[2].fields["server"], "nfs-1");
    let by_owner = h.logs("web", "?owner=acme-storage").await;
    assert_eq!(by_owner.len(), 4, "{by_owner:?}");
    let all = h.logs("web", "").await;
    assert!(all.len() > by_owner.len());
    assert!(
        all.windows(2).all(|pair| pair[0].time <= pair[1].time),
        "time order"
    );
    assert!(
        all.iter()
            .any(|e| e.step == "storage" && e.message.contains("blocked"))
    );

    // The instance is finished: nothing moves any more.
    let (status, value) = h
        .step(
            "web",
            &owner,
            json!({"action": "claim", "step": "acme/slow-mount"}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{value}");
}

#[tokio::test]
async fn the_driver_times_out_a_running_step_and_leaves_quiet_objects_alone() {
    let h = Harness::new().await;
    h.register_slow_mount().await;
    h.create_pod("web", "img:1").await;
    let owner = h.token("acme-storage", Role::Controller).await;
    h.step_ok(
        "web",
        &owner,
        json!({"action": "claim", "step": "acme/slow-mount"}),
    )
    .await;
    let version = |object: Value| object["metadata"]["resourceVersion"].as_u64();
    let before = version(h.ok("GET", &format!("{PODS}/web"), None).await);

    h.clock.advance(TimeDelta::minutes(5));
    let written = corral_server::workflows::tick_all(&h.server)
        .await
        .expect("tick");
    assert_eq!(written, 0, "nothing changed, nothing written");
    assert_eq!(
        version(h.ok("GET", &format!("{PODS}/web"), None).await),
        before
    );

    h.clock.advance(TimeDelta::minutes(6));
    let written = corral_server::workflows::tick_all(&h.server)
        .await
        .expect("tick");
    assert_eq!(written, 1);
    let status = h.workflows("web").await;
    let instance = status.latest().expect("instance");
    assert_eq!(phase(instance, "acme/slow-mount"), "timedOut");
    assert_eq!(phase(instance, "storage"), "blocked");
    assert_eq!(instance.outcome.as_str(), "failed");
    let logs = h.logs("web", "?step=acme/slow-mount").await;
    let last = logs.last().expect("entries");
    assert_eq!(last.message, "timed out after 10m (attempt 1, the last)");
    assert_eq!(last.level.as_str(), "error");
    // A finished instance is not touched again.
    h.clock.advance(TimeDelta::minutes(1));
    assert_eq!(
        corral_server::workflows::tick_all(&h.server)
            .await
            .expect("tick"),
        0
    );
}

#[tokio::test]
async fn step_logs_outlive_the_object() {
    let h = Harness::new().await;
    h.create_pod("web", "img:1").await;
    h.ok("DELETE", &format!("{PODS}/web"), None).await;
    let logs = h.logs("web", "?step=scheduler/place").await;
    assert!(!logs.is_empty(), "the deleted pod's log is still readable");
    let (status, _) = h
        .call(
            "GET",
            &format!("{PODS}/never/steplogs"),
            &h.admin.clone(),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_step_delegated_to_the_node_is_moved_by_the_bound_nodes_agent() {
    let h = Harness::new().await;
    let body = json!({
        "kind": "Controller",
        "metadata": {"name": "dirvol"},
        "spec": {"steps": [{
            "name": "dirvol/prepare", "kind": "Pod", "workflow": "start",
            "before": ["storage"], "executor": "node"
        }]}
    });
    h.ok("PUT", "/v1/controllers/dirvol", Some(body)).await;
    h.create_pod("web", "img:1").await;
    let step = h.workflows("web").await.instances[0]
        .step("dirvol/prepare")
        .expect("registered step")
        .definition
        .clone();
    assert_eq!(step.owner, "dirvol", "the step stays its controller's");
    assert_eq!(
        step.executor,
        Some(corral_api::workflow::StepExecutor::Node)
    );

    let claim = json!({"action": "claim", "step": "dirvol/prepare"});
    let agent = h.token("node-1", Role::Node).await;
    // Not bound yet: no node's agent may move it.
    let (status, value) = h.step("web", &agent, claim.clone()).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{value}");
    assert!(
        value["message"]
            .as_str()
            .unwrap_or_default()
            .contains("controller dirvol or the agent of the object's node"),
        "{value}"
    );

    // Bound to node-1: its agent may, another node's may not.
    h.bind("web", "node-1").await;
    let stranger = h.token("node-2", Role::Node).await;
    let (status, value) = h.step("web", &stranger, claim.clone()).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{value}");
    let claimed = h.step_ok("web", &agent, claim).await;
    assert_eq!(phase(&claimed, "dirvol/prepare"), "running");
    let done = h
        .step_ok(
            "web",
            &agent,
            json!({"action": "complete", "step": "dirvol/prepare", "note": "no volume of plugin dirvol"}),
        )
        .await;
    assert_eq!(phase(&done, "dirvol/prepare"), "done");
}

#[tokio::test]
async fn a_batch_moves_several_steps_and_owned_status_in_one_write() {
    let h = Harness::new().await;
    h.create_pod("web", "img:1").await;
    let before = h.ok("GET", &format!("{PODS}/web"), None).await;
    let version = before["metadata"]["resourceVersion"]
        .as_u64()
        .expect("version");
    let scheduler = h.token("scheduler", Role::Controller).await;
    let batch = json!({
        "actions": [
            {"action": "claim", "step": "scheduler/place"},
            {"action": "log", "step": "scheduler/place", "message": "chose node-1"},
            {"action": "complete", "step": "scheduler/place", "note": "node-1"}
        ],
        "status": {"node": "node-1"}
    });
    let instance = h.step_ok("web", &scheduler, batch).await;
    assert_eq!(phase(&instance, "scheduler/place"), "done");
    assert_eq!(phase(&instance, "ipam/assign-address"), "ready");
    let after = h.ok("GET", &format!("{PODS}/web"), None).await;
    assert_eq!(after["status"]["node"], "node-1");
    assert_eq!(
        after["metadata"]["resourceVersion"].as_u64(),
        Some(version + 1),
        "one write for the whole batch"
    );
    let logs = h.logs("web", "?step=scheduler/place").await;
    assert!(
        logs.iter().any(|entry| entry.message == "chose node-1"),
        "{logs:?}"
    );

    // A field the caller does not own refuses the whole batch.
    let ipam = h.token("ipam", Role::Controller).await;
    let (status, refused) = h
        .step(
            "web",
            &ipam,
            json!({
                "actions": [{"action": "claim", "step": "ipam/assign-address"}],
                "status": {"node": "node-2"}
            }),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{refused}");
    assert!(
        refused["message"]
            .as_str()
            .unwrap_or_default()
            .contains("status.node"),
        "{refused}"
    );
    let instance = h.workflows("web").await;
    let latest = instance.latest().expect("an instance");
    assert_eq!(
        phase(latest, "ipam/assign-address"),
        "ready",
        "nothing changed"
    );

    let (status, _) = h
        .step("web", &ipam, json!({"actions": [], "status": {}}))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn a_claim_if_ready_rides_along_and_skips_a_waiting_step() {
    let h = Harness::new().await;
    h.create_pod("web", "img:1").await;
    let scheduler = h.token("scheduler", Role::Controller).await;
    h.step_ok(
        "web",
        &scheduler,
        json!({
            "actions": [
                {"action": "claim", "step": "scheduler/place"},
                {"action": "complete", "step": "scheduler/place", "note": "node-1"}
            ],
            "status": {"node": "node-1"}
        }),
    )
    .await;
    let agent = h.token("node-1", Role::Node).await;
    let version = |pod: &serde_json::Value| pod["metadata"]["resourceVersion"].as_u64();
    let before = h.ok("GET", &format!("{PODS}/web"), None).await;
    // The sandbox still waits for its address: its claim is left out, the
    // rest of the batch is applied, in one write.
    let riding = json!({"action": "claim", "step": "node/create-sandbox", "ifReady": true});
    let instance = h
        .step_ok(
            "web",
            &agent,
            json!({"actions": [
                {"action": "claim", "step": "node/pull-image"},
                riding.clone()
            ]}),
        )
        .await;
    assert_eq!(phase(&instance, "node/pull-image"), "running");
    assert_eq!(phase(&instance, "node/create-sandbox"), "waiting");
    let after = h.ok("GET", &format!("{PODS}/web"), None).await;
    assert_eq!(version(&after), version(&before).map(|v| v + 1));
    // Alone and still waiting: nothing is written.
    let instance = h
        .step_ok("web", &agent, json!({"actions": [riding.clone()]}))
        .await;
    assert_eq!(phase(&instance, "node/create-sandbox"), "waiting");
    let unchanged = h.ok("GET", &format!("{PODS}/web"), None).await;
    assert_eq!(version(&unchanged), version(&after));

    // Another owner's claim if ready is refused like any claim of it.
    let (status, refused) = h
        .step("web", &scheduler, json!({"actions": [riding.clone()]}))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{refused}");

    // Once IPAM is done, the same claim takes the step.
    let ipam = h.token("ipam", Role::Controller).await;
    h.step_ok(
        "web",
        &ipam,
        json!({"actions": [
            {"action": "claim", "step": "ipam/assign-address"},
            {"action": "complete", "step": "ipam/assign-address"}
        ]}),
    )
    .await;
    let instance = h
        .step_ok(
            "web",
            &agent,
            json!({"actions": [
                {"action": "complete", "step": "node/pull-image"},
                riding
            ]}),
        )
        .await;
    assert_eq!(phase(&instance, "node/pull-image"), "done");
    assert_eq!(phase(&instance, "node/create-sandbox"), "running");

    // Only a claim takes ifReady.
    let (status, refused) = h
        .step(
            "web",
            &agent,
            json!({"action": "complete", "step": "node/create-sandbox", "ifReady": true}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}");
    assert!(
        refused["message"]
            .as_str()
            .unwrap_or_default()
            .contains("ifReady: the complete action takes no ifReady"),
        "{refused}"
    );
}

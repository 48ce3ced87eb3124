//! The ownership model end to end: defaults, registrations, the write
//! check with the acceptance cases, transfer and convergence.

use chrono::{DateTime, Utc};
use corral_api::kinds::ControllerSpec;
use corral_api::workflow::WorkflowStatus;
use corral_api::{Identity, Kind, Object, ObjectKey, Role};
use serde_json::{Value, json};

use crate::*;

fn person(name: &str, role: Role) -> Identity {
    Identity::new(name, role)
}

fn controller(name: &str) -> Identity {
    Identity::new(name, Role::Controller)
}

fn spec(owns: &[&str], reads: &[&str]) -> ControllerSpec {
    ControllerSpec {
        owns: owns.iter().map(|s| s.to_string()).collect(),
        reads: reads.iter().map(|s| s.to_string()).collect(),
        steps: Vec::new(),
    }
}

fn registry(entries: &[(&str, ControllerSpec)]) -> Registry {
    Registry::new(entries.iter().map(|(name, spec)| Registration {
        name: name.to_string(),
        spec: spec.clone(),
    }))
}

fn builtins() -> Registry {
    Registry::new(builtin_controllers())
}

fn pod(status: Value) -> Object {
    let mut object = Object::new(
        Kind::Pod,
        Some("default"),
        "web",
        json!({"containers": [{"name": "web", "image": "busybox"}], "runtime": "runc"}),
    );
    object.status = status;
    object
}

fn at(seconds: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(1_767_225_600 + seconds, 0).expect("valid time")
}

#[test]
fn defaults_name_an_owner_for_every_pod_field() {
    let registry = Registry::default();
    let owner = |path: &str| registry.owner_of(Kind::Pod, path);
    assert_eq!(owner("spec.containers[0].image"), Owner::People);
    assert_eq!(owner("metadata.labels.app"), Owner::People);
    assert_eq!(owner("status.node"), Owner::Controller("scheduler".into()));
    assert_eq!(owner("status.address"), Owner::Controller("ipam".into()));
    assert_eq!(owner("status.containers[0].ready"), Owner::BoundNode);
    assert_eq!(
        owner("status.workflow.instances[0]"),
        Owner::Controller("workflow".into())
    );
    assert_eq!(owner("status.somethingElse"), Owner::Unowned);
    let node = |path: &str| registry.owner_of(Kind::Node, path);
    assert_eq!(node("status.capacity.cpu"), Owner::OwnNode);
    assert_eq!(node("status.prefix"), Owner::Controller("ipam".into()));
    assert_eq!(
        node("status.silentSince"),
        Owner::Controller("node-lifecycle".into())
    );
    assert_eq!(
        registry.owner_of(Kind::Policy, "spec.grant"),
        Owner::Operators
    );
    assert_eq!(
        registry.owner_of(Kind::Controller, "spec.owns"),
        Owner::Registrant
    );
    assert_eq!(
        registry.owner_of(Kind::PinnedDeployment, "status.next.ready"),
        Owner::Controller("pinned-deployment".into())
    );
}

#[test]
fn a_person_may_not_write_status_node_but_the_scheduler_may() {
    let registry = builtins();
    let stored = pod(Value::Null);
    let mut placed = stored.clone();
    placed.status = json!({"node": "node-1"});
    let error = registry
        .check_write(&person("admin", Role::Operator), Some(&stored), &placed)
        .expect_err("a person may not place a pod");
    assert_eq!(
        error.to_string(),
        "status.node is owned by controller scheduler; admin (operator) may not write it"
    );
    registry
        .check_write(&controller("scheduler"), Some(&stored), &placed)
        .expect("the scheduler places pods");
    let error = registry
        .check_write(&controller("ipam"), Some(&stored), &placed)
        .expect_err("ipam may not place");
    assert!(
        error
            .to_string()
            .contains("ipam (controller) may not write it"),
        "{error}"
    );
}

#[test]
fn the_bound_nodes_agent_writes_pod_status_and_nobody_else() {
    let registry = builtins();
    let stored = pod(json!({"node": "node-1"}));
    let mut running = stored.clone();
    running.status = json!({"node": "node-1", "phase": "Running", "containers": [{"name": "web", "state": "running"}]});
    registry
        .check_write(&person("node-1", Role::Node), Some(&stored), &running)
        .expect("the bound node reports status");
    let error = registry
        .check_write(&person("node-2", Role::Node), Some(&stored), &running)
        .expect_err("another node may not");
    assert!(
        error
            .to_string()
            .starts_with("status.containers[0].name, status.containers[0].state and 1 more are owned by the agent of node node-1; node-2 (node) may not write them"),
        "{error}"
    );
}

#[test]
fn controllers_never_write_spec_or_unowned_fields() {
    let registry = builtins();
    let stored = pod(Value::Null);
    let mut edited = stored.clone();
    edited.spec["runtime"] = json!("gvisor");
    edited.status = json!({"note": "x"});
    let error = registry
        .check_write(&controller("scheduler"), Some(&stored), &edited)
        .expect_err("a controller may not edit spec");
    let text = error.to_string();
    assert!(
        text.contains("spec.runtime is owned by people (operators and users)"),
        "{text}"
    );
    assert!(
        text.contains("status.note is owned by nobody: unowned fields are written by people only"),
        "{text}"
    );
    registry
        .check_write(&person("alice", Role::User), Some(&stored), &edited)
        .expect("people write spec and unowned fields");
}

#[test]
fn creating_counts_every_field_and_ignores_server_metadata() {
    let registry = builtins();
    let mut fresh = pod(Value::Null);
    fresh.metadata.uid = "uid-1".into();
    fresh.metadata.revision = 3;
    fresh.metadata.labels.insert("app".into(), "web".into());
    let fields = changed_fields(None, &fresh);
    assert_eq!(
        fields,
        vec![
            "metadata.labels.app",
            "spec.containers[0].image",
            "spec.containers[0].name",
            "spec.runtime"
        ]
    );
    let error = registry
        .check_write(&controller("scheduler"), None, &fresh)
        .expect_err("controllers do not create pods");
    assert!(
        error
            .to_string()
            .contains("metadata.labels.app, spec.containers[0].image and 2 more"),
        "{error}"
    );
    // A node creates its own Node with an empty spec and its own status.
    let node = Object::new(Kind::Node, None, "node-1", json!({}));
    registry
        .check_write(&person("node-1", Role::Node), None, &node)
        .expect("nothing people own is set");
    let mut reported = node.clone();
    reported.status = json!({"capacity": {"cpu": "2"}, "prefix": "fd00:1::/64"});
    let error = registry
        .check_write(&person("node-1", Role::Node), Some(&node), &reported)
        .expect_err("the prefix is IPAM's");
    assert_eq!(
        error.to_string(),
        "status.prefix is owned by controller ipam; node-1 (node) may not write it"
    );
}

#[test]
fn a_second_owner_is_refused_naming_the_first() {
    let registry = registry(&[("metallb", spec(&["Pod:status.loadBalancer"], &[]))]);
    let error = registry
        .check_registration("other-lb", &spec(&["Pod:status.loadBalancer"], &[]))
        .expect_err("the MetalLB lesson");
    assert_eq!(
        error.to_string(),
        "Pod:status.loadBalancer is already owned by controller metallb; controller other-lb may not register it"
    );
    let error = registry
        .check_registration("other-lb", &spec(&["Pod:status"], &[]))
        .expect_err("a broader path contains the owned one");
    assert!(
        error
            .to_string()
            .starts_with("Pod:status.loadBalancer is already owned by controller metallb"),
        "{error}"
    );
    registry
        .check_registration(
            "metallb",
            &spec(&["Pod:status.loadBalancer", "Pod:status.lbClass"], &[]),
        )
        .expect("re-registering one's own fields is fine");
}

#[test]
fn one_lb_controller_owns_load_balancer_status() {
    let empty = Registry::default();
    empty
        .check_registration("lb-l4-proxy", &spec(&["LoadBalancer:status"], &[]))
        .expect("nobody owns a LoadBalancer's status by default");
    let registry = registry(&[("lb-l4-proxy", spec(&["LoadBalancer:status"], &[]))]);
    let error = registry
        .check_registration("lb-other", &spec(&["LoadBalancer:status.addresses"], &[]))
        .expect_err("a second LB controller");
    assert_eq!(
        error.to_string(),
        "LoadBalancer:status.addresses is already owned by controller lb-l4-proxy; controller lb-other may not register it"
    );
    let error = empty
        .check_registration("lb-other", &spec(&["LoadBalancer:spec.ports"], &[]))
        .expect_err("the spec is people's");
    assert!(error.to_string().contains("owned by people"), "{error}");
}

#[test]
fn defaults_count_as_owners_for_registration() {
    let registry = Registry::default();
    let error = registry
        .check_registration("rogue", &spec(&["Pod:status.node"], &[]))
        .expect_err("the scheduler owns it by default");
    assert!(
        error
            .to_string()
            .starts_with("Pod:status.node is already owned by controller scheduler"),
        "{error}"
    );
    let error = registry
        .check_registration("rogue", &spec(&["Pod:spec.containers"], &[]))
        .expect_err("spec belongs to people");
    assert!(error.to_string().contains("owned by people"), "{error}");
    let error = registry
        .check_registration("rogue", &spec(&["Node:status.capacity"], &[]))
        .expect_err("the node's own");
    assert!(
        error.to_string().contains("the node's own agent"),
        "{error}"
    );
    registry
        .check_registration(
            "acme",
            &spec(
                &["Pod:metadata.annotations.acme/injected", "Pod:status.acme"],
                &[],
            ),
        )
        .expect("annotation sub-keys and unowned status can be claimed");
    registry
        .check_registration("ipam", &spec(&["Node:status.prefix"], &[]))
        .expect("ipam owns the prefix by default");
    let error = registry
        .check_registration("acme", &spec(&["Pod:metadata.uid"], &[]))
        .expect_err("server metadata");
    assert!(matches!(error, RegistrationError::NotOwnable { .. }));
    assert!(matches!(
        registry.check_registration("acme", &spec(&[], &["nonsense"])),
        Err(RegistrationError::BadField(_))
    ));
}

#[test]
fn builtins_register_one_after_another_and_converge() {
    let mut registered: Vec<Registration> = Vec::new();
    for controller in builtin_controllers() {
        Registry::new(registered.clone())
            .check_registration(&controller.name, &controller.spec)
            .unwrap_or_else(|e| panic!("{} refused: {e}", controller.name));
        registered.push(controller);
    }
    let convergence = Registry::new(registered).check_convergence();
    assert!(convergence.converges(), "{:?}", convergence.cycles);
    assert!(
        convergence.edges.iter().any(|e| e.to_string()
            == "scheduler writes Pod:status.node and VirtualMachine:status.node read by ipam"),
        "{:?}",
        convergence.edges
    );
}

#[test]
fn a_two_controller_cycle_is_named() {
    let mut controllers = builtin_controllers();
    controllers.push(Registration {
        name: "alpha".into(),
        spec: spec(&["Pod:status.alpha"], &["Pod:status.beta"]),
    });
    controllers.push(Registration {
        name: "beta".into(),
        spec: spec(&["Pod:status.beta"], &["Pod:status.alpha.x"]),
    });
    let convergence = Registry::new(controllers).check_convergence();
    let cycles: Vec<String> = convergence.cycles.iter().map(ToString::to_string).collect();
    assert_eq!(
        cycles,
        vec![
            "alpha writes Pod:status.alpha.x read by beta; beta writes Pod:status.beta read by alpha"
        ]
    );
}

#[test]
fn every_cycle_is_named_once() {
    let registry = registry(&[
        (
            "a",
            spec(&["Pod:status.a"], &["Pod:status.b", "Pod:status.c"]),
        ),
        (
            "b",
            spec(&["Pod:status.b"], &["Pod:status.a", "Pod:status.c"]),
        ),
        ("c", spec(&["Pod:status.c"], &["Pod:status.a"])),
    ]);
    let cycles: Vec<String> = registry
        .check_convergence()
        .cycles
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        cycles,
        vec![
            "a writes Pod:status.a read by b; b writes Pod:status.b read by a",
            "a writes Pod:status.a read by c; c writes Pod:status.c read by a",
            "a writes Pod:status.a read by c; c writes Pod:status.c read by b; b writes Pod:status.b read by a",
        ]
    );
    // A controller reading what it writes is not a cycle.
    let alone = registry_self();
    assert!(alone.check_convergence().converges());
}

fn registry_self() -> Registry {
    registry(&[("solo", spec(&["Pod:status.solo"], &["Pod:status.solo"]))])
}

#[test]
fn transfer_moves_a_field_and_keeps_it_moved() {
    let registry = registry(&[
        ("scheduler", spec(&["Pod:status.node"], &[])),
        ("other", spec(&[], &[])),
    ]);
    let field: FieldRef = "Pod:status.node".parse().expect("field");
    let plan = registry
        .plan_transfer(&field, "scheduler", "other")
        .expect("the owner hands over");
    assert_eq!(plan.from.as_ref().map(|s| s.owns.len()), Some(0));
    assert_eq!(plan.to.owns, vec!["Pod:status.node"]);
    let after = registry_of(&[
        ("scheduler", plan.from.clone().expect("from")),
        ("other", plan.to.clone()),
    ]);
    assert_eq!(
        after.owner_of(Kind::Pod, "status.node"),
        Owner::Controller("other".into())
    );
    assert!(
        !after
            .effective_rules()
            .iter()
            .any(|r| r.owner == Owner::Controller("scheduler".into()) && r.field == field)
    );
    // The old owner cannot take it back by registering again.
    let error = after
        .check_registration("scheduler", &spec(&["Pod:status.node"], &[]))
        .expect_err("handed over");
    assert!(
        error
            .to_string()
            .starts_with("Pod:status.node is already owned by controller other"),
        "{error}"
    );
    // The new owner re-registers freely.
    after
        .check_registration("other", &plan.to)
        .expect("its own field");
    assert!(matches!(
        after.plan_transfer(&field, "scheduler", "third"),
        Err(TransferError::NotOwner { .. })
    ));
}

fn registry_of(entries: &[(&str, ControllerSpec)]) -> Registry {
    registry(entries)
}

#[test]
fn workflow_changes_follow_the_step_owner_rule() {
    let registry = builtins();
    let definition = corral_workflow::builtin(Kind::Pod, "start").expect("pod start");
    let (instance, _) = corral_workflow::instantiate(&definition, "start-1", "uid-1", 1, at(0));
    let status = |instance: &corral_api::workflow::WorkflowInstance, node: Option<&str>| {
        let mut status = json!({"workflow": WorkflowStatus { instances: vec![instance.clone()] }});
        if let Some(node) = node {
            status["node"] = json!(node);
        }
        status
    };
    let stored = pod(status(&instance, None));
    let mut claimed = instance.clone();
    corral_workflow::claim(
        &mut claimed,
        "scheduler/place",
        &controller("scheduler"),
        None,
        at(1),
    )
    .expect("scheduler claims");
    let mut next = stored.clone();
    next.status = status(&claimed, None);
    registry
        .check_write(&controller("scheduler"), Some(&stored), &next)
        .expect("the step's owner moves it");
    let error = registry
        .check_write(&controller("ipam"), Some(&stored), &next)
        .expect_err("not ipam's step");
    assert!(
        error
            .to_string()
            .starts_with("status.workflow: workflow start-1: step scheduler/place"),
        "{error}"
    );
    registry
        .check_write(&controller("workflow"), Some(&stored), &next)
        .expect("the engine writes anything");
    let mut emptied = stored.clone();
    emptied.status = json!({"workflow": {}});
    let error = registry
        .check_write(&person("admin", Role::Operator), Some(&stored), &emptied)
        .expect_err("only the engine removes instances");
    assert_eq!(
        error.to_string(),
        "status.workflow: only the workflow engine creates or removes workflow instances"
    );
}

#[test]
fn only_people_delete_and_only_operators_delete_configuration() {
    let pod = ObjectKey::new(Kind::Pod, None, "web");
    let policy = ObjectKey::new(Kind::Policy, None, "p");
    check_delete(&person("alice", Role::User), &pod).expect("people delete pods");
    check_delete(&person("admin", Role::Operator), &policy).expect("operators delete policies");
    let error = check_delete(&person("alice", Role::User), &policy).expect_err("users may not");
    assert_eq!(
        error.to_string(),
        "only operators delete Policy objects; alice (user) may not delete policy/p"
    );
    let error = check_delete(&controller("scheduler"), &pod).expect_err("controllers never");
    assert_eq!(
        error.to_string(),
        "only people (operators and users) delete Pod objects; scheduler (controller) may not delete pod/web"
    );
}

#[test]
fn a_controller_sees_what_it_reads_and_owns() {
    let registry = registry(&[("sidecar", spec(&[], &["Pod:spec.containers"]))]);
    let stored = pod(json!({"node": "node-1", "phase": "Running"}));
    let paths = registry
        .visible_paths("sidecar", Kind::Pod, "web")
        .expect("a mask");
    let served = strip(&stored, &paths);
    assert_eq!(
        served.spec,
        json!({"containers": [{"name": "web", "image": "busybox"}]})
    );
    assert_eq!(served.status, Value::Null);
    assert_eq!(
        crate::strip_owned(stored.clone(), &paths),
        served,
        "the owned form serves the same"
    );
    let scheduler = builtins()
        .visible_paths("scheduler", Kind::Pod, "web")
        .expect("a mask");
    assert!(
        scheduler.contains(&"status.node".to_string()),
        "{scheduler:?}"
    );
    assert_eq!(
        registry.visible_paths("sidecar", Kind::Controller, "sidecar"),
        None
    );
    assert_eq!(
        registry.visible_paths("nobody", Kind::Pod, "web"),
        Some(Vec::new())
    );
    assert_eq!(
        builtins().readers_of(Kind::Pod, "status.node"),
        vec!["ipam"]
    );
}

#[test]
fn a_controller_registers_itself_but_not_others() {
    let registry = Registry::default();
    let mut own = Object::new(Kind::Controller, None, "acme", json!({"owns": []}));
    own.spec = json!({"owns": ["Pod:status.acme"], "reads": [], "steps": []});
    registry
        .check_write(&controller("acme"), None, &own)
        .expect("self-registration");
    let error = registry
        .check_write(&controller("rogue"), None, &own)
        .expect_err("not its registration");
    assert!(
        error
            .to_string()
            .contains("owned by operators and the registered controller itself"),
        "{error}"
    );
    registry
        .check_write(&person("admin", Role::Operator), None, &own)
        .expect("operators register anyone");
    let error = registry
        .check_write(&person("alice", Role::User), None, &own)
        .expect_err("users do not");
    assert!(
        error.to_string().contains("alice (user) may not write"),
        "{error}"
    );
}

#[test]
fn field_refs_parse_and_print() {
    let field: FieldRef = "pod:status.node".parse().expect("parses");
    assert_eq!(field.to_string(), "Pod:status.node");
    assert!("status.node".parse::<FieldRef>().is_err());
    assert!("Pod:".parse::<FieldRef>().is_err());
    assert!(
        ownable("metadata.annotations.x") && !ownable("metadata.annotations") && !ownable("kind")
    );
}

#[test]
fn each_builtin_controller_is_served_the_same_through_its_compiled_mask() {
    let registry = builtins();
    let stored = pod(json!({
        "node": "node-1",
        "address": "fd00::5",
        "phase": "Running",
        "containers": [{"name": "web", "ready": true}],
        "workflow": {"instances": [{"id": "start-1", "steps": {"node/start": {"phase": "done"}}}]}
    }));
    for controller in builtin_controllers() {
        let paths = registry
            .visible_paths(&controller.name, Kind::Pod, "web")
            .expect("a mask");
        assert_eq!(
            crate::Mask::new(&paths).strip(&stored),
            strip(&stored, &paths),
            "{} sees {paths:?}",
            controller.name
        );
    }
}

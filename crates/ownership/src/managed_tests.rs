//! Managed objects: the PinnedDeployment controller creates, edits and
//! deletes the pods it manages; nobody else gains that right.

use corral_api::{Identity, Kind, MANAGED_BY, Object, Role};
use serde_json::json;

use crate::*;

fn managed_pod(manager: &str) -> Object {
    let mut object = Object::new(
        Kind::Pod,
        Some("default"),
        "web-0",
        json!({"containers": [{"name": "web", "image": "busybox"}]}),
    );
    object
        .metadata
        .annotations
        .insert(MANAGED_BY.into(), manager.into());
    object.metadata.labels.insert("app".into(), "web".into());
    object
}

fn pinned() -> Identity {
    Identity::new(PINNED_DEPLOYMENT, Role::Controller)
}

#[test]
fn the_manager_creates_edits_and_deletes_its_pods() {
    let registry = Registry::new(builtin_controllers());
    let pod = managed_pod(PINNED_DEPLOYMENT);
    registry
        .check_write(&pinned(), None, &pod)
        .expect("the manager creates");
    let mut edited = pod.clone();
    edited.spec["containers"][0]["image"] = json!("busybox:2");
    registry
        .check_write(&pinned(), Some(&pod), &edited)
        .expect("the manager edits the spec");
    check_delete_object(&pinned(), &pod).expect("the manager deletes");
}

#[test]
fn people_and_other_controllers_may_not_write_managed_fields() {
    let registry = Registry::new(builtin_controllers());
    let pod = managed_pod(PINNED_DEPLOYMENT);
    let mut edited = pod.clone();
    edited.spec["containers"][0]["image"] = json!("busybox:2");
    let error = registry
        .check_write(&Identity::new("alice", Role::User), Some(&pod), &edited)
        .expect_err("the spec is the manager's");
    assert_eq!(
        error.to_string(),
        "spec.containers[0].image is owned by controller pinned-deployment; alice (user) may not write it"
    );
    let error = registry
        .check_write(&Identity::new("scheduler", Role::Controller), None, &pod)
        .expect_err("only the named manager creates");
    assert!(
        error
            .to_string()
            .contains("owned by controller pinned-deployment")
    );
    check_delete_object(&Identity::new("scheduler", Role::Controller), &pod)
        .expect_err("other controllers never delete");
    check_delete_object(&Identity::new("alice", Role::User), &pod).expect("people still delete");
}

#[test]
fn a_controller_cannot_make_itself_a_manager() {
    let registry = Registry::new(builtin_controllers());
    let pod = managed_pod("scheduler");
    let error = registry
        .check_write(&Identity::new("scheduler", Role::Controller), None, &pod)
        .expect_err("the scheduler manages nothing");
    assert_eq!(
        error.to_string(),
        "metadata.annotations.corral.dev/managed-by: controller scheduler may not manage Pod objects (allowed: pinned-deployment, job, per-node)"
    );
    check_delete_object(&Identity::new("scheduler", Role::Controller), &pod)
        .expect_err("and deletes nothing");
}

#[test]
fn a_person_cannot_take_a_managed_pod_back_by_removing_the_annotation() {
    let registry = Registry::new(builtin_controllers());
    let pod = managed_pod(PINNED_DEPLOYMENT);
    let mut taken = pod.clone();
    taken.metadata.annotations.clear();
    registry
        .check_write(&Identity::new("admin", Role::Operator), Some(&pod), &taken)
        .expect_err("the annotation is the manager's too");
}

fn owned_by(pod: &Object, uid: &str) -> Object {
    let mut owned = pod.clone();
    owned.metadata.owner = Some(corral_api::OwnerReference {
        kind: Kind::PinnedDeployment,
        name: "web".into(),
        uid: uid.into(),
    });
    owned
}

#[test]
fn the_manager_alone_writes_the_owner_reference() {
    let registry = Registry::new(builtin_controllers());
    let orphan = managed_pod(PINNED_DEPLOYMENT);
    let owned = owned_by(&orphan, "u-1");
    registry
        .check_write(&pinned(), None, &owned)
        .expect("the manager creates an owned pod");
    registry
        .check_write(&pinned(), Some(&orphan), &owned)
        .expect("the manager adopts an orphan");
    registry
        .check_write(&Identity::new("alice", Role::User), Some(&owned), &owned)
        .expect("leaving the owner alone is no write of it");

    let error = registry
        .check_write(&Identity::new("alice", Role::User), Some(&orphan), &owned)
        .expect_err("people do not adopt");
    assert_eq!(
        error.to_string(),
        "metadata.owner is written by controller pinned-deployment, which manages the object; alice (user) may not write it"
    );
    let error = registry
        .check_write(
            &Identity::new("scheduler", Role::Controller),
            Some(&owned),
            &owned_by(&orphan, "u-2"),
        )
        .expect_err("another controller does not take the pod over");
    assert!(
        error
            .to_string()
            .starts_with("metadata.owner is written by controller pinned-deployment"),
        "{error}"
    );
}

#[test]
fn an_unmanaged_object_takes_no_owner() {
    let registry = Registry::new(builtin_controllers());
    let mut plain = managed_pod(PINNED_DEPLOYMENT);
    plain.metadata.annotations.clear();
    let error = registry
        .check_write(
            &Identity::new("admin", Role::Operator),
            None,
            &owned_by(&plain, "u-1"),
        )
        .expect_err("an owner needs a managing controller");
    assert!(
        error.to_string().contains(
            "this one names none in corral.dev/managed-by; admin (operator) may not write it"
        ),
        "{error}"
    );
}

#[test]
fn the_job_controller_deletes_a_job_only_when_its_ttl_asks() {
    let job = Identity::new(JOB, Role::Controller);
    let mut batch = Object::new(
        Kind::Job,
        Some("default"),
        "batch",
        json!({"template": {"spec": {"restartPolicy": "Never",
               "containers": [{"name": "c", "image": "busybox"}]}}}),
    );
    check_delete_object(&job, &batch).expect_err("a person's Job without a TTL stays");
    batch.spec["ttlSecondsAfterFinished"] = json!(30);
    check_delete_object(&job, &batch).expect("its TTL asks the job controller to delete it");
    check_delete_object(&pinned(), &batch).expect_err("no other controller");
    let registry = Registry::new(builtin_controllers());
    let mut run = batch.clone();
    run.metadata
        .annotations
        .insert(MANAGED_BY.into(), JOB.into());
    registry
        .check_write(&job, None, &run)
        .expect("the job controller creates the runs of a scheduled Job");
}

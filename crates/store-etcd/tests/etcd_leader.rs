//! Controller leadership on a real etcd: one leader at a time, and a
//! deposed leader's writes refused by etcd (fencing), even when the deposed
//! server still believes it leads.

use std::time::Duration;

use chrono::Utc;
use corral_api::{AuthorClass, Kind, Object};
use corral_store::{ChangeMeta, Store, StoreError};
use corral_store_etcd::leader::{self, FencePolicy};
use corral_store_etcd::{EtcdConfig, EtcdStore};
use corral_testkit::etcd::EtcdCluster;
use serde_json::json;

fn by(author: &str) -> ChangeMeta {
    ChangeMeta {
        author: author.to_string(),
        class: AuthorClass::System,
        message: format!("written by {author}"),
        time: Utc::now(),
        always_record: false,
    }
}

fn pod(name: &str) -> Object {
    let mut object = Object::new(Kind::Pod, Some("default"), name, json!({"containers": []}));
    object.metadata.uid = format!("uid-{name}");
    object.metadata.created_at = Some(Utc::now());
    object
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_leader_writes_and_a_deposed_leader_is_fenced() {
    let cluster = EtcdCluster::start(1);
    let config = EtcdConfig::new(cluster.endpoints());
    let base = EtcdStore::connect(&config).await.expect("connect");
    let (policy_a, policy_b) = (
        FencePolicy::new(["scheduler"]),
        FencePolicy::new(["scheduler"]),
    );
    let server_a = base.with_fencing(policy_a.clone());
    let server_b = base.with_fencing(policy_b.clone());

    let leadership_a = leader::campaign(&server_a, "server-a")
        .await
        .expect("a campaigns");
    policy_a.set(Some(leadership_a.fence()));
    server_a
        .create(pod("placed-by-a"), &by("scheduler"))
        .await
        .expect("the leader's controller writes");
    match server_b.create(pod("placed-by-b"), &by("scheduler")).await {
        Err(StoreError::Unavailable(_)) => {}
        other => panic!("a follower's controller write must be refused, got {other:?}"),
    }
    server_b
        .create(pod("applied-by-alice"), &by("alice"))
        .await
        .expect("ordinary writers write through any server");

    // B campaigns while A leads: it must wait.
    let campaign_b = tokio::spawn({
        let server_b = server_b.clone();
        async move { leader::campaign(&server_b, "server-b").await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!campaign_b.is_finished(), "two leaders at once");

    // A loses its lease but (like a paused process) still holds its fence.
    let stale_fence = leadership_a.fence();
    leadership_a.resign().await;
    let leadership_b = tokio::time::timeout(Duration::from_secs(20), campaign_b)
        .await
        .expect("b wins within 20 s")
        .expect("campaign task")
        .expect("b campaigns");
    policy_b.set(Some(leadership_b.fence()));
    assert_eq!(policy_a.current(), Some(stale_fence), "a still believes");
    match server_a
        .create(pod("late-write-of-a"), &by("scheduler"))
        .await
    {
        Err(StoreError::Unavailable(message)) => {
            assert!(
                message.contains("no longer the controller leader"),
                "{message}"
            )
        }
        other => panic!("a deposed leader's write must be fenced, got {other:?}"),
    }
    let placed = server_a.get(&pod("placed-by-a").key()).await.expect("get");
    let mut edit = placed.expect("exists");
    let expected = edit.metadata.resource_version;
    edit.spec = json!({"containers": [], "placement": {"node": "n1"}});
    assert!(
        server_a
            .update(edit.clone(), expected, &by("scheduler"))
            .await
            .is_err(),
        "a deposed leader's update is fenced too"
    );
    server_b
        .update(edit, expected, &by("scheduler"))
        .await
        .expect("the new leader writes");
    assert_eq!(
        server_b
            .get(&pod("late-write-of-a").key())
            .await
            .expect("get"),
        None
    );
    leadership_b.resign().await;
}

//! The instrument tested: hollow nodes against an in-process API server
//! (SQLite in memory, TLS on loopback) with the built-in controllers and
//! the workflow driver, as `corral server` runs them. Three nodes join and
//! become Ready, ten pods are placed on them and reach Running, their start
//! workflows succeed, and a deleted pod is forgotten without errors. It
//! takes a few seconds. The same harness shows the scheduler placing a
//! pod that waited for a node as soon as one is Ready.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use corral_api::kinds::PodStatus;
use corral_api::workflow::WorkflowOutcome;
use corral_api::{Identity, Kind, Role};
use corral_client::{Client, ClientConfig};
use corral_server::tls::{self, TlsListener};
use corral_server::{Server, TokenIssuer};
use corral_store::sqlite::SqliteStore;
use tokio_util::sync::CancellationToken;

use super::{HollowCluster, HollowOptions, NodeSettings};
use crate::scale::workload::{RunningPods, create_pods, pod};

/// A running in-process control plane; stopped when dropped.
struct ControlPlane {
    admin: ClientConfig,
    shutdown: CancellationToken,
    _tls_dir: tempfile::TempDir,
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// The API server on a loopback port, the built-in controllers each with
/// its own token, and the workflow driver: what `corral server` starts.
async fn control_plane() -> ControlPlane {
    let store = SqliteStore::open_in_memory().expect("an in-memory store");
    let server = Server::new(Arc::new(store));
    let tokens = corral_server::ownership::register_builtins(&server, &BTreeMap::new())
        .await
        .expect("built-in controllers register");
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let address = tcp.local_addr().expect("its address");
    let tls_dir = tempfile::tempdir().expect("a temp dir");
    let material = tls::load_or_create(tls_dir.path(), &tls::server_names(address, &[]))
        .expect("a cluster CA and server certificate");
    let config = |token: String| ClientConfig {
        server: format!("https://{address}"),
        token,
        ca: Some(material.ca_pem.clone()),
    };
    let shutdown = CancellationToken::new();
    tokio::spawn(corral_server::serve(
        TlsListener::new(tcp, &material),
        server.clone(),
        shutdown.clone(),
    ));
    let controller = |name: &str| {
        let token = tokens.get(name).expect("a built-in token").clone();
        Client::new(&config(token)).expect("a client")
    };
    corral_controllers::spawn_all(
        controller("scheduler"),
        controller("ipam"),
        controller("node-lifecycle"),
        "fd00:5ca1:e::/48".parse().expect("a cluster prefix"),
        shutdown.clone(),
    );
    tokio::spawn(corral_server::workflows::drive(
        server.clone(),
        shutdown.clone(),
    ));
    let admin = TokenIssuer::issue(
        &*server.store,
        &*server.clock,
        Identity::new("admin", Role::Operator),
    )
    .await
    .expect("an admin token");
    ControlPlane {
        admin: config(admin),
        shutdown,
        _tls_dir: tls_dir,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hollow_nodes_join_and_run_pods_through_the_real_api() {
    let plane = control_plane().await;
    let admin = Client::new(&plane.admin).expect("an admin client");
    let options = HollowOptions {
        nodes: 3,
        name_prefix: "hollow".into(),
        node: NodeSettings {
            index: 0,
            pod_capacity: 110,
            heartbeat: Duration::from_secs(5),
            parallel_pods: 4,
        },
    };
    let cluster = HollowCluster::start(&admin, &plane.admin, &options)
        .await
        .expect("hollow nodes join");
    cluster
        .wait_ready(&admin, Duration::from_secs(30))
        .await
        .expect("every hollow node becomes Ready");

    let running = RunningPods::start(&admin).await.expect("a pod watch");
    let deadline = Instant::now() + Duration::from_secs(60);
    let created = create_pods(&admin, 0..10, 4, deadline)
        .await
        .expect("pods are created");
    assert_eq!(created, 10);
    assert!(
        running.reached(10, deadline).await.is_some(),
        "only {} of 10 pods seen running; hollow nodes: {}",
        running.count(),
        cluster.counters().describe()
    );
    assert!(cluster.wait_idle(Duration::from_secs(30)).await);

    // Every pod runs on a hollow node, reported as a real agent would, and
    // its start workflow is over and succeeded (the driver may take a tick).
    let mut nodes_used = std::collections::BTreeSet::new();
    let settled = Instant::now() + Duration::from_secs(10);
    loop {
        let pods = admin
            .list(Kind::Pod, Some("default"), None)
            .await
            .expect("pods")
            .items;
        assert_eq!(pods.len(), 10);
        let succeeded = pods.iter().all(|pod| {
            corral_api::workflow::StoredWorkflows::of(&pod.status).is_ok_and(|status| {
                status
                    .for_revision(pod.metadata.revision)
                    .is_some_and(|instance| instance.outcome == WorkflowOutcome::Succeeded)
            })
        });
        for pod in &pods {
            let status: PodStatus = pod.typed_status().expect("a pod status");
            assert!(crate::pod_watch::is_running(&status), "{}", pod.status);
            assert!(status.is_ready());
            assert!(status.address.is_some(), "IPAM gave it an address");
            let node = status.node.expect("bound");
            assert!(node.starts_with("hollow-"), "{node}");
            nodes_used.insert(node);
        }
        if succeeded {
            break;
        }
        assert!(
            Instant::now() < settled,
            "start workflows not all succeeded"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(nodes_used.len() > 1, "spread over nodes: {nodes_used:?}");

    // A deleted pod stops through its node's steps and is removed: no
    // errors, nothing left in progress.
    admin
        .delete(&pod(3).key(), Some("test"))
        .await
        .expect("delete a pod");
    assert!(cluster.wait_idle(Duration::from_secs(10)).await);
    let deadline = Instant::now() + Duration::from_secs(10);
    while admin.get(&pod(3).key()).await.is_ok() {
        assert!(Instant::now() < deadline, "the deleted pod was not removed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let counters = cluster.counters();
    let errors = counters.errors.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(errors, 0, "{}", counters.describe());
    let steps = counters.steps.load(std::sync::atomic::Ordering::Relaxed);
    // Per node 5 join steps, per pod 6 start steps, and the deleted pod's
    // 4 node steps of its stop workflow, each claimed once.
    assert_eq!(steps, 3 * 5 + 10 * 6 + 4, "{}", counters.describe());
}

/// The `scheduler/place` state of the pod's newest instance.
async fn place_state(
    admin: &Client,
    index: usize,
) -> Option<(u32, corral_api::workflow::StepState)> {
    let pod = admin.get(&pod(index).key()).await.expect("the pod");
    let status = corral_api::workflow::StoredWorkflows::of(&pod.status).expect("its workflows");
    let step = status.latest()?.steps.get("scheduler/place")?.clone();
    Some((step.attempts, step.state))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_waiting_for_a_node_is_placed_once_one_is_ready_not_after_its_backoff() {
    let plane = control_plane().await;
    let admin = Client::new(&plane.admin).expect("an admin client");
    let deadline = Instant::now() + Duration::from_secs(30);
    assert_eq!(
        create_pods(&admin, 0..1, 1, deadline).await.expect("a pod"),
        1
    );
    // With no node, placement fails and backs off: 1 s, then 2 s, then 4 s.
    let retry_at = loop {
        match place_state(&admin, 0).await {
            Some((
                attempts,
                corral_api::workflow::StepState::Failed {
                    next_retry_at: Some(at),
                    error,
                    ..
                },
            )) if attempts >= 3 => {
                assert!(error.contains("no node"), "{error}");
                break at;
            }
            _ => {
                assert!(Instant::now() < deadline, "placement never failed 3 times");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let running = RunningPods::start(&admin).await.expect("a pod watch");
    let options = HollowOptions {
        nodes: 1,
        name_prefix: "late".into(),
        node: NodeSettings {
            index: 0,
            pod_capacity: 110,
            heartbeat: Duration::from_secs(5),
            parallel_pods: 4,
        },
    };
    let cluster = HollowCluster::start(&admin, &plane.admin, &options)
        .await
        .expect("a hollow node joins");
    assert!(
        running.reached(1, deadline).await.is_some(),
        "the pod never ran: {}",
        cluster.counters().describe()
    );
    let placed = chrono::Utc::now();
    assert!(
        placed < retry_at,
        "placed at {placed}, not before its retry at {retry_at}"
    );
}

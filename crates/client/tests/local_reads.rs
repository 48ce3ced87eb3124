//! Informers reading in-process ([`corral_server::local_reads`]) hear the
//! same changes, in the same order, with the same fields, as informers of
//! the same token over HTTPS to the same server: created, changed, deleted,
//! and leaving or entering a scope by node, labels or managing controller.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use corral_api::{AuthorClass, Kind, Object, ObjectKey};
use corral_client::runtime::{Change, Informer, Scope};
use corral_client::{Client, ClientConfig};
use corral_server::local_reads::InProcessReads;
use corral_server::ownership::{BuiltinTokens, register_builtins};
use corral_server::tls::{self, TlsListener};
use corral_server::{Server, SharedServer};
use corral_store::sqlite::SqliteStore;
use corral_store::{ChangeMeta, Store};
use serde_json::json;
use tokio_util::sync::CancellationToken;

fn change(message: &str) -> ChangeMeta {
    ChangeMeta {
        author: "test".into(),
        class: AuthorClass::External,
        message: message.into(),
        time: Utc::now(),
        always_record: false,
    }
}

fn pod(name: &str, app: &str, node: Option<&str>) -> Object {
    let mut object = Object::new(
        Kind::Pod,
        Some("default"),
        name,
        json!({"containers": [{"name": "c", "image": "local/busybox:1"}]}),
    );
    object.metadata.uid = format!("uid-{name}");
    object.metadata.labels = BTreeMap::from([("app".to_string(), app.to_string())]);
    if let Some(node) = node {
        object.status = json!({"node": node});
    }
    object
}

/// `object` with its `corral.dev/managed-by` annotation naming `manager`,
/// or without one.
fn managed(mut object: Object, manager: Option<&str>) -> Object {
    match manager {
        Some(manager) => object
            .metadata
            .annotations
            .insert(corral_api::MANAGED_BY.to_string(), manager.to_string()),
        None => object.metadata.annotations.remove(corral_api::MANAGED_BY),
    };
    object
}

fn key(name: &str) -> ObjectKey {
    ObjectKey::new(Kind::Pod, Some("default"), name)
}

/// A real API server over TLS on loopback, with the built-in controllers
/// registered (so their read masks apply: the tests read as IPAM).
struct Running {
    server: SharedServer,
    url: String,
    ca: String,
    tokens: BuiltinTokens,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    _tls_dir: tempfile::TempDir,
}

async fn start(store: Arc<SqliteStore>) -> Running {
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a free port");
    let address = tcp.local_addr().expect("an address");
    let tls_dir = tempfile::tempdir().expect("a tls dir");
    let material =
        tls::load_or_create(tls_dir.path(), &tls::server_names(address, &[])).expect("tls");
    let server = Server::new(store);
    let tokens = register_builtins(&server, &BuiltinTokens::new())
        .await
        .expect("the built-in controllers register");
    let ca = material.ca_pem.clone();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn({
        let (server, shutdown) = (server.clone(), shutdown.clone());
        async move {
            corral_server::serve(TlsListener::new(tcp, &material), server, shutdown)
                .await
                .expect("the server runs");
        }
    });
    Running {
        server,
        url: format!("https://{address}"),
        ca,
        tokens,
        shutdown,
        task,
        _tls_dir: tls_dir,
    }
}

impl Running {
    fn client(&self, controller: &str) -> Client {
        Client::new(&ClientConfig {
            server: self.url.clone(),
            token: self.tokens[controller].clone(),
            ca: Some(self.ca.clone()),
        })
        .expect("a client")
    }

    async fn stop(self) {
        self.shutdown.cancel();
        self.task.await.expect("the server stops");
    }
}

/// What an informer's handler heard, as `+name@rv` and `-name`.
type Heard = Arc<Mutex<Vec<String>>>;

fn follow(client: Client, scope: Scope, shutdown: &CancellationToken) -> (Informer, Heard) {
    let informer = Informer::start(client, scope, Vec::new(), shutdown.clone());
    let heard: Heard = Arc::default();
    // Registered before the follower first runs (one-threaded test
    // runtime): the first list is heard too.
    informer.on_change(|_, _| unreachable!("nothing is cached yet"), {
        let heard = heard.clone();
        move |change| {
            let entry = match change {
                Change::Applied { key, object, .. } => {
                    format!("+{}@{}", key.name, object.metadata.resource_version)
                }
                Change::Deleted { key, .. } => format!("-{}", key.name),
            };
            heard.lock().expect("heard").push(entry);
        }
    });
    (informer, heard)
}

fn cached(informer: &Informer) -> BTreeMap<String, serde_json::Value> {
    informer
        .cache()
        .list()
        .into_iter()
        .map(|(key, object)| {
            let value = serde_json::to_value(object.as_ref()).expect("an object encodes");
            (key.name, value)
        })
        .collect()
}

#[tokio::test]
async fn in_process_informers_hear_what_http_informers_hear() {
    let store = Arc::new(SqliteStore::open_in_memory().expect("a store"));
    store
        .create(pod("old", "web", Some("n1")), &change("before the server"))
        .await
        .expect("old");
    let running = start(store).await;
    let shutdown = CancellationToken::new();
    let scopes = [
        Scope::all(Kind::Pod),
        Scope::on_node(Kind::Pod, "n1"),
        Scope {
            selector: Some("app=web".into()),
            ..Scope::all(Kind::Pod)
        },
        Scope::managed_by(Kind::Pod, "job"),
    ];
    let reads = InProcessReads::new(running.server.clone());
    let mut pairs = Vec::new();
    for scope in &scopes {
        let http = running.client("ipam");
        let local = running.client("ipam").with_local_reads(reads.clone());
        assert!(!http.reads_locally() && local.reads_locally());
        pairs.push((
            scope.clone(),
            follow(http, scope.clone(), &shutdown),
            follow(local, scope.clone(), &shutdown),
        ));
    }
    for (_, (http, _), (local, _)) in &pairs {
        http.synced().await;
        local.synced().await;
    }

    let store = running.server.store.clone();
    let a = store
        .create(managed(pod("a", "web", None), Some("job")), &change("a"))
        .await
        .expect("a");
    let b = store
        .create(pod("b", "db", None), &change("b"))
        .await
        .expect("b");
    let mut bound = a.clone();
    bound.status = json!({"node": "n1"});
    let a = store
        .update(bound, a.metadata.resource_version, &change("a to n1"))
        .await
        .expect("bind a");
    let mut relabelled = managed(b.clone(), Some("job"));
    relabelled
        .metadata
        .labels
        .insert("app".into(), "web".into());
    let b = store
        .update(relabelled, b.metadata.resource_version, &change("b is web"))
        .await
        .expect("relabel b");
    // Moved, and no longer the job controller's.
    let mut moved = managed(a.clone(), None);
    moved.status = json!({"node": "n2"});
    store
        .update(moved, a.metadata.resource_version, &change("a to n2"))
        .await
        .expect("move a");
    let mut bound = b.clone();
    bound.status = json!({"node": "n1"});
    store
        .update(bound, b.metadata.resource_version, &change("b to n1"))
        .await
        .expect("bind b");
    store
        .delete(&key("b"), None, &change("b goes"))
        .await
        .expect("delete b");
    let marker = store
        .create(
            managed(pod("z", "web", Some("n1")), Some("job")),
            &change("the end"),
        )
        .await
        .expect("z");
    let last = format!("+z@{}", marker.metadata.resource_version);

    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    for (scope, (_, http_heard), (_, local_heard)) in &pairs {
        for heard in [http_heard, local_heard] {
            while !heard.lock().expect("heard").contains(&last) {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "an informer of {scope:?} never heard {last}; heard {:?}",
                    heard.lock().expect("heard")
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
    for (scope, (http, http_heard), (local, local_heard)) in &pairs {
        let http_heard = http_heard.lock().expect("heard").clone();
        let local_heard = local_heard.lock().expect("heard").clone();
        assert_eq!(http_heard, local_heard, "changes of {scope:?}");
        assert_eq!(cached(http), cached(local), "cached objects of {scope:?}");
    }
    // The scopes did filter: n1 heard a leave and b go, app=web heard b
    // arrive, and nobody in those scopes has a now.
    let node_heard = pairs[1].2.1.lock().expect("heard").clone();
    assert!(node_heard.contains(&"-a".to_string()), "{node_heard:?}");
    let web_heard = pairs[2].2.1.lock().expect("heard").clone();
    assert!(
        web_heard.iter().any(|e| e.starts_with("+b@")),
        "{web_heard:?}"
    );
    assert_eq!(
        cached(&pairs[1].2.0).into_keys().collect::<Vec<_>>(),
        ["old", "z"]
    );
    // The job controller's scope heard a arrive and leave (let go), and b
    // arrive (adopted) and go; old was never its.
    let managed_heard = pairs[3].2.1.lock().expect("heard").clone();
    let signs: Vec<String> = managed_heard
        .iter()
        .map(|e| e.split('@').next().unwrap_or_default().to_string())
        .collect();
    assert_eq!(
        signs,
        ["+a", "+a", "+b", "-a", "+b", "-b", "+z"],
        "{managed_heard:?}"
    );
    assert_eq!(cached(&pairs[3].2.0).into_keys().collect::<Vec<_>>(), ["z"]);
    // IPAM reads a pod's node and workflow, not its spec: the mask holds
    // in-process too.
    let z = &cached(&pairs[0].2.0)["z"];
    assert_eq!(z["spec"], serde_json::Value::Null, "{z}");
    assert_eq!(z["status"]["node"], "n1", "{z}");

    shutdown.cancel();
    running.stop().await;
}

#[tokio::test]
async fn in_process_reads_refuse_what_http_refuses() {
    let store = Arc::new(SqliteStore::open_in_memory().expect("a store"));
    let old = store
        .create(pod("old", "web", None), &change("first"))
        .await
        .expect("old");
    store
        .update(old.clone(), old.metadata.resource_version, &change("again"))
        .await
        .expect("old again");
    let running = start(store).await;
    let reads = InProcessReads::new(running.server.clone());
    let token = running.tokens["ipam"].clone();
    let scope = Scope::all(Kind::Pod);

    let listed = reads.list_all(&token, &scope).await.expect("a list");
    assert_eq!(listed.items.len(), 1);
    let status = |error: corral_server::ApiError| error.status().as_u16();

    // Before the cache's window (it loaded after both writes): list again.
    let before = reads
        .watch_from(&token, &scope, 1)
        .await
        .err()
        .expect("gone");
    assert_eq!(status(before), 410);
    // After the store's newest revision: list again.
    let after = reads
        .watch_from(&token, &scope, listed.resource_version + 100)
        .await
        .err()
        .expect("gone");
    assert_eq!(status(after), 410);
    // An unknown token reads nothing.
    let unknown = reads
        .list_all("not-a-token", &scope)
        .await
        .expect_err("refused");
    assert_eq!(status(unknown), 401);
    // A node scope of a kind not bound to nodes is a bad request.
    let nodes = Scope::on_node(Kind::Node, "n1");
    let bad = reads.list_all(&token, &nodes).await.expect_err("refused");
    assert_eq!(status(bad), 400);

    running.stop().await;
}

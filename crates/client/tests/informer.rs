//! The informer against a real API server (TLS on loopback, in-process):
//! it survives the server's restart and a watch whose window moved on
//! without losing a change a controller must act on.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use corral_api::{AuthorClass, Identity, Kind, Object, ObjectKey, Role};
use corral_client::runtime::{Change, Informer, Scope};
use corral_client::{Client, ClientConfig};
use corral_server::tls::{self, TlsListener};
use corral_server::{Server, TokenIssuer};
use corral_store::sqlite::SqliteStore;
use corral_store::{ChangeMeta, Store};
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// A real API server on a fixed loopback port over a store that outlives
/// it, so it can be stopped and started again.
struct ApiServer {
    store: Arc<SqliteStore>,
    address: SocketAddr,
    tls_dir: tempfile::TempDir,
    ca: String,
    running: Option<(CancellationToken, tokio::task::JoinHandle<()>)>,
}

impl ApiServer {
    async fn start(store: Arc<SqliteStore>) -> ApiServer {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        let address = probe.local_addr().expect("an address");
        drop(probe);
        let mut server = ApiServer {
            store,
            address,
            tls_dir: tempfile::tempdir().expect("a tls dir"),
            ca: String::new(),
            running: None,
        };
        server.run().await;
        server
    }

    async fn run(&mut self) {
        let names = tls::server_names(self.address, &[]);
        let material = tls::load_or_create(self.tls_dir.path(), &names).expect("tls material");
        self.ca = material.ca_pem.clone();
        let tcp = tokio::net::TcpListener::bind(self.address)
            .await
            .expect("the server's port is free again");
        let server = Server::new(self.store.clone());
        let shutdown = CancellationToken::new();
        let task = tokio::spawn({
            let shutdown = shutdown.clone();
            async move {
                corral_server::serve(TlsListener::new(tcp, &material), server, shutdown)
                    .await
                    .expect("the server runs");
            }
        });
        self.running = Some((shutdown, task));
    }

    async fn stop(&mut self) {
        if let Some((shutdown, task)) = self.running.take() {
            shutdown.cancel();
            task.await.expect("the server stops");
        }
    }

    async fn client(&self) -> Client {
        let token = TokenIssuer::issue(
            self.store.as_ref(),
            &corral_server::SystemClock,
            Identity::new("admin", Role::Operator),
        )
        .await
        .expect("a token");
        Client::new(&ClientConfig {
            server: format!("https://{}", self.address),
            token,
            ca: Some(self.ca.clone()),
        })
        .expect("a client")
    }
}

fn change(message: &str) -> ChangeMeta {
    ChangeMeta {
        author: "test".into(),
        class: AuthorClass::External,
        message: message.into(),
        time: Utc::now(),
        always_record: false,
    }
}

fn pod(name: &str) -> Object {
    let mut object = Object::new(
        Kind::Pod,
        Some("default"),
        name,
        json!({"containers": [{"name": "c", "image": "local/busybox:1"}]}),
    );
    object.metadata.uid = format!("uid-{name}");
    object
}

fn key(name: &str) -> ObjectKey {
    ObjectKey::new(Kind::Pod, Some("default"), name)
}

/// What the handler heard, as `+name` and `-name`.
type Heard = Arc<Mutex<Vec<String>>>;

async fn wait_for(heard: &Heard, entry: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !heard.lock().expect("heard").iter().any(|e| e == entry) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the informer never reported {entry}; heard {:?}",
            heard.lock().expect("heard")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn the_informer_survives_a_restart_and_an_expired_watch() {
    let store = Arc::new(SqliteStore::open_in_memory().expect("a store"));
    store.create(pod("a"), &change("first")).await.expect("a");
    let mut server = ApiServer::start(store.clone()).await;
    let client = server.client().await;

    let shutdown = CancellationToken::new();
    let informer = Informer::start(client, Scope::all(Kind::Pod), Vec::new(), shutdown.clone());
    let heard: Heard = Arc::default();
    informer.on_change(
        |key, _| heard.lock().expect("heard").push(format!("+{}", key.name)),
        {
            let heard = heard.clone();
            move |change| {
                let entry = match change {
                    Change::Applied { key, .. } => format!("+{}", key.name),
                    Change::Deleted { key, .. } => format!("-{}", key.name),
                };
                heard.lock().expect("heard").push(entry);
            }
        },
    );
    informer.synced().await;
    wait_for(&heard, "+a").await;

    // A change while the server is down is replayed when it is back.
    server.stop().await;
    store
        .create(pod("b"), &change("while down"))
        .await
        .expect("b");
    server.run().await;
    wait_for(&heard, "+b").await;

    // Down again; meanwhile the store forgets the changes the informer
    // would resume from: the watch is expired, and the informer lists again.
    server.stop().await;
    store
        .create(pod("c"), &change("forgotten"))
        .await
        .expect("c");
    store
        .delete(&key("a"), None, &change("gone"))
        .await
        .expect("delete a");
    let newest = store.current_revision().await.expect("revision");
    store.compact_events(newest).await.expect("compact events");
    server.run().await;
    wait_for(&heard, "+c").await;
    wait_for(&heard, "-a").await;

    let cached: Vec<String> = {
        let mut names: Vec<String> = informer
            .cache()
            .list()
            .iter()
            .map(|(key, _)| key.name.clone())
            .collect();
        names.sort();
        names
    };
    assert_eq!(cached, ["b", "c"]);
    shutdown.cancel();
    server.stop().await;
}

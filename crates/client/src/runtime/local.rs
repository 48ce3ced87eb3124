//! The in-process fast path of an informer's list and watch.
//!
//! A controller that runs inside the API server's own process (the
//! built-in scheduler, IPAM, lifecycle, …) need not list and watch its own
//! server over HTTPS: the server installs a [`LocalReads`] on the
//! controller's [`Client`] and the informer asks it instead. It answers
//! from the server's watch cache with the semantics of the HTTP list and
//! watch (scopes, resume after a `resourceVersion`, `410 Gone` to list
//! again) and the same authorisation, without encoding, TLS or HTTP.
//!
//! Only the informer's reads take this path. Writes, and every other call
//! of the client, still go through the API like any controller's. Agents
//! and external controllers have no [`LocalReads`] and use HTTP.

use std::sync::Arc;

use corral_api::watch::{ObjectList, WatchEvent};
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{StreamExt, TryFutureExt};

use super::Scope;
use crate::{Client, ClientError};

/// The changes a watch delivers, in store order; ends on error (`410
/// Gone`: list again) or when the server stops.
pub type LocalEvents = BoxStream<'static, Result<WatchEvent, ClientError>>;

/// Lists and watches answered in the server's own process, as the caller
/// holding `token` would be answered over HTTP: the same objects, the same
/// fields (a controller's read mask), the same errors.
pub trait LocalReads: Send + Sync + std::fmt::Debug {
    /// Every object in `scope`, and the `resourceVersion` to watch from.
    fn list<'a>(
        &'a self,
        token: &'a str,
        scope: &'a Scope,
    ) -> BoxFuture<'a, Result<ObjectList, ClientError>>;

    /// The changes in `scope` after store revision `after`, then live ones.
    /// An `after` the server can no longer resume from is `410 Gone`.
    fn watch<'a>(
        &'a self,
        token: &'a str,
        scope: &'a Scope,
        after: u64,
    ) -> BoxFuture<'a, Result<LocalEvents, ClientError>>;
}

impl Client {
    /// This client with `reads` answering its informers' lists and
    /// watches in-process (the server does this for its built-in
    /// controllers).
    #[must_use]
    pub fn with_local_reads(mut self, reads: Arc<dyn LocalReads>) -> Self {
        self.local = Some(reads);
        self
    }

    /// Whether informers of this client read in-process.
    pub fn reads_locally(&self) -> bool {
        self.local.is_some()
    }

    /// An informer's list: in-process when this client can, else HTTP.
    pub(crate) async fn informer_list(&self, scope: &Scope) -> Result<ObjectList, ClientError> {
        match &self.local {
            Some(local) => local.list(&self.token, scope).await,
            None => self.list_scope_all(scope).await,
        }
    }

    /// An informer's watch: in-process when this client can, else HTTP.
    pub(crate) async fn informer_watch(
        &self,
        scope: &Scope,
        after: u64,
    ) -> Result<LocalEvents, ClientError> {
        match &self.local {
            Some(local) => local.watch(&self.token, scope, after).await,
            None => {
                self.watch_scope(scope, after)
                    .map_ok(StreamExt::boxed)
                    .await
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::Mutex;
    use std::time::Duration;

    use corral_api::watch::EventType;
    use corral_api::{Kind, Object};
    use serde_json::json;
    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::ClientConfig;
    use crate::runtime::{Change, Informer};

    /// Answers lists and watches from a script, and remembers the tokens
    /// it was asked with.
    #[derive(Debug, Default)]
    struct Scripted {
        lists: Mutex<VecDeque<ObjectList>>,
        watches: Mutex<VecDeque<Vec<Result<WatchEvent, ClientError>>>>,
        asked: Mutex<Vec<String>>,
    }

    impl LocalReads for Scripted {
        fn list<'a>(
            &'a self,
            token: &'a str,
            _scope: &'a Scope,
        ) -> BoxFuture<'a, Result<ObjectList, ClientError>> {
            self.asked
                .lock()
                .expect("asked")
                .push(format!("list {token}"));
            let next = self.lists.lock().expect("lists").pop_front();
            Box::pin(async move { next.ok_or_else(|| ClientError::Watch("no more lists".into())) })
        }

        fn watch<'a>(
            &'a self,
            token: &'a str,
            _scope: &'a Scope,
            after: u64,
        ) -> BoxFuture<'a, Result<LocalEvents, ClientError>> {
            self.asked
                .lock()
                .expect("asked")
                .push(format!("watch {token} after {after}"));
            let next = self.watches.lock().expect("watches").pop_front();
            Box::pin(async move {
                Ok(match next {
                    Some(events) => futures::stream::iter(events).boxed(),
                    None => futures::stream::pending().boxed(),
                })
            })
        }
    }

    fn pod(name: &str, revision: u64) -> Object {
        let mut object = Object::new(Kind::Pod, Some("default"), name, json!({}));
        object.metadata.resource_version = revision;
        object
    }

    fn gone() -> ClientError {
        ClientError::Api {
            status: 410,
            code: "Gone".into(),
            message: "the window moved on; list again".into(),
            fields: Vec::new(),
        }
    }

    #[tokio::test]
    async fn an_informer_reads_in_process_and_lists_again_when_gone() {
        let reads = Arc::new(Scripted::default());
        reads.lists.lock().expect("lists").extend([
            ObjectList {
                items: vec![pod("a", 1), pod("b", 2)],
                resource_version: 2,
                continue_token: None,
            },
            ObjectList {
                items: vec![pod("a", 3), pod("c", 5)],
                resource_version: 5,
                continue_token: None,
            },
        ]);
        reads.watches.lock().expect("watches").push_back(vec![
            Ok(WatchEvent::new(EventType::Modified, pod("a", 3))),
            Err(gone()),
        ]);
        // No server listens here: every answer must come from `reads`.
        let client = Client::new(&ClientConfig {
            server: "https://127.0.0.1:1".into(),
            token: "the-token".into(),
            ca: None,
        })
        .expect("a client")
        .with_local_reads(reads.clone());
        assert!(client.reads_locally());

        let shutdown = CancellationToken::new();
        let informer = Informer::start(client, Scope::all(Kind::Pod), Vec::new(), shutdown.clone());
        // Registered before the follower first runs (one-threaded test
        // runtime): every change is heard.
        let heard = Arc::new(Mutex::new(Vec::new()));
        informer.on_change(|_, _| unreachable!("nothing is cached yet"), {
            let heard = heard.clone();
            move |change| {
                let entry = match change {
                    Change::Applied { key, new, .. } => {
                        format!("+{}@{}", key.name, new.metadata.resource_version)
                    }
                    Change::Deleted { key, .. } => format!("-{}", key.name),
                };
                heard.lock().expect("heard").push(entry);
            }
        });
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while informer.cache().resource_version() < 5 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the informer never listed again; heard {:?}",
                heard.lock().expect("heard")
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let heard = heard.lock().expect("heard").clone();
        let mut first_list = heard[..2].to_vec();
        first_list.sort();
        assert_eq!(first_list, ["+a@1", "+b@2"], "heard {heard:?}");
        assert_eq!(heard[2..], ["+a@3", "-b", "+c@5"], "heard {heard:?}");
        let mut names: Vec<String> = informer
            .cache()
            .list()
            .into_iter()
            .map(|(key, _)| key.name)
            .collect();
        names.sort();
        assert_eq!(names, ["a", "c"]);
        assert_eq!(
            reads.asked.lock().expect("asked")[..3],
            [
                "list the-token".to_string(),
                "watch the-token after 2".to_string(),
                "list the-token".to_string(),
            ]
        );
        shutdown.cancel();
    }
}

//! Objects: read, list, apply, create, status, delete, and their history
//! (revisions, diffs, rollbacks, the cluster-wide query).

use corral_api::history::RevisionDiff;
use corral_api::watch::ObjectList;
use corral_api::{Cascade, HistoryQuery, Kind, Object, ObjectKey, RevisionRecord};
use reqwest::Method;

use crate::watch::scope;
use crate::{Client, ClientError, collection_path, object_path};

impl Client {
    pub async fn get(&self, key: &ObjectKey) -> Result<Object, ClientError> {
        self.call(self.request(Method::GET, &object_path(key)))
            .await
    }

    /// Objects of a kind in one namespace or all, optionally by label
    /// selector, sorted by namespace then name, read [`LIST_PAGE`](crate::LIST_PAGE) at a
    /// time; the `resourceVersion` is the first page's, so a watch from it
    /// misses nothing.
    pub async fn list(
        &self,
        kind: Kind,
        namespace: Option<&str>,
        selector: Option<&str>,
    ) -> Result<ObjectList, ClientError> {
        self.list_scope_all(&scope(kind, namespace, selector)).await
    }

    /// One page of a list: at most `limit` objects after the position
    /// `continue_token` (from the previous page's `continue_token`) names;
    /// the page's `continue_token` is `None` on the last page.
    pub async fn list_page(
        &self,
        kind: Kind,
        namespace: Option<&str>,
        selector: Option<&str>,
        limit: usize,
        continue_token: Option<&str>,
    ) -> Result<ObjectList, ClientError> {
        let scope = scope(kind, namespace, selector);
        self.list_scope_page(&scope, limit, continue_token).await
    }

    /// Creates or updates an object (compare-and-swap when it carries a
    /// `resourceVersion`), recording `message` in history.
    pub async fn apply(
        &self,
        object: &Object,
        message: Option<&str>,
    ) -> Result<Object, ClientError> {
        let request = self
            .request(Method::PUT, &object_path(&object.key()))
            .query(&[("message", message.unwrap_or_default())])
            .json(object);
        self.call(request).await
    }

    /// Creates an object; fails if it exists.
    pub async fn create(
        &self,
        object: &Object,
        message: Option<&str>,
    ) -> Result<Object, ClientError> {
        let key = object.key();
        let namespace = (!key.namespace.is_empty()).then_some(key.namespace.as_str());
        let request = self
            .request(Method::POST, &collection_path(key.kind, namespace))
            .query(&[("message", message.unwrap_or_default())])
            .json(object);
        self.call(request).await
    }

    /// Replaces an object's status (compare-and-swap when it carries a
    /// `resourceVersion`).
    pub async fn put_status(&self, object: &Object) -> Result<Object, ClientError> {
        self.put_status_with_message(object, None).await
    }

    /// [`Client::put_status`] with a message for the history record a
    /// status change may make (a pod's move between nodes).
    pub async fn put_status_with_message(
        &self,
        object: &Object,
        message: Option<&str>,
    ) -> Result<Object, ClientError> {
        let path = format!("{}/status", object_path(&object.key()));
        let mut request = self.request(Method::PUT, &path).json(object);
        if let Some(message) = message {
            request = request.query(&[("message", message)]);
        }
        self.call(request).await
    }

    /// Deletes the object at `key` and its dependents.
    pub async fn delete(
        &self,
        key: &ObjectKey,
        message: Option<&str>,
    ) -> Result<Object, ClientError> {
        self.delete_with(key, message, Cascade::Delete).await
    }

    /// Deletes the object at `key`; `cascade` says what happens to the
    /// objects it owns (deleted too, or kept without an owner).
    pub async fn delete_with(
        &self,
        key: &ObjectKey,
        message: Option<&str>,
        cascade: Cascade,
    ) -> Result<Object, ClientError> {
        let options = DeleteOptions {
            message,
            cascade,
            ..DeleteOptions::default()
        };
        self.delete_as(key, &options).await
    }

    /// Deletes the object at `key` as `options` say. A Pod a node took is
    /// answered while its stop workflow runs (`metadata.deleting` set); it
    /// is gone when that finishes.
    pub async fn delete_as(
        &self,
        key: &ObjectKey,
        options: &DeleteOptions<'_>,
    ) -> Result<Object, ClientError> {
        let mut query = vec![
            ("message", options.message.unwrap_or_default().to_string()),
            ("cascade", options.cascade.as_str().to_string()),
        ];
        if options.force {
            query.push(("force", "true".to_string()));
        }
        for step in options.skip {
            query.push(("skip", step.clone()));
        }
        let request = self
            .request(Method::DELETE, &object_path(key))
            .query(&query);
        self.call(request).await
    }

    pub async fn history(&self, key: &ObjectKey) -> Result<Vec<RevisionRecord>, ClientError> {
        let path = format!("{}/history", object_path(key));
        self.call(self.request(Method::GET, &path)).await
    }

    /// The newest `limit` (at least one) revisions, oldest first.
    pub async fn recent_history(
        &self,
        key: &ObjectKey,
        limit: usize,
    ) -> Result<Vec<RevisionRecord>, ClientError> {
        let path = format!("{}/history", object_path(key));
        let limit = [("limit", limit.max(1).to_string())];
        self.call(self.request(Method::GET, &path).query(&limit))
            .await
    }

    pub async fn revision(
        &self,
        key: &ObjectKey,
        revision: u64,
    ) -> Result<RevisionRecord, ClientError> {
        let path = format!("{}/history/{revision}", object_path(key));
        self.call(self.request(Method::GET, &path)).await
    }

    pub async fn diff(
        &self,
        key: &ObjectKey,
        from: u64,
        to: Option<u64>,
    ) -> Result<RevisionDiff, ClientError> {
        let path = format!("{}/diff", object_path(key));
        let mut query = vec![("from", from.to_string())];
        if let Some(to) = to {
            query.push(("to", to.to_string()));
        }
        self.call(self.request(Method::GET, &path).query(&query))
            .await
    }

    /// A Secret's values (of revision `revision`, default the current
    /// one), for callers who may read them.
    pub async fn reveal(
        &self,
        key: &ObjectKey,
        revision: Option<u64>,
    ) -> Result<corral_api::kinds::RevealedSecret, ClientError> {
        self.reveal_for(key, revision, None).await
    }

    /// Nodes: the values of a Secret for `pod` (of the Secret's namespace),
    /// which must be bound to the node and use the Secret.
    pub async fn reveal_for(
        &self,
        key: &ObjectKey,
        revision: Option<u64>,
        pod: Option<&str>,
    ) -> Result<corral_api::kinds::RevealedSecret, ClientError> {
        let path = format!("{}/reveal", object_path(key));
        let mut request = self.request(Method::GET, &path);
        if let Some(revision) = revision {
            request = request.query(&[("revision", revision)]);
        }
        if let Some(pod) = pod {
            request = request.query(&[("pod", pod)]);
        }
        self.call(request).await
    }

    /// Operators: a new secrets data key; every value sealed again.
    pub async fn rotate_secrets_key(&self) -> Result<serde_json::Value, ClientError> {
        self.call(self.request(Method::POST, "/v1/secrets/rotate-key"))
            .await
    }

    pub async fn rollback(
        &self,
        key: &ObjectKey,
        to: u64,
        message: Option<&str>,
    ) -> Result<Object, ClientError> {
        let path = format!("{}/rollback", object_path(key));
        let body = serde_json::json!({"to": to, "message": message});
        self.call(self.request(Method::POST, &path).json(&body))
            .await
    }

    /// Cluster-wide history, oldest first.
    pub async fn cluster_history(
        &self,
        query: &HistoryQuery,
    ) -> Result<Vec<RevisionRecord>, ClientError> {
        let mut params: Vec<(&str, String)> = Vec::new();
        if let Some(since) = query.since {
            params.push(("since", since.to_rfc3339()));
        }
        params.extend(query.authors.iter().map(|a| ("author", a.clone())));
        params.extend(
            query
                .exclude_authors
                .iter()
                .map(|a| ("excludeAuthor", a.clone())),
        );
        if let Some(class) = query.class {
            params.push(("class", class.as_str().to_string()));
        }
        if let Some(kind) = query.kind {
            params.push(("kind", kind.as_str().to_string()));
        }
        if let Some(limit) = query.limit {
            params.push(("limit", limit.to_string()));
        }
        self.call(self.request(Method::GET, "/v1/history").query(&params))
            .await
    }
}

/// How a deletion goes besides its cascade.
#[derive(Debug, Clone, Copy, Default)]
pub struct DeleteOptions<'a> {
    pub message: Option<&'a str>,
    pub cascade: Cascade,
    /// Skip every step of the stop workflow not done yet: removed now.
    pub force: bool,
    /// Skip these steps of the stop workflow.
    pub skip: &'a [String],
}

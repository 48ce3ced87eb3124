//! Watch streams (newline-delimited JSON events, split into lines by
//! `tokio_util`'s `LinesCodec`) and paged lists of a scope.

use corral_api::Kind;
use corral_api::watch::{ObjectList, WatchEvent};
use futures::{Stream, StreamExt};
use reqwest::{Method, StatusCode};
use tokio_util::codec::{FramedRead, LinesCodec};
use tokio_util::io::StreamReader;

use crate::{Client, ClientError, LIST_PAGE, api_error, collection_path, runtime};

impl Client {
    /// Changes to objects of `kind` after store revision `after`, as they
    /// happen. The stream ends when the server ends it or on error.
    pub async fn watch(
        &self,
        kind: Kind,
        namespace: Option<&str>,
        name: Option<&str>,
        after: u64,
    ) -> Result<impl Stream<Item = Result<WatchEvent, ClientError>> + Send + use<>, ClientError>
    {
        let scope = runtime::Scope {
            namespace: namespace.map(str::to_string),
            ..runtime::Scope::all(kind)
        };
        let mut query = Vec::new();
        if let Some(name) = name {
            query.push(("name", name.to_string()));
        }
        self.open_watch(&scope, query, after).await
    }

    /// Changes to the objects in `scope` after store revision `after`. A
    /// node-scoped watch also delivers, as a deletion, each object that
    /// leaves the node. An expired `after` is a 410 error.
    pub async fn watch_scope(
        &self,
        scope: &runtime::Scope,
        after: u64,
    ) -> Result<impl Stream<Item = Result<WatchEvent, ClientError>> + Send + use<>, ClientError>
    {
        self.open_watch(scope, Vec::new(), after).await
    }

    async fn open_watch(
        &self,
        scope: &runtime::Scope,
        mut query: Vec<(&'static str, String)>,
        after: u64,
    ) -> Result<impl Stream<Item = Result<WatchEvent, ClientError>> + Send + use<>, ClientError>
    {
        query.push(("watch", "true".to_string()));
        query.push(("resourceVersion", after.to_string()));
        query.extend(scope.query());
        let path = collection_path(scope.kind, scope.namespace.as_deref());
        let response = self
            .execute(self.request(Method::GET, &path).query(&query))
            .await?;
        let status = response.status();
        if !status.is_success() {
            let body = response.bytes().await.unwrap_or_default();
            return Err(api_error(status, &body));
        }
        // Lines of the response body (`LinesCodec` keeps a partial line
        // until the rest arrives); blank lines are keep-alives.
        let body = response
            .bytes_stream()
            .map(|chunk| chunk.map_err(std::io::Error::other));
        let mut lines = FramedRead::new(StreamReader::new(body), LinesCodec::new());
        let (sender, receiver) = tokio::sync::mpsc::channel(64);
        tokio::spawn(async move {
            loop {
                // Stop reading (and so close the connection) once the
                // stream's receiver is gone, even if no event comes.
                let line = tokio::select! {
                    line = lines.next() => line,
                    () = sender.closed() => return,
                };
                let (event, last) = match line {
                    None => return,
                    Some(Ok(line)) if line.trim().is_empty() => continue,
                    Some(Ok(line)) => (decode_watch_line(line.as_bytes()), false),
                    Some(Err(error)) => (Err(ClientError::Watch(error.to_string())), true),
                };
                if sender.send(event).await.is_err() || last {
                    return; // the stream was dropped, or the connection failed
                }
            }
        });
        Ok(futures::stream::unfold(
            receiver,
            |mut receiver| async move { receiver.recv().await.map(|item| (item, receiver)) },
        ))
    }

    /// One page of the objects in `scope`: at most `limit`, after the
    /// position `continue_token` (from the previous page) names.
    pub async fn list_scope_page(
        &self,
        scope: &runtime::Scope,
        limit: usize,
        continue_token: Option<&str>,
    ) -> Result<ObjectList, ClientError> {
        let mut query = scope.query();
        query.push(("limit", limit.max(1).to_string()));
        if let Some(token) = continue_token {
            query.push(("continue", token.to_string()));
        }
        let path = collection_path(scope.kind, scope.namespace.as_deref());
        self.call(self.request(Method::GET, &path).query(&query))
            .await
    }

    /// Every object in `scope`, read [`LIST_PAGE`] at a time; the
    /// resourceVersion is the first page's, so a watch from it misses
    /// nothing.
    pub async fn list_scope_all(&self, scope: &runtime::Scope) -> Result<ObjectList, ClientError> {
        let mut list = self.list_scope_page(scope, LIST_PAGE, None).await?;
        let mut next = list.continue_token.take();
        while let Some(token) = next {
            let page = self.list_scope_page(scope, LIST_PAGE, Some(&token)).await?;
            list.items.extend(page.items);
            next = page.continue_token;
        }
        Ok(list)
    }
}

pub(crate) fn scope(kind: Kind, namespace: Option<&str>, selector: Option<&str>) -> runtime::Scope {
    runtime::Scope {
        namespace: namespace.map(str::to_string),
        selector: selector.map(str::to_string),
        ..runtime::Scope::all(kind)
    }
}

fn decode_watch_line(line: &[u8]) -> Result<WatchEvent, ClientError> {
    let value: serde_json::Value = serde_json::from_slice(line).map_err(ClientError::Decode)?;
    if value.get("type").and_then(|t| t.as_str()) == Some("ERROR") {
        let message = value
            .pointer("/error/message")
            .and_then(|m| m.as_str())
            .unwrap_or("the server ended the watch");
        // A window that moved on is told apart, so watchers list again.
        if value.pointer("/error/code").and_then(|c| c.as_str()) == Some("Gone") {
            return Err(ClientError::Api {
                status: StatusCode::GONE.as_u16(),
                code: "Gone".to_string(),
                message: message.to_string(),
                fields: Vec::new(),
            });
        }
        return Err(ClientError::Watch(message.to_string()));
    }
    serde_json::from_value(value).map_err(ClientError::Decode)
}

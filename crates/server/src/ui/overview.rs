//! The overview's live tables: one server-sent-event stream per page that
//! lists, then watches (from the watch cache, as `GET …?watch=1` does),
//! every kind in [`KINDS`] of one namespace and sends each object as a
//! ready-made row — the same cells and status reasons as `corral get`.
//! Adding a kind to the overview is one entry in [`KINDS`] (and a
//! [`cells`] arm if its columns differ from the generic phase and message).

use std::convert::Infallible;

use axum::extract::{Query, State};
use axum::http::Method;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use corral_api::kinds::{NodeStatus, PodStatus};
use corral_api::watch::EventType;
use corral_api::{Kind, Object};
use futures::{Stream, StreamExt, stream};
use serde::Deserialize;
use serde_json::{Value, json};

use super::session::Session;
use crate::SharedServer;
use crate::error::ApiError;
use crate::watchcache::{ListRequest, Scope};

/// The kinds the overview shows, in order.
pub const KINDS: &[Kind] = &[
    Kind::Node,
    Kind::Pod,
    Kind::VirtualMachine,
    Kind::PinnedDeployment,
    Kind::PerNodeDeployment,
    Kind::Job,
    Kind::LoadBalancer,
];

/// The column headers of `kind`'s table (NAME first).
pub fn headers(kind: Kind) -> &'static [&'static str] {
    match kind {
        Kind::Node => &["NAME", "PHASE", "CPU", "MEMORY", "PODS", "KVM", "PROBLEM"],
        Kind::Pod => &["NAME", "REVISION", "STATUS", "READY", "RESTARTS", "NODE"],
        Kind::PinnedDeployment => &["NAME", "REVISION", "PREVIOUS", "NEXT"],
        Kind::LoadBalancer => &["NAME", "REVISION", "ADDRESSES", "PORTS", "READY"],
        Kind::Job => &[
            "NAME",
            "REVISION",
            "STATUS",
            "COMPLETIONS",
            "ACTIVE",
            "FAILED",
        ],
        Kind::PerNodeDeployment => &["NAME", "REVISION", "DESIRED", "CURRENT", "READY"],
        // NAME, REVISION, then `corral_api::kinds::VM_HEADERS`.
        Kind::VirtualMachine => &["NAME", "REVISION", "PHASE", "NODE", "MESSAGE"],
        _ => &["NAME", "REVISION", "PHASE", "NODE", "MESSAGE"],
    }
}

/// The cells of `object`'s row, one per [`headers`] entry.
pub fn cells(object: &Object, now: DateTime<Utc>) -> Vec<String> {
    let name = object.metadata.name.clone();
    let revision = object.metadata.revision.to_string();
    let text = |path: &str| {
        object
            .status
            .get(path)
            .and_then(Value::as_str)
            .unwrap_or("-")
            .to_string()
    };
    match object.kind {
        Kind::Node => {
            let status: NodeStatus = object.typed_status().unwrap_or_default();
            vec![
                name,
                format!("{:?}", status.phase),
                status.capacity.cpu.to_string(),
                status.capacity.memory.to_string(),
                status.capacity.pods.to_string(),
                status
                    .features
                    .get("kvm")
                    .cloned()
                    .unwrap_or_else(|| "-".into()),
                status.problem(now).unwrap_or_else(|| "-".into()),
            ]
        }
        Kind::Pod => {
            let status: PodStatus = object.typed_status().unwrap_or_default();
            vec![
                name,
                revision,
                corral_api::kinds::pod_status_word(object),
                status.ready_count(),
                status.restarts().to_string(),
                status.node.clone().unwrap_or_else(|| "-".into()),
            ]
        }
        Kind::PinnedDeployment => {
            let status: corral_api::kinds::PinnedDeploymentStatus =
                object.typed_status().unwrap_or_default();
            let version = |v: &corral_api::kinds::VersionStatus| {
                format!("{}/{} ready of {}", v.ready, v.current, v.desired)
            };
            vec![
                name,
                revision,
                version(&status.previous),
                version(&status.next),
            ]
        }
        Kind::LoadBalancer => [name, revision]
            .into_iter()
            .chain(corral_api::kinds::load_balancer_columns(object))
            .collect(),
        Kind::Job => [name, revision]
            .into_iter()
            .chain(corral_api::kinds::job_columns(object))
            .collect(),
        Kind::PerNodeDeployment => [name, revision]
            .into_iter()
            .chain(corral_api::kinds::per_node_columns(object))
            .collect(),
        Kind::VirtualMachine => [name, revision]
            .into_iter()
            .chain(corral_api::kinds::vm_columns(object))
            .collect(),
        _ => vec![name, revision, text("phase"), text("node"), text("message")],
    }
}

#[derive(Debug, Deserialize)]
pub struct LiveQuery {
    namespace: Option<String>,
}

/// `GET /ui/live?namespace=NS`: a `kinds` event (each kind's plural and
/// headers), then a `row` event per object listed or changed, `{"plural",
/// "namespace", "name", "cells", "deleted"}`. A kind the caller may not
/// read is left out with an `error` event naming the rule.
pub async fn live(
    State(server): State<SharedServer>,
    session: Session,
    Query(query): Query<LiveQuery>,
) -> Response {
    let namespace = query
        .namespace
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| super::pages::default_namespace(&session.caller));
    let mut first = vec![json_event(
        "kinds",
        &json!(
            KINDS
                .iter()
                .map(|kind| json!({"plural": kind.plural(), "title": kind.as_str(), "headers": headers(*kind)}))
                .collect::<Vec<_>>()
        ),
    )];
    let mut streams = Vec::new();
    for kind in KINDS {
        match kind_rows(&server, &session, *kind, &namespace).await {
            Ok((listed, changes)) => {
                first.extend(listed);
                streams.push(changes);
            }
            Err(error) => first.push(json_event(
                "error",
                &json!({"plural": kind.plural(), "message": error.to_string()}),
            )),
        }
    }
    let events = stream::iter(first)
        .chain(stream::select_all(streams))
        .take_until(server.stopping.clone().cancelled_owned())
        .map(Ok::<_, Infallible>);
    Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response()
}

type Rows = std::pin::Pin<Box<dyn Stream<Item = Event> + Send>>;

/// `kind`'s rows in `namespace` now, and its changes after.
async fn kind_rows(
    server: &SharedServer,
    session: &Session,
    kind: Kind,
    namespace: &str,
) -> Result<(Vec<Event>, Rows), ApiError> {
    let path = if kind.is_namespaced() {
        format!("/v1/namespaces/{namespace}/{}", kind.plural())
    } else {
        format!("/v1/{}", kind.plural())
    };
    crate::scope::check(&session.caller, &Method::GET, &path, None)?;
    let scope = Scope {
        namespace: kind.is_namespaced().then(|| namespace.to_string()),
        ..Scope::default()
    };
    let mut listed = Vec::new();
    let mut request = ListRequest {
        kind,
        scope: scope.clone(),
        limit: Some(500),
        continue_token: None,
    };
    let after = loop {
        let page = server.cache.list(&request).await?;
        for cached in &page.items {
            if let Ok(object) = cached.decode() {
                listed.push(row_event(&object, false));
            }
        }
        match page.continue_token {
            Some(token) => request.continue_token = Some(token),
            None => break page.resource_version,
        }
    };
    let changes = server
        .cache
        .watch(kind, scope, after)
        .await?
        .ok_or_else(|| ApiError::Gone("the watch window moved on; reload".into()))?;
    let rows = changes
        .map(|change| match change {
            Ok((event_type, cached)) => match cached.decode() {
                Ok(object) => row_event(&object, event_type == EventType::Deleted),
                Err(error) => json_event("error", &json!({"message": error.to_string()})),
            },
            // The page reconnects (EventSource does) and lists again.
            Err(gone) => json_event("gone", &json!({"message": gone.0})),
        })
        .boxed();
    Ok((listed, rows))
}

fn row_event(object: &Object, deleted: bool) -> Event {
    json_event(
        "row",
        &json!({
            "plural": object.kind.plural(),
            "namespace": object.metadata.namespace,
            "name": object.metadata.name,
            "cells": cells(object, Utc::now()),
            "deleted": deleted,
        }),
    )
}

fn json_event(name: &str, data: &Value) -> Event {
    Event::default().event(name).data(data.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_as_many_cells_as_headers() {
        for kind in KINDS {
            let object = Object::new(
                *kind,
                kind.is_namespaced().then_some("default"),
                "x",
                Value::Null,
            );
            assert_eq!(
                cells(&object, Utc::now()).len(),
                headers(*kind).len(),
                "{kind}"
            );
        }
    }

    #[test]
    fn a_pod_row_says_what_get_says() {
        let mut pod = Object::new(Kind::Pod, Some("default"), "web", Value::Null);
        let status = PodStatus::default();
        pod.status = serde_json::to_value(&status).unwrap_or_default();
        assert_eq!(cells(&pod, Utc::now())[2], status.reason());
    }

    #[test]
    fn a_vm_row_has_get_s_columns_and_shows_a_stopped_vm() {
        assert_eq!(
            headers(Kind::VirtualMachine)[2..],
            corral_api::kinds::VM_HEADERS
        );
        let mut vm = Object::new(Kind::VirtualMachine, Some("default"), "vm", Value::Null);
        vm.status = serde_json::json!({"phase": "Stopped", "node": "n1", "message": "stopped"});
        assert_eq!(cells(&vm, Utc::now())[2..], ["Stopped", "n1", "stopped"]);
    }
}

//! HTML fragments of the object page, rendered on the server from the same
//! data and renderers as the CLI: the object (`get -o yaml`), its workflow
//! (`why` — the verdict line and the graph of `analyze dot`, as SVG), its
//! history (`history`), a side-by-side diff of two revisions (`diff`) and
//! its step logs (`logs --steps`). The page fetches them with its cookie;
//! each is checked against the caller's scope as the `/v1` read it mirrors.

use std::fmt::Write;

use axum::extract::{Path, Query, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use chrono::Utc;
use corral_api::{Kind, Object, ObjectKey};
use corral_store::StepLogFilter;
use serde::Deserialize;
use serde_json::Value;

use super::pages::escape;
use super::session::Session;
use crate::SharedServer;
use crate::error::ApiError;
use crate::render::to_yaml;

#[derive(Debug, Deserialize)]
pub struct PartQuery {
    namespace: Option<String>,
    from: Option<u64>,
    to: Option<u64>,
}

/// `GET /ui/part/{part}/{plural}/{name}?namespace=&from=&to=`.
pub async fn part(
    State(server): State<SharedServer>,
    session: Session,
    Path((part, plural, name)): Path<(String, String, String)>,
    Query(query): Query<PartQuery>,
) -> Response {
    match render(&server, &session, &part, &plural, &name, &query).await {
        Ok(html) => ([(CONTENT_TYPE, "text/html; charset=utf-8")], html).into_response(),
        Err(error) => {
            let status = match &error {
                ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
                ApiError::NotFound(_) => StatusCode::NOT_FOUND,
                _ => StatusCode::BAD_REQUEST,
            };
            let html = format!("<p class=\"error\">{}</p>", escape(&error.to_string()));
            (status, [(CONTENT_TYPE, "text/html; charset=utf-8")], html).into_response()
        }
    }
}

/// The object's key, once the caller may read it.
pub fn readable_key(
    session: &Session,
    plural: &str,
    namespace: Option<&str>,
    name: &str,
) -> Result<ObjectKey, ApiError> {
    let kind: Kind = plural
        .parse()
        .map_err(|e: corral_api::UnknownKind| ApiError::NotFound(e.to_string()))?;
    let namespace = namespace.filter(|n| !n.is_empty()).unwrap_or("default");
    let path = if kind.is_namespaced() {
        format!("/v1/namespaces/{namespace}/{plural}/{name}")
    } else {
        format!("/v1/{plural}/{name}")
    };
    crate::scope::check(&session.caller, &Method::GET, &path, None)?;
    Ok(ObjectKey::new(kind, Some(namespace), name))
}

async fn render(
    server: &SharedServer,
    session: &Session,
    part: &str,
    plural: &str,
    name: &str,
    query: &PartQuery,
) -> Result<String, ApiError> {
    let key = readable_key(session, plural, query.namespace.as_deref(), name)?;
    match part {
        "object" => Ok(object_part(&current(server, &key).await?)),
        "summary" => Ok(summary_part(&current(server, &key).await?)),
        "why" => why_part(server, &key).await,
        "history" => history_part(server, &key).await,
        "diff" => {
            let from = query.from.ok_or_else(|| {
                ApiError::BadRequest("from: a revision number is required".into())
            })?;
            let to = match query.to {
                Some(to) => to,
                None => current(server, &key).await?.metadata.revision,
            };
            diff_part(server, &key, from, to).await
        }
        "steplogs" => steplogs_part(server, &key).await,
        other => Err(ApiError::NotFound(format!(
            "part: {other:?} is not one of object, summary, why, history, diff, steplogs"
        ))),
    }
}

async fn current(server: &SharedServer, key: &ObjectKey) -> Result<Object, ApiError> {
    server
        .store
        .get(key)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("{key} not found")))
}

fn object_part(object: &Object) -> String {
    format!(
        "<div class=\"columns\"><div><h3>spec</h3><pre id=\"spec\">{}</pre></div>\
         <div><h3>status</h3><pre id=\"status\">{}</pre></div></div>",
        escape(&to_yaml(&object.spec)),
        escape(&to_yaml(&object.status))
    )
}

/// The facts a person looks for first: revision, age, owner, and for a
/// VM its node, phase, size, disk and network.
fn summary_part(object: &Object) -> String {
    let mut rows: Vec<(&str, String)> = vec![
        ("revision", object.metadata.revision.to_string()),
        (
            "created",
            object
                .metadata
                .created_at
                .map(|t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string())
                .unwrap_or_default(),
        ),
        (
            "owner",
            object
                .metadata
                .owner
                .as_ref()
                .map_or_else(|| "-".into(), ToString::to_string),
        ),
    ];
    if object.kind == Kind::VirtualMachine {
        let status = |field: &str| {
            object
                .status
                .get(field)
                .and_then(Value::as_str)
                .unwrap_or("-")
                .to_string()
        };
        let spec = object
            .typed_spec::<corral_api::kinds::VirtualMachineSpec>()
            .ok();
        let disk = spec.as_ref().and_then(|s| s.disk.as_ref()).map_or_else(
            || "none".to_string(),
            |disk| {
                let source = match (&disk.volume, &disk.image) {
                    (Some(volume), _) => format!("local volume {volume}"),
                    (None, Some(image)) => format!("image {image} (copy-on-write)"),
                    (None, None) => "a disk of its own".into(),
                };
                match &disk.size {
                    Some(size) => format!("{source}, {size}"),
                    None => source,
                }
            },
        );
        let asked = match &spec {
            Some(spec) if spec.template => "never runs: a template".to_string(),
            Some(spec) if !spec.running => {
                "stopped: its spec asks for it (spec.running: false); Start runs it again"
                    .to_string()
            }
            Some(_) => "run".to_string(),
            None => "-".to_string(),
        };
        rows.extend([
            ("node", status("node")),
            ("asked", asked),
            ("phase", status("phase")),
            ("message", status("message")),
            (
                "size",
                spec.as_ref()
                    .map(|s| format!("{} vCPU, {} memory", s.cpus, s.memory))
                    .unwrap_or_default(),
            ),
            ("disk", disk),
            ("network", status("address")),
        ]);
    }
    let mut html = String::from("<table id=\"summary\"><tbody>");
    for (name, value) in rows {
        let _ = write!(
            html,
            "<tr data-field=\"{name}\"><th>{name}</th><td>{}</td></tr>",
            escape(&value)
        );
    }
    html.push_str("</tbody></table>");
    html
}

async fn why_part(server: &SharedServer, key: &ObjectKey) -> Result<String, ApiError> {
    let object = current(server, key).await?;
    let workflows = crate::workflows::instances(server, &object).await?;
    let Some(instance) = workflows.latest() else {
        return Ok("<p class=\"hint\" id=\"verdict\">no workflow: only pods, VMs and nodes have lifecycles to explain</p>".into());
    };
    let name = format!("{}/{}", key.kind.short(), key.name);
    let now = Utc::now();
    let why = corral_workflow::why_json(&name, instance, now);
    let mut state = why["verdict"]["state"]
        .as_str()
        .unwrap_or("unknown")
        .to_string();
    let mut line = why["verdict"]["line"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    // Once its operation succeeded, an object answers for its health now,
    // as `corral why` does.
    if instance.outcome == corral_api::workflow::WorkflowOutcome::Succeeded
        && let Some(problem) = health_problem(server, &object, now).await
    {
        state = "unhealthy".into();
        line = format!(
            "{name} (revision {}) is not healthy: {problem}",
            instance.revision
        );
    } else if instance.outcome == corral_api::workflow::WorkflowOutcome::Succeeded
        && corral_api::health::kept_stopped(&object)
    {
        // Stopped on purpose, as `corral why` says: who asked.
        let by = stopped_by(server, key, &object).await;
        state = "stopped".into();
        line = corral_api::health::stopped_line(&name, &object, by.as_ref());
    }
    // A step of a cancelled instance its owner is still finishing, as
    // `corral why` lists it.
    let held = corral_workflow::unfinished_before(&workflows, instance, now);
    let held = if held.is_empty() {
        String::new()
    } else {
        format!(
            "<p class=\"hint\" id=\"held-up\">Held up by a cancelled operation: {}</p>",
            escape(corral_workflow::unfinished_text(&held, instance, now).trim())
        )
    };
    Ok(format!(
        "<p id=\"verdict\" class=\"verdict {}\">{}</p>{held}<div class=\"graph\">{}</div>",
        escape(&state),
        escape(&line),
        corral_workflow::svg(&name, instance, now)
    ))
}

/// The revision that stopped a VM its spec keeps stopped, from its
/// history, as `corral why` finds it ([`corral_api::health::stopped_by`]).
async fn stopped_by(
    server: &SharedServer,
    key: &ObjectKey,
    object: &Object,
) -> Option<corral_api::RevisionRecord> {
    let history = server.store.history(key).await.ok()?;
    corral_api::health::stopped_by(history, object, |revision| async move {
        server.store.revision(key, revision).await.ok()?.spec
    })
    .await
}

/// [`corral_api::health::unhealthy_now`], its bound node read from the store.
async fn health_problem(
    server: &SharedServer,
    object: &Object,
    now: chrono::DateTime<Utc>,
) -> Option<String> {
    let node = match corral_api::health::bound_node(object) {
        Some(name) => server
            .store
            .get(&ObjectKey::new(Kind::Node, None, &name))
            .await
            .ok()
            .flatten()
            .map(|node| {
                node.typed_status::<corral_api::kinds::NodeStatus>()
                    .unwrap_or_default()
            }),
        None => None,
    };
    corral_api::health::unhealthy_now(object, node.as_ref(), now)
}

/// Revisions the dashboard's timeline shows, newest first; `corral history`
/// lists them all.
const TIMELINE_ROWS: usize = 100;

async fn history_part(server: &SharedServer, key: &ObjectKey) -> Result<String, ApiError> {
    // One more than shown says whether older ones are left out.
    let mut records = server.store.recent_history(key, TIMELINE_ROWS + 1).await?;
    if records.is_empty() {
        return Err(ApiError::NotFound(format!("{key} has no history")));
    }
    let older = records.len() > TIMELINE_ROWS;
    if older {
        records.remove(0);
    }
    let mut html = String::from(
        "<table id=\"timeline\"><thead><tr><th>REVISION</th><th>TIME</th><th>AUTHOR</th>\
         <th>CLASS</th><th>MESSAGE</th></tr></thead><tbody>",
    );
    for record in records.iter().rev() {
        let _ = write!(
            html,
            "<tr data-revision=\"{}\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            record.revision,
            record.revision,
            escape(&record.time.format("%Y-%m-%d %H:%M:%S UTC").to_string()),
            escape(&record.author),
            escape(&serde_json::to_value(record.class).map_or_else(
                |_| String::new(),
                |v| v.as_str().unwrap_or_default().to_string()
            )),
            escape(&if record.deleted {
                format!("(deleted) {}", record.message)
            } else {
                record.message.clone()
            }),
        );
    }
    if older {
        let _ = write!(
            html,
            "<tr class=\"older\"><td colspan=\"5\">older revisions are not shown: \
             <code>corral history {}</code></td></tr>",
            escape(&history_target(key))
        );
    }
    html.push_str("</tbody></table>");
    Ok(html)
}

/// `KIND/NAME` (with `-n NS` outside `default`), as `corral history` takes it.
fn history_target(key: &ObjectKey) -> String {
    let target = format!("{}/{}", key.kind.as_str().to_lowercase(), key.name);
    match key.namespace.as_str() {
        "" | "default" => target,
        namespace => format!("{target} -n {namespace}"),
    }
}

/// Revisions `from` and `to` side by side, line by line, changed lines
/// marked (`similar`'s line diff of the two specs as YAML, as `diff`).
async fn diff_part(
    server: &SharedServer,
    key: &ObjectKey,
    from: u64,
    to: u64,
) -> Result<String, ApiError> {
    let old = server.store.revision(key, from).await?;
    let new = server.store.revision(key, to).await?;
    let null = Value::Null;
    Ok(side_by_side(
        from,
        &to_yaml(old.spec.as_ref().unwrap_or(&null)),
        to,
        &to_yaml(new.spec.as_ref().unwrap_or(&null)),
    ))
}

/// A two-column table of `old` and `new`, changed lines marked.
pub fn side_by_side(from: u64, old: &str, to: u64, new: &str) -> String {
    use similar::{ChangeTag, TextDiff};
    let diff = TextDiff::from_lines(old, new);
    let mut rows: Vec<(Option<String>, Option<String>)> = Vec::new();
    let mut removed: Vec<String> = Vec::new();
    let mut added: Vec<String> = Vec::new();
    let flush = |rows: &mut Vec<_>, removed: &mut Vec<String>, added: &mut Vec<String>| {
        let count = removed.len().max(added.len());
        let mut removed = removed.drain(..);
        let mut added = added.drain(..);
        for _ in 0..count {
            rows.push((
                removed.next().map(|l| format!("-{l}")),
                added.next().map(|l| format!("+{l}")),
            ));
        }
    };
    for change in diff.iter_all_changes() {
        let line = change.value().trim_end_matches('\n').to_string();
        match change.tag() {
            ChangeTag::Delete => removed.push(line),
            ChangeTag::Insert => added.push(line),
            ChangeTag::Equal => {
                flush(&mut rows, &mut removed, &mut added);
                rows.push((Some(format!(" {line}")), Some(format!(" {line}"))));
            }
        }
    }
    flush(&mut rows, &mut removed, &mut added);
    let mut html = format!(
        "<table class=\"diff\" id=\"diff-table\" data-from=\"{from}\" data-to=\"{to}\"><thead><tr>\
         <th>revision {from}</th><th>revision {to}</th></tr></thead><tbody>"
    );
    let cell = |line: &Option<String>| match line {
        Some(line) => {
            let class = match line.chars().next() {
                Some('-') => " class=\"removed\"",
                Some('+') => " class=\"added\"",
                _ => "",
            };
            format!("<td{class}>{}</td>", escape(line))
        }
        None => "<td class=\"empty\"></td>".into(),
    };
    for (left, right) in &rows {
        let _ = write!(html, "<tr>{}{}</tr>", cell(left), cell(right));
    }
    html.push_str("</tbody></table>");
    html
}

async fn steplogs_part(server: &SharedServer, key: &ObjectKey) -> Result<String, ApiError> {
    let entries = crate::workflows::step_logs(server, key, &StepLogFilter::default()).await?;
    if entries.is_empty() {
        return Ok("<p class=\"hint\">no step logs</p>".into());
    }
    let mut html = String::from(
        "<table id=\"steplogs\"><thead><tr><th>TIME</th><th>WORKFLOW</th><th>STEP</th>\
         <th>OWNER</th><th>MESSAGE</th></tr></thead><tbody>",
    );
    for entry in entries.iter().rev().take(200) {
        let _ = write!(
            html,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&entry.time.format("%H:%M:%S%.3f").to_string()),
            escape(&entry.workflow_id),
            escape(&entry.step),
            escape(&entry.owner),
            escape(&entry.message),
        );
    }
    html.push_str("</tbody></table>");
    Ok(html)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_timeline_shows_the_newest_revisions_and_says_when_older_ones_are_left_out() {
        let server = crate::Server::in_memory();
        let change = corral_store::ChangeMeta {
            author: "alice".into(),
            class: corral_api::AuthorClass::External,
            message: "edit".into(),
            time: Utc::now(),
            always_record: false,
        };
        let config = |revision: usize| {
            let spec = serde_json::json!({"data": {"n": revision.to_string()}});
            let mut object = Object::new(Kind::Config, Some("team"), "site", spec);
            object.metadata.uid = "uid-site".into();
            object
        };
        let mut object = server
            .store
            .create(config(1), &change)
            .await
            .expect("create");
        let key = object.key();
        let rows = |html: &str| html.matches("<tr data-revision=").count();
        for revision in 2..=TIMELINE_ROWS + 1 {
            let html = history_part(&server, &key).await.expect("timeline");
            assert_eq!(rows(&html), revision - 1);
            assert!(!html.contains("older revisions"), "{html}");
            let mut next = config(revision);
            next.metadata = object.metadata.clone();
            object = server
                .store
                .update(next, object.metadata.resource_version, &change)
                .await
                .expect("update");
        }
        let html = history_part(&server, &key).await.expect("timeline");
        assert_eq!(rows(&html), TIMELINE_ROWS);
        let first_row = html.find("<tr data-revision=").expect("a row");
        let newest = format!("<tr data-revision=\"{}\">", TIMELINE_ROWS + 1);
        assert_eq!(
            html.find(&newest),
            Some(first_row),
            "the newest first: {html}"
        );
        assert!(html.contains("<tr data-revision=\"2\">"), "{html}");
        assert!(!html.contains("<tr data-revision=\"1\">"), "{html}");
        assert!(
            html.contains(
                "older revisions are not shown: <code>corral history config/site -n team</code>"
            ),
            "{html}"
        );
    }

    #[test]
    fn side_by_side_pairs_changed_lines() {
        let html = side_by_side(1, "a: 1\nb: <x>\n", 2, "a: 1\nb: 3\nc: 4\n");
        assert!(html.contains("<td> a: 1</td><td> a: 1</td>"), "{html}");
        assert!(
            html.contains("<td class=\"removed\">-b: &lt;x&gt;</td><td class=\"added\">+b: 3</td>"),
            "{html}"
        );
        assert!(
            html.contains("<td class=\"empty\"></td><td class=\"added\">+c: 4</td>"),
            "{html}"
        );
    }
}

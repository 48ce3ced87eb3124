//! `describe`: one object summed up for a person — who and what it is, its
//! state and health now, its newest operation in a line, its last revisions
//! and the last things its workflow and controllers did. The whole object
//! stays in `get -o yaml`, every step in `why`.

use std::fmt::Write as _;
use std::path::PathBuf;

use chrono::{DateTime, Utc};
use clap::Args;
use corral_api::kinds::{ContainerStatus, PodSpec, PodStatus};
use corral_api::workflow::{StoredWorkflows, WorkflowOutcome};
use corral_api::{Kind, Object, manager_of};
use corral_client::{Client, StepLogQuery};

use super::connect;
use crate::output::{Table, age, timestamp};
use crate::target::Target;

/// Revisions and step-log events shown.
const RECENT: usize = 5;
const EVENTS: usize = 10;

#[derive(Debug, Args)]
#[command(after_help = "Examples:
  corral describe pod/web               state, health, containers, last revisions and events
  corral describe node node-1           KIND NAME works too
  corral describe pd/web -n team-a      in namespace team-a")]
pub struct DescribeArgs {
    /// KIND/NAME.
    target: String,
    name: Option<String>,
    #[arg(short = 'n', long, value_name = "NS", default_value = "default")]
    namespace: String,
}

pub async fn describe(config: Option<PathBuf>, args: DescribeArgs) -> anyhow::Result<()> {
    let key = Target::parse(&args.target, args.name.as_deref())?.key(Some(&args.namespace))?;
    let client = connect(config)?;
    let object = client.get(&key).await?;
    let history = client.history(&key).await?;
    let now = Utc::now();
    let mut out = String::new();
    let meta = &object.metadata;
    line(&mut out, "Name", &meta.name);
    if let Some(namespace) = &meta.namespace {
        line(&mut out, "Namespace", namespace);
    }
    line(&mut out, "Kind", object.kind.as_str());
    line(
        &mut out,
        "Revision",
        &format!("{} (uid {})", meta.revision, meta.uid),
    );
    let creator = history
        .first()
        .map(|first| format!(" by {}", first.author))
        .unwrap_or_default();
    line(
        &mut out,
        "Created",
        &format!("{} ago{creator}", age(meta.created_at, now)),
    );
    let labels: Vec<String> = meta
        .labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    line(&mut out, "Labels", &none_if_empty(labels.join(", ")));
    if let Some(manager) = manager_of(meta) {
        line(&mut out, "Managed by", manager);
    }
    if let Some(owner) = &meta.owner {
        line(&mut out, "Owner", &format!("{owner} (uid {})", owner.uid));
    }
    match object.kind {
        Kind::Pod => pod(&mut out, &client, &object, now).await,
        Kind::VirtualMachine => {
            vm(&mut out, &object);
            generic(&mut out, &object);
        }
        _ => generic(&mut out, &object),
    }
    workflow(&mut out, &object);
    revisions(&mut out, &object, &history);
    events(&mut out, &client, &object).await;
    print!("{out}");
    Ok(())
}

fn line(out: &mut String, label: &str, value: &str) {
    let _ = writeln!(out, "{:<12} {value}", format!("{label}:"));
}

fn none_if_empty(text: String) -> String {
    if text.is_empty() {
        "<none>".into()
    } else {
        text
    }
}

/// Node, address, state, health and one block per container.
async fn pod(out: &mut String, client: &Client, object: &Object, now: DateTime<Utc>) {
    let status: PodStatus = object.typed_status().unwrap_or_default();
    let spec: Option<PodSpec> = object.typed_spec().ok();
    line(out, "Node", status.node.as_deref().unwrap_or("-"));
    line(out, "Address", status.address.as_deref().unwrap_or("-"));
    line(
        out,
        "Status",
        &format!(
            "{}, {} ready, {} restarts",
            status.reason(),
            status.ready_count(),
            status.restarts()
        ),
    );
    // Health is judged once the newest operation succeeded; until then the
    // operation is the answer (as in `why`, which judges it the same way).
    let operation = StoredWorkflows::of(&object.status)
        .ok()
        .and_then(|w| w.latest().map(|i| (i.workflow.clone(), i.outcome)));
    let health = match operation {
        Some((workflow, outcome)) if outcome != WorkflowOutcome::Succeeded => format!(
            "its {workflow} workflow is {}: see Workflow below",
            outcome.as_str()
        ),
        _ => super::workflow::unhealthy_now(client, object, now)
            .await
            .map_or_else(
                || "healthy".to_string(),
                |problem| format!("not healthy: {problem}"),
            ),
    };
    line(out, "Health", &health);
    let _ = writeln!(out, "Containers:");
    let specs = spec.map(|s| s.containers).unwrap_or_default();
    for container in &specs {
        let reported = status.containers.iter().find(|c| c.name == container.name);
        let _ = writeln!(out, "  {}:", container.name);
        let _ = writeln!(out, "    image:     {}", container.image);
        match reported {
            Some(reported) => container_lines(out, reported, now),
            None => {
                let _ = writeln!(out, "    state:     not reported by the node yet");
            }
        }
    }
}

fn container_lines(out: &mut String, c: &ContainerStatus, now: DateTime<Utc>) {
    let since = c
        .started_at
        .map(|at| format!(", started {} ({} ago)", timestamp(at), age(Some(at), now)))
        .unwrap_or_default();
    let reason = c.reason.map_or("-", |r| r.as_str());
    let ready = if c.ready { "ready" } else { "not ready" };
    let _ = writeln!(
        out,
        "    state:     {reason}{since}; {ready}; {} restarts",
        c.restarts
    );
    if let Some(message) = &c.message {
        let _ = writeln!(out, "    why:       {message}");
    }
    if let Some(exit) = &c.last_exit {
        let code = exit
            .code
            .map_or_else(|| "unknown".to_string(), |code| code.to_string());
        let _ = writeln!(
            out,
            "    last exit: code {code} at {} ({} ago)",
            timestamp(exit.at),
            age(Some(exit.at), now)
        );
    }
    if let Some(at) = c.next_restart_at {
        let _ = writeln!(out, "    restart:   due {}", timestamp(at));
    }
}

/// Other kinds: their spec and status as YAML, without the workflow (which
/// `why` shows whole).
/// A VM's node, phase and message (`get`'s columns), and whether its
/// spec keeps it stopped.
fn vm(out: &mut String, object: &Object) {
    let [phase, node, message] = corral_api::kinds::vm_columns(object);
    line(out, "Node", &node);
    let asked = if corral_api::health::kept_stopped(object) {
        " (its spec keeps it stopped: spec.running: false; `corral vm start` runs it again)"
    } else {
        ""
    };
    line(out, "Phase", &format!("{phase}{asked}"));
    line(out, "Message", &message);
}

fn generic(out: &mut String, object: &Object) {
    let mut status = object.status.clone();
    if let Some(map) = status.as_object_mut() {
        map.remove("workflow");
    }
    for (label, value) in [("Spec", &object.spec), ("Status", &status)] {
        let empty = value.is_null() || value.as_object().is_some_and(|m| m.is_empty());
        if empty {
            line(out, label, "<none>");
            continue;
        }
        let _ = writeln!(out, "{label}:");
        let yaml = serde_yaml_ng::to_string(value).unwrap_or_default();
        for text in yaml.lines() {
            let _ = writeln!(out, "  {text}");
        }
    }
}

/// The newest workflow instance in a line.
fn workflow(out: &mut String, object: &Object) {
    let Some(instance) = StoredWorkflows::of(&object.status)
        .ok()
        .and_then(|w| w.latest().cloned())
    else {
        return;
    };
    let finished = instance
        .finished_at
        .map(|at| format!(", finished {}", timestamp(at)))
        .unwrap_or_default();
    line(
        out,
        "Workflow",
        &format!(
            "{} (revision {}) {}{finished}; `corral why {}/{}` for its steps",
            instance.id,
            instance.revision,
            instance.outcome.as_str(),
            object.kind.short(),
            object.metadata.name
        ),
    );
}

fn revisions(out: &mut String, object: &Object, history: &[corral_api::RevisionRecord]) {
    let _ = writeln!(
        out,
        "\nRecent revisions (of {}; `corral history {}/{}` for all):",
        history.len(),
        object.kind.short(),
        object.metadata.name
    );
    let mut table = Table::new(&["REVISION", "TIME", "AUTHOR", "CLASS", "MESSAGE"]);
    for record in history.iter().rev().take(RECENT).rev() {
        table.row(vec![
            record.revision.to_string(),
            timestamp(record.time),
            record.author.clone(),
            record.class.as_str().into(),
            record.message.clone(),
        ]);
    }
    out.push_str(&table.render());
}

/// The last lines of the object's step log: what its workflow and its
/// controllers did last.
async fn events(out: &mut String, client: &Client, object: &Object) {
    let Ok(entries) = client
        .step_logs(&object.key(), &StepLogQuery::default())
        .await
    else {
        return;
    };
    if entries.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\nRecent events (of {}; `corral logs {}/{} --steps` for all):",
        entries.len(),
        object.kind.short(),
        object.metadata.name
    );
    let mut table = Table::new(&["TIME", "WORKFLOW", "STEP", "OWNER", "MESSAGE"]);
    let skip = entries.len().saturating_sub(EVENTS);
    for entry in entries.iter().skip(skip) {
        table.row(vec![
            timestamp(entry.time),
            entry.workflow_id.clone(),
            entry.step.clone(),
            entry.owner.clone(),
            entry.message.clone(),
        ]);
    }
    out.push_str(&table.render());
}

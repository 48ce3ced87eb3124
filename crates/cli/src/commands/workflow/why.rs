//! `corral why` and `corral analyze`.

use std::path::PathBuf;

use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};
use corral_api::kinds::{NodeStatus, PodStatus};
use corral_api::workflow::{StepState, WorkflowInstance, WorkflowOutcome};
use corral_api::{Kind, Object, ObjectKey};
use corral_client::Client;
use corral_workflow::Unfinished;
use serde_json::json;

use super::{display_name, load_instance};
use crate::commands::connect;
use crate::output::{Format, print_structured};
use crate::target::Target;

/// Which object, which instance, which format.
#[derive(Debug, Args)]
pub struct ObjectArgs {
    /// The object: KIND/NAME (pod/web, vm/builder, node/node-1).
    target: String,
    #[arg(short = 'n', long, value_name = "NS", default_value = "default")]
    namespace: String,
    /// Explain this workflow instance (start-1, update-3) instead of the newest.
    #[arg(long, value_name = "ID")]
    workflow: Option<String>,
    /// `json` or `yaml` for scripts; the default is text.
    #[arg(short = 'o', long, value_enum, default_value_t)]
    output: Format,
}

#[derive(Debug, Args)]
#[command(after_help = "Each step is marked:
  ✓ done (how long it took)      ● running (for how long, time left)
  ✗ failed (the error)           ⊘ blocked (which failed dependency)
  ○ waiting (on what) or ready (not yet claimed, by whom it should be)

Below the steps: what running steps' owners last said (At work now), a step
of a cancelled operation its owner is still finishing while this one waits
(Held up by a cancelled operation: after quick successive updates the node
stops a container with its grace period before it takes the newest), and
containers restarted in place.

Examples:
  corral why pod/web                  the newest operation on pod/web
  corral why pod/web --workflow start-1
  corral why job/nightly               a Job's phase, its reason and each pod
  corral why node/node-1 -o json      verdict and per-step name, owner, state, timings")]
pub struct WhyArgs {
    #[command(flatten)]
    object: ObjectArgs,
}

/// `corral why KIND/NAME`: a one-line verdict, then the step graph.
pub async fn why(config: Option<PathBuf>, args: WhyArgs) -> anyhow::Result<()> {
    let args = args.object;
    let key = Target::parse(&args.target, None)?.key(Some(&args.namespace))?;
    let client = connect(config)?;
    if key.kind == Kind::PinnedDeployment {
        return super::why_pd::why_pd(&client, &key, args.output).await;
    }
    if key.kind == Kind::Job {
        return super::why_job::why_job(&client, &key, args.output).await;
    }
    if key.kind == Kind::PerNodeDeployment {
        return super::why_pnd::why_pnd(&client, &key, args.output).await;
    }
    let (object, instance) = load_instance(&client, &key, args.workflow.as_deref()).await?;
    let name = display_name(&key);
    let now = Utc::now();
    // Once its operation succeeded, a pod answers for its health now.
    let unhealthy = if args.workflow.is_none() && instance.outcome == WorkflowOutcome::Succeeded {
        unhealthy_now(&client, &object, now).await
    } else {
        None
    };
    let mut json = corral_workflow::why_json(&name, &instance, now);
    let fenced = if args.workflow.is_none() {
        super::why_fence::lines(&client, &object).await
    } else {
        Vec::new()
    };
    if !fenced.is_empty() {
        json["selfFencing"] = json!(fenced);
    }
    let held_up = if args.workflow.is_none() {
        held_up_by(&client, &key, &instance, now).await
    } else {
        Vec::new()
    };
    if !held_up.is_empty() {
        json["heldUpBy"] = json!(
            held_up
                .iter()
                .map(
                    |step| json!({"workflowId": step.workflow_id, "step": step.step,
                    "owner": step.owner, "claimedAt": step.claimed_at,
                    "cancelledAt": step.cancelled_at})
                )
                .collect::<Vec<_>>()
        );
    }
    if let Some(problem) = &unhealthy {
        let line = format!(
            "{name} (revision {}) is not healthy: {problem}",
            instance.revision
        );
        json["health"] = json!({"healthy": false, "message": problem});
        json["verdict"] = json!({"state": "unhealthy", "message": problem, "line": line});
    }
    // A VM its spec keeps stopped is stopped on purpose, not failed: say
    // so, and who asked.
    let stopped = args.workflow.is_none()
        && unhealthy.is_none()
        && instance.outcome == WorkflowOutcome::Succeeded
        && corral_api::health::kept_stopped(&object);
    if stopped {
        let by = stopped_by(&client, &key, &object).await;
        let line = corral_api::health::stopped_line(&name, &object, by.as_ref());
        if let Some(record) = &by {
            json["stoppedBy"] = json!({"revision": record.revision, "author": record.author,
                                       "message": record.message, "time": record.time});
        }
        json["verdict"] = json!({"state": "stopped", "message": "its spec asks for it (spec.running: false)", "line": line});
    }
    if print_structured(args.output, &json)? {
        return Ok(());
    }
    let text = corral_workflow::why_text(&name, &instance, now);
    match &unhealthy {
        _ if stopped => {
            println!("{}", json["verdict"]["line"].as_str().unwrap_or_default());
            print!("{}", text.split_once('\n').map_or("", |(_, rest)| rest));
        }
        Some(_) => {
            // The health verdict replaces the workflow's first line ("is
            // running: start workflow finished …"); its steps follow.
            println!("{}", json["verdict"]["line"].as_str().unwrap_or_default());
            print!("{}", text.split_once('\n').map_or("", |(_, rest)| rest));
        }
        None => print!("{text}"),
    }
    let lines = super::running_lines(&client, &key, &instance).await;
    if !lines.is_empty() {
        print!("\nAt work now:\n{}", super::running_lines_text(&lines));
    }
    if !held_up.is_empty() {
        print!(
            "\nHeld up by a cancelled operation:\n{}",
            corral_workflow::unfinished_text(&held_up, &instance, now)
        );
    }
    let restarted = restarted_in_place(&object);
    if !restarted.is_empty() {
        print!("\nRestarted in place:\n{restarted}");
    }
    if !fenced.is_empty() {
        println!("\nSelf-fencing:");
        for line in &fenced {
            println!("  {line}");
        }
    }
    if args.workflow.is_none() && instance.outcome == WorkflowOutcome::Failed {
        let namespace = match key.namespace.as_str() {
            "" | "default" => String::new(),
            ns => format!(" -n {ns}"),
        };
        println!(
            "\nOnce the cause is fixed, `corral retry {name}{namespace}` (or applying it again) runs the failed steps again."
        );
    }
    Ok(())
}

/// Steps of cancelled instances whose owner has not ended them while it
/// leaves the newest instance's ready steps unclaimed
/// ([`corral_workflow::unfinished_before`]): after quick successive
/// updates, the node may still be stopping a container for one of them.
async fn held_up_by(
    client: &Client,
    key: &ObjectKey,
    instance: &WorkflowInstance,
    now: DateTime<Utc>,
) -> Vec<Unfinished> {
    let ready = instance
        .steps
        .iter()
        .any(|step| matches!(step.state, StepState::Ready { .. }));
    if instance.outcome != WorkflowOutcome::Running || !ready {
        return Vec::new();
    }
    match client.workflows(key).await {
        Ok(status) => corral_workflow::unfinished_before(&status, instance, now),
        Err(_) => Vec::new(),
    }
}

/// `  envy: restarted: secret/db revision 2 changed DB_PASS` per container
/// the node restarted in place for new data (not a crash: no revision, so
/// no history record either; this is where it shows).
fn restarted_in_place(object: &Object) -> String {
    let Ok(status) = object.typed_status::<PodStatus>() else {
        return String::new();
    };
    status
        .containers
        .iter()
        .filter_map(|c| {
            let message = c.message.as_deref()?;
            message
                .starts_with("restarted: ")
                .then(|| format!("  {}: {message}\n", c.name))
        })
        .collect()
}

/// The revision that stopped a VM its spec keeps stopped, from its
/// history ([`corral_api::health::stopped_by`]).
async fn stopped_by(
    client: &Client,
    key: &ObjectKey,
    object: &Object,
) -> Option<corral_api::RevisionRecord> {
    let history = client.history(key).await.ok()?;
    corral_api::health::stopped_by(history, object, |revision| async move {
        client.revision(key, revision).await.ok()?.spec
    })
    .await
}

/// Why the object is not healthy now ([`corral_api::health`]), its
/// bound node read from the API.
pub(crate) async fn unhealthy_now(
    client: &Client,
    object: &Object,
    now: DateTime<Utc>,
) -> Option<String> {
    let node = match corral_api::health::bound_node(object) {
        Some(name) => client
            .get(&ObjectKey::new(Kind::Node, None, &name))
            .await
            .ok()
            .map(|node| node.typed_status::<NodeStatus>().unwrap_or_default()),
        None => None,
    };
    corral_api::health::unhealthy_now(object, node.as_ref(), now)
}

#[derive(Debug, Args)]
pub struct AnalyzeArgs {
    #[command(subcommand)]
    command: AnalyzeCommand,
}

#[derive(Debug, Subcommand)]
enum AnalyzeCommand {
    /// Steps by how long they took, slowest first (like systemd-analyze blame).
    #[command(after_help = "Example:\n  corral analyze blame pod/web")]
    Blame(ObjectArgs),
    /// The chain of steps that set the time to the goal: each with
    /// @time-since-start when it finished and +duration it took.
    #[command(after_help = "Example:\n  corral analyze critical-chain pod/web")]
    CriticalChain(ObjectArgs),
    /// The step graph in Graphviz dot, coloured by state.
    #[command(after_help = "Example:\n  corral analyze dot pod/web | dot -Tsvg > web.svg")]
    Dot(ObjectArgs),
}

/// The three analyses.
#[derive(Debug, Clone, Copy)]
enum Analysis {
    Blame,
    CriticalChain,
    Dot,
}

/// `corral analyze blame|critical-chain|dot KIND/NAME`.
pub async fn analyze(config: Option<PathBuf>, args: AnalyzeArgs) -> anyhow::Result<()> {
    let (analysis, args) = match args.command {
        AnalyzeCommand::Blame(args) => (Analysis::Blame, args),
        AnalyzeCommand::CriticalChain(args) => (Analysis::CriticalChain, args),
        AnalyzeCommand::Dot(args) => (Analysis::Dot, args),
    };
    let key = Target::parse(&args.target, None)?.key(Some(&args.namespace))?;
    let client = connect(config)?;
    let (_, instance) = load_instance(&client, &key, args.workflow.as_deref()).await?;
    let name = display_name(&key);
    let now = Utc::now();
    let (json, text) = match analysis {
        Analysis::Blame => (
            corral_workflow::blame_json(&name, &instance, now),
            corral_workflow::blame_text(&name, &instance, now),
        ),
        Analysis::CriticalChain => (
            corral_workflow::critical_chain_json(&name, &instance, now),
            corral_workflow::critical_chain_text(&name, &instance, now),
        ),
        Analysis::Dot => {
            let dot = corral_workflow::dot(&name, &instance, now);
            let json = json!({"object": name, "workflowId": instance.id, "dot": dot});
            (json, dot)
        }
    };
    if !print_structured(args.output, &json)? {
        print!("{text}");
        if !text.ends_with('\n') {
            println!();
        }
    }
    Ok(())
}

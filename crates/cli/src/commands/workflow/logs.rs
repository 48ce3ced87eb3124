//! `corral logs pod/NAME [-c C] [-f] [--tail N]`: a container's output,
//! streamed from the agent of the pod's node through the API. With one
//! container the pod's only one is shown; with several, `-c` must name one
//! (the error lists them).
//!
//! `corral logs vm/NAME [-f] [--tail N]`: everything a VM's serial console
//! printed (across restarts), the same way.
//!
//! `corral logs job/NAME [-c C] [--tail N]`: each of a Job's pods' output
//! in turn, oldest pod first, under a `==> pod/NAME-N <==` header.
//!
//! `corral logs KIND/NAME --steps`: everything every controller did about
//! one object, in order.

use std::path::PathBuf;

use anyhow::bail;
use clap::Args;
use corral_api::Kind;
use corral_api::workflow::StepLogEntry;
use corral_client::{LogsQuery, StepLogQuery};
use futures::StreamExt;
use tokio::io::AsyncWriteExt;

use crate::commands::connect;
use crate::output::{Format, Table, print_structured};
use crate::target::Target;

#[derive(Debug, Args)]
#[command(after_help = "Examples:
  corral logs pod/web                                 the container's output (the pod has one)
  corral logs pod/web -c side -f                      follow container side's output
  corral logs pod/web --tail 20                       the last 20 lines
  corral logs job/batch                               every pod of the Job, in order
  corral logs vm/builder -f                           follow a VM's serial console output
  corral logs pod/web --steps                         every step transition and owner's line
  corral logs pod/web --steps --step acme/slow-mount  one step
  corral logs pod/web --steps --owner acme-storage    what one controller did
  corral logs pod/web --steps --workflow update-3 -o json")]
pub struct LogsArgs {
    /// The object: KIND/NAME (pod/web, node/node-1).
    target: String,
    #[arg(short = 'n', long, value_name = "NS", default_value = "default")]
    namespace: String,
    /// The container whose output to show; needed when the pod has several.
    #[arg(short = 'c', long, value_name = "NAME", conflicts_with = "steps")]
    container: Option<String>,
    /// Keep streaming what the container writes (Ctrl-C to stop).
    #[arg(short = 'f', long, conflicts_with = "steps")]
    follow: bool,
    /// Start with the last N lines.
    #[arg(long, value_name = "N", conflicts_with = "steps")]
    tail: Option<u64>,
    /// Show the workflow step log: every step transition and every line a
    /// step's owner appended, with time, workflow, step, owner and level.
    #[arg(long)]
    steps: bool,
    /// Only this step's entries.
    #[arg(long, value_name = "STEP", requires = "steps")]
    step: Option<String>,
    /// Only entries about steps this controller owns.
    #[arg(long, value_name = "NAME", requires = "steps")]
    owner: Option<String>,
    /// Only this workflow instance's entries (start-1, update-3).
    #[arg(long, value_name = "ID", requires = "steps")]
    workflow: Option<String>,
    #[arg(short = 'o', long, value_enum, default_value_t)]
    output: Format,
}

pub async fn logs(config: Option<PathBuf>, args: LogsArgs) -> anyhow::Result<()> {
    let key = Target::parse(&args.target, None)?.key(Some(&args.namespace))?;
    if !args.steps && key.kind == Kind::Job {
        if args.follow {
            bail!(
                "follow one pod of the Job: `corral logs pod/{}-N -f` (`corral why {}` lists them)",
                key.name,
                args.target
            );
        }
        let client = connect(config)?;
        return job_logs(&client, &key, args.container, args.tail).await;
    }
    if !args.steps {
        if !matches!(key.kind, Kind::Pod | Kind::VirtualMachine) {
            bail!(
                "only pods (container output), Jobs (their pods') and VMs (console output) have \
                 logs; for what the workflow and its controllers did about {}, use `corral logs {} --steps`",
                args.target,
                args.target
            );
        }
        if key.kind == Kind::VirtualMachine && args.container.is_some() {
            bail!("a VM has no containers; `corral logs vm/NAME` shows its console output");
        }
        let client = connect(config)?;
        let query = LogsQuery {
            container: args.container,
            follow: args.follow,
            tail: args.tail,
        };
        let mut stream = client.logs(&key, &query).await?;
        let mut stdout = tokio::io::stdout();
        while let Some(chunk) = stream.next().await {
            stdout.write_all(&chunk?).await?;
            stdout.flush().await?;
        }
        return Ok(());
    }
    let client = connect(config)?;
    let query = StepLogQuery {
        step: args.step,
        owner: args.owner,
        workflow: args.workflow,
    };
    let entries = client.step_logs(&key, &query).await?;
    if print_structured(args.output, &entries)? {
        return Ok(());
    }
    if entries.is_empty() {
        eprintln!("no step log entries match");
        return Ok(());
    }
    let mut table = Table::new(&["TIME", "WORKFLOW", "STEP", "OWNER", "LEVEL", "MESSAGE"]);
    for entry in &entries {
        table.row(vec![
            entry.time.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string(),
            entry.workflow_id.clone(),
            entry.step.clone(),
            entry.owner.clone(),
            entry.level.as_str().to_string(),
            message(entry),
        ]);
    }
    table.print();
    Ok(())
}

/// Each pod of the Job `key`, oldest first, under a header.
async fn job_logs(
    client: &corral_client::Client,
    key: &corral_api::ObjectKey,
    container: Option<String>,
    tail: Option<u64>,
) -> anyhow::Result<()> {
    let selector = format!("{}={}", corral_controllers::job::JOB_LABEL, key.name);
    let mut pods = client
        .list(Kind::Pod, Some(&key.namespace), Some(&selector))
        .await?
        .items;
    if pods.is_empty() {
        bail!("job/{} has no pods (yet)", key.name);
    }
    pods.sort_by_key(|pod| {
        let index = pod.metadata.name.rsplit('-').next();
        index
            .and_then(|i| i.parse::<u32>().ok())
            .unwrap_or(u32::MAX)
    });
    let mut stdout = tokio::io::stdout();
    for (n, pod) in pods.iter().enumerate() {
        let separator = if n == 0 { "" } else { "\n" };
        let header = format!("{separator}==> pod/{} <==\n", pod.metadata.name);
        stdout.write_all(header.as_bytes()).await?;
        let query = LogsQuery {
            container: container.clone(),
            follow: false,
            tail,
        };
        match client.logs(&pod.key(), &query).await {
            Ok(mut stream) => {
                while let Some(chunk) = stream.next().await {
                    stdout.write_all(&chunk?).await?;
                }
            }
            // A pod not placed yet, or whose node is gone: say so, go on.
            Err(error) => stdout.write_all(format!("({error})\n").as_bytes()).await?,
        }
        stdout.flush().await?;
    }
    Ok(())
}

/// The message with the fields an owner attached (`server=nfs-1`); the
/// engine's own `phase` and `attempt` fields are in the message already.
fn message(entry: &StepLogEntry) -> String {
    let mut text = entry.message.clone();
    for (name, value) in &entry.fields {
        if name == "phase" || name == "attempt" {
            continue;
        }
        let value = match value {
            serde_json::Value::String(text) => text.clone(),
            other => other.to_string(),
        };
        text.push_str(&format!(" {name}={value}"));
    }
    text
}

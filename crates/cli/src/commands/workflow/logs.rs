//! `corral logs KIND/NAME --steps`: everything every controller did about
//! one object, in order. Container logs come with the node agent.

use std::path::PathBuf;

use anyhow::bail;
use clap::Args;
use corral_api::workflow::StepLogEntry;
use corral_client::StepLogQuery;

use crate::commands::connect;
use crate::output::{Format, Table, print_structured};
use crate::target::Target;

#[derive(Debug, Args)]
#[command(after_help = "Examples:
  corral logs pod/web --steps                         every step transition and owner's line
  corral logs pod/web --steps --step acme/slow-mount  one step
  corral logs pod/web --steps --owner acme-storage    what one controller did
  corral logs pod/web --steps --workflow update-3 -o json")]
pub struct LogsArgs {
    /// The object: KIND/NAME (pod/web, node/node-1).
    target: String,
    #[arg(short = 'n', long, value_name = "NS", default_value = "default")]
    namespace: String,
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
    if !args.steps {
        bail!(
            "container logs are not available yet: they come with the node agent; \
             for what the workflow and its controllers did, use `corral logs {} --steps`",
            args.target
        );
    }
    let key = Target::parse(&args.target, None)?.key(Some(&args.namespace))?;
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

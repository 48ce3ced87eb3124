//! `corral retry KIND/NAME`: run the failed steps of an object's newest
//! workflow again, after fixing what made them fail.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::{display_name, follow};
use crate::commands::connect;
use crate::target::Target;

#[derive(Debug, Args)]
#[command(
    after_help = "A failed step retries on its own a few times with a growing backoff (its
policy; `corral why` shows when the next retry is due). Once it failed for
good, the workflow stops: fix the cause (import the missing image, free
the port, …), then retry. Done steps stay done; each failed step starts a
fresh round of attempts; the steps it blocked wait for it again. Applying
the same manifest again retries too.

Examples:
  corral retry pod/web                 after `corral image import`, say
  corral retry pod/web --wait          and follow it like `apply --wait`
  corral retry vm/builder -n team-a    in namespace team-a"
)]
pub struct RetryArgs {
    /// KIND/NAME: a pod, VM, node or any object with a workflow.
    target: String,
    #[arg(short = 'n', long, value_name = "NS", default_value = "default")]
    namespace: String,
    /// Follow the retried workflow until it succeeds, fails or --timeout
    /// passes; exit non-zero unless it succeeds.
    #[arg(short, long)]
    wait: bool,
    /// How long --wait waits (`90s`, `10m`).
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = humantime::parse_duration, requires = "wait")]
    timeout: Duration,
}

pub async fn retry(config: Option<PathBuf>, args: RetryArgs) -> anyhow::Result<()> {
    let key = Target::parse(&args.target, None)?.key(Some(&args.namespace))?;
    let client = connect(config)?;
    let deadline = tokio::time::Instant::now() + args.timeout;
    let instance = client.retry(&key).await?;
    println!(
        "{} retrying {} (revision {})",
        display_name(&key),
        instance.id,
        instance.revision
    );
    if args.wait {
        let object = client.get(&key).await?;
        let live = std::io::IsTerminal::is_terminal(&std::io::stdout());
        follow(&client, &object, deadline, live).await?;
    }
    Ok(())
}

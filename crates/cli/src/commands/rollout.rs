//! `corral rollout`: move a PinnedDeployment's share of replicas to its
//! next template, watch the rollout, pause and resume it, and promote next
//! to previous.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::bail;
use clap::Args;
use corral_api::kinds::{PinnedDeploymentSpec, PinnedDeploymentStatus};
use corral_api::{Kind, Object, ObjectKey};
use corral_client::Client;

use super::connect;
use crate::target::Target;

#[derive(Debug, Args)]
#[command(after_help = "Examples:
  corral rollout pd/web --percent 50     half the replicas on templates.next
  corral rollout status pd/web           follow until every pod is current and ready
  corral rollout promote pd/web          after 100%: previous := next, percent := 0
  corral rollout pause pd/web            convert no more pods until resumed
  corral rollout resume pd/web           go on converting, maxUnavailable at a time")]
pub struct RolloutArgs {
    /// `pd/NAME`, or `status|promote|pause|resume pd/NAME`.
    #[arg(value_name = "ACTION|pd/NAME", num_args = 1..=2)]
    words: Vec<String>,
    /// The share of replicas on templates.next, 0–100.
    #[arg(long, value_name = "P")]
    percent: Option<u8>,
    #[arg(short = 'n', long, value_name = "NS", default_value = "default")]
    namespace: String,
    /// `status`: give up after this many seconds (exit code 1).
    #[arg(long, value_name = "SECONDS", default_value_t = 600)]
    timeout: u64,
}

enum Action {
    Percent(u8),
    Status,
    Promote,
    Pause(bool),
}

pub async fn rollout(config: Option<PathBuf>, args: RolloutArgs) -> anyhow::Result<()> {
    let (action, target) = match args.words.as_slice() {
        [verb, target] if verb == "status" => (Action::Status, target),
        [verb, target] if verb == "promote" => (Action::Promote, target),
        [verb, target] if verb == "pause" => (Action::Pause(true), target),
        [verb, target] if verb == "resume" => (Action::Pause(false), target),
        [verb, _] => {
            bail!("unknown rollout action {verb:?}: expected status, promote, pause or resume")
        }
        [target] => match args.percent {
            Some(percent) => (Action::Percent(percent), target),
            None => bail!("say where to: corral rollout {target} --percent P"),
        },
        _ => {
            bail!("usage: corral rollout pd/NAME --percent P | status|promote|pause|resume pd/NAME")
        }
    };
    let target = Target::parse(target, None)?;
    if target.kind != Kind::PinnedDeployment {
        bail!(
            "rollout works on PinnedDeployments (pd/NAME), not {}",
            target.kind
        );
    }
    let key = target.key(Some(&args.namespace))?;
    let client = connect(config)?;
    match action {
        Action::Percent(percent) => set_percent(&client, &key, percent).await,
        Action::Promote => promote(&client, &key).await,
        Action::Pause(paused) => pause(&client, &key, paused).await,
        Action::Status => status(&client, &key, Duration::from_secs(args.timeout)).await,
    }
}

async fn set_percent(client: &Client, key: &ObjectKey, percent: u8) -> anyhow::Result<()> {
    if percent > 100 {
        bail!("--percent {percent}: expected 0–100");
    }
    let (written, spec, ()) = super::update_spec::<PinnedDeploymentSpec, _>(
        client,
        key,
        |spec| format!("rollout {}% → {percent}%", spec.replicas_percent_next),
        |spec| {
            spec.replicas_percent_next = percent;
            Ok(())
        },
    )
    .await?;
    let next = spec.next_replicas();
    println!(
        "{key} revision {}: {percent}% on next ({next} of {} replicas), {} on previous",
        written.metadata.revision,
        spec.replicas,
        spec.replicas - next
    );
    Ok(())
}

async fn promote(client: &Client, key: &ObjectKey) -> anyhow::Result<()> {
    let (written, _, ()) = super::update_spec::<PinnedDeploymentSpec, _>(
        client,
        key,
        |_| "rollout promote: previous := next".to_string(),
        |spec| {
            if spec.replicas_percent_next != 100 {
                bail!(
                    "{key} runs {}% on next: promote needs 100% (corral rollout {key} --percent 100)",
                    spec.replicas_percent_next
                );
            }
            spec.templates.previous = spec.templates.next.clone();
            spec.replicas_percent_next = 0;
            Ok(())
        },
    )
    .await?;
    println!(
        "{key} revision {}: promoted; templates.previous is the former next, 0% on next",
        written.metadata.revision
    );
    Ok(())
}

async fn pause(client: &Client, key: &ObjectKey, paused: bool) -> anyhow::Result<()> {
    let verb = if paused { "pause" } else { "resume" };
    let (written, _, ()) = super::update_spec::<PinnedDeploymentSpec, _>(
        client,
        key,
        |_| format!("rollout {verb}"),
        |spec| {
            spec.paused = paused;
            Ok(())
        },
    )
    .await?;
    let status: PinnedDeploymentStatus = written.typed_status().unwrap_or_default();
    if paused {
        println!(
            "{key} revision {}: paused; no pod is converted until `corral rollout resume {key}`",
            written.metadata.revision
        );
    } else {
        println!("{key} revision {}: resumed", written.metadata.revision);
        if let Some(halt) = status.halted {
            println!(
                "it was halted at revision {}: {}; the halt ends when that pod is ready or the spec changes",
                halt.revision, halt.reason
            );
        }
    }
    Ok(())
}

/// One line of progress: `revision 3: previous 2/2 current, 2 ready; next 1/2 current, 0 ready`.
fn progress(object: &Object, status: &PinnedDeploymentStatus) -> String {
    let version = |name: &str, v: &corral_api::kinds::VersionStatus| {
        format!(
            "{name} {}/{} current, {} ready",
            v.current, v.desired, v.ready
        )
    };
    format!(
        "revision {}: {}; {}",
        object.metadata.revision,
        version("previous", &status.previous),
        version("next", &status.next)
    )
}

fn settled(object: &Object, status: &PinnedDeploymentStatus) -> bool {
    status.observed_revision == Some(object.metadata.revision)
        && [&status.previous, &status.next]
            .iter()
            .all(|v| v.current == v.desired && v.ready == v.desired)
}

/// Follows the rollout until it settles: on a terminal one line redrawn in
/// place, otherwise a line per change.
async fn status(client: &Client, key: &ObjectKey, timeout: Duration) -> anyhow::Result<()> {
    let terminal = std::io::stdout().is_terminal();
    let deadline = Instant::now() + timeout;
    let mut last = String::new();
    loop {
        let object = client.get(key).await?;
        let status: PinnedDeploymentStatus = object.typed_status().unwrap_or_default();
        let line = progress(&object, &status);
        let done = settled(&object, &status);
        if line != last {
            if terminal {
                print!("\r\x1b[2K{line}");
                use std::io::Write;
                std::io::stdout().flush()?;
            } else {
                println!("{line}");
            }
            last = line;
        }
        if done {
            if terminal {
                println!();
            }
            println!("{key}: rollout settled");
            return Ok(());
        }
        if let Some(halt) = status
            .halted
            .as_ref()
            .filter(|halt| halt.revision == object.metadata.revision)
        {
            if terminal {
                println!();
            }
            bail!("{key}: rollout halted: {}", halt.reason);
        }
        if Instant::now() >= deadline {
            if terminal {
                println!();
            }
            bail!("{key}: not settled after {}s", timeout.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

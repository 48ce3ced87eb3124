//! `apply`, `edit` and `delete`.

use std::io::{IsTerminal, Read};
use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Args;
use corral_api::workflow::{StoredWorkflows, WorkflowOutcome};
use corral_api::{Cascade, Object, parse_manifests};
use corral_client::{Client, DeleteOptions};

use super::connect;
use super::workflow::Until;
use crate::target::Target;

#[derive(Debug, Args)]
#[command(after_help = "Examples:
  corral apply -f pod.yaml -m \"first version\"
  corral apply -f pod.yaml --wait               follow the start or update workflow live
  corral apply -f pod.yaml --wait --timeout 10m | cat    plain lines, one per step transition
  corral apply -f pod.yaml --dry-run            what would change and which containers restart")]
pub struct ApplyArgs {
    /// Manifest file (YAML or JSON; `-` reads standard input).
    #[arg(short = 'f', long = "filename", value_name = "FILE")]
    file: PathBuf,
    /// Message recorded with each new revision, like a commit message.
    #[arg(short = 'm', long, value_name = "MSG")]
    message: Option<String>,
    /// Namespace for objects whose manifest names none.
    #[arg(short = 'n', long, value_name = "NS")]
    namespace: Option<String>,
    /// After applying, follow each object's newest workflow (start, update,
    /// join) until it succeeds, fails or --timeout passes; exit non-zero
    /// unless it succeeds. A live view in a terminal, one line per step
    /// transition otherwise.
    #[arg(long)]
    wait: bool,
    /// How long --wait waits in all (`90s`, `10m`).
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = humantime::parse_duration, requires = "wait")]
    timeout: std::time::Duration,
    /// Write nothing: say what each object would become (created,
    /// unchanged, or the spec's diff and which containers would restart).
    #[arg(long, conflicts_with = "wait")]
    dry_run: bool,
}

/// Reads and validates a whole manifest before anything is sent, so a bad
/// document changes nothing.
pub(super) fn read_manifest(
    file: &PathBuf,
    namespace: Option<&str>,
) -> anyhow::Result<Vec<Object>> {
    let text = if file.as_os_str() == "-" {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text)?;
        text
    } else {
        std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?
    };
    let mut objects = parse_manifests(&text)
        .with_context(|| format!("{} is not a valid manifest", file.display()))?;
    for object in &mut objects {
        if object.kind.is_namespaced() && object.metadata.namespace.is_none() {
            object.metadata.namespace = namespace.map(str::to_string);
        }
    }
    Ok(objects)
}

pub async fn apply(config: Option<PathBuf>, args: ApplyArgs) -> anyhow::Result<()> {
    let objects = read_manifest(&args.file, args.namespace.as_deref())?;
    let client = connect(config)?;
    if args.dry_run {
        super::preview::preview(&client, &objects).await?;
        return Ok(());
    }
    let deadline = tokio::time::Instant::now() + args.timeout;
    let mut applied = Vec::new();
    for object in objects {
        applied.push(apply_one(&client, &object, args.message.as_deref()).await?);
    }
    if args.wait {
        let live = std::io::stdout().is_terminal();
        for stored in &applied {
            super::workflow::follow(&client, stored, deadline, live).await?;
        }
    }
    Ok(())
}

async fn apply_one(
    client: &Client,
    object: &Object,
    message: Option<&str>,
) -> anyhow::Result<Object> {
    let key = object.key();
    let before = match client.get(&key).await {
        Ok(existing) => Some(existing),
        Err(error) if error.status() == Some(404) => None,
        Err(error) => return Err(error).with_context(|| format!("cannot read {key}")),
    };
    let stored = client
        .apply(object, message)
        .await
        .with_context(|| format!("{key} was not applied"))?;
    let revision = stored.metadata.revision;
    match before {
        None => println!("{key} created (revision {revision})"),
        Some(before) if before.metadata.revision == revision => match retried(&before, &stored) {
            // An unchanged apply of a failed object runs its failed steps again.
            Some(id) => println!("{key} unchanged (revision {revision}); retrying failed {id}"),
            None => println!("{key} unchanged (revision {revision})"),
        },
        Some(_) => println!("{key} configured (revision {revision})"),
    }
    Ok(stored)
}

/// The id of the newest workflow instance if it failed in `before` and runs
/// again in `after`.
fn retried(before: &Object, after: &Object) -> Option<String> {
    let newest = |object: &Object| {
        StoredWorkflows::of(&object.status)
            .ok()
            .and_then(|stored| stored.latest().map(|i| (i.id.clone(), i.outcome)))
    };
    let (id, was) = newest(before)?;
    let (now_id, now) = newest(after)?;
    (id == now_id && was == WorkflowOutcome::Failed && now == WorkflowOutcome::Running)
        .then_some(id)
}

#[derive(Debug, Args)]
#[command(after_help = "Examples:
  corral edit pd/web -m \"more replicas\"       in $VISUAL, else $EDITOR, else vi
  VISUAL=nano corral edit pod/web -n team-a   with nano, in namespace team-a")]
pub struct EditArgs {
    /// The object: KIND/NAME.
    target: String,
    /// Message recorded with the new revision.
    #[arg(short = 'm', long, value_name = "MSG")]
    message: Option<String>,
    #[arg(short = 'n', long, value_name = "NS")]
    namespace: Option<String>,
}

pub async fn edit(config: Option<PathBuf>, args: EditArgs) -> anyhow::Result<()> {
    let key = Target::parse(&args.target, None)?.key(args.namespace.as_deref())?;
    let client = connect(config)?;
    let mut object = client.get(&key).await?;
    object.status = serde_json::Value::Null;
    let original = serde_yaml_ng::to_string(&object)?;
    let file = tempfile::Builder::new()
        .prefix("corral-edit-")
        .suffix(".yaml")
        .tempfile()?;
    let header = format!(
        "# Edit {key} and save; an empty file or no change cancels.\n# resourceVersion makes the write fail if someone else changed it meanwhile.\n"
    );
    std::fs::write(file.path(), format!("{header}{original}"))?;
    let editor = std::env::var("VISUAL")
        .or_else(|_| std::env::var("EDITOR"))
        .unwrap_or_else(|_| "vi".into());
    // What the person was last shown: the original, or their own refused
    // edit. Saving it unchanged gives up.
    let mut shown = original.clone();
    let mut refused = false;
    loop {
        run_editor(&editor, file.path())?;
        let edited = std::fs::read_to_string(file.path())?;
        let body = uncommented(&edited);
        if body.trim().is_empty() || body.trim() == shown.trim() {
            if refused {
                let (_, kept) = file.keep()?;
                bail!(
                    "edit cancelled, nothing changed; your edit is kept in {}",
                    kept.display()
                );
            }
            println!("edit cancelled, no changes made");
            return Ok(());
        }
        match apply_edit(&client, &object, &body, args.message.as_deref()).await {
            Ok(revision) => {
                println!("{key} edited (revision {revision})");
                return Ok(());
            }
            Err(error) => {
                // Open the buffer again with the reason on top, like kubectl.
                let reason: String = format!("{error:#}")
                    .lines()
                    .map(|line| format!("# {line}\n"))
                    .collect();
                std::fs::write(
                    file.path(),
                    format!(
                        "# The edit was refused; fix it and save, or save it unchanged to give up:\n{reason}#\n{header}{body}\n"
                    ),
                )?;
                eprintln!("error: {error:#}; reopening the editor");
                shown = body;
                refused = true;
            }
        }
    }
}

/// Runs `editor` on `path`, through the shell so `EDITOR="code --wait"` works.
fn run_editor(editor: &str, path: &std::path::Path) -> anyhow::Result<()> {
    let status = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("{editor} \"$1\""))
        .arg("sh")
        .arg(path)
        .status()
        .with_context(|| format!("cannot run the editor {editor:?}"))?;
    if !status.success() {
        bail!("the editor {editor:?} failed ({status}); nothing changed");
    }
    Ok(())
}

/// The edited text without its comment lines.
fn uncommented(text: &str) -> String {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Checks and applies an edit of `read` (the object as it was read);
/// returns the new revision. The write carries the resourceVersion read, so
/// a concurrent change of the spec is refused; a conflict caused only by
/// status writes (the spec revision did not move) is not one, and the edit
/// is written again on the fresh version.
async fn apply_edit(
    client: &Client,
    read: &Object,
    body: &str,
    message: Option<&str>,
) -> anyhow::Result<u64> {
    let key = read.key();
    let objects = parse_manifests(body).context("the edited object is not valid")?;
    let [edited] = objects.as_slice() else {
        bail!("the edited file must hold exactly one object");
    };
    if edited.key() != key {
        bail!(
            "the edit renamed {key} to {}; names cannot change",
            edited.key()
        );
    }
    let mut edited = edited.clone();
    // Controllers and the node write the object's status all along (a pod
    // being placed or started): only a new spec revision refuses the edit;
    // status writes are waited out, a little longer each time.
    for attempt in 0..10u64 {
        match client.apply(&edited, message).await {
            Ok(stored) => return Ok(stored.metadata.revision),
            Err(error) if error.status() == Some(409) => {
                let fresh = client.get(&key).await?;
                if fresh.metadata.revision != read.metadata.revision {
                    return Err(error.into());
                }
                edited.metadata.resource_version = fresh.metadata.resource_version;
                tokio::time::sleep(std::time::Duration::from_millis(20 * attempt)).await;
            }
            Err(error) => return Err(error.into()),
        }
    }
    bail!("{key} kept changing while the edit was written; try again")
}

#[derive(Debug, Args)]
#[command(after_help = "Examples:
  corral delete pod/web                         delete one object
  corral delete pd web -m \"replaced by pd/api\"  KIND NAME, with a message for its history
  corral delete pd/web --cascade=orphan         keep its pods, without an owner
  corral delete -f web.yaml                     every object in the manifest
  corral delete pod/web --wait                  follow its stop workflow until it is gone
  corral delete pod/web --skip acme/backup      do not wait for that step
  corral delete pod/web --force                 skip every step left: remove it now
  corral delete node/node-2 --wait              drain it: its pods move, then its agent leaves

A pod a node runs stops through its `stop` workflow: preStop hooks,
SIGTERM and the grace period, volumes released through their plugins,
the sandbox and address freed, and every step a Controller registered
(a finalizer); it is removed when that finishes. `corral why pod/web`
names what a deletion waits on. --skip and --force are recorded in the
step log and in the pod's history. A VM stops the same way (ACPI first).
Deleting a node drains it: nothing new is placed there, every pod not
pinned to it moves, pods pinned there and VMs hold the drain until you
delete, re-pin or migrate them (`corral why node/x` names them), then its
agent stops heartbeating and the node is removed; restarting the agent
joins it again.

Deleting an object deletes its dependents too: the objects whose
metadata.owner names it (a PinnedDeployment's pods), each recorded in its
history as `deleted with pd/web`.")]
pub struct DeleteArgs {
    /// KIND/NAME (or KIND NAME) of the object to delete.
    target: Option<String>,
    name: Option<String>,
    /// Delete every object of a manifest instead.
    #[arg(
        short = 'f',
        long = "filename",
        value_name = "FILE",
        conflicts_with = "target"
    )]
    file: Option<PathBuf>,
    #[arg(short = 'm', long, value_name = "MSG")]
    message: Option<String>,
    #[arg(short = 'n', long, value_name = "NS")]
    namespace: Option<String>,
    /// What happens to the objects it owns: `delete` them too (the
    /// default), or `orphan` them (kept, their owner cleared).
    #[arg(long, value_name = "POLICY", default_value_t = Cascade::Delete)]
    cascade: Cascade,
    /// Follow the stop workflow live until the object is gone.
    #[arg(long)]
    wait: bool,
    /// How long --wait waits in all (`90s`, `10m`).
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = humantime::parse_duration, requires = "wait")]
    timeout: std::time::Duration,
    /// Skip this step of the stop workflow (repeatable); it is recorded as
    /// skipped by you.
    #[arg(long, value_name = "STEP")]
    skip: Vec<String>,
    /// Skip every step of the stop workflow not done yet: the object is
    /// removed now, whatever still runs on its node is left to the node.
    #[arg(long)]
    force: bool,
}

pub async fn delete(config: Option<PathBuf>, args: DeleteArgs) -> anyhow::Result<()> {
    let keys = match (&args.file, &args.target) {
        (Some(file), _) => read_manifest(file, args.namespace.as_deref())?
            .iter()
            .map(Object::key)
            .collect(),
        (None, Some(target)) => {
            vec![Target::parse(target, args.name.as_deref())?.key(args.namespace.as_deref())?]
        }
        (None, None) => bail!("name what to delete: KIND/NAME or -f FILE"),
    };
    let client = connect(config)?;
    let options = DeleteOptions {
        message: args.message.as_deref(),
        cascade: args.cascade,
        force: args.force,
        skip: &args.skip,
    };
    let deadline = tokio::time::Instant::now() + args.timeout;
    let live = std::io::stdout().is_terminal();
    for key in keys {
        let answered = client.delete_as(&key, &options).await?;
        let Some(deletion) = answered
            .metadata
            .deleting
            .as_ref()
            .filter(|deletion| !stop_finished(&answered, &deletion.workflow))
        else {
            println!("{key} deleted");
            continue;
        };
        if args.wait {
            super::workflow::follow_until(&client, &answered, deadline, live, Until::Gone).await?;
        } else {
            println!(
                "{key} deleting: its stop workflow {} runs (corral why {key}; --wait to follow it)",
                deletion.workflow
            );
        }
    }
    Ok(())
}

/// Whether the object's stop instance `id` succeeded: the server removed it
/// in the same request (a pod with nothing left to wait for, `--force`).
fn stop_finished(object: &Object, id: &str) -> bool {
    StoredWorkflows::of(&object.status).is_ok_and(|status| {
        status
            .instances
            .iter()
            .any(|instance| instance.id == id && instance.outcome == WorkflowOutcome::Succeeded)
    })
}

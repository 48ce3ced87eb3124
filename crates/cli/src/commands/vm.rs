//! `corral vm …`: operations on a VirtualMachine beyond its manifest —
//! snapshots (take, list, delete), restore, stop and start (`spec.running`,
//! docs/design/0041-vm-stop-start.md), restart, reset and live
//! migration to another node. Each is a
//! new revision of the VM written by whoever ran the command (so `corral
//! history vm/NAME` shows who took, restored or deleted what, and when),
//! which the VM's node applies in place through the `update` workflow
//! (see docs/design/0029-vm-operations.md) — a migration through the
//! `migrate` workflow (docs/design/0034-live-migration.md). By default the
//! command follows
//! that workflow until it is done.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use chrono::{SecondsFormat, Utc};
use clap::{Args, Subcommand};
use corral_api::kinds::{
    PowerAction, VirtualMachineSpec, VmMigration, VmPower, VmRestore, VmSnapshot,
};
use corral_api::{Kind, Object, ObjectKey};
use corral_client::Client;
use serde_json::Value;

use super::connect;
use crate::target::Target;

#[derive(Debug, Args)]
pub struct VmArgs {
    #[command(subcommand)]
    command: VmCommand,
}

/// What every operation takes: the VM, and whether to wait for it.
#[derive(Debug, Args)]
struct Operation {
    /// The VM: vm/NAME (or just NAME).
    target: String,
    #[arg(short = 'n', long, value_name = "NS", default_value = "default")]
    namespace: String,
    /// Return once the revision is written, without following the node.
    #[arg(long)]
    no_wait: bool,
    /// How long to follow the node's work (`90s`, `10m`).
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = humantime::parse_duration)]
    timeout: Duration,
}

#[derive(Debug, Subcommand)]
enum VmCommand {
    /// Take a snapshot of the VM's disk — with the guest's memory when it
    /// runs, so a restore resumes it where it was — or list (`list`) or
    /// delete (`delete`) its snapshots.
    #[command(
        args_conflicts_with_subcommands = true,
        subcommand_negates_reqs = true,
        after_help = "Examples:
  corral vm snapshot vm/builder before-upgrade     take it (disk and memory)
  corral vm snapshot list vm/builder               its snapshots, who took them and when
  corral vm snapshot delete vm/builder before-upgrade"
    )]
    Snapshot(SnapshotArgs),
    /// Return the VM to a snapshot: a running guest resumes where it was
    /// when the snapshot was taken (its disk too); a disk-only snapshot
    /// boots again from the restored disk.
    #[command(after_help = "Examples:
  corral vm restore vm/builder before-upgrade
  corral history vm/builder                        the restore is a revision")]
    Restore {
        #[command(flatten)]
        operation: Operation,
        /// The snapshot.
        name: String,
    },
    /// Power the VM off and keep it (disks, address, node) until `vm start`.
    ///
    /// The guest gets the ACPI power button and its grace period
    /// (spec.stopGraceSeconds) to shut down, then QEMU is quit. Its disks,
    /// address and node stay, and so does its room on the node; it stays
    /// off, across node restarts too, until `corral vm start`. Writes
    /// `spec.running: false` as a revision by you; on a VM already stopped
    /// it says so and writes nothing.
    #[command(after_help = "Examples:
  corral vm stop vm/builder
  corral vm stop vm/builder -m \"maintenance window\"  the reason, in history
  corral get vm/builder                             PHASE Stopped
  corral why vm/builder                             stopped because its spec asks, by whom")]
    Stop {
        #[command(flatten)]
        operation: Operation,
        /// Why, for history: the revision's message is `vm stop: MESSAGE`.
        #[arg(short = 'm', long)]
        message: Option<String>,
    },
    /// Power a stopped VM on again: a fresh boot from its kept disks.
    ///
    /// It boots on the same node with the same address (the boot marker is
    /// awaited as usual). Writes `spec.running: true` (left out of the
    /// spec: the default) as a revision by you; on a VM that already runs
    /// it says so and writes nothing.
    #[command(after_help = "Examples:
  corral vm start vm/builder
  corral vm start vm/builder -m \"maintenance done\"    the reason, in history")]
    Start {
        #[command(flatten)]
        operation: Operation,
        /// Why, for history: the revision's message is `vm start: MESSAGE`.
        #[arg(short = 'm', long)]
        message: Option<String>,
    },
    /// Stop the guest cleanly (ACPI power button, then quit after its
    /// grace period) and start it again. A stopped VM is started with
    /// `corral vm start` instead.
    #[command(after_help = "Examples:
  corral vm restart vm/builder")]
    Restart {
        #[command(flatten)]
        operation: Operation,
    },
    /// Press the machine's reset button: the guest reboots at once.
    #[command(after_help = "Examples:
  corral vm reset vm/builder")]
    Reset {
        #[command(flatten)]
        operation: Operation,
    },
    /// Move the running guest to another node without stopping it (QEMU
    /// live migration: its disks, then its memory, over the node network);
    /// the VM's `migrate` workflow shows each phase.
    #[command(after_help = "Examples:
  corral vm migrate vm/builder --to node-2
  corral why vm/builder                            which phase a migration is in")]
    Migrate {
        #[command(flatten)]
        operation: Operation,
        /// The node the VM goes to.
        #[arg(long, value_name = "NODE")]
        to: String,
    },
}

#[derive(Debug, Args)]
struct SnapshotArgs {
    #[command(subcommand)]
    command: Option<SnapshotCommand>,
    /// The VM: vm/NAME.
    #[arg(required = true)]
    target: Option<String>,
    /// The snapshot's name (letters, digits, '-', '_', '.').
    #[arg(required = true)]
    name: Option<String>,
    #[arg(short = 'n', long, value_name = "NS", default_value = "default")]
    namespace: String,
    /// Return once the revision is written, without following the node.
    #[arg(long)]
    no_wait: bool,
    /// How long to follow the node's work (`90s`, `10m`).
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = humantime::parse_duration)]
    timeout: Duration,
}

#[derive(Debug, Subcommand)]
enum SnapshotCommand {
    /// List the VM's snapshots: whether each holds memory, when it was
    /// taken and by whom.
    #[command(after_help = "Examples:
  corral vm snapshot list vm/builder")]
    List {
        /// The VM: vm/NAME.
        target: String,
        #[arg(short = 'n', long, value_name = "NS", default_value = "default")]
        namespace: String,
    },
    /// Delete a snapshot from the VM's disk.
    #[command(after_help = "Examples:
  corral vm snapshot delete vm/builder before-upgrade")]
    Delete {
        #[command(flatten)]
        operation: Operation,
        name: String,
    },
}

/// The VM `target` names: `vm/NAME`, or just its name.
fn vm_key(target: &str, namespace: &str) -> anyhow::Result<ObjectKey> {
    if !target.contains('/') {
        return Ok(ObjectKey::new(
            Kind::VirtualMachine,
            Some(namespace),
            target,
        ));
    }
    let key = Target::parse(target, None)?.key(Some(namespace))?;
    if key.kind != Kind::VirtualMachine {
        bail!("{target} is a {}, not a VM", key.kind);
    }
    Ok(key)
}

fn now() -> String {
    Utc::now().to_rfc3339_opts(SecondsFormat::Millis, true)
}

pub async fn run(config: Option<PathBuf>, args: VmArgs) -> anyhow::Result<()> {
    let client = connect(config)?;
    match args.command {
        VmCommand::Snapshot(SnapshotArgs {
            command: Some(SnapshotCommand::List { target, namespace }),
            ..
        }) => list(&client, &vm_key(&target, &namespace)?).await,
        VmCommand::Snapshot(SnapshotArgs {
            command: Some(SnapshotCommand::Delete { operation, name }),
            ..
        }) => {
            let message = format!("vm snapshot delete {name}");
            change(&client, &operation, &message, |spec| {
                let before = spec.snapshots.len();
                spec.snapshots.retain(|s| s.name != name);
                if spec.snapshots.len() == before {
                    bail!("the VM has no snapshot {name}");
                }
                if spec.restore.as_ref().is_some_and(|r| r.snapshot == name) {
                    spec.restore = None;
                }
                Ok(())
            })
            .await
        }
        VmCommand::Snapshot(SnapshotArgs {
            command: None,
            target: Some(target),
            name: Some(name),
            namespace,
            no_wait,
            timeout,
        }) => {
            let operation = Operation {
                target,
                namespace,
                no_wait,
                timeout,
            };
            if !corral_api::kinds::is_snapshot_name(&name) {
                bail!(
                    "{name:?} cannot name a snapshot: use letters, digits, '-', '_' and '.' (at most 64)"
                );
            }
            let message = format!("vm snapshot {name}");
            change(&client, &operation, &message, |spec| {
                if spec.snapshots.iter().any(|s| s.name == name) {
                    bail!("the VM already has a snapshot {name}; delete it first");
                }
                spec.snapshots.push(VmSnapshot { name: name.clone() });
                Ok(())
            })
            .await
        }
        VmCommand::Snapshot(_) => bail!("give vm/NAME and a snapshot name, or list/delete"),
        VmCommand::Restore { operation, name } => {
            let message = format!("vm restore {name}");
            change(&client, &operation, &message, |spec| {
                if !spec.snapshots.iter().any(|s| s.name == name) {
                    bail!("the VM has no snapshot {name} (corral vm snapshot list)");
                }
                spec.restore = Some(VmRestore {
                    snapshot: name.clone(),
                    at: now(),
                });
                Ok(())
            })
            .await
        }
        VmCommand::Stop { operation, message } => {
            run_or_stop(&client, &operation, false, message.as_deref()).await
        }
        VmCommand::Start { operation, message } => {
            run_or_stop(&client, &operation, true, message.as_deref()).await
        }
        VmCommand::Restart { operation } => power(&client, &operation, PowerAction::Restart).await,
        VmCommand::Reset { operation } => power(&client, &operation, PowerAction::Reset).await,
        VmCommand::Migrate { operation, to } => {
            let message = format!("vm migrate to {to}");
            change(&client, &operation, &message, |spec| {
                spec.migration = Some(VmMigration {
                    to: to.clone(),
                    at: now(),
                });
                Ok(())
            })
            .await
        }
    }
}

async fn power(client: &Client, operation: &Operation, action: PowerAction) -> anyhow::Result<()> {
    let word = match action {
        PowerAction::Restart => "restart",
        PowerAction::Reset => "reset",
    };
    change(client, operation, &format!("vm {word}"), |spec| {
        spec.power = Some(VmPower { action, at: now() });
        Ok(())
    })
    .await
}

/// `corral vm stop|start`: writes `spec.running` unless it already says
/// so (then says so and writes nothing).
async fn run_or_stop(
    client: &Client,
    operation: &Operation,
    running: bool,
    reason: Option<&str>,
) -> anyhow::Result<()> {
    let word = if running { "start" } else { "stop" };
    let key = vm_key(&operation.target, &operation.namespace)?;
    let vm = client.get(&key).await?;
    let spec: VirtualMachineSpec = vm
        .typed_spec()
        .with_context(|| format!("{key} has an unreadable spec"))?;
    if spec.template {
        bail!(
            "vm/{} is a template: it never runs (its disk is its clones' base); there is nothing to {word}",
            key.name
        );
    }
    if spec.running == running {
        let state = if running { "running" } else { "stopped" };
        println!(
            "vm/{}: already {state} (spec.running: {running} in revision {}): nothing written",
            key.name, vm.metadata.revision
        );
        return Ok(());
    }
    let message = match reason {
        Some(reason) if !reason.trim().is_empty() => format!("vm {word}: {}", reason.trim()),
        _ => format!("vm {word}"),
    };
    change(client, operation, &message, |spec| {
        if spec.running == running {
            bail!("the VM was changed meanwhile and is already as asked; run the command again");
        }
        spec.running = running;
        Ok(())
    })
    .await
}

/// Writes the VM's spec changed by `edit` as a revision with `message`,
/// then (unless --no-wait) follows its workflow on the node.
async fn change(
    client: &Client,
    operation: &Operation,
    message: &str,
    edit: impl Fn(&mut VirtualMachineSpec) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let key = vm_key(&operation.target, &operation.namespace)?;
    let deadline = tokio::time::Instant::now() + operation.timeout;
    let (written, _, ()) =
        super::update_spec::<VirtualMachineSpec, _>(client, &key, |_| message.to_string(), edit)
            .await?;
    println!(
        "vm/{}: {message} (revision {})",
        key.name, written.metadata.revision
    );
    if !operation.no_wait {
        let live = std::io::stdout().is_terminal();
        super::workflow::follow(client, &written, deadline, live).await?;
    }
    Ok(())
}

/// `corral vm snapshot list`: the snapshots in the disk (the node's
/// report), each with the revision that asked for it (author and time).
async fn list(client: &Client, key: &ObjectKey) -> anyhow::Result<()> {
    let vm = client.get(key).await?;
    let history = client.history(key).await?;
    let rows = snapshot_rows(&vm, &history)?;
    let mut table = crate::output::Table::new(&["NAME", "MEMORY", "TAKEN", "BY", "REVISION"]);
    for row in rows {
        table.row(row);
    }
    table.print();
    Ok(())
}

/// One row per snapshot the node reports in `status.snapshots` (or, not
/// taken yet, the spec lists).
fn snapshot_rows(
    vm: &Object,
    history: &[corral_api::history::RevisionRecord],
) -> anyhow::Result<Vec<Vec<String>>> {
    let spec: VirtualMachineSpec = vm
        .typed_spec()
        .with_context(|| format!("{} has an unreadable spec", vm.key()))?;
    let reported: Vec<Value> = vm
        .status
        .get("snapshots")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let asked = |name: &str| {
        let message = format!("vm snapshot {name}");
        history.iter().rev().find(|r| r.message == message)
    };
    let mut names: Vec<String> = reported
        .iter()
        .filter_map(|s| s["name"].as_str().map(str::to_string))
        .collect();
    for listed in &spec.snapshots {
        if !names.contains(&listed.name) {
            names.push(listed.name.clone());
        }
    }
    Ok(names
        .into_iter()
        .map(|name| {
            let report = reported.iter().find(|s| s["name"] == name.as_str());
            let memory = match report.map(|s| s["memory"].as_bool()) {
                Some(Some(true)) => "yes",
                Some(_) => "no",
                None => "-",
            };
            let taken = report
                .and_then(|s| s["takenAt"].as_str())
                .unwrap_or(if spec.snapshots.iter().any(|s| s.name == name) {
                    "(not yet)"
                } else {
                    "(being deleted)"
                })
                .to_string();
            let revision = asked(&name);
            vec![
                name.clone(),
                memory.to_string(),
                taken,
                revision.map_or("-".to_string(), |r| r.author.clone()),
                revision.map_or("-".to_string(), |r| r.revision.to_string()),
            ]
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vm_is_named_with_or_without_its_kind() {
        let key = vm_key("builder", "team-a").unwrap();
        assert_eq!(
            key,
            ObjectKey::new(Kind::VirtualMachine, Some("team-a"), "builder")
        );
        assert_eq!(vm_key("vm/builder", "team-a").unwrap(), key);
        let error = vm_key("pod/web", "default").unwrap_err().to_string();
        assert!(error.contains("not a VM"), "{error}");
    }
}

//! A VirtualMachine on this node, as the executor ([`crate::executor`])
//! runs it: the VM's node steps (tap, boot artifacts, disk, QEMU, boot
//! marker), QEMU restarted in place when the spec changes (same disk, same
//! namespace and tap, so the same address) or when it exits, and the
//! node-owned status fields.

use std::io::{Read, Seek, SeekFrom};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::Utc;
use corral_api::kinds::{DEFAULT_STOP_GRACE_SECONDS, VirtualMachineSpec};
use corral_api::{Object, ObjectKey};
use corral_runtime::vm::qmp::RunState;
use corral_runtime::vm::snapshot::SnapshotInfo;
use corral_runtime::vm::{self, VmConfig, process};
use corral_workflow::VmStep;
use serde_json::{Map, Value};

use super::VmContext;
use super::boot::{self, INITRD_PATH, KERNEL_PATH};
use super::state::VmRecord;
use crate::executor::{StepOutcome, StepRun, Workload};
use crate::steps::NodeWork;

/// How often QEMU's run state is asked for.
const RUN_STATE_EVERY: Duration = Duration::from_secs(2);
/// A disk the node creates is this big unless the spec says otherwise.
pub const DEFAULT_DISK_BYTES: u64 = 1 << 30;
/// The tap device in every VM's namespace.
pub const TAP: &str = "tap0";
/// The wait before QEMU is started again after it exited.
const RESTART_DELAY: Duration = Duration::from_secs(2);

/// The status fields the node owns on a VM.
const STATUS_FIELDS: [&str; 6] = [
    "phase",
    "observedRevision",
    "message",
    "runState",
    "snapshots",
    "sandbox",
];

/// One VM on this node: its local record and the VM as the API last
/// showed it.
#[derive(Debug)]
pub struct VmWorkload {
    pub(super) ctx: Arc<VmContext>,
    pub(super) record: VmRecord,
    pub(super) desired: Object,
    restart_at: Option<Instant>,
    /// QEMU's run state as last asked, and when.
    run_state: Option<RunState>,
    run_state_at: Option<Instant>,
    /// The disk's snapshot table as last read (`None`: not read yet).
    pub(super) snapshots: Option<Vec<SnapshotInfo>>,
    /// `node/remove-tap` of the VM's stop workflow is done: its removal
    /// only forgets it.
    pub(super) released: bool,
    /// A live migration's byte relay between QEMU's unix socket and the
    /// other node ([`super::migration`]), while it runs.
    pub(super) relay: Option<tokio::task::JoinHandle<()>>,
    /// QEMU waits for (or is receiving) a migrating guest: it is not
    /// supervised until the switch-over.
    pub(super) incoming: bool,
}

pub(super) fn typed_spec(object: &Object) -> Option<VirtualMachineSpec> {
    object.typed_spec().ok()
}

pub(super) fn short(uid: &str) -> String {
    uid.chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .take(12)
        .collect()
}

impl VmWorkload {
    pub fn new(ctx: Arc<VmContext>, mut record: VmRecord) -> Self {
        // A pid from before a reboot may now be anyone's.
        if let Some(pid) = record.pid
            && !process::is_vm_process(pid, &qemu_name(&record.vm.metadata.uid))
        {
            record.pid = None;
        }
        let desired = record.vm.clone();
        VmWorkload {
            ctx,
            record,
            desired,
            restart_at: None,
            run_state: None,
            run_state_at: None,
            snapshots: None,
            released: false,
            relay: None,
            incoming: false,
        }
    }

    pub(super) fn key(&self) -> ObjectKey {
        self.record.vm.key()
    }

    pub(super) fn uid(&self) -> String {
        self.record.vm.metadata.uid.clone()
    }

    pub(super) fn save(&self) {
        if let Err(error) = self.ctx.state.save(&self.record) {
            tracing::error!(vm = %self.key(), error = %crate::chain(&error), "cannot save local VM state");
        }
    }

    /// The VM's namespace, its tap device and (when the node has a pod
    /// network) the veth to the node bridged to the tap; returns a note.
    async fn ensure_network(&mut self) -> Result<String, String> {
        let netns = self.ctx.agent.netns.clone();
        let name = format!("vm-{}", short(&self.uid()));
        let path = tokio::task::spawn_blocking(move || {
            let path = netns.create(&name).map_err(|e| crate::chain(&e))?;
            process::create_tap(&path, TAP).map_err(|e| crate::chain(&e))?;
            Ok::<_, String>(path)
        })
        .await
        .map_err(|e| e.to_string())??;
        let mut note = format!("{} in {}", TAP, path.display());
        self.record.netns = Some(path.clone());
        self.save();
        if let Some(network) = self.ctx.agent.network.clone() {
            let address = self.address().await?;
            let ipv4 = self.egress_address(&network)?;
            let link = corral_net::datapath::VmLink::nth(0, TAP);
            let wired = network
                .wire_vm(&self.network_owner(), &path, address, ipv4, &link)
                .await
                .map_err(|e| crate::chain(&e))?;
            note = format!("{note}; {wired}");
        }
        for further in self.wire_further_links(&path).await? {
            note = format!("{note}; {further}");
        }
        Ok(note)
    }

    /// The key the VM's host veth is named after and labelled with; apart
    /// from pods' (`NAMESPACE/NAME`), so a pod and a VM may share a name.
    pub(super) fn network_owner(&self) -> String {
        let key = self.key();
        format!("vm/{}/{}", key.namespace, key.name)
    }

    /// The VM's IPv6 address from its status (asking the API once when our
    /// copy predates the address IPAM wrote).
    async fn address(&self) -> Result<std::net::Ipv6Addr, String> {
        use crate::network::{NetworkError, pod_address};
        match pod_address(&self.desired) {
            Ok(address) => Ok(address),
            Err(NetworkError::NoAddress) if self.ctx.agent.client.is_some() => {
                let client = self
                    .ctx
                    .agent
                    .client
                    .as_ref()
                    .expect("INVARIANT: checked above");
                let fresh = client
                    .get(&self.key())
                    .await
                    .map_err(|e| crate::chain(&e))?;
                pod_address(&fresh).map_err(|e| crate::chain(&e))
            }
            Err(error) => Err(crate::chain(&error)),
        }
    }

    /// QEMU's configuration for the desired revision.
    pub(super) async fn config(&self) -> Result<VmConfig, String> {
        let spec = typed_spec(&self.desired).ok_or("the VM's spec does not decode")?;
        let runner = self.ctx.agent.runner.clone();
        let (kernel, initrd) = (spec.boot.kernel.clone(), spec.boot.initrd.clone());
        let (kernel, initrd) = tokio::task::spawn_blocking(move || {
            let kernel = kernel
                .map(|r| boot::artifact(&runner, &r, KERNEL_PATH))
                .transpose()?;
            let initrd = initrd
                .map(|r| boot::artifact(&runner, &r, INITRD_PATH))
                .transpose()?;
            Ok::<_, String>((kernel, initrd))
        })
        .await
        .map_err(|e| e.to_string())??;
        let disk = self.disk(&spec).await?.map(|(path, _)| path);
        let dir = self.ctx.vm_dir(&self.uid());
        let mut cmdline = spec
            .boot
            .cmdline
            .clone()
            .unwrap_or_else(|| "console=ttyS0".to_string());
        // The guest learns its address from the kernel command line: one
        // /128 like a pod's, everything else via fe80::1 (the node's end).
        let address = match self.ctx.agent.network {
            Some(_) => self.address().await.ok(),
            None => crate::network::pod_address(&self.desired).ok(),
        };
        if let Some(address) = address {
            cmdline.push_str(&format!(" corral.addr={address}/128"));
        }
        let (extra_nics, further) = self.further_nics(&spec).await?;
        cmdline.push_str(&further);
        Ok(VmConfig {
            name: qemu_name(&self.uid()),
            cpus: spec.cpus,
            memory_bytes: spec.memory.bytes,
            accel: self.ctx.accel(),
            kernel,
            initrd,
            cmdline: Some(cmdline),
            disk,
            data_disks: self.data_disks(&spec),
            tap: self.record.netns.as_ref().map(|_| TAP.to_string()),
            mac: vm::mac_for(&self.uid()),
            extra_nics,
            console_socket: dir.join("console.sock"),
            console_log: dir.join("console.log"),
            qmp_socket: dir.join("qmp.sock"),
            incoming: None,
            sandboxed: false,
        })
    }

    /// Stops QEMU if it runs: the ACPI power button, the VM's grace
    /// period, then quit, then SIGKILL. Returns how it went.
    pub(super) async fn stop(&mut self) -> Result<String, String> {
        let Some(pid) = self.record.pid else {
            return Ok("QEMU was not running".into());
        };
        let grace = typed_spec(&self.desired)
            .or_else(|| typed_spec(&self.record.vm))
            .map_or(DEFAULT_STOP_GRACE_SECONDS, |spec| spec.stop_grace());
        let qmp = self.ctx.vm_dir(&self.uid()).join("qmp.sock");
        let outcome = tokio::task::spawn_blocking(move || {
            process::stop(pid, &qmp, Duration::from_secs(grace.into()))
        })
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| crate::chain(&e))?;
        tracing::info!(vm = %self.key(), pid, %outcome, "QEMU stopped");
        self.record.pid = None;
        self.run_state = None;
        self.save();
        Ok(outcome.to_string())
    }

    /// (Re)starts QEMU with the desired revision; that revision is then
    /// the admitted one.
    pub(super) async fn start(&mut self) -> Result<String, String> {
        if typed_spec(&self.desired).is_some_and(|spec| spec.template) {
            // A template is not run: its disk is its clones' base.
            let stopped = self.stop().await?;
            self.record.vm = self.desired.clone();
            self.record.admitted_revision = self.desired.metadata.revision;
            self.record.booted = true;
            self.save();
            return Ok(format!(
                "a template does not run ({stopped}): its disk is its clones' base"
            ));
        }
        if typed_spec(&self.desired).is_some_and(|spec| !spec.running) {
            // Kept stopped ([`super::running`]): admitted, not started.
            let stopped = self.stop_kept().await?;
            self.record.vm = self.desired.clone();
            self.record.admitted_revision = self.desired.metadata.revision;
            self.save();
            return Ok(format!("not started: {stopped}"));
        }
        let config = self.config().await?;
        self.stop().await?;
        let accel = config.accel;
        let (pid, offset) = self.spawn_qemu(config).await?;
        self.record.pid = Some(pid);
        self.record.started_at = Some(Utc::now());
        self.record.console_offset = offset;
        self.record.booted = false;
        self.record.vm = self.desired.clone();
        self.record.admitted_revision = self.desired.metadata.revision;
        self.save();
        tracing::info!(vm = %self.key(), pid, %accel, revision = self.record.admitted_revision, "QEMU started");
        Ok(format!("qemu pid {pid} under {accel}"))
    }

    /// Whether the guest printed its marker since QEMU last started.
    fn check_booted(&mut self) -> bool {
        if self.record.booted {
            return true;
        }
        let Some(spec) = typed_spec(&self.record.vm) else {
            return false;
        };
        let booted = match &spec.boot.marker {
            None => self.record.pid.is_some(),
            Some(marker) => {
                let log = self.ctx.vm_dir(&self.uid()).join("console.log");
                console_since(&log, self.record.console_offset).contains(marker.as_str())
            }
        };
        if booted {
            self.record.booted = true;
            self.save();
        }
        booted
    }

    fn await_boot(&mut self) -> StepOutcome {
        if self.record.admitted_revision != self.desired.metadata.revision {
            return StepOutcome::NotYet;
        }
        if self.kept_stopped() && self.record.pid.is_none() {
            return StepOutcome::Done(Some(format!(
                "no boot to await: {}",
                super::running::KEPT_STOPPED
            )));
        }
        if self.check_booted() {
            return StepOutcome::Done(None);
        }
        if self.record.pid.is_none() {
            let output = std::fs::read_to_string(self.ctx.vm_dir(&self.uid()).join("qemu.log"))
                .unwrap_or_default();
            let last = output.lines().last().unwrap_or("no output").to_string();
            return StepOutcome::Failed(format!(
                "QEMU exited (code {:?}) before the guest booted: {last}",
                self.record.last_exit
            ));
        }
        StepOutcome::NotYet
    }

    /// Notices an exited QEMU and starts it again after a short delay;
    /// returns whether anything changed.
    async fn supervise_qemu(&mut self) -> bool {
        // A guest arriving by migration is the switch-over's to watch; one
        // that left is not this node's any more.
        if self.incoming || self.record.migrated_away {
            return false;
        }
        // The disk's snapshot table, read once (then after each change).
        if self.snapshots.is_none() && self.record.admitted_revision > 0 {
            self.refresh_snapshots().await;
        }
        if let Some(pid) = self.record.pid {
            if let Some(code) = process::exit_status(pid) {
                tracing::info!(vm = %self.key(), pid, ?code, "QEMU exited");
                self.record.pid = None;
                self.record.last_exit = code;
                self.record.booted = false;
                self.save();
                self.restart_at = Some(Instant::now() + RESTART_DELAY);
                return true;
            }
            if self
                .run_state_at
                .is_none_or(|at| at.elapsed() >= RUN_STATE_EVERY)
            {
                self.run_state = self.query_run_state().await;
                self.run_state_at = Some(Instant::now());
            }
            let was_booted = self.record.booted;
            return self.check_booted() && !was_booted;
        }
        // A template never runs; a VM its spec keeps stopped stays so
        // (after an agent restart or a reboot too: the admitted spec is
        // in its local record).
        if self.record.admitted_revision == 0 || self.is_template() || self.kept_stopped() {
            return false;
        }
        if self.restart_at.is_none_or(|at| Instant::now() >= at) {
            self.restart_at = Some(Instant::now() + RESTART_DELAY * 5);
            let desired = std::mem::replace(&mut self.desired, self.record.vm.clone());
            let result = self.start().await;
            self.desired = desired;
            match result {
                Ok(_) => {
                    self.record.restarts += 1;
                    self.save();
                }
                Err(error) => tracing::warn!(vm = %self.key(), %error, "QEMU restart failed"),
            }
            return true;
        }
        false
    }

    fn status_value(&self) -> serde_json::Value {
        let template = self.is_template() && self.record.admitted_revision > 0;
        let stopped = self.kept_stopped() && self.record.pid.is_none();
        let phase = match (self.record.pid, self.record.booted) {
            _ if template => "Template",
            _ if stopped => "Stopped",
            (Some(_), true) => "Running",
            _ => "Pending",
        };
        let run_state = match (self.record.pid, self.run_state) {
            (Some(_), Some(state)) => Value::from(state.as_str()),
            // Not asked yet, or QMP did not answer.
            (Some(_), None) => Value::Null,
            (None, _) => Value::from("stopped"),
        };
        let message = match self.record.pid {
            Some(pid) => format!(
                "qemu pid {pid} under {}; {}{}; restarts {}",
                self.ctx.accel(),
                self.run_state
                    .map_or(String::new(), |state| format!("{state}; ")),
                if self.record.booted {
                    "booted"
                } else {
                    "booting"
                },
                self.record.restarts
            ),
            None if template => {
                "a template: QEMU does not run; its disk is its clones' base".to_string()
            }
            None if stopped => super::running::KEPT_STOPPED.to_string(),
            None => match self.record.last_exit {
                Some(code) => format!("QEMU exited with code {code}; the node starts it again"),
                None => "QEMU is not running (its exit code was not collected); the node starts it again".to_string(),
            },
        };
        let mut status = serde_json::json!({
            "phase": phase,
            "message": message,
            "runState": run_state,
            "snapshots": self.snapshots_status(),
        });
        if self.record.admitted_revision > 0 {
            status["observedRevision"] = self.record.admitted_revision.into();
        }
        if let (Some(_), Some(sandbox)) = (self.record.pid, &self.record.sandbox) {
            status["sandbox"] = serde_json::to_value(sandbox).unwrap_or(Value::Null);
        }
        status
    }
}

#[async_trait]
impl Workload for VmWorkload {
    fn desired(&self) -> &Object {
        &self.desired
    }

    fn desired_mut(&mut self) -> &mut Object {
        &mut self.desired
    }

    /// A revision without a workflow (written before workflows existed)
    /// restarts QEMU in place.
    async fn admit_without_workflow(&mut self) {
        if self.desired.metadata.revision > self.record.admitted_revision
            && self.record.admitted_revision > 0
            && let Err(error) = self.apply_revision().await
        {
            tracing::warn!(vm = %self.key(), %error, "in-place restart failed; retrying");
        }
    }

    async fn run_step(&mut self, step: &str, work: &NodeWork) -> StepRun {
        let Ok(typed) = step.parse::<VmStep>() else {
            return StepOutcome::Failed(format!("this node does not know step {step}")).into();
        };
        match typed {
            VmStep::CreateTap => self.ensure_network().await.map(Some).into(),
            VmStep::FetchKernel => self
                .config()
                .await
                .map(|c| {
                    c.kernel
                        .map(|k| format!("kernel {}", k.display()))
                        .or(Some("boot from disk".into()))
                })
                .into(),
            VmStep::PrepareDisk => self.ensure_disk().await.into(),
            VmStep::StartVm => self.start().await.map(Some).into(),
            VmStep::RestartVm => self.apply_revision().await.map(Some).into(),
            VmStep::AwaitBoot => self.await_boot().into(),
            VmStep::StopVm => self.stop().await.map(Some).into(),
            VmStep::ReleaseDisk => self.release_disk().await.into(),
            VmStep::RemoveTap => self.remove_network().await.into(),
            VmStep::PrepareIncoming => self.prepare_incoming().await.map(Some).into(),
            VmStep::CopyDisk => self.copy_disk(work).await.map(Some).into(),
            VmStep::MigrateRam => self.migrate_ram().await.map(Some).into(),
            VmStep::SwitchOver => self.switch_over(work).await.map(Some).into(),
            VmStep::CleanupSource => self.cleanup_source().await.map(Some).into(),
        }
    }

    fn acts_for(&self, owner: &str) -> bool {
        self.acts_as(owner)
    }

    async fn supervise(&mut self) -> bool {
        if self.desired.metadata.deleting.is_some() {
            // Its stop workflow stops QEMU: nothing restarts it.
            return false;
        }
        self.supervise_qemu().await
    }

    fn status(&self) -> Option<Map<String, Value>> {
        // Only the VM's node reports it (not the node a migration leaves).
        if !self.bound_here() {
            return None;
        }
        let value = self.status_value();
        Some(crate::executor::owned_fields(&value, &STATUS_FIELDS))
    }

    async fn remove(&mut self) {
        self.remove_vm().await;
    }
}

/// QEMU's `-name` for the VM with `uid`.
pub fn qemu_name(uid: &str) -> String {
    format!("corral-{}", short(uid))
}

/// The console output after byte `offset` (lossy UTF-8).
fn console_since(log: &std::path::Path, offset: u64) -> String {
    let Ok(mut file) = std::fs::File::open(log) else {
        return String::new();
    };
    if file.seek(SeekFrom::Start(offset)).is_err() {
        return String::new();
    }
    let mut bytes = Vec::new();
    let _ = file.read_to_end(&mut bytes);
    String::from_utf8_lossy(&bytes).into_owned()
}

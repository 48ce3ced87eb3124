//! VirtualMachines bound to this node: the manager follows them through a
//! node-scoped informer ([`crate::bound`]) and routes each VM to its own
//! executor ([`crate::executor`]) with a [`workload::VmWorkload`], which
//! runs the VM's node-owned workflow steps and supervises its QEMU process.
//!
//! Each VM gets its own network namespace with a persistent tap device
//! (`tap0`) that QEMU attaches as virtio-net, a directory `DATA/vms/UID/`
//! (console socket and log, QMP socket, QEMU's output, an image disk's
//! overlay) and, for `disk.volume`, a qcow2 file in the node-local volume
//! `DATA/volumes/NAME/disk.qcow2` that outlives the VM. Whether KVM works
//! is probed once per node ([`probe_accel`]), off the start's critical
//! path (when the first VM needs it, or a while after the agent starts);
//! TCG is the fallback.
//!
//! The namespace's end of the VM's veth to the node is bridged to the tap
//! (`crate::network::PodNetwork::wire_vm`), so the guest is on the pod link
//! with its address (and IPv4 egress, like a pod); each further interface
//! is one more such link with its own address ([`nics`]). [`io`] serves the
//! console to the agent's endpoint.
//!
//! QEMU never runs as root: [`sandbox`] gives each VM its own host uid,
//! its files, a private mount namespace and QEMU's seccomp filter, and
//! [`cgroup`] its memory and CPU limits.

pub mod boot;
pub mod cgroup;
pub mod clone;
mod disks;
pub mod io;
pub mod migration;
pub mod nics;
pub mod operations;
mod removal;
pub mod running;
pub mod sandbox;
pub mod state;
pub mod workload;

/// A small VM spec for unit tests, with the fields of `extra` set over it.
#[cfg(test)]
fn test_spec(extra: serde_json::Value) -> corral_api::kinds::VirtualMachineSpec {
    let mut spec = serde_json::json!({"cpus": 1, "memory": "256Mi", "disk": {"volume": "d"},
                                      "boot": {"kernel": "k"}});
    for (key, value) in extra.as_object().expect("extra is a JSON object") {
        spec[key] = value.clone();
    }
    serde_json::from_value(spec).expect("a valid VM spec")
}

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use corral_api::{Kind, Object, ObjectKey};
use corral_runtime::vm::Accel;
use corral_runtime::vm::kvm::{self, KvmProbe};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::AgentContext;
use crate::bound::Bound;
use crate::executor::{Executor, Message as VmMessage};
use state::{VmRecord, VmState};
use workload::VmWorkload;

/// The QEMU binary VMs run with.
pub const QEMU: &str = "qemu-system-x86_64";

/// `DATA/agent/vms`: the agent's VM records.
pub fn state_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("agent").join("vms")
}

/// `DATA/vms`: one directory per VM uid (console, QMP, QEMU's output).
pub fn vms_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("vms")
}

/// What every VM worker shares beyond the agent's context.
#[derive(Debug)]
pub struct VmContext {
    pub agent: Arc<AgentContext>,
    pub state: VmState,
    /// `DATA/vms`: one directory per VM uid.
    pub vms_dir: PathBuf,
    /// `DATA/volumes`: node-local volumes, by name.
    pub volumes_dir: PathBuf,
    /// The agent's data dir (the KVM verdict is cached there).
    pub data_dir: PathBuf,
    /// Set once the KVM probe has answered, before any VM starts.
    pub accel: tokio::sync::OnceCell<Accel>,
    /// The node's address: a VM migrating here is received on it
    /// ([`migration`]); `None` receives none.
    pub migration_address: Option<std::net::IpAddr>,
}

impl VmContext {
    /// The accelerator VMs use (TCG until the probe said otherwise).
    pub fn accel(&self) -> Accel {
        self.accel.get().copied().unwrap_or(Accel::Tcg)
    }

    /// Probes KVM once (concurrent callers wait for the same probe) and
    /// reports the verdict as the node's `features.kvm`.
    pub async fn probed_accel(&self) -> Accel {
        *self
            .accel
            .get_or_init(|| async {
                let data_dir = self.data_dir.clone();
                let verdict = tokio::task::spawn_blocking(move || probe_accel(&data_dir))
                    .await
                    .unwrap_or_else(|error| {
                        KvmProbe::Unusable(format!("the probe task failed: {error}"))
                    });
                crate::node::set_kvm_feature(verdict.feature());
                tracing::info!(accel = %verdict.accel(), kvm = %verdict.feature(), "VM accelerator chosen");
                verdict.accel()
            })
            .await
    }

    pub fn vm_dir(&self, uid: &str) -> PathBuf {
        self.vms_dir.join(uid)
    }
}

/// The KVM verdict for this node, probed once and kept in
/// `DATA/agent/kvm-probe` (delete it to probe again).
pub fn probe_accel(data_dir: &Path) -> KvmProbe {
    let cache = data_dir.join("agent").join("kvm-probe");
    if let Ok(text) = std::fs::read_to_string(&cache) {
        return match text.trim() {
            "usable" => KvmProbe::Usable,
            "absent" => KvmProbe::Absent,
            other => KvmProbe::Unusable(
                other
                    .strip_prefix("unusable: ")
                    .unwrap_or(other)
                    .to_string(),
            ),
        };
    }
    let verdict = kvm::probe(
        Path::new(QEMU),
        &data_dir.join("agent"),
        Duration::from_secs(5),
    );
    let text = match &verdict {
        KvmProbe::Usable => "usable".to_string(),
        KvmProbe::Absent => "absent".to_string(),
        KvmProbe::Unusable(reason) => format!("unusable: {reason}"),
    };
    let _ = std::fs::write(&cache, text);
    verdict
}

/// How long after the agent starts KVM is probed when no VM asked first:
/// the probe runs a guest for up to seconds, which the node's first pods
/// must not wait behind.
pub const KVM_PROBE_DELAY: Duration = Duration::from_secs(20);

/// Routes VMs to their executors.
#[derive(Debug)]
pub struct VmManager {
    ctx: Arc<VmContext>,
    workers: BTreeMap<ObjectKey, (String, mpsc::Sender<VmMessage>)>,
}

impl VmManager {
    pub fn new(ctx: Arc<VmContext>) -> Self {
        VmManager {
            ctx,
            workers: BTreeMap::new(),
        }
    }

    /// A worker for every VM in local state: their QEMUs keep running (or
    /// start again) without the API.
    pub fn restore(&mut self) -> Result<usize, crate::state::StateError> {
        let records = self.ctx.state.load_all()?;
        let count = records.len();
        for record in records {
            self.spawn(record);
        }
        Ok(count)
    }

    fn spawn(&mut self, record: VmRecord) -> mpsc::Sender<VmMessage> {
        let key = record.vm.key();
        let uid = record.vm.metadata.uid.clone();
        let (sender, receiver) = mpsc::channel(16);
        let workload = VmWorkload::new(self.ctx.clone(), record);
        tokio::spawn(Executor::new(workload, self.ctx.agent.steps.clone()).run(receiver));
        self.workers.insert(key, (uid, sender.clone()));
        sender
    }

    fn bound_here(&self, vm: &Object) -> bool {
        vm.status.get("node").and_then(|n| n.as_str()) == Some(self.ctx.agent.node.as_str())
    }

    async fn route(&mut self, vm: Object) {
        let key = vm.key();
        if !self.bound_here(&vm) {
            // A VM migrating away stays with its worker, which sends the
            // guest and cleans up ([`migration`]); once that worker is gone
            // (done, or the agent restarted after it) there is nothing here.
            let leaving = migration::migrated_from(&vm) == Some(self.ctx.agent.node.as_str());
            match self.workers.get(&key) {
                Some((uid, sender)) if leaving && *uid == vm.metadata.uid => {
                    let _ = sender.send(VmMessage::Desired(Box::new(vm))).await;
                }
                _ => self.remove(&key).await,
            }
            return;
        }
        // No VM starts before the accelerator is known.
        self.ctx.probed_accel().await;
        if self
            .workers
            .get(&key)
            .is_some_and(|(uid, _)| *uid != vm.metadata.uid)
        {
            self.remove(&key).await;
        }
        let sender = match self.workers.get(&key) {
            Some((_, sender)) if !sender.is_closed() => sender.clone(),
            _ => {
                let record = self
                    .ctx
                    .state
                    .load_all()
                    .unwrap_or_default()
                    .into_iter()
                    .find(|r| r.vm.key() == key && r.vm.metadata.uid == vm.metadata.uid)
                    .unwrap_or_else(|| VmRecord::new(vm.clone()));
                self.spawn(record)
            }
        };
        let _ = sender.send(VmMessage::Desired(Box::new(vm))).await;
    }

    async fn remove(&mut self, key: &ObjectKey) {
        if let Some((_, sender)) = self.workers.remove(key) {
            let _ = sender.send(VmMessage::Remove).await;
        }
    }

    /// Restores the VMs in local state (probing KVM first when there are
    /// any), then follows the API's VirtualMachines until cancelled. With
    /// no VM to run, KVM is probed [`KVM_PROBE_DELAY`] after the start or
    /// when the first VM arrives, whichever comes first.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let has_records = self
            .ctx
            .state
            .load_all()
            .is_ok_and(|records| !records.is_empty());
        if has_records {
            self.ctx.probed_accel().await;
        } else {
            let ctx = self.ctx.clone();
            let cancelled = shutdown.clone();
            tokio::spawn(async move {
                tokio::select! {
                    () = tokio::time::sleep(KVM_PROBE_DELAY) => {
                        ctx.probed_accel().await;
                    }
                    () = cancelled.cancelled() => {}
                }
            });
        }
        match self.restore() {
            Ok(restored) => tracing::info!(restored, "VMs restored from local state"),
            Err(error) => tracing::error!(error = %crate::chain(&error), "cannot restore VMs"),
        }
        let Some(client) = self.ctx.agent.client.clone() else {
            shutdown.cancelled().await;
            return;
        };
        let mut changes = crate::bound::follow(
            client,
            Kind::VirtualMachine,
            &self.ctx.agent.node,
            shutdown.child_token(),
        );
        // Keys the API named since the agent started (see the pod manager).
        let mut seen: Option<BTreeSet<ObjectKey>> = Some(BTreeSet::new());
        loop {
            let change = tokio::select! {
                change = changes.recv() => change,
                () = shutdown.cancelled() => return,
            };
            match change {
                Some(Bound::Desired(vm)) => {
                    if let Some(seen) = seen.as_mut() {
                        seen.insert(vm.key());
                    }
                    self.route(*vm).await;
                }
                Some(Bound::Gone(key)) => self.remove(&key).await,
                Some(Bound::Synced) => {
                    let seen = seen.take().unwrap_or_default();
                    let gone: Vec<ObjectKey> = self
                        .workers
                        .keys()
                        .filter(|key| !seen.contains(key))
                        .cloned()
                        .collect();
                    for key in gone {
                        self.remove(&key).await;
                    }
                }
                None => return,
            }
        }
    }
}

//! Whether the guest runs: `spec.running` (`corral vm stop|start`, see
//! docs/design/0041-vm-stop-start.md). A VM whose spec says `false` is
//! stopped in place by `node/restart-vm` — the same clean stop as a
//! restart's first half (ACPI power button, the grace period, quit) — and
//! keeps everything else: its disks, its namespace and tap, its address
//! and its node. `true` again starts it like a restart's second half (the
//! boot marker awaited as usual).
//!
//! The node then leaves it stopped: supervision does not start a QEMU the
//! admitted spec keeps stopped, and since that spec is in the VM's local
//! record, neither an agent restart nor a reboot recovery starts it. A
//! guest that powers itself off while its spec says `running: true` is a
//! QEMU exit like any other: the node starts it again (the spec is what
//! the person asked for; `corral vm stop` is how to keep it off).

use corral_api::kinds::VirtualMachineSpec;

use super::workload::VmWorkload;

/// What a revision does to the VM's QEMU as a whole (what changes in
/// place besides, snapshots and disk sizes, is [`super::operations::plan`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunChange {
    /// QEMU runs and goes on running: everything else is done in place.
    Keep,
    /// A new QEMU: the machine changed (or QEMU is to run and does not).
    Start,
    /// Stop QEMU cleanly and keep the VM (its spec stops it).
    Stop,
    /// QEMU does not run and the spec keeps it so: only what changes in
    /// place (on its disks) is done.
    StayStopped,
    /// A template: its start stops QEMU and admits it as its clones' base.
    Template,
}

/// The change from QEMU as it is (`qemu_runs`, with the `admitted` spec)
/// to the `desired` spec: a stopped spec stops the guest and keeps it
/// stopped; one that does starts it
/// when QEMU does not run or runs another machine, and keeps it otherwise.
pub fn run_change(
    qemu_runs: bool,
    admitted: Option<&VirtualMachineSpec>,
    desired: &VirtualMachineSpec,
) -> RunChange {
    if desired.template {
        return RunChange::Template;
    }
    match (desired.running, qemu_runs) {
        (false, true) => RunChange::Stop,
        (false, false) => RunChange::StayStopped,
        (true, false) => RunChange::Start,
        (true, true) => {
            let same_machine = admitted.is_some_and(|a| a.machine() == desired.machine());
            if same_machine {
                RunChange::Keep
            } else {
                RunChange::Start
            }
        }
    }
}

/// The note of a VM its spec keeps stopped.
pub const KEPT_STOPPED: &str = "stopped as its spec asks (spec.running: false): QEMU does not run; its disks, address and node are kept";

impl VmWorkload {
    /// Whether the admitted revision keeps the VM stopped (`running:
    /// false`; a template is apart: it never runs).
    pub(super) fn kept_stopped(&self) -> bool {
        self.record.admitted_revision > 0
            && super::workload::typed_spec(&self.record.vm).is_some_and(|spec| !spec.running)
    }

    /// Stops QEMU cleanly and keeps the VM: nothing else is released.
    pub(super) async fn stop_kept(&mut self) -> Result<String, String> {
        let stopped = self.stop().await?;
        self.record.booted = false;
        self.save();
        Ok(format!(
            "stopped as its spec asks (spec.running: false): {stopped}; its disks, tap and address are kept"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vms::test_spec as spec;
    use serde_json::json;

    #[test]
    fn a_stopped_spec_stops_a_running_vm_in_place_and_keeps_it_stopped() {
        let running = spec(json!({}));
        let stopped = spec(json!({"running": false}));
        assert_eq!(run_change(true, Some(&running), &stopped), RunChange::Stop);
        // Admitted, QEMU gone: nothing starts it (an agent restart, a
        // reboot, a later snapshot or disk growth).
        assert_eq!(
            run_change(false, Some(&stopped), &stopped),
            RunChange::StayStopped
        );
        let grown = spec(json!({"running": false, "disk": {"volume": "d", "size": "2Gi"}}));
        assert_eq!(
            run_change(false, Some(&stopped), &grown),
            RunChange::StayStopped
        );
        // Another machine while stopped: it waits for the next start.
        let bigger = spec(json!({"running": false, "cpus": 2}));
        assert_eq!(
            run_change(false, Some(&stopped), &bigger),
            RunChange::StayStopped
        );
        // Created stopped: never started.
        assert_eq!(run_change(false, None, &stopped), RunChange::StayStopped);
    }

    #[test]
    fn a_running_spec_starts_a_stopped_vm_and_keeps_a_running_one() {
        let running = spec(json!({}));
        let stopped = spec(json!({"running": false}));
        assert_eq!(
            run_change(false, Some(&stopped), &running),
            RunChange::Start
        );
        assert_eq!(run_change(true, Some(&running), &running), RunChange::Keep);
        let bigger = spec(json!({"cpus": 2}));
        assert_eq!(run_change(true, Some(&running), &bigger), RunChange::Start);
        // A template never runs (its start stops it).
        let template = spec(json!({"template": true}));
        assert_eq!(
            run_change(true, Some(&running), &template),
            RunChange::Template
        );
    }
}

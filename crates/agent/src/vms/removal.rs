//! A VirtualMachine leaving this node: the steps of its `stop` workflow
//! after `node/stop-vm` (QEMU's clean stop, [`VmWorkload::stop`]) and,
//! for a VM removed without one (bound elsewhere, its deletion forced),
//! all of them at once.

use super::workload::{VmWorkload, short};

impl VmWorkload {
    /// `node/release-disk`: the VM's directory (an image disk's overlay,
    /// the console log, the sockets). A `local` volume's disk stays: it
    /// outlives the VM.
    pub(super) async fn release_disk(&mut self) -> Result<Option<String>, String> {
        let dir = self.ctx.vm_dir(&self.uid());
        self.release_sandbox();
        match std::fs::remove_dir_all(&dir) {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => Err(format!(
                "cannot remove the VM's directory {}: {error}",
                dir.display()
            )),
            _ => Ok(None),
        }
    }

    /// `node/remove-tap`: the VM's veth and network namespace (its tap
    /// lives in it).
    pub(super) async fn remove_network(&mut self) -> Result<Option<String>, String> {
        if let Some(network) = self.ctx.agent.network.clone() {
            network
                .unwire_pod(&self.network_owner())
                .await
                .map_err(|error| {
                    format!("cannot remove the VM's veth: {}", crate::chain(&error))
                })?;
        }
        let netns = self.ctx.agent.netns.clone();
        let name = format!("vm-{}", short(&self.uid()));
        let _ = tokio::task::spawn_blocking(move || netns.remove(&name)).await;
        self.released = true;
        Ok(None)
    }

    /// Stops QEMU, removes the namespace and the VM's directory and forgets
    /// the VM: what its stop workflow did not do already (all of it when
    /// it goes without one).
    pub(super) async fn remove_vm(&mut self) {
        if !self.released {
            if let Err(error) = self.stop().await {
                tracing::warn!(vm = %self.key(), %error, "cannot stop QEMU");
            }
            if let Err(error) = self.remove_network().await {
                tracing::warn!(vm = %self.key(), %error, "cannot remove the VM's network");
            }
            if let Err(error) = self.release_disk().await {
                tracing::warn!(vm = %self.key(), %error, "cannot remove the VM's files");
            }
        }
        self.release_sandbox();
        if let Err(error) = self.ctx.state.remove(&self.key()) {
            tracing::error!(vm = %self.key(), error = %crate::chain(&error), "cannot forget the VM");
        }
        tracing::info!(vm = %self.key(), "VM removed from this node");
    }
}

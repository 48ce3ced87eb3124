//! The pod's sandbox: its network namespace (and, unless it runs without
//! one, the user namespace that owns it, mapped to the pod's host id
//! range), wired to the node's pod network with the pod's IPv6 address,
//! its IPv4 egress and its `resolv.conf`. What `node/create-sandbox` does,
//! and what every container start makes sure of first.

use std::path::{Path, PathBuf};

use corral_api::kinds::{PodSpec, RuntimeClass};
use corral_api::security::{NetworkStack, network_stack};
use corral_runtime::oci::netns;
use corral_runtime::oci::userns::IdRange;

use super::{PodWorkload, short, typed_spec};
use crate::sandbox;

impl PodWorkload {
    /// Whether the pod's network namespace exists (made, and wired,
    /// before): a namespace mounted on the recorded file, not merely the
    /// file (a reboot leaves the file and takes the namespace).
    pub(super) fn has_sandbox(&self) -> bool {
        self.record
            .netns
            .as_ref()
            .is_some_and(|path| netns::exists(path))
    }

    /// The pod's namespaces, made if missing, and wired; returns a note.
    pub(super) async fn ensure_sandbox(&mut self) -> Result<String, String> {
        let began = std::time::Instant::now();
        // The containers start next, and runc then moves each into its
        // cgroup: the kernel's lock for that is made warm from now on.
        self.ctx.runner.cgroup_primer.nudge();
        let (path, created, pooled) = match &self.record.netns {
            Some(path) if netns::exists(path) => (path.clone(), false, false),
            stale => {
                // The files a reboot left (no namespace behind them) go
                // first, or the new namespace could not be pinned there.
                if let Some(name) = stale
                    .as_ref()
                    .and_then(|path| path.file_name())
                    .and_then(|name| name.to_str())
                    .map(str::to_string)
                {
                    let manager = self.ctx.netns.clone();
                    tokio::task::spawn_blocking(move || manager.remove(&name))
                        .await
                        .map_err(|e| e.to_string())?
                        .map_err(|e| crate::chain(&e))?;
                }
                let (path, pooled) = self.create_sandbox().await?;
                self.record.netns = Some(path.clone());
                (path, true, pooled)
            }
        };
        let made = began.elapsed();
        // The new namespace is saved with the egress address it gets (one
        // write), or alone.
        let network = self.ensure_network(&path, created).await;
        self.freshly_wired = network.is_ok();
        tracing::debug!(pod = %self.key(), ?made, pooled, wired = ?began.elapsed(), "sandbox ready");
        if created && !matches!(network, Ok((_, true))) {
            self.save();
        }
        let from_pool = if pooled {
            " (a spare from the node's warm pool)"
        } else {
            ""
        };
        match network?.0 {
            Some(note) => Ok(format!("{}; {note}{from_pool}", path.display())),
            None => Ok(format!("{}{from_pool}", path.display())),
        }
    }

    /// Wires the pod's namespace again before a container of a pod on
    /// gVisor's own network stack starts. runsc takes the namespace's
    /// addresses off `eth0` when a sandbox starts (it serves them itself;
    /// the kernel must not answer for them too) and the sandbox gives
    /// nothing back when it ends, so a later sandbox (the container after
    /// an init container, a restart) would find no address. Called with
    /// no container of the pod running: admission allows such a pod one
    /// long-running container. Nothing for other pods, nor for the first
    /// start after `node/create-sandbox` wired the namespace.
    pub(super) async fn rewire_for_gvisor_stack(&mut self, spec: &PodSpec) -> Result<(), String> {
        let relax = sandbox::relaxations(spec).map_err(|e| e.to_string())?;
        let runtime = spec.runtime.unwrap_or(RuntimeClass::Runc);
        if network_stack(runtime, &relax) != NetworkStack::Gvisor {
            return Ok(());
        }
        // The start about to happen takes what the last wiring made.
        if std::mem::take(&mut self.freshly_wired) {
            return Ok(());
        }
        let Some(netns) = self.record.netns.clone().filter(|_| self.has_sandbox()) else {
            return Ok(());
        };
        self.ensure_network(&netns, false).await.map(drop)
    }

    /// Makes the pod's namespaces, or takes a spare sandbox made ahead
    /// ([`crate::sandbox_pool`]); says which.
    async fn create_sandbox(&self) -> Result<(PathBuf, bool), String> {
        let spec = typed_spec(&self.desired).ok_or("the pod's spec does not decode")?;
        let relax = sandbox::relaxations(&spec).map_err(|e| e.to_string())?;
        let runtime = spec.runtime.unwrap_or(RuntimeClass::Runc);
        let user_namespace = sandbox::wants_user_namespace(&relax, runtime);
        let (netns, ranges, uid) = (
            self.ctx.netns.clone(),
            self.ctx.id_ranges.clone(),
            self.uid(),
        );
        let name = format!("pod-{}", short(&uid));
        if !user_namespace {
            return tokio::task::spawn_blocking(move || netns.create(&name))
                .await
                .map_err(|e| e.to_string())?
                .map(|path| (path, false))
                .map_err(|e| crate::chain(&e));
        }
        let (pool, reserving) = (self.ctx.sandbox_pool.clone(), uid.clone());
        let host_base =
            tokio::task::spawn_blocking(move || pool.reserve_range(&ranges, &reserving))
                .await
                .map_err(|e| e.to_string())??;
        if let Some(spare) = self.ctx.sandbox_pool.take_reserved(&uid) {
            let owner = self.network_owner();
            match crate::sandbox_pool::adopt(&self.ctx, spare, &name, &owner).await {
                Ok(path) => return Ok((path, true)),
                Err(error) => {
                    tracing::warn!(pod = %self.key(), %error, "cannot use a spare sandbox; making one");
                }
            }
        }
        tokio::task::spawn_blocking(move || {
            let ids = IdRange {
                host_base,
                size: sandbox::IDS_PER_POD,
            };
            netns
                .create_with_user_namespace(&name, ids)
                .map(|pinned| (pinned.net, false))
                .map_err(|e| crate::chain(&e))
        })
        .await
        .map_err(|e| e.to_string())?
    }

    /// Wires the pod's network namespace (veth, its IPv6 address from
    /// `status.address`, IPv4 egress); `None` when the node has no pod
    /// network. Also says whether the record was saved (`unsaved`: it
    /// has changes to save anyway).
    async fn ensure_network(
        &mut self,
        netns: &Path,
        unsaved: bool,
    ) -> Result<(Option<String>, bool), String> {
        let Some(network) = self.ctx.network.clone() else {
            return Ok((None, false));
        };
        let ipv6 = match crate::network::pod_address(&self.desired) {
            Ok(address) => address,
            // Wired before: the address kept in local state (a pod is
            // wired again after a reboot with the API away).
            Err(crate::network::NetworkError::NoAddress) if self.record.address.is_some() => {
                self.record.address.expect("INVARIANT: checked above")
            }
            Err(crate::network::NetworkError::NoAddress) if self.ctx.client.is_some() => {
                // Our copy may predate the address IPAM wrote: ask once.
                let client = self.ctx.client.as_ref().expect("INVARIANT: checked above");
                let fresh = client
                    .get(&self.key())
                    .await
                    .map_err(|e| crate::chain(&e))?;
                crate::network::pod_address(&fresh).map_err(|e| crate::chain(&e))?
            }
            Err(error) => return Err(crate::chain(&error)),
        };
        // What changes here is saved once, before it is used: a new pod's
        // address and egress address go to disk in one write.
        let mut unsaved = unsaved;
        if self.record.address != Some(ipv6) {
            self.record.address = Some(ipv6);
            unsaved = true;
        }
        // Only a node that gives pods IPv4 egress chooses an address free
        // of the other pods' (kept in memory) and the VMs'.
        if self.record.egress_ipv4.is_none() && network.gives_egress() {
            // VMs take theirs from the same range.
            let vms = crate::vms::state::VmState::open(crate::vms::state_dir(&self.ctx.data_dir));
            let taken = vms
                .and_then(|vms| {
                    crate::vms::state::egress_addresses_taken(&self.ctx.state, &vms, &self.key())
                })
                .map_err(|e| {
                    format!(
                        "cannot choose a free IPv4 egress address: {}",
                        crate::chain(&e)
                    )
                })?;
            self.record.egress_ipv4 = network
                .allocate_egress(&taken)
                .map_err(|e| crate::chain(&e))?;
            // Saved before it is used: no other pod takes it.
            unsaved = true;
        }
        if unsaved {
            self.save();
        }
        if network.dns_address().is_none()
            && let Ok(prefix) = ipnet::Ipv6Net::new(ipv6, 64)
            && let Err(error) = network.start_dns(prefix.trunc())
        {
            tracing::warn!(pod = %self.key(), error = %crate::chain(&error), "the pod gets no DNS");
        }
        let owner = self.network_owner();
        let note = network
            .wire_pod(&owner, netns, ipv6, self.record.egress_ipv4)
            .await
            .map_err(|e| crate::chain(&e))?;
        if let Some(server) = network.dns_address() {
            let dir = crate::containers::pod_dir(&self.ctx.runner.pods_dir, &self.uid());
            let text = corral_net::dns::pod_resolv_conf(server, &self.key().namespace);
            std::fs::create_dir_all(&dir)
                .and_then(|()| std::fs::write(dir.join(crate::containers::RESOLV_CONF), text))
                .map_err(|e| format!("cannot write the pod's resolv.conf: {e}"))?;
        }
        Ok((Some(note), unsaved))
    }
}

//! Starting and stopping one container of a pod with the OCI runtime:
//! image → overlay rootfs → bundle → `runc create` + `start`. Blocking
//! calls; the pod worker runs them on the blocking pool.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use corral_api::kinds::{Container, PodSpec, RuntimeClass};
use corral_api::security::{NetworkStack, Relaxation, network_stack};
use corral_runtime::bundle::{
    ContainerConfig, NetworkNamespace, ProcessOverrides, merge_process, resolve_user_in_rootfs,
    write_bundle,
};
use corral_runtime::cgroup_migration::MigrationPrimer;
use corral_runtime::image::{Image, ImageError, ImageStore, PullOptions, Registry, RegistryError};
use corral_runtime::oci::{ContainerIo, OciRuntime, Signal, Status, reap};

use crate::container_files::{
    container_dir, container_dirs, every_container_dir, mount_run_dir, remove_container_dir,
};
use crate::mount_points::prepare_mount_point;
use crate::plan::config_hash;
use crate::sandbox::{self, PodSandbox};
use crate::state::ContainerRecord;

/// The pod's `resolv.conf` in its directory, bind-mounted into every container.
pub const RESOLV_CONF: &str = "resolv.conf";

#[derive(Debug, thiserror::Error)]
pub enum ContainerError {
    /// Finding or pulling an image; the error names the image.
    #[error(transparent)]
    Image(ImageError),
    #[error("container {container}: cannot mount the layers of image {reference}")]
    Rootfs {
        container: String,
        reference: String,
        #[source]
        source: Box<ImageError>,
    },
    #[error("runtime {0:?} is not available on this node")]
    RuntimeUnavailable(RuntimeClass),
    #[error("container {container}: {message}")]
    Config { container: String, message: String },
    #[error("container {container}: the runtime failed")]
    Runtime {
        container: String,
        #[source]
        source: corral_runtime::oci::OciError,
    },
    #[error("cannot prepare {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The runtimes a node has.
#[derive(Clone)]
pub struct Runtimes {
    pub runc: Arc<dyn OciRuntime>,
    /// runsc on gVisor's own network stack: what gVisor pods start with.
    pub gvisor: Option<Arc<dyn OciRuntime>>,
    /// runsc on the host kernel's network stack (`--network=host`), for
    /// gVisor pods granted `host-network-stack` and `host-network` pods.
    /// It shares `gvisor`'s state directory: only `start` tells them apart.
    pub gvisor_host_stack: Option<Arc<dyn OciRuntime>>,
}

impl std::fmt::Debug for Runtimes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtimes")
            .field("gvisor", &self.gvisor.is_some())
            .finish_non_exhaustive()
    }
}

impl Runtimes {
    pub fn for_class(
        &self,
        class: Option<RuntimeClass>,
    ) -> Result<&Arc<dyn OciRuntime>, ContainerError> {
        match class.unwrap_or(RuntimeClass::Runc) {
            RuntimeClass::Runc => Ok(&self.runc),
            RuntimeClass::Gvisor => self
                .gvisor
                .as_ref()
                .ok_or(ContainerError::RuntimeUnavailable(RuntimeClass::Gvisor)),
        }
    }

    /// The runtime that creates and starts a container of `class` on
    /// `stack`. gVisor's own stack only for a container joining a network
    /// namespace of its own: runsc takes over that namespace's addresses,
    /// and must never take the node's.
    pub fn for_start(
        &self,
        class: Option<RuntimeClass>,
        stack: NetworkStack,
        network: &NetworkNamespace,
    ) -> Result<&Arc<dyn OciRuntime>, ContainerError> {
        let own_namespace = matches!(network, NetworkNamespace::Join(_));
        match class.unwrap_or(RuntimeClass::Runc) {
            RuntimeClass::Gvisor if stack == NetworkStack::HostKernel || !own_namespace => self
                .gvisor_host_stack
                .as_ref()
                .ok_or(ContainerError::RuntimeUnavailable(RuntimeClass::Gvisor)),
            class => self.for_class(Some(class)),
        }
    }
}

/// Makes a registry client. Called on the blocking pool for each pull: the
/// HTTP client blocks, so it must never be made or dropped on an async task.
pub type RegistryFactory = Arc<dyn Fn() -> Result<Box<dyn Registry>, RegistryError> + Send + Sync>;

/// Runs containers for pods on this node.
#[derive(Clone)]
pub struct ContainerRunner {
    pub images: Arc<ImageStore>,
    pub registry: RegistryFactory,
    pub runtimes: Runtimes,
    /// `DATA/pods`: per-pod directories (rootfs layers, bundles, logs).
    pub pods_dir: PathBuf,
    /// Nudged as a container start begins, so the runtime's move of the
    /// container into its cgroup does not wait out a kernel grace period
    /// (see [`corral_runtime::cgroup_migration`]).
    pub cgroup_primer: Arc<MigrationPrimer>,
}

impl std::fmt::Debug for ContainerRunner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContainerRunner")
            .field("pods_dir", &self.pods_dir)
            .finish_non_exhaustive()
    }
}

/// The directory of one pod's files.
pub fn pod_dir(pods_dir: &Path, uid: &str) -> PathBuf {
    pods_dir.join(uid)
}

/// A container's log file.
pub fn log_path(pods_dir: &Path, uid: &str, container: &str) -> PathBuf {
    pod_dir(pods_dir, uid)
        .join("logs")
        .join(format!("{container}.log"))
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> ContainerError + '_ {
    move |source| ContainerError::Io {
        path: path.to_path_buf(),
        source,
    }
}

impl ContainerRunner {
    /// The image, from the local store or pulled from its registry.
    pub fn ensure_image(&self, reference: &str) -> Result<Image, ContainerError> {
        self.ensure_image_with(reference, PullOptions::default())
    }

    /// The image: the one on the node under the name as given (or, for a
    /// name with no registry host, its Docker Hub name) is used as it is;
    /// any other is pulled with `options` (a `local/` name never is).
    pub fn ensure_image_with(
        &self,
        reference: &str,
        options: PullOptions<'_>,
    ) -> Result<Image, ContainerError> {
        let error = ContainerError::Image;
        if let Some(image) = self.images.find(reference).map_err(error)? {
            return Ok(image);
        }
        let registry = (self.registry)().map_err(|e| error(ImageError::Registry(e)))?;
        self.images
            .pull(registry.as_ref(), reference, options)
            .map_err(error)
    }

    /// Starts `container` of the pod `uid` in the pod's sandbox (its
    /// network and user namespaces); returns its new record.
    pub fn start(
        &self,
        uid: &str,
        pod_name: &str,
        spec: &PodSpec,
        container: &Container,
        generation: u64,
        sandbox: &PodSandbox,
    ) -> Result<ContainerRecord, ContainerError> {
        let began = Instant::now();
        // Known before any work: a node without the runtime says so first.
        self.runtimes.for_class(spec.runtime)?;
        // The runtime moves the container into its cgroup some 10 ms from
        // now: the kernel's lock for that is made warm meanwhile.
        self.cgroup_primer.nudge();
        let image = self.ensure_image(&container.image)?;
        let imaged = began.elapsed();
        let runtime_id = runtime_id(uid, &container.name, generation);
        let writable = sandbox.relax.contains(&Relaxation::WritableRootfs);
        let dir = container_dir(&self.pods_dir, uid, &runtime_id, writable);
        if !writable && let Some(run_dir) = dir.parent() {
            mount_run_dir(run_dir)?;
        }
        // The directory is made before the runtime hears of the id: without
        // it (in either place: an agent before this layout made it on the
        // disk) no earlier start of this id can have left a container behind.
        let started_before = container_dirs(&self.pods_dir, uid, &runtime_id)
            .iter()
            .any(|dir| dir.exists());
        std::fs::create_dir_all(&dir).map_err(io_error(&dir))?;
        let mounted =
            self.images
                .mount_rootfs(&image, &dir)
                .map_err(|source| ContainerError::Rootfs {
                    container: container.name.clone(),
                    reference: container.image.clone(),
                    source: Box::new(source),
                })?;
        let mounted_at = began.elapsed();
        let config_error = |message: String| ContainerError::Config {
            container: container.name.clone(),
            message,
        };
        let process = merge_process(
            &image.config,
            &ProcessOverrides {
                command: container.command.clone(),
                args: container.args.clone(),
                env: crate::pod_data::container_env(&self.pods_dir, uid, container)
                    .map_err(config_error)?,
                working_dir: container.working_dir.clone(),
            },
        )
        .map_err(|e| config_error(e.to_string()))?;
        let user =
            resolve_user_in_rootfs(image.config.user.as_deref().unwrap_or(""), &mounted.rootfs)
                .map_err(|e| config_error(e.to_string()))?;
        let mut config =
            ContainerConfig::new(&runtime_id, &mounted.rootfs, Vec::new()).with_process(process);
        config.hostname = Some(pod_name.to_string());
        config.network = NetworkNamespace::Join(sandbox.netns.clone());
        sandbox::apply(&mut config, user, sandbox).map_err(|e| config_error(e.to_string()))?;
        let stack = network_stack(sandbox.runtime, &sandbox.relax);
        let runtime = self
            .runtimes
            .for_start(spec.runtime, stack, &config.network)?;
        config.cgroup_path = Some(format!(
            "/{}",
            crate::pod_cgroups::container_path(uid, &container.name, generation)
        ));
        // The node's DNS server for the pod (written by the network setup).
        let resolv = pod_dir(&self.pods_dir, uid).join(RESOLV_CONF);
        if resolv.is_file() {
            config.mounts.push(corral_runtime::bundle::BindMount {
                source: resolv,
                destination: "/etc/resolv.conf".to_string(),
                read_only: true,
            });
        }
        config.mounts.extend(
            crate::volumes::container_mounts(&self.pods_dir, uid, spec, container)
                .map_err(|e| config_error(crate::chain(&e)))?,
        );
        // In a user namespace runc cannot create a missing mount point in
        // the image's root-owned tree: make them now, as root.
        for mount in &config.mounts {
            prepare_mount_point(&mounted.rootfs, &mount.destination, mount.source.is_dir())
                .map_err(config_error)?;
        }
        crate::mount_points::prepare_scratch(&mounted.rootfs, &mut config.tmpfs);
        if let Some(memory) = container.resources.memory {
            let bytes = i64::try_from(memory.bytes).unwrap_or(i64::MAX);
            config.memory_limit_bytes = Some(bytes);
            config.memory_swap_limit_bytes = Some(bytes);
        }
        if let Some(cpu) = container.resources.cpu {
            config.cpu_limit_millicores = Some(cpu.millis);
            config.cpu_shares_millicores = Some(cpu.millis);
        }
        // A bundle holding values of Secrets or Configs (env) lives in the
        // pod's data tmpfs, never on the node's disk.
        let bundle = if container.env_refs().is_empty() {
            dir.join("bundle")
        } else {
            crate::pod_data::files::bundle_dir(&self.pods_dir, uid, &runtime_id)
        };
        write_bundle(&bundle, &config).map_err(|e| config_error(e.to_string()))?;
        let log = log_path(&self.pods_dir, uid, &container.name);
        if let Some(parent) = log.parent() {
            std::fs::create_dir_all(parent).map_err(io_error(parent))?;
        }
        let runtime_error = |source| ContainerError::Runtime {
            container: container.name.clone(),
            source,
        };
        // A container left over from a crashed start would block the id.
        if started_before {
            runtime.delete(&runtime_id, true).map_err(runtime_error)?;
        }
        let prepared = began.elapsed();
        // One runtime command (`run --detach`), not `create` then `start`.
        let started = runtime.run_detached(&runtime_id, &bundle, &ContainerIo::combined(&log));
        tracing::debug!(container = %runtime_id, ?imaged, mounted = ?mounted_at, ?prepared, started = ?began.elapsed(), "container started");
        let pid = match started {
            Ok(pid) => pid,
            Err(error) => {
                // A failed start leaves nothing behind: no created container
                // (runsc keeps a sandbox process for it), no rootfs mount.
                let _ = runtime.delete(&runtime_id, true);
                let _ = corral_runtime::image::unmount_rootfs(&dir);
                let _ = std::fs::remove_dir_all(&dir);
                return Err(runtime_error(error));
            }
        };
        Ok(ContainerRecord {
            runtime_id,
            config_hash: config_hash(spec, container),
            generation,
            started_at: Some(Utc::now()),
            restarts: 0,
            exit_code: None,
            pid: Some(pid),
            running: true,
            ready: false,
            restart_after: None,
            last_exit: None,
            stop_cause: None,
            start_error: None,
            readiness_error: None,
            data_restart: None,
        })
    }

    /// Whether the container's process is alive, per the runtime.
    pub fn is_running(&self, spec: &PodSpec, record: &ContainerRecord) -> bool {
        let Ok(runtime) = self.runtimes.for_class(spec.runtime) else {
            return false;
        };
        matches!(
            runtime.state(&record.runtime_id),
            Ok(Some(state)) if matches!(state.status, Status::Running | Status::Created | Status::Creating)
        )
    }

    /// Stops a container ([`halt`](Self::halt)) and removes its files.
    /// Safe to call for a container that is gone.
    pub fn stop(
        &self,
        uid: &str,
        spec: &PodSpec,
        record: &ContainerRecord,
        grace: Duration,
    ) -> Result<(), ContainerError> {
        let halted = self.halt(spec, record, grace);
        let cleaned = self.cleanup(uid, record);
        halted.and(cleaned)
    }

    /// Stops a container: [`end_process`](Self::end_process), then deletes
    /// it from the runtime. Its files stay for [`cleanup`](Self::cleanup).
    /// Safe to call for a container that is gone.
    pub fn halt(
        &self,
        spec: &PodSpec,
        record: &ContainerRecord,
        grace: Duration,
    ) -> Result<(), ContainerError> {
        let began = Instant::now();
        self.end_process(spec, record, grace)?;
        let signalled = began.elapsed();
        let deleted = self.delete(spec, record);
        tracing::debug!(container = %record.runtime_id, ?signalled, deleted = ?began.elapsed(), "container stopped");
        deleted
    }

    /// Ends a container's process: SIGTERM, up to `grace` for its init
    /// process to exit (watched by pid, so one that exits at once is not
    /// waited for), then SIGKILL. True when its process is known to be
    /// gone (it had a pid, now dead), so that deleting the container from
    /// the runtime can wait; false when only the runtime's forced delete
    /// can be sure to end it.
    pub fn end_process(
        &self,
        spec: &PodSpec,
        record: &ContainerRecord,
        grace: Duration,
    ) -> Result<bool, ContainerError> {
        let runtime = self.runtimes.for_class(spec.runtime)?;
        let id = &record.runtime_id;
        match record.pid {
            Some(pid) => {
                if !grace.is_zero() && process_alive(pid) {
                    let _ = runtime.kill(id, Signal::SIGTERM);
                    wait_for_exit(pid, Instant::now() + grace);
                }
                // Killed and collected here, so the runtime's delete finds
                // it stopped: `runc delete --force` of a running container
                // polls every 100 ms until its init is gone, and a zombie
                // of ours would keep it polling.
                match reap::try_wait(pid) {
                    Ok(None) => {
                        // An unreaped child of ours: the pid cannot belong
                        // to anyone else.
                        let _ = nix::sys::signal::kill(
                            nix::unistd::Pid::from_raw(pid as i32),
                            nix::sys::signal::Signal::SIGKILL,
                        );
                    }
                    Ok(Some(_)) => {}
                    Err(_) if process_alive(pid) => {
                        let _ = runtime.kill(id, Signal::SIGKILL);
                    }
                    Err(_) => {}
                }
                wait_for_exit(pid, Instant::now() + KILL_WAIT);
                Ok(!process_alive(pid))
            }
            // Without a pid, ask the runtime.
            None => {
                if !grace.is_zero() && self.is_running(spec, record) {
                    let _ = runtime.kill(id, Signal::SIGTERM);
                    let deadline = Instant::now() + grace;
                    while Instant::now() < deadline && self.is_running(spec, record) {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                }
                Ok(false)
            }
        }
    }

    /// Deletes a container from the runtime (its state and its cgroup),
    /// forcing it to stop if it still runs. Safe to call for a container
    /// that is gone.
    pub fn delete(&self, spec: &PodSpec, record: &ContainerRecord) -> Result<(), ContainerError> {
        let id = &record.runtime_id;
        self.runtimes
            .for_class(spec.runtime)?
            .delete(id, true)
            .map_err(|source| ContainerError::Runtime {
                container: id.clone(),
                source,
            })
    }

    /// Unmounts and removes a container's files after it stopped.
    pub fn cleanup(&self, uid: &str, record: &ContainerRecord) -> Result<(), ContainerError> {
        let bundle = crate::pod_data::files::bundle_dir(&self.pods_dir, uid, &record.runtime_id);
        if let Err(error) = std::fs::remove_dir_all(&bundle)
            && error.kind() != std::io::ErrorKind::NotFound
        {
            return Err(ContainerError::Io {
                path: bundle,
                source: error,
            });
        }
        container_dirs(&self.pods_dir, uid, &record.runtime_id)
            .iter()
            .try_for_each(|dir| remove_container_dir(dir))
    }

    /// Removes what is left of the pod's containers once they are all
    /// stopped: each container directory of the pod (in either place),
    /// with the container of that id deleted from the runtime first. A
    /// container stopped for a new revision is deleted from the runtime
    /// after the record that forgets it is saved (`pods/revision.rs`); an
    /// agent stopped in between leaves it to this sweep, since its
    /// directory goes only after that delete.
    pub fn cleanup_all(&self, uid: &str, spec: &PodSpec) {
        let runtime = self.runtimes.for_class(spec.runtime).ok();
        for dir in every_container_dir(&self.pods_dir, uid) {
            if let (Some(runtime), Some(id)) = (runtime, dir.file_name().and_then(|n| n.to_str())) {
                // A container the runtime no longer knows is fine.
                let _ = runtime.delete(id, true);
            }
            if let Err(error) = remove_container_dir(&dir) {
                tracing::warn!(error = %crate::chain(&error), "cannot remove a container's files");
            }
        }
    }
}

/// How often a stopping container's init process is looked at.
const EXIT_POLL: Duration = Duration::from_millis(5);

/// How long a killed container's init process gets to be gone before the
/// runtime is asked to delete it anyway.
const KILL_WAIT: Duration = Duration::from_secs(5);

/// Whether process `pid` still runs (a child of ours that exited is
/// collected on the way).
fn process_alive(pid: u32) -> bool {
    reap::liveness(pid) == reap::Liveness::Alive
}

/// Waits until `pid` has exited or `deadline` passes; returns whether it
/// exited.
fn wait_for_exit(pid: u32, deadline: Instant) -> bool {
    loop {
        if !process_alive(pid) {
            return true;
        }
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        std::thread::sleep(EXIT_POLL.min(deadline - now));
    }
}

/// `c<uid prefix>-<container>-<generation>`: unique per start, readable in
/// `runc list`.
pub fn runtime_id(uid: &str, container: &str, generation: u64) -> String {
    let short: String = uid
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .take(12)
        .collect();
    format!("c{short}-{container}-{generation}")
}

#[cfg(test)]
mod tests {
    use super::wait_for_exit;

    use std::time::{Duration, Instant};

    // The first child is collected by `waitpid` by pid, not `Child::wait`.
    #[test]
    #[allow(clippy::zombie_processes)]
    fn a_stop_waits_for_the_process_not_the_grace_period() {
        let mut child = std::process::Command::new("sleep")
            .arg("0.05")
            .spawn()
            .expect("sleep runs");
        let began = Instant::now();
        let exited = wait_for_exit(child.id(), began + Duration::from_secs(10));
        assert!(exited);
        assert!(
            began.elapsed() < Duration::from_secs(2),
            "{:?}",
            began.elapsed()
        );
        // The wait collected it (it was our child): nothing is left to wait for.
        assert!(child.try_wait().is_err());
        let mut long = std::process::Command::new("sleep")
            .arg("10")
            .spawn()
            .expect("sleep runs");
        let began = Instant::now();
        assert!(!wait_for_exit(long.id(), began + Duration::from_millis(50)));
        assert!(began.elapsed() < Duration::from_secs(1));
        let _ = long.kill();
        let _ = long.wait();
    }
}

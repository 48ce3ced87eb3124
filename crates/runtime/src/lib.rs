//! corral-runtime: everything a node agent needs to run containers on one
//! machine, and nothing about the cluster.
//!
//! - [`image`]: the local image store (import, pull, unpack once, overlayfs
//!   rootfs per container, garbage collection).
//! - [`bundle`]: OCI runtime bundles (`config.json`) from a
//!   [`bundle::ContainerConfig`], and the Kubernetes-style merge of image
//!   config with pod overrides.
//! - [`oci`]: the `runc`/`runsc` adapter, network namespaces (the one
//!   module that makes them) and pods' user namespaces, exit-status reaping
//!   and process liveness.
//! - [`vm`]: the QEMU driver (command line, KVM probe, disk, tap, process).
//! - [`mounts`]: the mount table (mount points, unmounting a directory's).
//! - [`cgroup_migration`]: keeps the kernel's cgroup migration lock warm
//!   for the next container start (an idle node's `runc` otherwise waits
//!   out an RCU grace period).
//! - [`find_binary`]: the executables the runtime drives, found on `PATH`.
//!
//! It must not talk to the API server, decide policy (what a pod may do is
//! decided elsewhere and arrives as explicit [`bundle::ContainerConfig`]
//! fields), or touch host state it did not create: no cgroup remounts, no
//! host network changes. All I/O is blocking; async callers use
//! `spawn_blocking`.

pub mod bundle;
pub mod cgroup_migration;
pub mod image;
pub mod mounts;
pub mod oci;
pub mod vm;

use std::path::PathBuf;

/// The first file called `name` in a directory of `PATH` (how `runc`,
/// `runsc`, QEMU and the tools tests need are found).
pub fn find_binary(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

//! corral-runtime: everything a node agent needs to run containers on one
//! machine, and nothing about the cluster.
//!
//! - [`image`]: the local image store (import, pull, unpack once, overlayfs
//!   rootfs per container, garbage collection).
//! - [`bundle`]: OCI runtime bundles (`config.json`) from a
//!   [`bundle::ContainerConfig`], and the Kubernetes-style merge of image
//!   config with pod overrides.
//! - [`oci`]: the `runc`/`runsc` adapter, persistent pod network namespaces
//!   and exit-status reaping.
//! - [`vm`]: the QEMU driver (command line, KVM probe, disk, tap, process).
//!
//! It must not talk to the API server, decide policy (what a pod may do is
//! decided elsewhere and arrives as explicit [`bundle::ContainerConfig`]
//! fields), or touch host state it did not create: no cgroup remounts, no
//! host network changes. All I/O is blocking; async callers use
//! `spawn_blocking`.

pub mod bundle;
pub mod image;
pub mod oci;
pub mod vm;

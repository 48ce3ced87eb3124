//! corral-testkit: helpers for corral's tests — tiny OCI images built from
//! `busybox-static`, a real `docker-registry` on loopback, real etcd
//! clusters on loopback ([`etcd::EtcdCluster`]), guards that
//! clean up on drop, and `require_root` / `require_tool`, which panic (so
//! a test missing a prerequisite fails rather than passes).
//!
//! Test-only: never a dependency of a shipped crate's `[dependencies]`.

pub mod etcd;
mod guard;
mod image;
mod registry;

pub use guard::{Defer, require_root, require_tool, unique_name};
pub use image::{
    BUSYBOX_APPLETS, BUSYBOX_IMAGE, ImageBuilder, ImageFormat, LayerBuilder, busybox_image,
    busybox_image_tar,
};
pub use registry::{RegistryServer, push_oci_layout};

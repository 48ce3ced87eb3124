//! corral-testkit: helpers for corral's tests — tiny OCI images built from
//! `busybox-static`, VM boot assets (a Debian cloud kernel and a busybox
//! initramfs), real etcd clusters on loopback ([`etcd::EtcdCluster`]), a
//! real `docker-registry` on loopback (plain, or TLS from a [`TestCa`] with
//! htpasswd auth) and a token-auth front for it ([`TokenAuthProxy`]), a
//! headless Chromium over WebDriver ([`Browser`]), a node's reboot
//! simulated and what its agent runs read from local state and the kernel
//! ([`reboot`]), guards that
//! clean up on drop, and `require_root` / `require_tool`, which panic (so
//! a test missing a prerequisite fails rather than passes).
//!
//! Test-only: never a dependency of a shipped crate's `[dependencies]`.

mod browser;
pub mod etcd;
mod guard;
mod image;
pub mod reboot;
mod registry;
mod token_proxy;
mod vm;

pub use browser::{Browser, pixel_spread};
pub use guard::{Defer, require_root, require_tool, unique_name};
pub use image::{
    BUSYBOX_APPLETS, BUSYBOX_IMAGE, ImageBuilder, ImageFormat, LayerBuilder, LayerCompression,
    busybox_image, busybox_image_tar,
};
pub use registry::{RegistryServer, TestCa, htpasswd_line, push_oci_layout};
pub use token_proxy::TokenAuthProxy;
pub use vm::{
    CACHE_ENV, KERNEL_METAPACKAGE, VM_COUNT_PREFIX, VM_MARKER, VM_POWEROFF_MARKER, VM_READY_MARKER,
    VmAssets, build_initramfs, cache_dir, prepare as prepare_vm_assets, vm_assets,
};

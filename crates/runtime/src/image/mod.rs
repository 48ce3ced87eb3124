//! The node's local image store: a content-addressed OCI layout under one
//! root directory, with layers unpacked once and shared by every container
//! through overlayfs.
//!
//! ```text
//! <root>/blobs/sha256/<hex>      manifests, configs and layer blobs
//! <root>/layers/sha256/<hex>/    a layer unpacked, named by its diff id
//! <root>/images.json             reference -> manifest digest
//! <root>/tmp/                    staging for imports and pulls
//! ```
//!
//! Everything here is blocking file and network I/O: async callers run it
//! on `spawn_blocking`.

mod archive;
pub mod digest;
pub mod layer;
pub mod layout;
pub mod pack;
mod pull;
pub mod reference;
pub mod registry;
pub mod rootfs;
mod store;

pub use digest::{Digest, InvalidDigest};
pub use layout::ImageConfig;
pub use pull::{BlobProgress, PARALLEL_BLOBS, PullOptions};
pub use reference::{InvalidReference, Reference};
pub use registry::{
    AuthFile, AuthFileError, Credentials, HttpRegistry, Registry, RegistryConfig, RegistryError,
    TokenCache,
};
pub use rootfs::{MountError, MountedRootfs, Mounter, SyscallMounter, unmount_rootfs};
pub use store::{GcReport, Image, ImageError, ImageStore, ImageSummary};

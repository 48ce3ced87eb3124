//! corral's object model.
//!
//! This crate owns the shape of every kind (`Pod`, `Node`, `PinnedDeployment`,
//! `Policy`, `Controller`, `VirtualMachine`), object metadata, manifest parsing
//! with field-path errors, label selectors, resource quantities and the
//! history record types. It performs no I/O: the store, the server and the
//! CLI all build on these types, so they must stay plain data plus pure
//! validation.

pub mod cron;
pub mod fencing;
pub mod fieldpath;
pub mod health;
pub mod history;
pub mod identity;
pub mod kinds;
pub mod manifest;
pub mod meta;
pub mod object;
pub mod quantity;
pub mod security;
pub mod selector;
pub mod validate;
pub mod watch;
pub mod workflow;

pub use history::{HistoryQuery, RevisionRecord};
pub use identity::{AuthorClass, Identity, Role};
pub use manifest::{ManifestError, parse_manifests};
pub use meta::{
    Cascade, Deletion, Kind, MANAGED_BY, ObjectKey, ObjectMeta, OwnerReference, UnknownCascade,
    UnknownKind, manager_of,
};
pub use object::Object;
pub use selector::{LabelSelector, SelectorError};
pub use validate::{
    FieldError, canonical_spec, keep_grown_disks, validate_object, validate_update, validated,
};

//! The watch-fed cache runtime every controller and agent loop uses (the
//! kube-runtime pattern):
//!
//! - an [`Informer`] lists one kind once (in pages), then follows it by
//!   watch from the list's `resourceVersion`; when a watch breaks it
//!   resumes from the last change seen, and only when the server says the
//!   watch window has moved on (`410 Gone`) does it list again. Failures
//!   back off exponentially. It keeps a shared in-memory [`Cache`] of the
//!   objects, indexed by key and by any [`Index`] the caller declares
//!   (pods by node, say), and tells registered handlers about each change;
//! - a [`WorkQueue`] of keys with de-duplication, per-key exclusivity,
//!   delayed requeue and per-key backoff;
//! - [`run`] reconciles one key at a time from a queue with a given number
//!   of workers, requeueing on error or when the reconciler asks.
//!
//! A controller running inside the API server's process reads through
//! [`LocalReads`] instead of HTTP when its client carries one ([`local`]).
//!
//! Nothing here lists the world on a timer: after the first list, work
//! comes only from changes and from deadlines a reconciler asks for.

mod cache;
mod controller;
mod informer;
pub mod local;
mod queue;
mod scope;

pub use cache::{Cache, Index};
pub use controller::{Action, run};
pub use informer::{Change, Informer, Projection};
pub use local::{LocalEvents, LocalReads};
pub use queue::WorkQueue;
pub use scope::Scope;

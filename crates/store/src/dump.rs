//! A whole store in a backend-neutral form, for moving a cluster from one
//! backend to another (`corral migrate`): the live objects, every kept
//! revision with its spec, author, class, message and time, the tokens, the
//! workflow step logs and the sealed values (still encrypted).
//!
//! Watch events are not part of it: they are a replay buffer, and clients
//! list again after a migration like after any compaction. Store revisions
//! (`resourceVersion`) are renumbered by the target; per-object `revision`
//! numbers, uids and creation times are kept.

use corral_api::workflow::StepLogEntry;
use corral_api::{Object, RevisionRecord};
use serde::{Deserialize, Serialize};

use crate::{SealedRecord, TokenRecord};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Dump {
    /// Live objects, in the order they were last written.
    pub objects: Vec<Object>,
    /// Every kept revision of every object (live or deleted), each with its
    /// spec, in the order they were written.
    pub revisions: Vec<RevisionRecord>,
    pub tokens: Vec<TokenRecord>,
    /// Step log entries, in the order they were appended.
    pub step_logs: Vec<StepLogEntry>,
    /// Sealed values (Secrets' data), still encrypted, by name.
    #[serde(default)]
    pub sealed: Vec<SealedRecord>,
}

impl Dump {
    /// What a migration reports: `3 objects, 41 revisions, 5 tokens, 120
    /// step log entries, 2 sealed values`.
    pub fn summary(&self) -> String {
        format!(
            "{} objects, {} revisions, {} tokens, {} step log entries, {} sealed values",
            self.objects.len(),
            self.revisions.len(),
            self.tokens.len(),
            self.step_logs.len(),
            self.sealed.len()
        )
    }
}

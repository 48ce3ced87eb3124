//! Revision records and history queries.

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::identity::AuthorClass;
use crate::meta::Kind;

mod policy;

pub use policy::{CompactionPolicy, KeptRevision, PolicyParseError};

/// One spec revision of one object, as `history` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RevisionRecord {
    pub revision: u64,
    pub time: DateTime<Utc>,
    pub author: String,
    pub class: AuthorClass,
    pub message: String,
    pub kind: Kind,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// True for the record a deletion leaves (its spec is the last one).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deleted: bool,
    /// The spec at this revision; present when asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<serde_json::Value>,
}

/// A cluster-wide history query. Filters combine like a label selector: a
/// record must pass every one that is set.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HistoryQuery {
    /// Only records at or after this time.
    pub since: Option<DateTime<Utc>>,
    /// Only these authors (any of them), when not empty.
    pub authors: Vec<String>,
    /// Never these authors.
    pub exclude_authors: Vec<String>,
    /// Only this author class.
    pub class: Option<AuthorClass>,
    /// Only this kind.
    pub kind: Option<Kind>,
    /// At most this many records, newest kept, when set.
    pub limit: Option<usize>,
}

impl HistoryQuery {
    /// Whether a record passes the author and class filters (time and kind
    /// are applied by the store's index).
    pub fn admits(&self, record: &RevisionRecord) -> bool {
        (self.authors.is_empty() || self.authors.contains(&record.author))
            && !self.exclude_authors.contains(&record.author)
            && self.class.is_none_or(|class| class == record.class)
            && self.kind.is_none_or(|kind| kind == record.kind)
            && self.since.is_none_or(|since| record.time >= since)
    }
}

/// The difference between two revisions of one object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RevisionDiff {
    pub from: u64,
    pub to: u64,
    /// Every changed leaf, by field path.
    pub changes: Vec<crate::fieldpath::FieldChange>,
    /// A unified diff of the two specs rendered as YAML.
    pub unified: String,
}

//! `Secret` and `Config`: data pods read as files or env values.
//!
//! A Secret's values never stay in the object: a person applies them in
//! `data` (base64) or `stringData` (text); the API server encrypts them
//! apart from the object and keeps in the spec only `keys` — each value's
//! size and a keyed hash that tells values apart without revealing them.
//! History, diffs, watch events and `get` therefore show which keys
//! changed, never a value. A `Config` is plain data with the usual history.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The most data one Secret or Config holds (decoded), in bytes.
pub const MAX_DATA_BYTES: usize = 1024 * 1024;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecretSpec {
    /// Free-form kind of data, e.g. `tls` or `registry-auth`.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub secret_type: Option<String>,
    /// Values, base64-encoded, by key. Only in requests: never stored.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub data: BTreeMap<String, String>,
    /// Values as text, by key. Only in requests: never stored.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub string_data: BTreeMap<String, String>,
    /// What is stored and served: each key's size and keyed hash. Set by
    /// the server; a request may carry it back unchanged (a re-applied
    /// `get -o yaml`), but only with no values.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub keys: BTreeMap<String, SecretKey>,
}

impl SecretSpec {
    /// Whether the request carries values (rather than the served form).
    pub fn has_values(&self) -> bool {
        !self.data.is_empty() || !self.string_data.is_empty()
    }
}

/// One key of a stored Secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecretKey {
    /// The value's length in bytes.
    pub size: u64,
    /// A keyed hash of the value (HMAC-SHA-256 with a cluster key, first
    /// 16 bytes in hex): equal values, equal hashes; nothing else.
    pub hash: String,
}

/// A Secret's values as the reveal endpoint returns them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RevealedSecret {
    /// The Secret's revision these values belong to.
    pub revision: u64,
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub secret_type: Option<String>,
    /// Values, base64-encoded, by key.
    pub data: BTreeMap<String, String>,
}

/// Plain configuration: text values (whole files, or short settings) by key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConfigSpec {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub data: BTreeMap<String, String>,
}

/// Whether `key` may name a value of a Secret or Config: it becomes a file
/// name, so letters, digits, `-`, `_` and `.`, at most 253, not `.`/`..`.
pub fn is_data_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 253
        && key != "."
        && key != ".."
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

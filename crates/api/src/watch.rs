//! Wire types of lists and watch streams.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::object::Object;

/// What happened to an object in a watch event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

/// One change, as watchers see it. For `Deleted`, `object` is the last state.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WatchEvent {
    #[serde(rename = "type")]
    pub event_type: EventType,
    pub object: Object,
    /// `object` as JSON exactly as `serde_json` writes it, when the store
    /// already made those bytes (the body it stored): whoever needs the
    /// JSON (the server's watch cache) takes it instead of encoding the
    /// object again. Never sent; not part of equality.
    #[serde(skip)]
    pub encoded: Option<Arc<str>>,
}

impl PartialEq for WatchEvent {
    fn eq(&self, other: &Self) -> bool {
        self.event_type == other.event_type && self.object == other.object
    }
}

impl WatchEvent {
    /// A change of `object`, without its JSON.
    pub fn new(event_type: EventType, object: Object) -> Self {
        WatchEvent {
            event_type,
            object,
            encoded: None,
        }
    }

    /// The store revision of this change.
    pub fn resource_version(&self) -> u64 {
        self.object.metadata.resource_version
    }
}

/// The body of a list response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectList {
    pub items: Vec<Object>,
    /// Start a watch here to miss nothing after this list.
    pub resource_version: u64,
    /// Present when the list was cut at `limit`: pass it back as
    /// `continue` for the next page.
    #[serde(default, rename = "continue", skip_serializing_if = "Option::is_none")]
    pub continue_token: Option<String>,
}

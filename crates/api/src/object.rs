//! The generic object envelope the store and the API move around.
//!
//! Specs and statuses travel as JSON values so that the store, history diffs
//! and field ownership work the same for every kind; [`crate::kinds`] holds
//! the typed view used for validation and by controllers.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::meta::{Kind, ObjectKey, ObjectMeta};

/// One object of any kind: `kind`, `metadata`, `spec`, `status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Object {
    pub kind: Kind,
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: Value,
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub status: Value,
}

impl Object {
    /// An object with empty status and server-set metadata left blank.
    pub fn new(kind: Kind, namespace: Option<&str>, name: &str, spec: Value) -> Self {
        let key = ObjectKey::new(kind, namespace, name);
        Object {
            kind,
            metadata: ObjectMeta {
                name: key.name,
                namespace: (!key.namespace.is_empty()).then_some(key.namespace),
                ..ObjectMeta::default()
            },
            spec,
            status: Value::Null,
        }
    }

    /// The key of this object, with the namespace normalised for its kind.
    pub fn key(&self) -> ObjectKey {
        ObjectKey::new(
            self.kind,
            self.metadata.namespace.as_deref(),
            &self.metadata.name,
        )
    }

    /// Decodes the spec into the kind's typed spec.
    pub fn typed_spec<T: serde::de::DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        T::deserialize(&self.spec)
    }

    /// Decodes the status into a typed status; an absent status is the default.
    pub fn typed_status<T: serde::de::DeserializeOwned + Default>(
        &self,
    ) -> Result<T, serde_json::Error> {
        if self.status.is_null() {
            Ok(T::default())
        } else {
            T::deserialize(&self.status)
        }
    }
}

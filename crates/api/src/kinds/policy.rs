//! `kind: Policy` — an operator's half of a two-party relaxation.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::kinds::RuntimeClass;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PolicySpec {
    /// The namespaces this policy applies to.
    pub namespaces: Vec<String>,
    /// Relaxations pods in those namespaces may ask for (`run-as-root`,
    /// `capability:NAME`, `host-network`, `host-path:/PREFIX`, …).
    #[serde(default)]
    pub grant: Vec<String>,
    /// The runtime pods in those namespaces get when they name none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_runtime: Option<RuntimeClass>,
}

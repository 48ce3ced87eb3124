//! `kind: LoadBalancer` — a stable front door (IPv4 and IPv6 addresses) for
//! the ready pods a label selector picks. Load balancers live outside the
//! core: the spec is people's, the status is written by the one LB
//! controller that registered as its owner (see docs/design/0014).

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The class an LB controller serves when a LoadBalancer names none.
pub const DEFAULT_LB_CLASS: &str = "l4-proxy";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LoadBalancerSpec {
    /// Pods in the LoadBalancer's namespace carrying all these labels are
    /// its candidate backends; the ready ones receive traffic.
    pub selector: BTreeMap<String, String>,
    pub ports: Vec<LoadBalancerPort>,
    /// Which LB implementation serves it (default `l4-proxy`, the one
    /// corral ships); a controller leaves other classes alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
}

impl LoadBalancerSpec {
    /// The class, defaulted.
    pub fn class(&self) -> &str {
        self.class.as_deref().unwrap_or(DEFAULT_LB_CLASS)
    }
}

/// One frontend port and the pod port it forwards to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LoadBalancerPort {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The port clients connect to on the LoadBalancer's addresses.
    pub port: u16,
    /// The port on each backend pod.
    pub target_port: u16,
    #[serde(default)]
    pub protocol: LoadBalancerProtocol,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum LoadBalancerProtocol {
    #[default]
    Tcp,
}

/// Written by the LB controller that owns `LoadBalancer:status`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LoadBalancerStatus {
    /// The controller serving it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// Where clients connect: the frontend addresses (IPv4 and IPv6).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<String>,
    /// The ready pods' addresses traffic goes to, sorted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backends: Vec<String>,
    /// How many backends are ready (the length of `backends`).
    #[serde(default)]
    pub ready: u32,
    /// Why it is not fully served (a port taken by another LoadBalancer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

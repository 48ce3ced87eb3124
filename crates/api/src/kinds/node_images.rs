//! Wire types of a node's image store as the API serves it: what `GET
//! /v1/images` lists and what `POST /v1/images/import` imported, node by
//! node. Images are not API objects: each agent owns its node's store and
//! answers for it; the server asks the agents and gathers their answers.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One image in a node's store.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeImage {
    /// The name it is stored under (`local/busybox:1`).
    pub reference: String,
    /// The manifest's digest (`sha256:…`).
    pub digest: String,
    /// Bytes of its layers as stored (compressed, as imported or pulled).
    #[serde(default)]
    pub size: u64,
    /// The pods on the node whose containers use it (`pod/web`,
    /// `pod/team-a/web`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pods: Vec<String>,
}

/// One node's answer: its images, or why it could not answer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeImages {
    pub node: String,
    /// For a list, every image on the node; for an import, the images it
    /// imported (none when `error` is set: an import is all or nothing).
    #[serde(default)]
    pub images: Vec<NodeImage>,
    /// Why this node failed; absent when it succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A node left out because it is not Ready (only when the request named
/// no nodes: a named node is always asked).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SkippedNode {
    pub node: String,
    /// Its phase, as a sentence (`Silent: not Ready`).
    pub reason: String,
}

/// The answer of `GET /v1/images` and `POST /v1/images/import`: one entry
/// per node asked, in the order of the request (by name when it named none).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeImagesReport {
    pub nodes: Vec<NodeImages>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<SkippedNode>,
}

impl NodeImagesReport {
    /// The nodes that failed.
    pub fn failed(&self) -> impl Iterator<Item = &NodeImages> {
        self.nodes.iter().filter(|node| node.error.is_some())
    }
}

//! What a pod reads from Secrets and Configs: a volume whose files are a
//! Secret's or Config's keys, and container env values taken from one key.
//! The pod names them; the node fetches the values (a Secret's through the
//! reveal endpoint, naming the pod) and keeps them in memory only.

use std::collections::BTreeSet;
use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{Container, PodSpec};
use crate::meta::Kind;

/// A volume filled with the data of one Secret or Config of the pod's
/// namespace: one read-only file per key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DataVolume {
    /// The Secret's or Config's name.
    pub name: String,
}

/// A container env value: plain text, or one key of a Secret or Config
/// (`{secret: db, key: password}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum EnvValue {
    Text(String),
    From(EnvFrom),
}

/// Where an env value comes from: exactly one of `secret` or `config`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EnvFrom {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<String>,
    /// The key whose value the variable takes.
    pub key: String,
}

impl From<&str> for EnvValue {
    fn from(text: &str) -> Self {
        EnvValue::Text(text.to_string())
    }
}

impl EnvValue {
    /// The Secret or Config and key the value comes from; `None` for text
    /// (and for a reference that names neither or both, refused by
    /// validation).
    pub fn source(&self) -> Option<(DataRef, &str)> {
        match self {
            EnvValue::Text(_) => None,
            EnvValue::From(from) => Some((from.data_ref()?, from.key.as_str())),
        }
    }
}

impl EnvFrom {
    /// The Secret or Config named, if exactly one is.
    pub fn data_ref(&self) -> Option<DataRef> {
        match (&self.secret, &self.config) {
            (Some(name), None) => Some(DataRef::secret(name)),
            (None, Some(name)) => Some(DataRef::config(name)),
            _ => None,
        }
    }
}

/// One Secret or Config of the pod's namespace, shown as `secret/db`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct DataRef {
    /// [`Kind::Secret`] or [`Kind::Config`].
    pub kind: Kind,
    pub name: String,
}

impl DataRef {
    pub fn secret(name: &str) -> Self {
        DataRef {
            kind: Kind::Secret,
            name: name.to_string(),
        }
    }

    pub fn config(name: &str) -> Self {
        DataRef {
            kind: Kind::Config,
            name: name.to_string(),
        }
    }
}

impl fmt::Display for DataRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.kind.short(), self.name)
    }
}

impl super::Volume {
    /// The Secret or Config this volume shows, if it is one of those.
    pub fn data_ref(&self) -> Option<DataRef> {
        match (&self.secret, &self.config) {
            (Some(secret), _) => Some(DataRef::secret(&secret.name)),
            (None, Some(config)) => Some(DataRef::config(&config.name)),
            (None, None) => None,
        }
    }
}

impl Container {
    /// The Secrets and Configs this container's env values come from.
    pub fn env_refs(&self) -> BTreeSet<DataRef> {
        self.env
            .values()
            .filter_map(|value| value.source().map(|(source, _)| source))
            .collect()
    }
}

impl PodSpec {
    /// Every Secret and Config the pod reads, through volumes or env.
    pub fn data_refs(&self) -> BTreeSet<DataRef> {
        let volumes = self.volumes.iter().filter_map(super::Volume::data_ref);
        let env = self.containers.iter().flat_map(Container::env_refs);
        volumes.chain(env).collect()
    }

    /// Whether the pod reads the Secret or Config `source` (its pull
    /// secret included).
    pub fn uses(&self, source: &DataRef) -> bool {
        self.image_pull_secret
            .as_ref()
            .is_some_and(|name| *source == DataRef::secret(name))
            || self
                .volumes
                .iter()
                .any(|volume| volume.data_ref().as_ref() == Some(source))
            || self
                .containers
                .iter()
                .any(|container| container.env_refs().contains(source))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn spec() -> PodSpec {
        serde_json::from_value(serde_json::json!({
            "volumes": [
                {"name": "db", "secret": {"name": "db"}},
                {"name": "app", "config": {"name": "app"}},
                {"name": "scratch", "emptyDir": {}}
            ],
            "containers": [{
                "name": "web", "image": "local/busybox:1",
                "env": {
                    "PLAIN": "text",
                    "DB_PASS": {"secret": "db-env", "key": "password"},
                    "MODE": {"config": "app", "key": "mode"}
                }
            }]
        }))
        .unwrap()
    }

    #[test]
    fn plain_strings_and_references_decode_side_by_side() {
        let spec = spec();
        let env = &spec.containers[0].env;
        assert_eq!(env["PLAIN"], EnvValue::Text("text".into()));
        assert_eq!(
            env["DB_PASS"].source(),
            Some((DataRef::secret("db-env"), "password"))
        );
        // Plain values serialize back as plain strings.
        let back = serde_json::to_value(&spec).unwrap();
        assert_eq!(back["containers"][0]["env"]["PLAIN"], "text");
        assert_eq!(
            back["containers"][0]["env"]["DB_PASS"],
            serde_json::json!({"secret": "db-env", "key": "password"})
        );
    }

    #[test]
    fn a_reference_with_an_unknown_field_is_refused() {
        let refused = serde_json::from_value::<PodSpec>(serde_json::json!({
            "containers": [{"name": "a", "image": "i",
                "env": {"X": {"secret": "db", "key": "k", "extra": 1}}}]
        }));
        assert!(refused.is_err());
    }

    #[test]
    fn the_pod_lists_what_it_reads_once() {
        let spec = spec();
        let refs: Vec<String> = spec.data_refs().iter().map(DataRef::to_string).collect();
        assert_eq!(refs, ["secret/db", "secret/db-env", "config/app"]);
        assert!(spec.uses(&DataRef::secret("db-env")));
        assert!(spec.uses(&DataRef::config("app")));
        assert!(!spec.uses(&DataRef::config("db")));
        assert!(!spec.uses(&DataRef::secret("scratch")));
    }
}

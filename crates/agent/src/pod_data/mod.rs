//! The data a pod reads from Secrets and Configs on this node: fetched in
//! `node/prepare-volumes` (a Secret through the reveal endpoint, naming the
//! pod), kept only in a tmpfs in the pod's directory ([`files`]) — one
//! directory of read-only files per secret or config volume, and a
//! root-only snapshot of every value the pod reads, from which env values
//! are resolved when a container (re)starts, API or not.
//!
//! The pure parts live here: the snapshot ([`PodData`]), resolving a
//! container's env from it, checking a pod's references against it, and
//! which containers a new revision of a Secret or Config changes. Fetching
//! goes through [`DataApi`], which a fake stands in for in tests.

pub mod files;
pub mod follow;

use std::collections::{BTreeMap, BTreeSet};

use async_trait::async_trait;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use corral_api::kinds::{ConfigSpec, Container, DataRef, EnvValue, PodSpec};
use corral_api::{Kind, ObjectKey};
use serde::{Deserialize, Serialize};

/// Why a pod's data could not be had or used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DataError {
    #[error("{} {} not found in namespace {namespace}", .data.kind.short(), .data.name)]
    NotFound { data: DataRef, namespace: String },
    #[error("{} {} has no key {key}", .data.kind.short(), .data.name)]
    MissingKey { data: DataRef, key: String },
    #[error("{} {} key {key} is not UTF-8 text without NUL, so it cannot be an env value (mount it as a file instead)", .data.kind.short(), .data.name)]
    NotText { data: DataRef, key: String },
    #[error("cannot read {} {}: {message}", .data.kind.short(), .data.name)]
    Api { data: DataRef, message: String },
    #[error("{} {} holds a value that is not valid base64 under key {key}", .data.kind.short(), .data.name)]
    Corrupt { data: DataRef, key: String },
}

/// One Secret's or Config's values at one revision. Values are base64, as
/// the reveal endpoint gives them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceData {
    pub revision: u64,
    pub values: BTreeMap<String, String>,
}

impl SourceData {
    /// The value of `key`, decoded.
    pub fn value(&self, data: &DataRef, key: &str) -> Result<Vec<u8>, DataError> {
        let encoded = self.values.get(key).ok_or_else(|| DataError::MissingKey {
            data: data.clone(),
            key: key.to_string(),
        })?;
        STANDARD.decode(encoded).map_err(|_| DataError::Corrupt {
            data: data.clone(),
            key: key.to_string(),
        })
    }
}

/// Every Secret and Config a pod reads, as the node last fetched them
/// (kept root-only in the pod's tmpfs).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodData {
    /// By `secret/NAME` or `config/NAME`.
    pub sources: BTreeMap<String, SourceData>,
}

impl PodData {
    pub fn get(&self, data: &DataRef) -> Option<&SourceData> {
        self.sources.get(&data.to_string())
    }

    pub fn insert(&mut self, data: &DataRef, values: SourceData) {
        self.sources.insert(data.to_string(), values);
    }
}

/// Checks that everything `spec` reads is in `data`: each Secret and
/// Config fetched, each env key present and usable as text. The first
/// problem, named (`secret db has no key password`).
pub fn check(spec: &PodSpec, namespace: &str, data: &PodData) -> Result<(), DataError> {
    for source in spec.data_refs() {
        if data.get(&source).is_none() {
            return Err(DataError::NotFound {
                data: source,
                namespace: namespace.to_string(),
            });
        }
    }
    for container in &spec.containers {
        resolve_env(container, data)?;
    }
    Ok(())
}

/// The container's env with references replaced by their values.
pub fn resolve_env(
    container: &Container,
    data: &PodData,
) -> Result<BTreeMap<String, String>, DataError> {
    container
        .env
        .iter()
        .map(|(name, value)| {
            let text = match value {
                EnvValue::Text(text) => text.clone(),
                EnvValue::From(from) => {
                    let Some(source) = from.data_ref() else {
                        // Refused by validation; nothing to take.
                        return Ok((name.clone(), String::new()));
                    };
                    env_text(data, &source, &from.key)?
                }
            };
            Ok((name.clone(), text))
        })
        .collect()
}

fn env_text(data: &PodData, source: &DataRef, key: &str) -> Result<String, DataError> {
    let values = data.get(source).ok_or_else(|| DataError::MissingKey {
        data: source.clone(),
        key: key.to_string(),
    })?;
    let bytes = values.value(source, key)?;
    String::from_utf8(bytes)
        .ok()
        .filter(|text| !text.contains('\0'))
        .ok_or_else(|| DataError::NotText {
            data: source.clone(),
            key: key.to_string(),
        })
}

/// The env `container` of pod `uid` starts with: references resolved from
/// the snapshot in the pod's data tmpfs (written in
/// `node/prepare-volumes`), which must be there when it has any.
pub fn container_env(
    pods_dir: &std::path::Path,
    uid: &str,
    container: &Container,
) -> Result<BTreeMap<String, String>, String> {
    if container.env_refs().is_empty() {
        return resolve_env(container, &PodData::default()).map_err(|e| e.to_string());
    }
    let data = files::read(&files::data_dir(pods_dir, uid))
        .map_err(|e| crate::chain(&e))?
        .ok_or("its env takes values of Secrets or Configs, and the node holds none for the pod (node/prepare-volumes writes them)")?;
    resolve_env(container, &data).map_err(|e| e.to_string())
}

/// The env variables of `container` that take a value of `data` other
/// than the one it was `started` with. A reference `data` cannot resolve
/// (its key removed) changes nothing: the container keeps its value.
pub fn changed_env(
    container: &Container,
    started: &BTreeMap<String, String>,
    data: &PodData,
) -> Vec<String> {
    container
        .env
        .iter()
        .filter_map(|(name, value)| {
            let (source, key) = value.source()?;
            let now = env_text(data, &source, key).ok()?;
            (started.get(name) != Some(&now)).then(|| name.clone())
        })
        .collect()
}

/// The keys whose values differ between two revisions of one source
/// (added, removed or changed).
pub fn changed_keys(old: Option<&SourceData>, new: &SourceData) -> BTreeSet<String> {
    let empty = BTreeMap::new();
    let before = old.map_or(&empty, |old| &old.values);
    before
        .keys()
        .chain(new.values.keys())
        .filter(|key| before.get(*key) != new.values.get(*key))
        .cloned()
        .collect()
}

/// Reads Secrets' and Configs' current values for a pod.
#[async_trait]
pub trait DataApi: Send + Sync {
    /// The values of `data` in `namespace`, read for pod `pod` (a node may
    /// read only the Secrets of its pods).
    async fn fetch(
        &self,
        namespace: &str,
        data: &DataRef,
        pod: &str,
    ) -> Result<SourceData, DataError>;
}

#[async_trait]
impl DataApi for corral_client::Client {
    async fn fetch(
        &self,
        namespace: &str,
        data: &DataRef,
        pod: &str,
    ) -> Result<SourceData, DataError> {
        let key = ObjectKey::new(data.kind, Some(namespace), &data.name);
        let failed = |error: corral_client::ClientError| match error.status() {
            Some(404) => DataError::NotFound {
                data: data.clone(),
                namespace: namespace.to_string(),
            },
            _ => DataError::Api {
                data: data.clone(),
                message: crate::chain(&error),
            },
        };
        match data.kind {
            Kind::Secret => {
                let revealed = self
                    .reveal_for(&key, None, Some(pod))
                    .await
                    .map_err(failed)?;
                Ok(SourceData {
                    revision: revealed.revision,
                    values: revealed.data,
                })
            }
            _ => {
                let object = self.get(&key).await.map_err(failed)?;
                let spec: ConfigSpec = object.typed_spec().map_err(|error| DataError::Api {
                    data: data.clone(),
                    message: format!("its spec does not decode: {error}"),
                })?;
                Ok(SourceData {
                    revision: object.metadata.revision,
                    values: spec
                        .data
                        .into_iter()
                        .map(|(key, text)| (key, STANDARD.encode(text)))
                        .collect(),
                })
            }
        }
    }
}

/// Fetches everything `spec` reads (for pod `pod` of `namespace`) and
/// checks the references against it.
pub async fn fetch_all(
    api: &dyn DataApi,
    namespace: &str,
    pod: &str,
    spec: &PodSpec,
) -> Result<PodData, DataError> {
    let mut data = PodData::default();
    for source in spec.data_refs() {
        let values = api.fetch(namespace, &source, pod).await?;
        data.insert(&source, values);
    }
    check(spec, namespace, &data)?;
    Ok(data)
}

#[cfg(test)]
pub(crate) mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// Values by source, served as they are.
    #[derive(Debug, Default)]
    pub(crate) struct FakeApi(pub std::sync::Mutex<BTreeMap<String, SourceData>>);

    impl FakeApi {
        pub(crate) fn set(&self, source: &str, revision: u64, values: &[(&str, &str)]) {
            self.0
                .lock()
                .unwrap()
                .insert(source.to_string(), source_data(revision, values));
        }
    }

    #[async_trait]
    impl DataApi for FakeApi {
        async fn fetch(
            &self,
            namespace: &str,
            data: &DataRef,
            _pod: &str,
        ) -> Result<SourceData, DataError> {
            self.0
                .lock()
                .unwrap()
                .get(&data.to_string())
                .cloned()
                .ok_or_else(|| DataError::NotFound {
                    data: data.clone(),
                    namespace: namespace.to_string(),
                })
        }
    }

    pub(crate) fn source_data(revision: u64, values: &[(&str, &str)]) -> SourceData {
        SourceData {
            revision,
            values: values
                .iter()
                .map(|(k, v)| (k.to_string(), STANDARD.encode(v)))
                .collect(),
        }
    }

    pub(crate) fn spec() -> PodSpec {
        serde_json::from_value(serde_json::json!({
            "volumes": [
                {"name": "db", "secret": {"name": "db"}},
                {"name": "app", "config": {"name": "app"}}
            ],
            "containers": [
                {"name": "reader", "image": "i", "mounts": [{"volume": "db", "path": "/etc/db"}]},
                {"name": "env", "image": "i", "env": {
                    "PLAIN": "text",
                    "PASS": {"secret": "db", "key": "password"},
                    "MODE": {"config": "app", "key": "mode"}
                }}
            ]
        }))
        .unwrap()
    }

    fn data(password: &str, mode: &str) -> PodData {
        let mut data = PodData::default();
        data.insert(
            &DataRef::secret("db"),
            source_data(1, &[("password", password), ("user", "app")]),
        );
        data.insert(&DataRef::config("app"), source_data(1, &[("mode", mode)]));
        data
    }

    #[test]
    fn env_references_resolve_to_their_values() {
        let spec = spec();
        let env = resolve_env(&spec.containers[1], &data("s3cret", "fast")).unwrap();
        assert_eq!(env["PLAIN"], "text");
        assert_eq!(env["PASS"], "s3cret");
        assert_eq!(env["MODE"], "fast");
        assert!(
            resolve_env(&spec.containers[0], &PodData::default())
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn missing_sources_and_keys_are_named() {
        let spec = spec();
        let mut partial = data("s3cret", "fast");
        partial.sources.remove("config/app");
        assert_eq!(
            check(&spec, "default", &partial).unwrap_err().to_string(),
            "config app not found in namespace default"
        );
        let mut no_key = data("s3cret", "fast");
        no_key.insert(&DataRef::secret("db"), source_data(2, &[("user", "app")]));
        assert_eq!(
            check(&spec, "default", &no_key).unwrap_err().to_string(),
            "secret db has no key password"
        );
        let mut binary = data("s3cret", "fast");
        binary.insert(
            &DataRef::secret("db"),
            SourceData {
                revision: 3,
                values: [("password".to_string(), STANDARD.encode([0xff, 0xfe]))].into(),
            },
        );
        assert!(matches!(
            check(&spec, "default", &binary),
            Err(DataError::NotText { .. })
        ));
        check(&spec, "default", &data("s3cret", "fast")).unwrap();
    }

    #[test]
    fn only_variables_whose_values_changed_are_named() {
        let spec = spec();
        let started = resolve_env(&spec.containers[1], &data("a", "fast")).unwrap();
        assert_eq!(
            changed_env(&spec.containers[1], &started, &data("a", "slow")),
            ["MODE"]
        );
        assert!(changed_env(&spec.containers[0], &started, &data("b", "slow")).is_empty());
        assert!(changed_env(&spec.containers[1], &started, &data("a", "fast")).is_empty());
        // A key gone from the Secret leaves the running value alone.
        let mut gone = data("a", "fast");
        gone.insert(&DataRef::secret("db"), source_data(2, &[("user", "app")]));
        assert!(changed_env(&spec.containers[1], &started, &gone).is_empty());
    }

    #[test]
    fn changed_keys_count_additions_and_removals() {
        let old = source_data(1, &[("a", "1"), ("b", "2")]);
        let new = source_data(2, &[("a", "1"), ("b", "3"), ("c", "4")]);
        assert_eq!(
            changed_keys(Some(&old), &new)
                .into_iter()
                .collect::<Vec<_>>(),
            ["b", "c"]
        );
        let fewer = source_data(3, &[("a", "1")]);
        assert_eq!(
            changed_keys(Some(&old), &fewer)
                .into_iter()
                .collect::<Vec<_>>(),
            ["b"]
        );
    }

    #[tokio::test]
    async fn fetch_all_fetches_each_source_once_and_checks() {
        let api = FakeApi::default();
        api.set("secret/db", 4, &[("password", "p")]);
        let spec = spec();
        let error = fetch_all(&api, "default", "web", &spec).await.unwrap_err();
        assert_eq!(
            error.to_string(),
            "config app not found in namespace default"
        );
        api.set("config/app", 2, &[("mode", "m")]);
        let data = fetch_all(&api, "default", "web", &spec).await.unwrap();
        assert_eq!(data.get(&DataRef::secret("db")).unwrap().revision, 4);
        assert_eq!(data.sources.len(), 2);
    }
}

//! Secrets' values: sealed on the way in, kept apart from the object,
//! revealed only to who may read them.
//!
//! A Secret applied with values (`data`, `stringData`) is stored with only
//! `keys` (each value's size and keyed hash) in its spec; the values are
//! encrypted with the cluster's current data key ([`keyring`]) into one
//! sealed value named `{namespace}/{name}/{fingerprint}`, where the
//! fingerprint is a hash of the stored spec. History, diffs, watch events
//! and every read therefore carry hashes, never values; a rollback restores
//! an older spec, whose fingerprint names the older sealed value.
//!
//! Readers of values ([`reveal`]): operators; users with the read-secrets
//! right in their namespaces; controllers whose registration reads the
//! Secret's `spec.data`; nodes, for a pod bound to them that uses the
//! Secret (the node names the pod: one read decides).

pub mod keyring;

use std::collections::BTreeMap;
use std::sync::RwLock;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use corral_api::kinds::{DataRef, PodSpec, PodStatus, RevealedSecret, SecretKey, SecretSpec};
use corral_api::{FieldError, Identity, Kind, Object, ObjectKey, Role};
use corral_store::SealedRecord;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::Server;
use crate::error::ApiError;
pub use keyring::{Keyring, KeyringError};

/// The keyring file in a server's data dir.
pub const KEYRING_FILE: &str = "secrets-keyring";

/// How many sealed values one store write carries during a rotation.
const RESEAL_CHUNK: usize = 100;

/// The server's keys: a file-backed keyring once the control plane
/// installs one, an in-memory one made on first use otherwise (tests).
#[derive(Debug, Default)]
pub struct Secrets {
    keyring: RwLock<Option<Keyring>>,
    rotation: tokio::sync::Mutex<()>,
}

impl Secrets {
    /// Uses `keyring` from now on.
    pub fn install(&self, keyring: Keyring) {
        *self
            .keyring
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(keyring);
    }

    /// Runs `work` with the keyring, making an in-memory one if none is
    /// installed.
    fn with<T>(&self, work: impl FnOnce(&mut Keyring) -> T) -> Result<T, ApiError> {
        let mut guard = self
            .keyring
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if guard.is_none() {
            *guard = Some(Keyring::ephemeral().map_err(internal)?);
        }
        // INVARIANT: set just above when it was missing.
        Ok(work(guard.as_mut().expect("a keyring")))
    }
}

fn internal(error: KeyringError) -> ApiError {
    ApiError::Internal(format!("secrets: {error}"))
}

/// The name of the sealed value holding the values of `spec`'s stored form.
fn sealed_name(key: &ObjectKey, spec: &SecretSpec) -> String {
    #[derive(Serialize)]
    struct Stored<'a> {
        #[serde(rename = "type")]
        secret_type: &'a Option<String>,
        keys: &'a BTreeMap<String, SecretKey>,
    }
    // INVARIANT: strings and integers always serialize.
    let bytes = serde_json::to_vec(&Stored {
        secret_type: &spec.secret_type,
        keys: &spec.keys,
    })
    .expect("a stored secret spec serializes");
    let mut fingerprint = hex::encode(Sha256::digest(&bytes));
    fingerprint.truncate(32);
    format!("{}/{}/{fingerprint}", key.namespace, key.name)
}

/// Every sealed value of the Secret at `key`: the prefix of their names.
fn sealed_prefix(key: &ObjectKey) -> String {
    format!("{}/{}/", key.namespace, key.name)
}

fn typed(object: &Object) -> Result<SecretSpec, ApiError> {
    object.typed_spec().map_err(|_| {
        ApiError::Internal(format!(
            "{}: the stored spec is not a Secret's",
            object.key()
        ))
    })
}

fn invalid(key: &ObjectKey, path: &str, message: &str) -> ApiError {
    ApiError::invalid(&key.to_string(), vec![FieldError::new(path, message)])
}

/// Seals the values of a Secret being written (validated already): its
/// spec becomes the stored form and the sealed value is written to the
/// store — before the object, so an object never names values that are not
/// there. A request without values must name values the server holds (a
/// re-applied `get -o yaml`). Other kinds pass through.
pub async fn seal_incoming(server: &Server, object: &mut Object) -> Result<(), ApiError> {
    if object.kind != Kind::Secret {
        return Ok(());
    }
    let key = object.key();
    let mut spec = typed(object)?;
    if !spec.has_values() {
        if !spec.keys.is_empty()
            && server
                .store
                .get_sealed(&sealed_name(&key, &spec))
                .await?
                .is_none()
        {
            return Err(invalid(
                &key,
                "spec.keys",
                "names values this cluster does not hold: give the values in data or stringData",
            ));
        }
        return Ok(());
    }
    let mut values: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for (name, text) in std::mem::take(&mut spec.data) {
        let bytes = STANDARD
            .decode(&text)
            .map_err(|_| invalid(&key, &format!("spec.data.{name}"), "is not valid base64"))?;
        values.insert(name, bytes);
    }
    for (name, text) in std::mem::take(&mut spec.string_data) {
        values.insert(name, text.into_bytes());
    }
    let (keys, plaintext) = server.secrets.with(|keyring| {
        let keys = values
            .iter()
            .map(|(name, value)| {
                let info = SecretKey {
                    size: value.len() as u64,
                    hash: keyring.hash(value),
                };
                (name.clone(), info)
            })
            .collect();
        let encoded: BTreeMap<&String, String> = values
            .iter()
            .map(|(name, value)| (name, STANDARD.encode(value)))
            .collect();
        // INVARIANT: a map of strings always serializes.
        let plaintext = serde_json::to_vec(&encoded).expect("values serialize");
        (keys, plaintext)
    })?;
    spec.keys = keys;
    let name = sealed_name(&key, &spec);
    let sealed = server
        .secrets
        .with(|keyring| keyring.seal(&name, &plaintext))?
        .map_err(internal)?;
    server
        .store
        .write_sealed(
            &[SealedRecord {
                name,
                value: sealed,
            }],
            &[],
        )
        .await?;
    // INVARIANT: a typed spec always serializes.
    object.spec = serde_json::to_value(&spec).expect("a secret spec serializes");
    Ok(())
}

/// Refuses a rollback of a Secret to a revision whose values are gone.
pub async fn check_restorable(
    server: &Server,
    key: &ObjectKey,
    spec: &serde_json::Value,
) -> Result<(), ApiError> {
    if key.kind != Kind::Secret {
        return Ok(());
    }
    let spec: SecretSpec = serde_json::from_value(spec.clone())
        .map_err(|_| ApiError::Internal(format!("{key}: a revision's spec is not a Secret's")))?;
    if spec.keys.is_empty()
        || server
            .store
            .get_sealed(&sealed_name(key, &spec))
            .await?
            .is_some()
    {
        return Ok(());
    }
    Err(ApiError::Conflict(format!(
        "{key}: the values of that revision are no longer kept (the Secret was deleted since)"
    )))
}

/// Removes the sealed values of the Secret at `key` that neither its
/// current spec nor a kept revision names (after an update), or all of them
/// (after a delete: `live` is false).
pub async fn prune(server: &Server, key: &ObjectKey, live: bool) -> Result<(), ApiError> {
    if key.kind != Kind::Secret {
        return Ok(());
    }
    let mut kept = std::collections::BTreeSet::new();
    if live {
        for record in server.store.history(key).await? {
            let Ok(revision) = server.store.revision(key, record.revision).await else {
                continue;
            };
            if let Some(spec) = revision.spec
                && let Ok(spec) = serde_json::from_value::<SecretSpec>(spec)
            {
                kept.insert(sealed_name(key, &spec));
            }
        }
        if let Some(object) = server.store.get(key).await? {
            kept.insert(sealed_name(key, &typed(&object)?));
        }
    }
    let doomed: Vec<String> = server
        .store
        .list_sealed(&sealed_prefix(key))
        .await?
        .into_iter()
        .map(|record| record.name)
        .filter(|name| !kept.contains(name))
        .collect();
    for chunk in doomed.chunks(RESEAL_CHUNK) {
        server.store.write_sealed(&[], chunk).await?;
    }
    Ok(())
}

/// Whether `caller` may read the values of the Secret at `key`, and if not
/// the rule that refuses it. A node names the pod it reads them for.
async fn authorize(
    server: &Server,
    caller: &Identity,
    key: &ObjectKey,
    pod: Option<&str>,
) -> Result<(), ApiError> {
    let refused = |rule: String| {
        Err(ApiError::Forbidden(format!(
            "{} may not read the values of {key}: {rule}",
            caller.name
        )))
    };
    match caller.role {
        Role::Operator => Ok(()),
        // The namespace was checked against the token's before the handler.
        Role::User if caller.read_secrets => Ok(()),
        Role::User => refused(
            "a user reads Secrets' values only with a token made with --read-secrets".into(),
        ),
        Role::Controller => {
            let registry = crate::ownership::registry(server).await?;
            let reads = registry
                .visible_paths(&caller.name, Kind::Secret, &key.name)
                .unwrap_or_default()
                .iter()
                .any(|pattern| corral_ownership::overlaps(pattern, "spec.data"));
            if reads {
                Ok(())
            } else {
                refused(format!(
                    "a controller reads Secrets' values only if its registration declares it reads Secret spec.data (controller {} does not)",
                    caller.name
                ))
            }
        }
        Role::Node => match node_pod_rule(server, caller, key, pod).await? {
            None => Ok(()),
            Some(rule) => refused(rule),
        },
        Role::Joiner => refused("a join token only joins a node".into()),
    }
}

/// Why node `caller` may not read the Secret at `key` for pod `pod` (of
/// the Secret's namespace), or `None` when it may: the pod is bound to the
/// node and uses the Secret. One read of one pod, whatever the cluster's size.
async fn node_pod_rule(
    server: &Server,
    caller: &Identity,
    key: &ObjectKey,
    pod: Option<&str>,
) -> Result<Option<String>, ApiError> {
    const RULE: &str = "a node reads only the Secrets of pods bound to it that use them";
    let Some(pod) = pod else {
        return Ok(Some(format!("{RULE}: name the pod (?pod=NAME)")));
    };
    let pod_key = ObjectKey::new(Kind::Pod, Some(&key.namespace), pod);
    let Some(object) = server.store.get(&pod_key).await? else {
        return Ok(Some(format!(
            "{RULE}: pod {pod} not found in namespace {}",
            key.namespace
        )));
    };
    let bound = object
        .typed_status::<PodStatus>()
        .ok()
        .and_then(|status| status.node);
    if bound.as_deref() != Some(caller.name.as_str()) {
        let there = bound.map_or_else(|| "no node".to_string(), |node| format!("node {node}"));
        return Ok(Some(format!("{RULE}: pod {pod} is bound to {there}")));
    }
    let uses = object
        .typed_spec::<PodSpec>()
        .is_ok_and(|spec| spec.uses(&DataRef::secret(&key.name)));
    if !uses {
        return Ok(Some(format!(
            "{RULE}: pod {pod} does not use secret {}",
            key.name
        )));
    }
    Ok(None)
}

/// The values of the Secret at `key` (of its revision `revision`, default
/// the current one), for a caller who may read them; a node reads them for
/// `pod`.
pub async fn reveal(
    server: &Server,
    caller: &Identity,
    key: &ObjectKey,
    revision: Option<u64>,
    pod: Option<&str>,
) -> Result<RevealedSecret, ApiError> {
    if key.kind != Kind::Secret {
        return Err(ApiError::BadRequest(format!(
            "{key}: only Secrets are revealed (a Config's data is in its spec)"
        )));
    }
    authorize(server, caller, key, pod).await?;
    let object = server
        .store
        .get(key)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("{key} not found")))?;
    let (revision, spec) = match revision {
        None => (object.metadata.revision, typed(&object)?),
        Some(wanted) => {
            let record = server.store.revision(key, wanted).await?;
            if record.uid != object.metadata.uid {
                return Err(ApiError::NotFound(format!(
                    "revision {wanted} belongs to an earlier {key} that was deleted"
                )));
            }
            let spec = record
                .spec
                .and_then(|spec| serde_json::from_value(spec).ok())
                .ok_or_else(|| {
                    ApiError::Internal(format!("{key}: revision {wanted} has no Secret spec"))
                })?;
            (wanted, spec)
        }
    };
    let mut revealed = RevealedSecret {
        revision,
        secret_type: spec.secret_type.clone(),
        data: BTreeMap::new(),
    };
    if spec.keys.is_empty() {
        return Ok(revealed);
    }
    let name = sealed_name(key, &spec);
    let sealed = server.store.get_sealed(&name).await?.ok_or_else(|| {
        ApiError::Internal(format!(
            "{key}: the values of revision {revision} are missing from the store"
        ))
    })?;
    let plaintext = server
        .secrets
        .with(|keyring| keyring.open(&name, &sealed))?
        .map_err(internal)?;
    revealed.data = serde_json::from_slice(&plaintext)
        .map_err(|_| ApiError::Internal(format!("{key}: its sealed values are not a map")))?;
    Ok(revealed)
}

/// What a key rotation did.
#[derive(Debug, Clone, Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RotationReport {
    /// The new data key's id.
    pub key: u32,
    /// Sealed values encrypted again with it.
    pub resealed: usize,
    /// The data keys forgotten (they decrypt nothing any more).
    pub retired: Vec<u32>,
}

/// Makes a new data key current, seals every value again with it, then
/// forgets the old keys. Operators only. A crash midway leaves both keys in
/// the keyring (the new one current), so running it again finishes it.
pub async fn rotate(server: &Server, caller: &Identity) -> Result<RotationReport, ApiError> {
    if caller.role != Role::Operator {
        return Err(ApiError::Forbidden(format!(
            "{} may not rotate the secrets key: operators only",
            caller.name
        )));
    }
    let _one_at_a_time = server.secrets.rotation.lock().await;
    let key = server.secrets.with(Keyring::add_key)?.map_err(internal)?;
    let mut resealed = 0;
    let all = server.store.list_sealed("").await?;
    for chunk in all.chunks(RESEAL_CHUNK) {
        let records = server.secrets.with(|keyring| {
            chunk
                .iter()
                .map(|record| {
                    let plaintext = keyring.open(&record.name, &record.value)?;
                    Ok(SealedRecord {
                        name: record.name.clone(),
                        value: keyring.seal(&record.name, &plaintext)?,
                    })
                })
                .collect::<Result<Vec<_>, KeyringError>>()
        })?;
        let records = records.map_err(internal)?;
        server.store.write_sealed(&records, &[]).await?;
        resealed += records.len();
    }
    let retired = server
        .secrets
        .with(Keyring::retire_old)?
        .map_err(internal)?;
    tracing::info!(key, resealed, ?retired, "secrets key rotated");
    Ok(RotationReport {
        key,
        resealed,
        retired,
    })
}

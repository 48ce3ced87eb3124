//! The cluster's secret keys, kept outside the store: AES-256-GCM data
//! keys (one current, older ones only while a rotation runs) and the key of
//! the keyed hash that tells values apart in a Secret's spec.
//!
//! A sealed value is `CS1` + the data key's id (u32, big-endian) + a
//! random 96-bit nonce + the ciphertext and tag; the Secret's name and
//! fingerprint are the additional data, so a sealed value moved under
//! another name does not open. The file is JSON, mode 0600, replaced
//! atomically (written, fsynced, renamed) on every change.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};
use serde::{Deserialize, Serialize};

const MAGIC: &[u8; 3] = b"CS1";
const HEADER: usize = MAGIC.len() + 4 + NONCE_LEN;
/// Hex digits of the keyed hash shown in a Secret's spec (64 bits).
const HASH_HEX: usize = 32;

/// Why keys could not be read, kept or used.
#[derive(Debug, thiserror::Error)]
pub enum KeyringError {
    #[error("cannot read the secrets keyring {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write the secrets keyring {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the secrets keyring {path} is damaged: {reason}")]
    Damaged { path: PathBuf, reason: String },
    #[error("the system's random source failed")]
    Random,
    #[error(
        "a sealed value names data key {0}, which this keyring does not hold (rotated away, or the keyring of another cluster)"
    )]
    UnknownKey(u32),
    #[error("a sealed value does not open: it is damaged, or was sealed for another name")]
    Open,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct KeyringFile {
    hash_key: String,
    current: u32,
    keys: BTreeMap<u32, String>,
}

/// The keys, in memory.
pub struct Keyring {
    path: Option<PathBuf>,
    hash_key: [u8; 32],
    current: u32,
    keys: BTreeMap<u32, [u8; 32]>,
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keyring")
            .field("path", &self.path)
            .field("current", &self.current)
            .field("keys", &self.keys.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

fn random_key() -> Result<[u8; 32], KeyringError> {
    let mut key = [0u8; 32];
    SystemRandom::new()
        .fill(&mut key)
        .map_err(|_| KeyringError::Random)?;
    Ok(key)
}

impl Keyring {
    /// A fresh keyring kept only in memory (tests, and servers without a
    /// data dir).
    pub fn ephemeral() -> Result<Self, KeyringError> {
        Ok(Keyring {
            path: None,
            hash_key: random_key()?,
            current: 1,
            keys: BTreeMap::from([(1, random_key()?)]),
        })
    }

    /// The keyring at `path`, created there (mode 0600) when missing.
    pub fn open_or_create(path: &Path) -> Result<Self, KeyringError> {
        match std::fs::read(path) {
            Ok(bytes) => Self::parse(path, &bytes),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                let mut keyring = Self::ephemeral()?;
                keyring.path = Some(path.to_path_buf());
                keyring.persist()?;
                Ok(keyring)
            }
            Err(source) => Err(KeyringError::Read {
                path: path.to_path_buf(),
                source,
            }),
        }
    }

    fn parse(path: &Path, bytes: &[u8]) -> Result<Self, KeyringError> {
        let damaged = |reason: String| KeyringError::Damaged {
            path: path.to_path_buf(),
            reason,
        };
        let file: KeyringFile =
            serde_json::from_slice(bytes).map_err(|error| damaged(error.to_string()))?;
        let decode = |what: &str, text: &str| -> Result<[u8; 32], KeyringError> {
            STANDARD
                .decode(text)
                .ok()
                .and_then(|bytes| <[u8; 32]>::try_from(bytes).ok())
                .ok_or_else(|| damaged(format!("{what} is not 32 bytes of base64")))
        };
        let mut keys = BTreeMap::new();
        for (id, text) in &file.keys {
            keys.insert(*id, decode(&format!("data key {id}"), text)?);
        }
        if !keys.contains_key(&file.current) {
            return Err(damaged(format!(
                "the current data key {} is not in it",
                file.current
            )));
        }
        Ok(Keyring {
            path: Some(path.to_path_buf()),
            hash_key: decode("the hash key", &file.hash_key)?,
            current: file.current,
            keys,
        })
    }

    /// Writes the keyring to its file (if it has one): a new file beside
    /// it, fsynced, renamed over it, and the directory fsynced.
    fn persist(&self) -> Result<(), KeyringError> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let file = KeyringFile {
            hash_key: STANDARD.encode(self.hash_key),
            current: self.current,
            keys: self
                .keys
                .iter()
                .map(|(id, key)| (*id, STANDARD.encode(key)))
                .collect(),
        };
        // INVARIANT: plain strings and integers always serialize.
        let bytes = serde_json::to_vec_pretty(&file).expect("a keyring serializes");
        let write_error = |source| KeyringError::Write {
            path: path.clone(),
            source,
        };
        let staged = path.with_extension("new");
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&staged)
            .map_err(write_error)?;
        out.write_all(&bytes).map_err(write_error)?;
        out.sync_all().map_err(write_error)?;
        std::fs::rename(&staged, path).map_err(write_error)?;
        if let Some(dir) = path.parent() {
            std::fs::File::open(dir)
                .and_then(|dir| dir.sync_all())
                .map_err(write_error)?;
        }
        Ok(())
    }

    /// The id of the key new values are sealed with.
    pub fn current(&self) -> u32 {
        self.current
    }

    /// The ids of every data key held.
    pub fn key_ids(&self) -> Vec<u32> {
        self.keys.keys().copied().collect()
    }

    /// The keyed hash of `value`, as a Secret's spec shows it.
    pub fn hash(&self, value: &[u8]) -> String {
        let key = hmac::Key::new(hmac::HMAC_SHA256, &self.hash_key);
        let tag = hmac::sign(&key, value);
        let mut text = hex::encode(tag.as_ref());
        text.truncate(HASH_HEX);
        text
    }

    /// `plaintext` sealed with the current key, bound to `name`.
    pub fn seal(&self, name: &str, plaintext: &[u8]) -> Result<Vec<u8>, KeyringError> {
        let key = self.aead(self.current)?;
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new()
            .fill(&mut nonce)
            .map_err(|_| KeyringError::Random)?;
        let mut sealed = Vec::with_capacity(HEADER + plaintext.len() + 16);
        sealed.extend_from_slice(MAGIC);
        sealed.extend_from_slice(&self.current.to_be_bytes());
        sealed.extend_from_slice(&nonce);
        let mut body = plaintext.to_vec();
        key.seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(name.as_bytes()),
            &mut body,
        )
        .map_err(|_| KeyringError::Open)?;
        sealed.extend_from_slice(&body);
        Ok(sealed)
    }

    /// The plaintext of `sealed`, which must have been sealed for `name`.
    pub fn open(&self, name: &str, sealed: &[u8]) -> Result<Vec<u8>, KeyringError> {
        if sealed.len() < HEADER || &sealed[..MAGIC.len()] != MAGIC {
            return Err(KeyringError::Open);
        }
        let id_bytes: [u8; 4] = sealed[MAGIC.len()..MAGIC.len() + 4]
            .try_into()
            .map_err(|_| KeyringError::Open)?;
        let key = self.aead(u32::from_be_bytes(id_bytes))?;
        let nonce: [u8; NONCE_LEN] = sealed[MAGIC.len() + 4..HEADER]
            .try_into()
            .map_err(|_| KeyringError::Open)?;
        let mut body = sealed[HEADER..].to_vec();
        let plaintext = key
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(name.as_bytes()),
                &mut body,
            )
            .map_err(|_| KeyringError::Open)?;
        Ok(plaintext.to_vec())
    }

    /// The id of the data key `sealed` names, if it is a sealed value.
    pub fn key_of(sealed: &[u8]) -> Option<u32> {
        if !sealed.starts_with(MAGIC) {
            return None;
        }
        let bytes: [u8; 4] = sealed.get(MAGIC.len()..MAGIC.len() + 4)?.try_into().ok()?;
        Some(u32::from_be_bytes(bytes))
    }

    fn aead(&self, id: u32) -> Result<LessSafeKey, KeyringError> {
        let bytes = self.keys.get(&id).ok_or(KeyringError::UnknownKey(id))?;
        // INVARIANT: every held key is 32 bytes, AES-256's key length.
        let key = UnboundKey::new(&AES_256_GCM, bytes).expect("a 32-byte AES-256 key");
        Ok(LessSafeKey::new(key))
    }

    /// Adds a new data key and makes it current (kept on disk before it
    /// seals anything); the old ones stay until [`Keyring::retire_old`].
    pub fn add_key(&mut self) -> Result<u32, KeyringError> {
        let id = self.keys.keys().max().copied().unwrap_or(0) + 1;
        self.keys.insert(id, random_key()?);
        self.current = id;
        self.persist()?;
        Ok(id)
    }

    /// Forgets every data key but the current one, on disk too.
    pub fn retire_old(&mut self) -> Result<Vec<u32>, KeyringError> {
        let current = self.current;
        let retired: Vec<u32> = self
            .keys
            .keys()
            .filter(|id| **id != current)
            .copied()
            .collect();
        self.keys.retain(|id, _| *id == current);
        self.persist()?;
        Ok(retired)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seals_and_opens_bound_to_the_name() {
        let keyring = Keyring::ephemeral().unwrap();
        let sealed = keyring.seal("default/db/abc", b"hunter2").unwrap();
        assert!(!sealed.windows(7).any(|w| w == b"hunter2"));
        assert_eq!(keyring.open("default/db/abc", &sealed).unwrap(), b"hunter2");
        assert!(matches!(
            keyring.open("default/other/abc", &sealed),
            Err(KeyringError::Open)
        ));
        let mut damaged = sealed.clone();
        let last = damaged.len() - 1;
        damaged[last] ^= 1;
        assert!(matches!(
            keyring.open("default/db/abc", &damaged),
            Err(KeyringError::Open)
        ));
        assert_eq!(Keyring::key_of(&sealed), Some(1));
    }

    #[test]
    fn hashes_tell_values_apart_and_depend_on_the_cluster() {
        let one = Keyring::ephemeral().unwrap();
        let other = Keyring::ephemeral().unwrap();
        assert_eq!(one.hash(b"a"), one.hash(b"a"));
        assert_ne!(one.hash(b"a"), one.hash(b"b"));
        assert_ne!(one.hash(b"a"), other.hash(b"a"));
        assert_eq!(one.hash(b"a").len(), HASH_HEX);
    }

    #[test]
    fn the_file_survives_a_reopen_and_rotation_retires_the_old_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secrets-keyring");
        let mut keyring = Keyring::open_or_create(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o600
        );
        let old = keyring.seal("n", b"v").unwrap();
        let reopened = Keyring::open_or_create(&path).unwrap();
        assert_eq!(reopened.open("n", &old).unwrap(), b"v");
        assert_eq!(reopened.hash(b"v"), keyring.hash(b"v"));

        assert_eq!(keyring.add_key().unwrap(), 2);
        let new = keyring.seal("n", b"v").unwrap();
        assert_eq!(Keyring::key_of(&new), Some(2));
        assert_eq!(
            keyring.open("n", &old).unwrap(),
            b"v",
            "both held mid-rotation"
        );
        assert_eq!(keyring.retire_old().unwrap(), vec![1]);
        let after = Keyring::open_or_create(&path).unwrap();
        assert!(matches!(
            after.open("n", &old),
            Err(KeyringError::UnknownKey(1))
        ));
        assert_eq!(after.open("n", &new).unwrap(), b"v");
        assert_eq!(after.hash(b"v"), keyring.hash(b"v"), "the hash key stays");
    }

    #[test]
    fn a_damaged_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secrets-keyring");
        std::fs::write(
            &path,
            b"{\"hashKey\": \"AA==\", \"current\": 1, \"keys\": {}}",
        )
        .unwrap();
        let error = Keyring::open_or_create(&path).unwrap_err().to_string();
        assert!(
            error.contains("is damaged: the current data key 1 is not in it"),
            "{error}"
        );
    }
}

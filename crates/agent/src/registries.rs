//! How this node reaches image registries (node-local settings, never in
//! the API): the CA directory, the registries spoken to over plain HTTP,
//! the credentials file; and the pull step's progress lines.
//!
//! A registry client is made per pull, on the blocking pool (see
//! [`RegistryFactory`]); the credentials file is read at each pull, so an
//! edit applies without a restart, and bearer tokens are shared by every
//! pull of the node until they expire.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use corral_runtime::image::registry::{DEFAULT_AUTH_FILE, DEFAULT_CERTS_DIR};
use corral_runtime::image::{
    AuthFile, BlobProgress, Digest, HttpRegistry, Registry, RegistryConfig, TokenCache,
};

use crate::containers::RegistryFactory;

/// Bounds one registry request, body included: a large layer over a slow
/// link must fit.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// A blob being downloaded gets at most one log line this often.
pub const PROGRESS_INTERVAL: Duration = Duration::from_secs(5);

/// The node's registry settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistrySettings {
    /// `<certs dir>/<HOST[:PORT]>/*.crt`: CAs trusted for that registry.
    pub certs_dir: PathBuf,
    /// `HOST[:PORT]` of registries reached over plain HTTP.
    pub insecure: Vec<String>,
    /// A Docker `config.json` with the node's credentials; `None`: none.
    pub auth_file: Option<PathBuf>,
}

impl Default for RegistrySettings {
    /// The default certs dir, no insecure registry, and the default auth
    /// file when it exists.
    fn default() -> Self {
        let auth_file = PathBuf::from(DEFAULT_AUTH_FILE);
        Self {
            certs_dir: PathBuf::from(DEFAULT_CERTS_DIR),
            insecure: Vec::new(),
            auth_file: auth_file.is_file().then_some(auth_file),
        }
    }
}

/// Makes the node's registry clients from `settings`.
pub fn factory(settings: RegistrySettings) -> RegistryFactory {
    let tokens = Arc::new(TokenCache::default());
    Arc::new(move || {
        let auth = match &settings.auth_file {
            Some(path) => AuthFile::load(path)?,
            None => AuthFile::default(),
        };
        let config = RegistryConfig {
            timeout: REQUEST_TIMEOUT,
            certs_dir: settings.certs_dir.clone(),
            insecure: settings.insecure.clone(),
            auth,
            tokens: tokens.clone(),
        };
        Ok(Box::new(HttpRegistry::new(config)) as Box<dyn Registry>)
    })
}

/// The pull step's progress lines: per blob, one every
/// [`PROGRESS_INTERVAL`] while it downloads and one when it is done, e.g.
/// `busybox:1: layer sha256:0123456789ab… 12.3/45.6 MiB`.
#[derive(Debug)]
pub struct PullLog {
    interval: Duration,
    lines: Mutex<Vec<String>>,
    last_line: Mutex<HashMap<Digest, Instant>>,
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1 << 20)
}

impl PullLog {
    pub fn new(interval: Duration) -> Self {
        Self {
            interval,
            lines: Mutex::default(),
            last_line: Mutex::default(),
        }
    }

    /// Takes one progress report of `image`'s pull, seen at `now`.
    pub fn observe(&self, image: &str, progress: BlobProgress<'_>, now: Instant) {
        let done = progress.done >= progress.total;
        {
            let mut last = self
                .last_line
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let due = last
                .get(progress.digest)
                .is_none_or(|at| now.duration_since(*at) >= self.interval);
            if !(done || due) {
                return;
            }
            last.insert(progress.digest.clone(), now);
        }
        let hex = progress.digest.hex();
        let line = format!(
            "{image}: layer sha256:{}… {:.1}/{:.1} MiB{}",
            &hex[..hex.len().min(12)],
            mib(progress.done),
            mib(progress.total),
            if done { " done" } else { "" }
        );
        self.lines
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(line);
    }

    /// The lines so far, oldest first.
    pub fn take(&self) -> Vec<String> {
        std::mem::take(
            &mut *self
                .lines
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_blob_per_interval_and_one_when_done() {
        let log = PullLog::new(Duration::from_secs(5));
        let (a, b) = (Digest::of(b"a"), Digest::of(b"b"));
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        let total = 10 << 20;
        let report = |digest, done, seconds| {
            log.observe(
                "busybox:1",
                BlobProgress {
                    digest,
                    done,
                    total,
                },
                at(seconds),
            );
        };
        report(&a, 1 << 20, 0);
        report(&b, 1 << 20, 0);
        report(&a, 2 << 20, 1);
        report(&a, 3 << 20, 4);
        report(&a, 6 << 20, 5);
        report(&a, total, 6);
        let lines = log.take();
        let a_hex = &a.hex()[..12];
        assert_eq!(
            lines,
            vec![
                format!("busybox:1: layer sha256:{a_hex}… 1.0/10.0 MiB"),
                format!("busybox:1: layer sha256:{}… 1.0/10.0 MiB", &b.hex()[..12]),
                format!("busybox:1: layer sha256:{a_hex}… 6.0/10.0 MiB"),
                format!("busybox:1: layer sha256:{a_hex}… 10.0/10.0 MiB done"),
            ]
        );
        assert!(log.take().is_empty());
    }

    #[test]
    fn settings_default_to_the_etc_corral_paths() {
        let settings = RegistrySettings::default();
        assert_eq!(settings.certs_dir, PathBuf::from("/etc/corral/certs.d"));
        assert!(settings.insecure.is_empty());
    }
}

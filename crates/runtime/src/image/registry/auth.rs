//! Registry credentials: the node's Docker-format auth file, the
//! distribution API's `WWW-Authenticate` challenges, and bearer tokens
//! cached per registry and scope. Secrets never reach a `Debug` string, a
//! log line or an error message.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;

use crate::image::reference::{DOCKER_HUB, DOCKER_HUB_ALIASES};

/// A user name and password (or token) for one registry.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// Why the node's registry auth file cannot be used. No variant carries
/// the file's content: a parse error names only the position.
#[derive(Debug, thiserror::Error)]
pub enum AuthFileError {
    #[error("cannot read the registry auth file {path:?}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the registry auth file {path:?} is not a Docker config.json at line {line}, column \
         {column} (expected {{\"auths\": {{\"HOST[:PORT]\": {{\"auth\": \"base64 of user:password\"}}}}}})"
    )]
    Parse {
        path: PathBuf,
        line: usize,
        column: usize,
    },
    #[error(
        "the registry auth file {path:?} has an entry for {host} whose auth is not base64 of \
         user:password, and no username and password fields"
    )]
    BadEntry { path: PathBuf, host: String },
}

#[derive(serde::Deserialize)]
struct DockerConfig {
    #[serde(default)]
    auths: BTreeMap<String, DockerAuth>,
}

#[derive(serde::Deserialize)]
struct DockerAuth {
    auth: Option<String>,
    username: Option<String>,
    password: Option<String>,
}

/// The `HOST[:PORT]` a credentials key or a registry name stands for:
/// scheme and path dropped, Docker Hub's spellings (including the
/// `https://index.docker.io/v1/` key Docker writes) made `docker.io`.
pub fn registry_key(name: &str) -> String {
    let without_scheme = name
        .strip_prefix("https://")
        .or_else(|| name.strip_prefix("http://"))
        .unwrap_or(name);
    let host = without_scheme
        .split('/')
        .next()
        .unwrap_or(without_scheme)
        .to_ascii_lowercase();
    if DOCKER_HUB_ALIASES.contains(&host.as_str()) {
        DOCKER_HUB.to_string()
    } else {
        host
    }
}

/// The credentials of the node's auth file, by registry.
#[derive(Default, Clone, PartialEq, Eq)]
pub struct AuthFile {
    by_registry: BTreeMap<String, Credentials>,
}

impl std::fmt::Debug for AuthFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthFile")
            .field("registries", &self.by_registry.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl AuthFile {
    /// Reads a Docker `config.json`: `{"auths": {"host:port": {"auth":
    /// base64("user:pass")}}}`, or `username` and `password` fields.
    pub fn load(path: &Path) -> Result<Self, AuthFileError> {
        let bytes = std::fs::read(path).map_err(|source| AuthFileError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&bytes, path)
    }

    /// [`load`](Self::load) from bytes; `path` names the file in errors.
    pub fn parse(bytes: &[u8], path: &Path) -> Result<Self, AuthFileError> {
        let config: DockerConfig =
            serde_json::from_slice(bytes).map_err(|e| AuthFileError::Parse {
                path: path.to_path_buf(),
                line: e.line(),
                column: e.column(),
            })?;
        let mut by_registry = BTreeMap::new();
        for (key, entry) in config.auths {
            let from_fields = match (entry.username, entry.password) {
                (Some(username), Some(password)) => Some(Credentials { username, password }),
                _ => None,
            };
            let from_auth = entry.auth.as_deref().and_then(decode_basic);
            let credentials = from_auth.or(from_fields).ok_or(AuthFileError::BadEntry {
                path: path.to_path_buf(),
                host: key.clone(),
            })?;
            by_registry.insert(registry_key(&key), credentials);
        }
        Ok(Self { by_registry })
    }

    /// The credentials for a registry as written in an image reference.
    pub fn lookup(&self, registry: &str) -> Option<&Credentials> {
        self.by_registry.get(&registry_key(registry))
    }
}

fn decode_basic(auth: &str) -> Option<Credentials> {
    let decoded = BASE64.decode(auth.trim()).ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (username, password) = text.split_once(':')?;
    Some(Credentials {
        username: username.to_string(),
        password: password.to_string(),
    })
}

/// What a registry's 401 asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Challenge {
    /// HTTP basic auth on every request.
    Basic,
    /// The distribution token flow: get a token from `realm`.
    Bearer {
        realm: String,
        service: Option<String>,
        scope: Option<String>,
    },
}

/// Parses a `WWW-Authenticate` value: `Bearer realm="…",service="…",
/// scope="…"` or `Basic realm="…"`. Quoted values may hold commas.
pub fn parse_challenge(header: &str) -> Option<Challenge> {
    let header = header.trim();
    let (scheme, rest) = header.split_once(' ').unwrap_or((header, ""));
    let params = parse_params(rest);
    match scheme.to_ascii_lowercase().as_str() {
        "basic" => Some(Challenge::Basic),
        "bearer" => Some(Challenge::Bearer {
            realm: params.get("realm")?.clone(),
            service: params.get("service").cloned(),
            scope: params.get("scope").cloned(),
        }),
        _ => None,
    }
}

fn parse_params(mut rest: &str) -> HashMap<String, String> {
    let mut params = HashMap::new();
    loop {
        rest = rest.trim_start_matches([' ', ',']);
        let Some((key, after)) = rest.split_once('=') else {
            return params;
        };
        let key = key.trim().to_ascii_lowercase();
        let (value, after) = if let Some(quoted) = after.strip_prefix('"') {
            match quoted.find('"') {
                Some(end) => (&quoted[..end], &quoted[end + 1..]),
                None => (quoted, ""),
            }
        } else {
            match after.find(',') {
                Some(end) => (&after[..end], &after[end..]),
                None => (after, ""),
            }
        };
        params.insert(key, value.trim().to_string());
        rest = after;
    }
}

/// A token endpoint's answer.
#[derive(Debug, serde::Deserialize)]
pub struct TokenResponse {
    token: Option<String>,
    access_token: Option<String>,
    expires_in: Option<u64>,
}

/// How long a token is trusted when the server does not say (the
/// distribution spec's default).
pub const DEFAULT_TOKEN_LIFETIME: Duration = Duration::from_secs(60);

impl TokenResponse {
    /// The token and how long to reuse it (a few seconds short of its
    /// lifetime, so a request never carries one about to expire).
    pub fn into_token(self) -> Option<(String, Duration)> {
        let lifetime = self
            .expires_in
            .map_or(DEFAULT_TOKEN_LIFETIME, Duration::from_secs);
        let reuse = lifetime.saturating_sub(Duration::from_secs(5));
        let token = self.token.or(self.access_token)?;
        (!token.is_empty()).then_some((token, reuse))
    }
}

/// Bearer tokens by registry and scope, reused until they expire. One is
/// shared by every pull of a node.
#[derive(Default)]
pub struct TokenCache {
    tokens: Mutex<HashMap<(String, String), (String, Instant)>>,
}

impl std::fmt::Debug for TokenCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenCache").finish_non_exhaustive()
    }
}

impl TokenCache {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), (String, Instant)>> {
        // Only whole entries are ever written: a poisoned map is whole.
        self.tokens
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The token for `registry` and `scope`, if one is still valid at `now`.
    pub fn get(&self, registry: &str, scope: &str, now: Instant) -> Option<String> {
        let mut tokens = self.lock();
        let key = (registry.to_string(), scope.to_string());
        match tokens.get(&key) {
            Some((token, until)) if *until > now => Some(token.clone()),
            Some(_) => {
                tokens.remove(&key);
                None
            }
            None => None,
        }
    }

    /// Keeps `token` until `now + lifetime`.
    pub fn put(
        &self,
        registry: &str,
        scope: &str,
        token: String,
        now: Instant,
        lifetime: Duration,
    ) {
        self.lock().insert(
            (registry.to_string(), scope.to_string()),
            (token, now + lifetime),
        );
    }

    /// Forgets a token the registry refused.
    pub fn forget(&self, registry: &str, scope: &str) {
        self.lock()
            .remove(&(registry.to_string(), scope.to_string()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auth_file(text: &str) -> Result<AuthFile, AuthFileError> {
        AuthFile::parse(text.as_bytes(), Path::new("/etc/corral/registry-auth.json"))
    }

    #[test]
    fn reads_docker_config_json_entries() {
        let alice = BASE64.encode("alice:s3cret:with:colons");
        let file = auth_file(&format!(
            r#"{{"auths": {{
                "127.0.0.1:5000": {{"auth": "{alice}"}},
                "https://index.docker.io/v1/": {{"username": "bob", "password": "pw"}},
                "https://Reg.Example.com/v2/": {{"auth": "{alice}"}}
            }}, "credsStore": "desktop"}}"#
        ))
        .expect("parse");
        let alice = Credentials {
            username: "alice".into(),
            password: "s3cret:with:colons".into(),
        };
        assert_eq!(file.lookup("127.0.0.1:5000"), Some(&alice));
        assert_eq!(file.lookup("reg.example.com"), Some(&alice));
        assert_eq!(file.lookup("127.0.0.1:5001"), None);
        for hub in ["docker.io", "registry-1.docker.io", "index.docker.io"] {
            assert_eq!(file.lookup(hub).map(|c| c.username.as_str()), Some("bob"));
        }
    }

    #[test]
    fn auth_file_errors_never_show_secrets() {
        let error = auth_file(r#"{"auths": {"h": {"auth": "bm90LWEtcGFpcg=="}}}"#)
            .expect_err("no colon in the decoded auth");
        assert!(matches!(error, AuthFileError::BadEntry { ref host, .. } if host == "h"));
        let error = auth_file(r#"{"auths": "hunter2"}"#).expect_err("not an object");
        let message = error.to_string();
        assert!(message.contains("line 1"), "{message}");
        assert!(!message.contains("hunter2"), "{message}");
        let credentials = Credentials {
            username: "u".into(),
            password: "hunter2".into(),
        };
        assert!(!format!("{credentials:?}").contains("hunter2"));
    }

    #[test]
    fn parses_bearer_and_basic_challenges() {
        assert_eq!(
            parse_challenge(
                r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/busybox:pull,push""#
            ),
            Some(Challenge::Bearer {
                realm: "https://auth.docker.io/token".into(),
                service: Some("registry.docker.io".into()),
                scope: Some("repository:library/busybox:pull,push".into()),
            })
        );
        assert_eq!(
            parse_challenge(r#"Basic realm="Registry Realm""#),
            Some(Challenge::Basic)
        );
        assert_eq!(
            parse_challenge("bearer realm=http://127.0.0.1:9/token"),
            Some(Challenge::Bearer {
                realm: "http://127.0.0.1:9/token".into(),
                service: None,
                scope: None,
            })
        );
        assert_eq!(parse_challenge("Bearer service=x"), None);
        assert_eq!(parse_challenge("Negotiate"), None);
    }

    #[test]
    fn tokens_are_reused_until_they_expire() {
        let cache = TokenCache::default();
        let now = Instant::now();
        let scope = "repository:a:pull";
        let (token, lifetime) = TokenResponse {
            token: None,
            access_token: Some("t1".into()),
            expires_in: Some(300),
        }
        .into_token()
        .expect("token");
        assert_eq!(lifetime, Duration::from_secs(295));
        cache.put("reg:5000", scope, token, now, lifetime);
        assert_eq!(cache.get("reg:5000", scope, now).as_deref(), Some("t1"));
        assert_eq!(cache.get("reg:5000", "repository:b:pull", now), None);
        assert_eq!(cache.get("other:5000", scope, now), None);
        assert_eq!(
            cache.get("reg:5000", scope, now + lifetime),
            None,
            "expired"
        );
        assert_eq!(
            cache.get("reg:5000", scope, now),
            None,
            "dropped once expired"
        );
        let default = TokenResponse {
            token: Some("t".into()),
            access_token: None,
            expires_in: None,
        };
        assert_eq!(
            default.into_token().map(|t| t.1),
            Some(Duration::from_secs(55))
        );
    }
}

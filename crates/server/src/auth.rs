//! Authentication: every request carries `Authorization: Bearer TOKEN`.
//! Tokens are random, stored only as their SHA-256, and map to an
//! [`Identity`] (name and role).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use corral_api::Identity;
use corral_store::{Store, TokenRecord};
use rand::RngCore;
use sha2::{Digest, Sha256};

use crate::error::ApiError;
use crate::{Clock, Server, SharedServer};

/// Hex SHA-256 of a token, as stored.
pub fn hash_token(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// How long a resolved token is trusted before the store is asked again:
/// a revocation on any server of the cluster takes effect within it.
pub const REVALIDATE_AFTER: std::time::Duration = std::time::Duration::from_secs(5);

/// How stale a token's recorded last use may get before it is written
/// again (one small write per token per this period, at most).
const LAST_USE_EVERY: chrono::TimeDelta = chrono::TimeDelta::minutes(5);

/// A token as last read from the store.
#[derive(Debug, Clone)]
struct Known {
    record: TokenRecord,
    checked: std::time::Instant,
}

/// Resolves token hashes to identities, remembering each for
/// [`REVALIDATE_AFTER`].
pub struct TokenCache {
    store: Arc<dyn Store>,
    known: RwLock<HashMap<String, Known>>,
}

impl std::fmt::Debug for TokenCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenCache").finish_non_exhaustive()
    }
}

impl TokenCache {
    pub fn new(store: Arc<dyn Store>) -> Self {
        TokenCache {
            store,
            known: RwLock::new(HashMap::new()),
        }
    }

    /// The identity a token stands for, if any, used at `now`.
    pub async fn resolve(
        &self,
        token: &str,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<Option<Identity>, ApiError> {
        let hash = hash_token(token);
        if let Some(identity) = self.cached(&hash) {
            return Ok(Some(identity));
        }
        let Some(mut record) = self.store.find_token(&hash).await? else {
            self.forget(&[hash]);
            return Ok(None);
        };
        if record
            .last_used_at
            .is_none_or(|used| now - used >= LAST_USE_EVERY)
        {
            // Only an existing token is touched: a revocation racing this
            // read is never undone. A failure costs only the timestamp.
            match self.store.touch_token(&hash, now).await {
                Ok(()) => record.last_used_at = Some(now),
                Err(error) => tracing::warn!(%error, "cannot record a token's use"),
            }
        }
        let identity = record.identity.clone();
        if let Ok(mut known) = self.known.write() {
            known.insert(
                hash,
                Known {
                    record,
                    checked: std::time::Instant::now(),
                },
            );
        }
        Ok(Some(identity))
    }

    /// Drops revoked tokens at once on this server (others notice within
    /// [`REVALIDATE_AFTER`]).
    pub fn forget(&self, hashes: &[String]) {
        if let Ok(mut known) = self.known.write() {
            for hash in hashes {
                known.remove(hash);
            }
        }
    }

    fn cached(&self, hash: &str) -> Option<Identity> {
        let known = self.known.read().ok()?;
        let entry = known.get(hash)?;
        (entry.checked.elapsed() < REVALIDATE_AFTER).then(|| entry.record.identity.clone())
    }
}

/// Mints tokens and stores their hashes.
#[derive(Debug, Clone, Copy, Default)]
pub struct TokenIssuer;

impl TokenIssuer {
    /// A new random token for `identity`; the plain token is returned once
    /// and never stored.
    pub async fn issue(
        store: &dyn Store,
        clock: &dyn Clock,
        identity: Identity,
    ) -> Result<String, ApiError> {
        let mut bytes = [0u8; 24];
        rand::rng().fill_bytes(&mut bytes);
        let token = format!("corral_{}", hex::encode(bytes));
        store
            .put_token(TokenRecord {
                hash: hash_token(&token),
                identity,
                created_at: clock.now(),
                last_used_at: None,
            })
            .await?;
        Ok(token)
    }
}

/// The authenticated caller of a request.
#[derive(Debug, Clone)]
pub struct Caller(pub Identity);

impl FromRequestParts<SharedServer> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        server: &SharedServer,
    ) -> Result<Self, Self::Rejection> {
        let header = parts
            .headers
            .get(AUTHORIZATION)
            .ok_or_else(|| {
                ApiError::Unauthenticated(
                    "no credentials: send Authorization: Bearer TOKEN (corral token create makes one)"
                        .into(),
                )
            })?
            .to_str()
            .map_err(|_| ApiError::Unauthenticated("Authorization header is not text".into()))?;
        let token = header.strip_prefix("Bearer ").ok_or_else(|| {
            ApiError::Unauthenticated("Authorization header must be `Bearer TOKEN`".into())
        })?;
        let identity = identify(server, token.trim()).await?;
        crate::scope::check(
            &identity,
            &parts.method,
            parts.uri.path(),
            parts.uri.query(),
        )?;
        Ok(Caller(identity))
    }
}

/// The identity `token` stands for now: known, not revoked, not expired.
/// Every request is authenticated here, and so are the built-in
/// controllers' in-process reads ([`crate::local_reads`]).
pub async fn identify(server: &Server, token: &str) -> Result<Identity, ApiError> {
    match server.tokens.resolve(token, server.clock.now()).await? {
        Some(identity)
            if identity
                .expires_at
                .is_some_and(|at| at <= server.clock.now()) =>
        {
            Err(ApiError::Unauthenticated(format!(
                "token of {} expired at {}; ask an operator for a new one",
                identity.name,
                identity
                    .expires_at
                    .map(|at| at.to_rfc3339())
                    .unwrap_or_default()
            )))
        }
        Some(identity) => Ok(identity),
        None => Err(ApiError::Unauthenticated("unknown or revoked token".into())),
    }
}

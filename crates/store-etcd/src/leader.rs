//! Controller leadership on etcd, and fencing.
//!
//! The built-in controllers run on one corral server at a time: each server
//! campaigns in an etcd election (`P/leader`) under a lease it keeps alive;
//! the winner's election key exists exactly as long as its lease. A
//! [`Fence`] names that key and its `create_revision`. Writes made in the
//! name of a leader-only author (the built-in controllers) carry the fence
//! as an extra comparison in their etcd transaction, so once the lease has
//! expired (the leader was partitioned, paused or killed) its late writes
//! are refused by etcd itself — not by a clock on the deposed server.

use std::collections::BTreeSet;
use std::sync::{Arc, PoisonError, RwLock};

use corral_store::StoreError;
use etcd_client::{Client, Compare, CompareOp};

use crate::unavailable;

/// Proof of leadership: the election key and the revision that created it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    key: Vec<u8>,
    create_revision: i64,
}

impl Fence {
    pub fn new(key: impl Into<Vec<u8>>, create_revision: i64) -> Fence {
        Fence {
            key: key.into(),
            create_revision,
        }
    }

    /// The comparison a fenced write adds to its transaction.
    pub(crate) fn compare(&self) -> Compare {
        Compare::create_revision(self.key.clone(), CompareOp::Equal, self.create_revision)
    }

    /// Whether the fence still holds; the refusal names why not.
    pub(crate) async fn check(&self, client: &Client) -> Result<(), StoreError> {
        let mut response = client
            .clone()
            .get(self.key.clone(), None)
            .await
            .map_err(unavailable)?;
        let holds = response
            .take_kvs()
            .first()
            .is_some_and(|kv| kv.create_revision() == self.create_revision);
        if holds { Ok(()) } else { Err(deposed()) }
    }
}

fn deposed() -> StoreError {
    StoreError::Unavailable(
        "this corral server is no longer the controller leader (its etcd lease expired or it resigned): the write was fenced off".into(),
    )
}

fn not_leader() -> StoreError {
    StoreError::Unavailable(
        "this corral server is not the controller leader: built-in controller writes go through the leader only".into(),
    )
}

/// Which authors write only as leader, and the fence they write under now.
/// Shared by every clone of a store.
#[derive(Debug, Default)]
pub struct FencePolicy {
    authors: RwLock<BTreeSet<String>>,
    current: RwLock<Option<Fence>>,
}

impl FencePolicy {
    /// Writes by any of `authors` need leadership.
    pub fn new(authors: impl IntoIterator<Item = impl Into<String>>) -> Arc<FencePolicy> {
        Arc::new(FencePolicy {
            authors: RwLock::new(authors.into_iter().map(Into::into).collect()),
            current: RwLock::new(None),
        })
    }

    /// Writes by these authors need leadership too.
    pub fn add_authors(&self, authors: impl IntoIterator<Item = impl Into<String>>) {
        self.authors
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(authors.into_iter().map(Into::into));
    }

    /// Sets (on winning) or clears (on losing) the leadership fence.
    pub fn set(&self, fence: Option<Fence>) {
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = fence;
    }

    pub fn current(&self) -> Option<Fence> {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The fence a write by `author` must carry: none for ordinary authors,
    /// the current one for leader-only authors, a refusal when this server
    /// is not leader.
    pub(crate) fn fence_for(&self, author: &str) -> Result<Option<Fence>, StoreError> {
        let fenced = self
            .authors
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(author);
        if !fenced {
            return Ok(None);
        }
        self.current().map(Some).ok_or_else(not_leader)
    }
}

/// How long a leader's lease lives without keep-alives: a dead leader's
/// controllers stop acting (their writes are fenced) within this.
pub const LEASE_TTL_SECONDS: i64 = 5;

/// Held leadership. Its `lost` token fires when the lease can no longer be
/// kept alive; from then on the fence refuses this leader's writes.
pub struct Leadership {
    fence: Fence,
    lease: i64,
    lost: tokio_util::sync::CancellationToken,
    keeper: tokio::task::JoinHandle<()>,
    client: Client,
}

impl std::fmt::Debug for Leadership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leadership")
            .field("fence", &self.fence)
            .field("lease", &self.lease)
            .field("lost", &self.lost.is_cancelled())
            .finish_non_exhaustive()
    }
}

impl Leadership {
    pub fn fence(&self) -> Fence {
        self.fence.clone()
    }

    /// Fires when leadership is lost.
    pub fn lost(&self) -> tokio_util::sync::CancellationToken {
        self.lost.clone()
    }

    /// Gives leadership up at once (revoking the lease deletes the key).
    pub async fn resign(self) {
        self.keeper.abort();
        self.lost.cancel();
        if let Err(error) = self.client.clone().lease_revoke(self.lease).await {
            tracing::warn!(%error, "revoking the leader lease failed; it expires on its own");
        }
    }
}

/// Campaigns for controller leadership under `candidate` (stored as the
/// election value, for operators); resolves once this server leads.
pub async fn campaign(store: &crate::EtcdStore, candidate: &str) -> Result<Leadership, StoreError> {
    let mut client = store.client();
    let lease = client
        .lease_grant(LEASE_TTL_SECONDS, None)
        .await
        .map_err(unavailable)?
        .id();
    let lost = tokio_util::sync::CancellationToken::new();
    let keeper = tokio::spawn(keep_alive(client.clone(), lease, lost.clone()));
    let name = store.keys.leader();
    loop {
        if lost.is_cancelled() {
            return Err(StoreError::Unavailable(
                "the election lease expired while campaigning".into(),
            ));
        }
        // Campaign blocks until elected; the client's request timeout may
        // cut it short, and campaigning again with the same lease resumes.
        match client.campaign(name.clone(), candidate, lease).await {
            Ok(response) => {
                let Some(leader) = response.leader() else {
                    continue;
                };
                let fence = Fence::new(leader.key(), leader.rev());
                tracing::info!(candidate, lease, "won the controller leadership");
                return Ok(Leadership {
                    fence,
                    lease,
                    lost,
                    keeper,
                    client,
                });
            }
            Err(error) => {
                tracing::debug!(%error, "campaigning again");
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
        }
    }
}

/// Keeps `lease` alive every third of its TTL; cancels `lost` when that
/// fails (the lease is then gone or about to be).
async fn keep_alive(mut client: Client, lease: i64, lost: tokio_util::sync::CancellationToken) {
    let period = std::time::Duration::from_millis((LEASE_TTL_SECONDS as u64) * 1000 / 3);
    let result: Result<(), String> = async {
        let (mut keeper, mut responses) = client
            .lease_keep_alive(lease)
            .await
            .map_err(|error| error.to_string())?;
        loop {
            keeper
                .keep_alive()
                .await
                .map_err(|error| error.to_string())?;
            match tokio::time::timeout(period, responses.message()).await {
                Ok(Ok(Some(response))) if response.ttl() > 0 => {}
                Ok(Ok(Some(_))) => return Err("the lease expired".to_string()),
                Ok(Ok(None)) => return Err("the keep-alive stream ended".to_string()),
                Ok(Err(error)) => return Err(error.to_string()),
                Err(_) => return Err("no keep-alive answer in time".to_string()),
            }
            tokio::time::sleep(period).await;
        }
    }
    .await;
    if let Err(reason) = result {
        tracing::warn!(lease, %reason, "lost the controller leadership");
    }
    lost.cancel();
}

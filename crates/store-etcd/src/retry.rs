//! etcd calls that ride out a dead member: the client's balancer keeps
//! sending some requests to an endpoint that refuses connections until it
//! notices, so a call that fails for transport reasons is tried again,
//! for up to [`FAILOVER_BUDGET`], before the store reports the backend
//! unavailable. A write retried after etcd did commit it fails its
//! compare-and-swap (it was never acknowledged), so no write is applied
//! twice.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use etcd_client::{
    Client, CompactionOptions, CompactionResponse, Error, GetOptions, GetResponse, PutOptions,
    PutResponse, Txn, TxnResponse,
};
use tokio::time::Instant;

/// How long a call keeps retrying transport failures.
pub const FAILOVER_BUDGET: Duration = Duration::from_secs(15);
/// Pause between attempts.
const RETRY_PAUSE: Duration = Duration::from_millis(100);
/// gRPC's UNAVAILABLE status code.
const GRPC_UNAVAILABLE: i32 = 14;

/// Whether the request failed before etcd could answer it.
fn is_transient(error: &Error) -> bool {
    match error {
        Error::TransportError(_) | Error::IoError(_) => true,
        Error::GRpcStatus(status) => i32::from(status.code()) == GRPC_UNAVAILABLE,
        _ => false,
    }
}

/// How many KV requests a store has made, by kind (a retried call counts
/// once): a diagnostic, e.g. of round trips per write.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KvCalls {
    pub gets: u64,
    pub puts: u64,
    pub txns: u64,
    pub compactions: u64,
}

impl KvCalls {
    /// Every request, of any kind.
    pub fn total(&self) -> u64 {
        self.gets + self.puts + self.txns + self.compactions
    }
}

/// The counters behind [`KvCalls`], shared by a store and its clones.
#[derive(Debug, Default)]
pub(crate) struct KvCounters {
    gets: AtomicU64,
    puts: AtomicU64,
    txns: AtomicU64,
    compactions: AtomicU64,
}

impl KvCounters {
    pub fn snapshot(&self) -> KvCalls {
        KvCalls {
            gets: self.gets.load(Ordering::Relaxed),
            puts: self.puts.load(Ordering::Relaxed),
            txns: self.txns.load(Ordering::Relaxed),
            compactions: self.compactions.load(Ordering::Relaxed),
        }
    }
}

/// The KV calls the store makes, each retried on transport failure.
pub(crate) struct Kv {
    pub client: Client,
    pub counters: Arc<KvCounters>,
}

macro_rules! retrying {
    ($self:ident, |$client:ident| $call:expr) => {{
        let deadline = Instant::now() + FAILOVER_BUDGET;
        loop {
            let mut $client = $self.client.clone();
            match $call.await {
                Err(error) if is_transient(&error) && Instant::now() < deadline => {
                    tracing::debug!(%error, "etcd call failed in transport; retrying");
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
                other => break other,
            }
        }
    }};
}

impl Kv {
    pub async fn get(
        &self,
        key: impl Into<Vec<u8>>,
        options: Option<GetOptions>,
    ) -> Result<GetResponse, Error> {
        let key = key.into();
        self.counters.gets.fetch_add(1, Ordering::Relaxed);
        retrying!(self, |client| client.get(key.clone(), options.clone()))
    }

    pub async fn put(
        &self,
        key: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
        options: Option<PutOptions>,
    ) -> Result<PutResponse, Error> {
        let (key, value) = (key.into(), value.into());
        self.counters.puts.fetch_add(1, Ordering::Relaxed);
        retrying!(self, |client| client.put(
            key.clone(),
            value.clone(),
            options.clone()
        ))
    }

    pub async fn txn(&self, txn: Txn) -> Result<TxnResponse, Error> {
        self.counters.txns.fetch_add(1, Ordering::Relaxed);
        retrying!(self, |client| client.txn(txn.clone()))
    }

    pub async fn compact(
        &self,
        revision: i64,
        options: Option<CompactionOptions>,
    ) -> Result<CompactionResponse, Error> {
        self.counters.compactions.fetch_add(1, Ordering::Relaxed);
        retrying!(self, |client| client.compact(revision, options.clone()))
    }
}

//! etcd calls that ride out a dead member: the client's balancer keeps
//! sending some requests to an endpoint that refuses connections until it
//! notices, so a call that fails for transport reasons is tried again,
//! for up to [`FAILOVER_BUDGET`], before the store reports the backend
//! unavailable. A write retried after etcd did commit it fails its
//! compare-and-swap (it was never acknowledged), so no write is applied
//! twice.

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

/// The KV calls the store makes, each retried on transport failure.
pub(crate) struct Kv {
    pub client: Client,
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
        retrying!(self, |client| client.get(key.clone(), options.clone()))
    }

    pub async fn put(
        &self,
        key: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
        options: Option<PutOptions>,
    ) -> Result<PutResponse, Error> {
        let (key, value) = (key.into(), value.into());
        retrying!(self, |client| client.put(
            key.clone(),
            value.clone(),
            options.clone()
        ))
    }

    pub async fn txn(&self, txn: Txn) -> Result<TxnResponse, Error> {
        retrying!(self, |client| client.txn(txn.clone()))
    }

    pub async fn compact(
        &self,
        revision: i64,
        options: Option<CompactionOptions>,
    ) -> Result<CompactionResponse, Error> {
        retrying!(self, |client| client.compact(revision, options.clone()))
    }
}

//! corral's built-in controllers: the scheduler (`scheduler/place`, owns
//! `status.node`) and IPAM (`ipam/assign-prefix` for nodes,
//! `ipam/assign-address` for pods; owns `status.prefix` and
//! `status.address`) and node-lifecycle (a Node's `status.phase`).
//!
//! They have no back door: each holds its own controller token and reads
//! and writes through the API, claiming and completing its workflow steps
//! exactly as an external controller would. Decisions are made by the pure
//! engines (`corral-scheduler`, `corral-net`'s IPAM); this crate only
//! moves data between them and the API.

pub mod ipam;
pub mod lifecycle;
pub mod scheduler;
mod steps;

use std::time::Duration;

use corral_client::Client;
use tokio_util::sync::CancellationToken;

/// How often a controller looks for ready steps.
pub const POLL: Duration = Duration::from_millis(250);

/// Runs `round` every [`POLL`] until cancelled, logging failures.
pub(crate) async fn run_loop<F, Fut>(name: &'static str, shutdown: CancellationToken, mut round: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), corral_client::ClientError>>,
{
    while !shutdown.is_cancelled() {
        if let Err(error) = round().await {
            tracing::debug!(controller = name, error = %error, "round failed; retrying");
        }
        tokio::select! {
            () = tokio::time::sleep(POLL) => {}
            () = shutdown.cancelled() => return,
        }
    }
}

/// Starts every built-in controller; each gets the client holding its own token.
pub fn spawn_all(
    scheduler: Client,
    ipam: Client,
    lifecycle: Client,
    cluster_prefix: corral_net::ipam::ClusterPrefix,
    shutdown: CancellationToken,
) -> Vec<tokio::task::JoinHandle<()>> {
    vec![
        tokio::spawn(scheduler::run(scheduler, shutdown.clone())),
        tokio::spawn(lifecycle::run(lifecycle, shutdown.clone())),
        tokio::spawn(ipam::run(ipam, cluster_prefix, shutdown)),
    ]
}

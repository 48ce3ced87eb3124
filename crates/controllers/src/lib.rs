//! corral's built-in controllers: the scheduler (`scheduler/place`, owns
//! `status.node`) and IPAM (`ipam/assign-prefix` for nodes,
//! `ipam/assign-address` for pods; owns `status.prefix` and
//! `status.address`), node-lifecycle (a Node's `status.phase`) and
//! pinned-deployment (a PinnedDeployment's `status` and the pods it manages),
//! and the default load balancer (`loadbalancer`: an L4 proxy controller
//! that runs outside the server, as `corral lb-proxy`, like any add-on).
//!
//! They have no back door: each holds its own controller token and reads
//! and writes through the API, claiming and completing its workflow steps
//! exactly as an external controller would. Decisions are made by the pure
//! engines (`corral-scheduler`, `corral-net`'s IPAM); this crate only
//! moves data between them and the API.

pub mod evacuate;
pub mod ipam;
pub mod lifecycle;
pub mod loadbalancer;
pub mod pinned;
pub mod scheduler;
mod steps;

use std::sync::Arc;
use std::time::Duration;

use corral_api::Kind;
use corral_client::Client;
use futures::StreamExt;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// A controller runs a round at least this often, even with no change.
pub const RESYNC: Duration = Duration::from_secs(5);

/// Wakes controllers when pods or nodes change: a watch per kind, each
/// event a notification; rounds run on a wakeup or every [`RESYNC`].
/// Each clone remembers which changes it has seen, so a change that
/// happens during a round wakes the next wait at once.
#[derive(Debug, Clone)]
pub struct ChangeFeed {
    seen: watch::Receiver<u64>,
}

impl ChangeFeed {
    /// Follows pods, VMs and nodes through `client` until cancelled.
    pub fn follow(client: Client, shutdown: CancellationToken) -> ChangeFeed {
        Self::follow_kinds(
            client,
            &[Kind::Pod, Kind::VirtualMachine, Kind::Node],
            shutdown,
        )
    }

    /// Follows the given kinds through `client` until cancelled.
    pub fn follow_kinds(client: Client, kinds: &[Kind], shutdown: CancellationToken) -> ChangeFeed {
        let (changed, seen) = watch::channel(0u64);
        let changed = Arc::new(changed);
        for &kind in kinds {
            tokio::spawn(watch_kind(
                client.clone(),
                kind,
                changed.clone(),
                shutdown.clone(),
            ));
        }
        ChangeFeed { seen }
    }

    async fn next(&mut self) {
        tokio::select! {
            _ = self.seen.changed() => {}
            () = tokio::time::sleep(RESYNC) => {}
        }
    }
}

fn bump(changed: &watch::Sender<u64>) {
    changed.send_modify(|version| *version = version.wrapping_add(1));
}

async fn watch_kind(
    client: Client,
    kind: Kind,
    changed: Arc<watch::Sender<u64>>,
    shutdown: CancellationToken,
) {
    while !shutdown.is_cancelled() {
        let after = match client.list(kind, None, None).await {
            Ok(list) => list.resource_version,
            Err(_) => {
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_secs(1)) => continue,
                    () = shutdown.cancelled() => return,
                }
            }
        };
        bump(&changed);
        let Ok(events) = client.watch(kind, None, None, after).await else {
            continue;
        };
        futures::pin_mut!(events);
        loop {
            tokio::select! {
                event = events.next() => match event {
                    Some(Ok(_)) => bump(&changed),
                    _ => break,
                },
                () = shutdown.cancelled() => return,
            }
        }
    }
}

/// Runs `round` on every change and every [`RESYNC`] until cancelled,
/// logging failures.
pub(crate) async fn run_loop<F, Fut>(
    name: &'static str,
    mut feed: ChangeFeed,
    shutdown: CancellationToken,
    mut round: F,
) where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), corral_client::ClientError>>,
{
    while !shutdown.is_cancelled() {
        if let Err(error) = round().await {
            tracing::debug!(controller = name, error = %error, "round failed; retrying");
        }
        tokio::select! {
            () = feed.next() => {}
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
    spawn_all_timed(
        scheduler,
        ipam,
        lifecycle,
        cluster_prefix,
        lifecycle::Timing::default(),
        shutdown,
    )
}

/// [`spawn_all`] with the clocks of node loss chosen (tests shorten them).
pub fn spawn_all_timed(
    scheduler: Client,
    ipam: Client,
    lifecycle: Client,
    cluster_prefix: corral_net::ipam::ClusterPrefix,
    timing: lifecycle::Timing,
    shutdown: CancellationToken,
) -> Vec<tokio::task::JoinHandle<()>> {
    let feed = ChangeFeed::follow(scheduler.clone(), shutdown.clone());
    vec![
        tokio::spawn(scheduler::run(
            scheduler,
            timing,
            feed.clone(),
            shutdown.clone(),
        )),
        tokio::spawn(lifecycle::run(
            lifecycle,
            timing,
            feed.clone(),
            shutdown.clone(),
        )),
        tokio::spawn(ipam::run(ipam, cluster_prefix, feed, shutdown)),
    ]
}

/// Starts the PinnedDeployment controller with its own client and its own
/// feed (PinnedDeployments and pods).
pub fn spawn_pinned(client: Client, shutdown: CancellationToken) -> tokio::task::JoinHandle<()> {
    let feed = ChangeFeed::follow_kinds(
        client.clone(),
        &[Kind::PinnedDeployment, Kind::Pod],
        shutdown.clone(),
    );
    tokio::spawn(pinned::run(client, feed, shutdown))
}

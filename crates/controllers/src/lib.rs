//! corral's built-in controllers: the scheduler (`scheduler/place`, owns
//! `status.node`) and IPAM (`ipam/assign-prefix` for nodes,
//! `ipam/assign-address` for pods; owns `status.prefix` and
//! `status.address`), node-lifecycle (a Node's `status.phase`) and
//! pinned-deployment (a PinnedDeployment's `status` and the pods it manages),
//! job (a Job's `status`, its pods and a scheduled Job's runs), per-node
//! (a PerNodeDeployment's `status` and its pod on each matching node),
//! and the default load balancer (`loadbalancer`: an L4 proxy controller
//! that runs outside the server, as `corral lb-proxy`, like any add-on).
//!
//! They have no back door: each holds its own controller token and reads
//! and writes through the API, claiming and completing its workflow steps
//! exactly as an external controller would. Decisions are made by the pure
//! engines (`corral-scheduler`, `corral-ipam`); this crate only
//! moves data between them and the API.
//!
//! Each follows what it needs through `corral_client::runtime` informers
//! (list once, then watch) that keep small projections of the objects, and
//! reconciles one object at a time from a work queue. Nothing lists the
//! world on a timer; time-based changes (a node going silent, an ha pod's
//! grace) are requeued for the moment they are due.

pub mod drain;
pub mod evacuate;
pub mod ipam;
pub mod job;
pub mod lifecycle;
pub mod loadbalancer;
pub mod migration;
pub mod per_node;
pub mod pinned;
pub mod scheduler;
mod status;
mod steps;

use corral_client::Client;
use tokio_util::sync::CancellationToken;

/// Starts every built-in controller; each gets the client holding its own token.
pub fn spawn_all(
    scheduler: Client,
    ipam: Client,
    lifecycle: Client,
    cluster_prefix: corral_ipam::ClusterPrefix,
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
    cluster_prefix: corral_ipam::ClusterPrefix,
    timing: lifecycle::Timing,
    shutdown: CancellationToken,
) -> Vec<tokio::task::JoinHandle<()>> {
    vec![
        tokio::spawn(scheduler::run(scheduler, timing, shutdown.clone())),
        tokio::spawn(lifecycle::run(lifecycle, timing, shutdown.clone())),
        tokio::spawn(ipam::run(ipam, cluster_prefix, shutdown)),
    ]
}

/// Starts the Job controller with its own client.
pub fn spawn_job(client: Client, shutdown: CancellationToken) -> tokio::task::JoinHandle<()> {
    tokio::spawn(job::run(client, shutdown))
}

/// Starts the PerNodeDeployment controller with its own client.
pub fn spawn_per_node(client: Client, shutdown: CancellationToken) -> tokio::task::JoinHandle<()> {
    tokio::spawn(per_node::run(client, shutdown))
}

/// Starts the PinnedDeployment controller with its own client.
pub fn spawn_pinned(client: Client, shutdown: CancellationToken) -> tokio::task::JoinHandle<()> {
    tokio::spawn(pinned::run(client, shutdown))
}

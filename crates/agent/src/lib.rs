//! The corral node agent.
//!
//! It owns everything that happens on one node: registering the `Node`
//! object and its heartbeat, running each bound pod's containers with
//! `runc` (or `runsc`) through the pod's workflow steps, restarting exited
//! containers per policy, updating pods in place (only changed containers
//! restart), and reporting the status fields the node owns. Pods, VMs and
//! the node's own join go through one node-step executor
//! ([`executor`]); what differs is a [`executor::Workload`] ([`pods`],
//! [`vms`], [`join`]).
//!
//! Everything it needs is in local state under its data dir, so pods keep
//! running, crashed containers restart, and after the agent's own restart
//! its pods come back, all with the API unreachable. It never decides
//! placement or addresses: those come from the API.

pub mod bound;
mod container_files;
pub mod containers;
pub mod dns;
pub mod exec;
pub mod executor;
pub mod fencing;
pub mod heartbeat;
pub mod idranges;
pub mod image_upload;
pub mod images;
pub mod join;
pub mod leftover_cgroups;
pub mod logs;
pub mod manager;
pub mod mount_points;
pub mod network;
pub mod node;
pub mod node_identity;
pub mod node_tls;
pub mod plan;
pub mod plugin_volumes;
pub mod plugins;
pub mod pod_cgroups;
pub mod pod_data;
pub mod pods;
mod port_forward;
pub mod probes;
pub mod recovery;
pub mod registries;
pub mod routes;
pub mod sandbox;
pub mod sandbox_pool;
pub mod serve;
pub mod state;
pub mod steps;
pub mod tls_listener;
pub mod tunnel;
pub mod vms;
pub mod volumes;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use corral_client::Client;
use corral_client::runtime::{Informer, Scope};
use corral_runtime::cgroup_migration::MigrationPrimer;
use corral_runtime::image::ImageStore;
use corral_runtime::oci::netns::NetnsManager;
use corral_runtime::oci::{OciRuntime, RuncCli, reap};
use tokio_util::sync::CancellationToken;

use crate::containers::{ContainerRunner, Runtimes};
use crate::state::LocalState;
use crate::steps::StepApi;

/// Everything the executors share.
pub struct AgentContext {
    pub node: String,
    /// The agent's data dir (VMs' records and directories are found there).
    pub data_dir: PathBuf,
    pub client: Option<Client>,
    pub steps: Arc<dyn StepApi>,
    pub runner: ContainerRunner,
    pub state: LocalState,
    pub netns: Arc<NetnsManager>,
    /// Host uid/gid ranges of pods' user namespaces.
    pub id_ranges: Arc<idranges::IdRanges>,
    /// Spare sandboxes made ahead of pods ([`sandbox_pool`]).
    pub sandbox_pool: Arc<sandbox_pool::SandboxPool>,
    /// The pod network; `None` leaves pods with loopback only.
    pub network: Option<Arc<network::PodNetwork>>,
    /// Revisions whose images stay on the node (rollback without a pull).
    pub image_revisions: usize,
    /// Images pods are pulling, kept from collection ([`images::Pulls`]).
    pub pulls: images::Pulls,
    /// The node's volume plugins.
    pub plugins: plugins::Plugins,
    /// The self-fencing clock and the fence in force ([`fencing`]).
    pub fence: Arc<fencing::Fence>,
}

impl std::fmt::Debug for AgentContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentContext")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

/// How to start an agent.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub node: String,
    /// Holds `agent/` (pod records), `images/`, `pods/`, `runc/`, `netns/`.
    pub data_dir: PathBuf,
    /// The node's address, reported in its status.
    pub address: Option<String>,
    pub image_revisions: usize,
    pub heartbeat: Duration,
    /// The logs and exec endpoint the API server proxies to; `None`
    /// serves none (`corral logs` and `exec` then fail for this node).
    pub endpoint: Option<serve::EndpointConfig>,
    /// The pod network's node-local settings; `None` leaves pods with
    /// loopback only.
    pub network: Option<network::NetworkConfig>,
    /// Where volume plugins are installed besides `DATA/plugins`; `None`:
    /// [`plugins::DEFAULT_PLUGIN_DIR`].
    pub volume_plugin_dir: Option<PathBuf>,
    /// How the node reaches image registries.
    pub registries: registries::RegistrySettings,
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("local state")]
    State(#[from] state::StateError),
    #[error("image store")]
    Image(#[from] corral_runtime::image::ImageError),
    #[error("cannot prepare the data directory {path}")]
    DataDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the data directory {path} is below {ancestor} (mode {mode:04o}), which pod users cannot \
         enter: containers run as unprivileged host uids in user namespaces and would fail to reach \
         their root filesystems. Fix: `chmod o+x {ancestor}`, or choose a --data-dir outside it"
    )]
    Untraversable {
        path: PathBuf,
        ancestor: PathBuf,
        mode: u32,
    },
    #[error("cannot become the reaper of container processes")]
    Reap(#[from] reap::ReapError),
    #[error("cannot set up the pod network")]
    Network(#[from] network::NetworkError),
    #[error("cannot listen for logs and exec on {listen}")]
    Endpoint {
        listen: String,
        #[source]
        source: std::io::Error,
    },
}

/// The error and its sources, joined with `: `.
pub fn chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

/// Refuses a data directory that pod users could not reach: every
/// directory above it must let others traverse it (`o+x`); the data
/// directory itself and those the agent makes below are made traversable.
/// `corral up` and `corral agent` check this before they start anything.
pub fn check_data_dir(dir: &std::path::Path) -> Result<(), AgentError> {
    use std::os::unix::fs::PermissionsExt;
    let absolute = std::path::absolute(dir).map_err(|source| AgentError::DataDir {
        path: dir.to_path_buf(),
        source,
    })?;
    for ancestor in absolute.ancestors().skip(1) {
        // Directories not made yet are made by the agent, traversable.
        let Ok(metadata) = std::fs::metadata(ancestor) else {
            continue;
        };
        let mode = metadata.permissions().mode() & 0o7777;
        if mode & 0o001 == 0 {
            return Err(AgentError::Untraversable {
                path: absolute.clone(),
                ancestor: ancestor.to_path_buf(),
                mode,
            });
        }
    }
    Ok(())
}

/// Creates `dir` if needed and lets every user traverse it (mode `o+x`,
/// never listing): a container's init runs as its pod's unprivileged host
/// uid and must reach its rootfs and bundle below.
fn traversable(dir: &std::path::Path) -> Result<(), AgentError> {
    use std::os::unix::fs::PermissionsExt;
    let io = |source| AgentError::DataDir {
        path: dir.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    let mode = std::fs::metadata(dir).map_err(io)?.permissions().mode();
    if mode & 0o001 == 0 {
        std::fs::set_permissions(
            dir,
            std::fs::Permissions::from_mode((mode & 0o7777) | 0o011),
        )
        .map_err(io)?;
    }
    Ok(())
}

/// Builds the agent's context from its config.
pub fn context(
    config: &AgentConfig,
    client: Option<Client>,
    steps: Arc<dyn StepApi>,
) -> Result<AgentContext, AgentError> {
    let data = &config.data_dir;
    let pods_dir = data.join("pods");
    check_data_dir(data)?;
    traversable(data)?;
    traversable(&pods_dir)?;
    let runc: Arc<dyn OciRuntime> =
        Arc::new(RuncCli::new("runc", data.join("runc")).with_sealed_binary());
    // Two runsc command lines over one state directory: gVisor's own
    // network stack (netstack) by default, the host kernel's for pods
    // granted `host-network-stack` (and `host-network` pods). Only `start`
    // differs; the rest (state, kill, exec, delete) work on either.
    let runsc = node::find_binary("runsc");
    let gvisor_with = |network: &str| -> Option<Arc<dyn OciRuntime>> {
        runsc.as_ref().map(|binary| {
            let runtime = RuncCli::new(binary, data.join("runsc")).with_global_args([
                "--rootless=false",
                "--ignore-cgroups",
                network,
            ]);
            Arc::new(if network == "--network=sandbox" {
                runtime.with_netstack_start()
            } else {
                runtime
            }) as Arc<dyn OciRuntime>
        })
    };
    let gvisor = gvisor_with("--network=sandbox");
    let gvisor_host_stack = gvisor_with("--network=host");
    Ok(AgentContext {
        node: config.node.clone(),
        data_dir: data.clone(),
        client,
        steps,
        runner: ContainerRunner {
            images: Arc::new(ImageStore::open(data.join("images"))?),
            registry: registries::factory(config.registries.clone()),
            runtimes: Runtimes {
                runc,
                gvisor,
                gvisor_host_stack,
            },
            pods_dir,
            cgroup_primer: Arc::new(MigrationPrimer::new()),
        },
        state: LocalState::open(data.join("agent").join("pods"))?,
        netns: Arc::new(NetnsManager::new(data.join("netns"))),
        id_ranges: Arc::new(idranges::IdRanges::open(
            &data.join("agent").join("id-ranges.json"),
        )?),
        sandbox_pool: Arc::new(sandbox_pool::SandboxPool::new(sandbox_pool::POOL_SIZE)),
        network: None,
        image_revisions: config.image_revisions,
        fence: Arc::new(fencing::Fence::open(&data.join("agent"))),
        pulls: images::Pulls::default(),
        plugins: plugins::Plugins::new(vec![
            data.join("plugins"),
            config
                .volume_plugin_dir
                .clone()
                .unwrap_or_else(|| PathBuf::from(plugins::DEFAULT_PLUGIN_DIR)),
        ]),
    })
}

/// Runs the agent until cancelled: restores pods from local state at once,
/// then registers the node and follows the API (retrying while it is
/// unreachable). Containers keep running when the agent stops.
pub async fn run(
    config: AgentConfig,
    ctx: AgentContext,
    shutdown: CancellationToken,
) -> Result<(), AgentError> {
    reap::become_subreaper()?;
    let mut ctx = ctx;
    if ctx.network.is_none()
        && let Some(network) = &config.network
    {
        ctx.network = Some(Arc::new(
            network::PodNetwork::connect(network.clone()).await?,
        ));
    }
    let ctx = Arc::new(ctx);
    let (fences, fence_requests) = tokio::sync::mpsc::channel(1);
    let (lifts, lift_requests) = tokio::sync::mpsc::channel(1);
    let mut manager = manager::Manager::new(ctx.clone())
        .with_fences(fence_requests)
        .with_lifts(lift_requests);
    let restored = manager.restore()?;
    let vm_manager = start_vms(&config, ctx.clone())?;
    let endpoint = match &config.endpoint {
        Some(endpoint) => Some(
            serve::start(
                endpoint,
                config.address.as_deref(),
                ctx.clone(),
                shutdown.clone(),
            )
            .await
            .map_err(|source| AgentError::Endpoint {
                listen: endpoint.listen.clone(),
                source,
            })?,
        ),
        None => None,
    };
    tokio::spawn(logs::rotate_loop(
        ctx.runner.pods_dir.clone(),
        shutdown.clone(),
    ));
    tracing::info!(node = %ctx.node, restored, endpoint = ?endpoint, "agent started");
    if let Some(client) = ctx.client.clone() {
        let (registered, joining) = join::channel();
        // Stops with the agent, or when the node's Node is deleted.
        let heartbeat = shutdown.child_token();
        // Only a node that talks to a control plane holds a lease to lose.
        tokio::spawn(fencing::watch(ctx.clone(), shutdown.clone()));
        tokio::spawn(heartbeat::heartbeat_loop(
            client.clone(),
            config.clone(),
            endpoint,
            heartbeat::Fencing {
                fences,
                lifts,
                clock: ctx.fence.clone(),
            },
            registered.clone(),
            ctx.network.clone(),
            heartbeat.clone(),
        ));
        let nodes = Informer::start(
            client.clone(),
            Scope::all(corral_api::Kind::Node),
            Vec::new(),
            shutdown.clone(),
        );
        tokio::spawn(join::follow(
            ctx.node.clone(),
            nodes.clone(),
            (registered, joining),
            client.clone(),
            ctx.steps.clone(),
            ctx.network.clone(),
            heartbeat,
        ));
        if let Some(network) = ctx.network.clone() {
            tokio::spawn(routes::routes_loop(
                client,
                ctx.node.clone(),
                nodes,
                network,
                shutdown.clone(),
            ));
        }
    }
    tokio::spawn(image_gc_loop(ctx.clone(), shutdown.clone()));
    tokio::spawn(vm_manager.run(shutdown.clone()));
    let pool = tokio::spawn(sandbox_pool::run(ctx.clone(), shutdown.clone()));
    manager.run(shutdown).await;
    // The spares go with the agent (pods keep their sandboxes).
    if tokio::time::timeout(POOL_STOP_TIMEOUT, pool).await.is_err() {
        tracing::warn!("spare sandboxes are still being removed; the next start sweeps them");
    }
    if let Some(network) = &ctx.network {
        network.stop();
    }
    Ok(())
}

/// The VM side of the agent; it probes KVM (once per node, reported as
/// `status.features.kvm`) and restores its VMs when it starts running.
fn start_vms(config: &AgentConfig, ctx: Arc<AgentContext>) -> Result<vms::VmManager, AgentError> {
    let vm_ctx = vms::VmContext {
        agent: ctx,
        state: vms::state::VmState::open(vms::state_dir(&config.data_dir))?,
        vms_dir: vms::vms_dir(&config.data_dir),
        volumes_dir: config.data_dir.join("volumes"),
        data_dir: config.data_dir.clone(),
        accel: tokio::sync::OnceCell::new(),
        migration_address: config
            .address
            .as_deref()
            .and_then(|address| address.parse().ok()),
    };
    Ok(vms::VmManager::new(Arc::new(vm_ctx)))
}

/// How long a stopping agent waits for its spare sandboxes to be removed.
const POOL_STOP_TIMEOUT: Duration = Duration::from_secs(20);

/// How often unused pulled images are collected (see [`images`]).
pub const IMAGE_GC_INTERVAL: Duration = Duration::from_secs(600);

async fn image_gc_loop(ctx: Arc<AgentContext>, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(IMAGE_GC_INTERVAL) => {}
            () = shutdown.cancelled() => return,
        }
        let gc = ctx.clone();
        let result = tokio::task::spawn_blocking(move || {
            let records = gc.state.load_all().unwrap_or_default();
            images::collect(&gc.runner.images, &records, &gc.pulls)
        })
        .await;
        match result {
            Ok(Ok(report)) if !report.removed_images.is_empty() => {
                tracing::info!(removed = ?report.removed_images, "unused images collected");
            }
            Ok(Ok(_)) => {}
            Ok(Err(error)) => tracing::warn!(error = %chain(&error), "image collection failed"),
            Err(error) => tracing::warn!(%error, "image collection task failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::{AgentError, check_data_dir};

    #[test]
    fn a_data_dir_below_a_closed_directory_is_refused_with_the_fix() {
        let closed = tempfile::tempdir().expect("a temp dir");
        std::fs::set_permissions(closed.path(), std::fs::Permissions::from_mode(0o700))
            .expect("chmod 0700");
        let data = closed.path().join("data");
        let error = check_data_dir(&data).expect_err("refused");
        assert!(
            matches!(&error, AgentError::Untraversable { ancestor, mode: 0o700, .. } if ancestor == closed.path()),
            "{error:?}"
        );
        let message = error.to_string();
        assert!(
            message.contains(&format!("chmod o+x {}", closed.path().display())),
            "{message}"
        );
        std::fs::set_permissions(closed.path(), std::fs::Permissions::from_mode(0o711))
            .expect("chmod 0711");
        check_data_dir(&data).expect("traversable now");
    }
}

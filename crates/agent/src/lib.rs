//! The corral node agent.
//!
//! It owns everything that happens on one node: registering the `Node`
//! object and its heartbeat, running each bound pod's containers with
//! `runc` (or `runsc`) through the pod's workflow steps, restarting exited
//! containers per policy, updating pods in place (only changed containers
//! restart), and reporting the status fields the node owns.
//!
//! Everything it needs is in local state under its data dir, so pods keep
//! running, crashed containers restart, and after the agent's own restart
//! its pods come back, all with the API unreachable. It never decides
//! placement or addresses: those come from the API.

pub mod bound;
pub mod containers;
pub mod dns;
pub mod exec;
pub mod idranges;
pub mod images;
pub mod logs;
pub mod manager;
pub mod network;
pub mod node;
pub mod node_identity;
pub mod plan;
pub mod plugin_volumes;
pub mod plugins;
pub mod probes;
pub mod sandbox;
pub mod serve;
pub mod state;
pub mod steps;
pub mod tunnel;
pub mod vms;
pub mod volumes;
pub mod worker;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use corral_client::Client;
use corral_client::runtime::{Cache, Informer, Scope};
use corral_runtime::image::{HttpRegistry, ImageStore};
use corral_runtime::oci::netns::NetnsManager;
use corral_runtime::oci::{OciRuntime, RuncCli, reap};
use tokio_util::sync::CancellationToken;

use crate::containers::{ContainerRunner, Runtimes};
use crate::state::LocalState;
use crate::steps::StepApi;

/// Everything the workers share.
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
    /// The pod network; `None` leaves pods with loopback only.
    pub network: Option<Arc<network::PodNetwork>>,
    /// Revisions whose images stay on the node (rollback without a pull).
    pub image_revisions: usize,
    /// The node's volume plugins.
    pub plugins: plugins::Plugins,
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
    traversable(data)?;
    traversable(&pods_dir)?;
    let runc: Arc<dyn OciRuntime> = Arc::new(RuncCli::new("runc", data.join("runc")));
    let gvisor: Option<Arc<dyn OciRuntime>> = node::find_binary("runsc").map(|binary| {
        Arc::new(
            RuncCli::new(binary, data.join("runsc"))
                // `--network=host`: the sandbox uses the kernel network
                // stack of the namespace it joins, the pod's own. gVisor's
                // netstack mode refuses to start on current kernels (its
                // root-namespace check misfires; docs/design/0007).
                .with_global_args(["--rootless=false", "--ignore-cgroups", "--network=host"]),
        ) as Arc<dyn OciRuntime>
    });
    Ok(AgentContext {
        node: config.node.clone(),
        data_dir: data.clone(),
        client,
        steps,
        runner: ContainerRunner {
            images: Arc::new(ImageStore::open(data.join("images"))?),
            registry: Arc::new(|| {
                HttpRegistry::new(Duration::from_secs(60))
                    .map(|r| Box::new(r) as Box<dyn corral_runtime::image::Registry>)
            }),
            runtimes: Runtimes { runc, gvisor },
            pods_dir,
        },
        state: LocalState::open(data.join("agent").join("pods"))?,
        netns: Arc::new(NetnsManager::new(data.join("netns"))),
        id_ranges: Arc::new(idranges::IdRanges::open(
            &data.join("agent").join("id-ranges.json"),
        )?),
        network: None,
        image_revisions: config.image_revisions,
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
    let mut manager = manager::Manager::new(ctx.clone()).with_fences(fence_requests);
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
        tokio::spawn(heartbeat_loop(
            client.clone(),
            config.clone(),
            endpoint,
            fences,
            ctx.network.clone(),
            shutdown.clone(),
        ));
        if let Some(network) = ctx.network.clone() {
            tokio::spawn(routes_loop(
                client,
                ctx.node.clone(),
                network,
                shutdown.clone(),
            ));
        }
    }
    tokio::spawn(image_gc_loop(ctx.clone(), shutdown.clone()));
    tokio::spawn(vm_manager.run(shutdown.clone()));
    manager.run(shutdown).await;
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
        accel: std::sync::OnceLock::new(),
    };
    Ok(vms::VmManager::new(Arc::new(vm_ctx)))
}

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
            images::collect(&gc.runner.images, &records)
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

/// How often the heartbeat loop looks for ready join steps.
const JOIN_TICK: Duration = Duration::from_millis(500);

/// Missing this many heartbeats (frozen, cut off) makes the node fence
/// before its next one.
const FENCE_AFTER_MISSED: u32 = 3;

/// Asks the manager to fence; `None` if it did not answer in time.
async fn fence(fences: &tokio::sync::mpsc::Sender<manager::FenceRequest>) -> Option<usize> {
    let (reply, answer) = tokio::sync::oneshot::channel();
    fences.send(reply).await.ok()?;
    tokio::time::timeout(Duration::from_secs(120), answer)
        .await
        .ok()?
        .ok()
}

async fn heartbeat_loop(
    client: Client,
    config: AgentConfig,
    endpoint: Option<String>,
    fences: tokio::sync::mpsc::Sender<manager::FenceRequest>,
    network: Option<Arc<network::PodNetwork>>,
    shutdown: CancellationToken,
) {
    let mut node = None;
    let mut last_beat: Option<std::time::Instant> = None;
    // The status last written to the Node, without its heartbeat time.
    let mut reported: Option<node::NodeStatus> = None;
    let join_steps = steps::ClientSteps::new(client.clone());
    let mut joined = false;
    while !shutdown.is_cancelled() {
        // A node returning from silence stops the pods moved away from it
        // before it reports in, so no ha pod runs twice past the grace.
        if last_beat.is_some_and(|at| at.elapsed() >= config.heartbeat * FENCE_AFTER_MISSED) {
            match fence(&fences).await {
                Some(stopped) => {
                    tracing::info!(stopped, "returned from silence: fenced before heartbeating");
                    last_beat = None;
                }
                None => {
                    tokio::select! {
                        () = tokio::time::sleep(JOIN_TICK) => continue,
                        () = shutdown.cancelled() => return,
                    }
                }
            }
        }
        if last_beat.is_none_or(|at| at.elapsed() >= config.heartbeat) {
            let mut status = node::detect_status(config.address.clone());
            status.agent_endpoint = endpoint.clone();
            status.wireguard = network
                .as_deref()
                .and_then(network::PodNetwork::tunnel)
                .zip(config.address.as_deref().and_then(|a| a.parse().ok()))
                .map(|(tunnel, address)| tunnel.status(address));
            // The node's status is written when it changes; in between,
            // the heartbeat is a lease renewal, which writes no object.
            let offered = node::NodeStatus {
                heartbeat: None,
                ..status.clone()
            };
            let result = match &mut node {
                None => node::register(&client, &config.node, &status)
                    .await
                    .map(|n| node = Some(n)),
                Some(object) if reported.as_ref() != Some(&offered) => {
                    node::heartbeat(&client, object, &status).await
                }
                Some(_) => Ok(()),
            };
            let result = match result {
                Ok(()) => {
                    reported = Some(offered);
                    client.renew_lease(&config.node).await.map(|_| ())
                }
                Err(error) => Err(error),
            };
            match result {
                Ok(()) => last_beat = Some(std::time::Instant::now()),
                Err(error) => tracing::debug!(error = %chain(&error), "heartbeat failed; retrying"),
            }
        }
        // Follow the join workflow closely until it is over; then only beat.
        if let Some(object) = &mut node
            && !joined
            && let Ok(fresh) = client.get(&object.key()).await
        {
            *object = fresh;
            node::run_join_steps(&client, &join_steps, object, network.as_deref()).await;
            joined = steps::instance_for(&join_steps, object, object.metadata.revision)
                .await
                .is_some_and(|instance| !steps::is_running(&instance));
        }
        tokio::select! {
            () = tokio::time::sleep(JOIN_TICK) => {}
            () = shutdown.cancelled() => return,
        }
    }
}

/// One pass of the tunnel's peers over `nodes` (nothing without a tunnel).
async fn sync_peers(node: &str, nodes: &[corral_api::Object], network: &network::PodNetwork) {
    match network.reconcile_tunnel(node, nodes).await {
        Ok(Some((_, plan))) if !plan.is_empty() => {
            let set: Vec<String> = plan.set.iter().map(|p| p.endpoint.to_string()).collect();
            let removed = plan.remove.len();
            tracing::info!(?set, removed, "wireguard peers changed");
        }
        Ok(_) => {}
        Err(error) => tracing::warn!(error = %chain(&error), "cannot reconcile wireguard peers"),
    }
}

/// One pass of the routes to other nodes over `nodes`.
async fn sync_routes(node: &str, nodes: &[corral_api::Object], network: &network::PodNetwork) {
    match network.reconcile_routes(node, nodes).await {
        Ok((_, plan)) if !plan.is_empty() => {
            let added: Vec<String> = plan
                .ensure
                .iter()
                .map(|r| r.destination.to_string())
                .collect();
            let removed: Vec<String> = plan.remove.iter().map(ToString::to_string).collect();
            tracing::info!(?added, ?removed, "routes to other nodes changed");
        }
        Ok(_) => {}
        Err(error) => tracing::warn!(error = %chain(&error), "cannot reconcile node routes"),
    }
}

/// Starts the node's DNS server once the node has its /64.
fn start_dns(node: &str, nodes: &Cache<corral_api::Object>, network: &network::PodNetwork) {
    if network.dns_address().is_some() {
        return;
    }
    let prefix = nodes
        .get(&corral_api::ObjectKey::new(
            corral_api::Kind::Node,
            None,
            node,
        ))
        .and_then(|n| n.typed_status::<corral_api::kinds::NodeStatus>().ok())
        .and_then(|s| s.prefix?.parse().ok());
    let Some(prefix) = prefix else {
        return;
    };
    if let Err(error) = network.start_dns(prefix) {
        tracing::warn!(error = %chain(&error), "pods get no DNS");
    }
}

/// What DNS keeps of a pod: its name, labels and, once it has an address,
/// its address and readiness; nothing for a pod without an address.
fn dns_record(pod: &corral_api::Object) -> Option<corral_api::Object> {
    let status: corral_api::kinds::PodStatus = pod.typed_status().ok()?;
    status.address.as_ref()?;
    let mut record = corral_api::Object::new(
        pod.kind,
        pod.metadata.namespace.as_deref(),
        &pod.metadata.name,
        serde_json::Value::Null,
    );
    record.metadata.labels = pod.metadata.labels.clone();
    record.status = serde_json::json!({
        "phase": pod.status.get("phase"),
        "address": status.address,
        "containers": pod.status.get("containers"),
    });
    Some(record)
}

/// How often routes and peers are compared with the cached `Node` objects
/// even when nothing changed (someone may have removed a route by hand).
pub const ROUTES_RECHECK: Duration = Duration::from_secs(30);

/// How long changes are gathered before routes, peers or the DNS table are
/// made again.
const COALESCE: Duration = Duration::from_millis(100);

/// Keeps the routes to other nodes' /64s (and, with `--wireguard`, the
/// tunnel's peers) equal to what the `Node` objects say, and the DNS table
/// equal to the pods and PinnedDeployments, as they change: informers feed
/// them, so nothing is listed again. With the API away the routes, peers
/// and names stay.
async fn routes_loop(
    client: Client,
    node: String,
    network: Arc<network::PodNetwork>,
    shutdown: CancellationToken,
) {
    use corral_api::Kind;
    let nodes = Informer::start(
        client.clone(),
        Scope::all(Kind::Node),
        Vec::new(),
        shutdown.clone(),
    );
    let pods = Informer::start_projected(
        client.clone(),
        Scope::all(Kind::Pod),
        dns_record,
        Vec::new(),
        shutdown.clone(),
    );
    let deployments = Informer::start(
        client,
        Scope::all(Kind::PinnedDeployment),
        Vec::new(),
        shutdown.clone(),
    );
    let routes_changed = Arc::new(tokio::sync::Notify::new());
    let names_changed = Arc::new(tokio::sync::Notify::new());
    {
        let (routes, names) = (routes_changed.clone(), names_changed.clone());
        nodes.on_change(
            |_, _| {},
            move |_| {
                routes.notify_one();
                names.notify_one();
            },
        );
    }
    {
        let names = names_changed.clone();
        pods.on_change(|_, _| {}, move |_| names.notify_one());
        let names = names_changed.clone();
        deployments.on_change(|_, _| {}, move |_| names.notify_one());
    }
    nodes.synced().await;
    routes_changed.notify_one();
    names_changed.notify_one();
    loop {
        tokio::select! {
            () = routes_changed.notified() => {}
            () = names_changed.notified() => {
                tokio::time::sleep(COALESCE).await;
                start_dns(&node, nodes.cache(), &network);
                let table = {
                    let pods: Vec<corral_api::Object> = pods
                        .cache()
                        .list()
                        .into_iter()
                        .filter_map(|(_, pod)| pod.as_ref().clone())
                        .collect();
                    let deployments: Vec<corral_api::Object> = deployments
                        .cache()
                        .list()
                        .into_iter()
                        .map(|(_, d)| d.as_ref().clone())
                        .collect();
                    dns::build_table(&pods, &deployments)
                };
                network.set_dns_table(table);
                continue;
            }
            () = tokio::time::sleep(ROUTES_RECHECK) => {}
            () = shutdown.cancelled() => return,
        }
        tokio::time::sleep(COALESCE).await;
        let list: Vec<corral_api::Object> = nodes
            .cache()
            .list()
            .into_iter()
            .map(|(_, n)| n.as_ref().clone())
            .collect();
        // Peers first: a route through the tunnel needs its peer.
        sync_peers(&node, &list, &network).await;
        sync_routes(&node, &list, &network).await;
    }
}

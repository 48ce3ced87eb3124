//! `corral up` (a whole single-node cluster in one process), `corral
//! server` (the control plane alone) and `corral agent` (a node alone).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use corral_api::{Identity, Role};
use corral_client::{Client, ClientConfig};
use corral_net::ipam::ClusterPrefix;
use corral_server::tls::{self, TlsListener};
use corral_server::{Server, SharedServer, TokenIssuer};
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

use super::{ADMIN_CONFIG, default_data_dir};

/// The agent's client config inside the data dir of `corral up`.
pub const NODE_CONFIG: &str = "node.json";
/// The cluster's settings chosen at first start.
pub const CLUSTER_FILE: &str = "cluster.json";
/// The secret the API server presents to node agents (logs, exec).
pub const AGENT_SECRET_FILE: &str = "agent-secret";

#[derive(Debug, Args)]
pub struct ServerArgs {
    /// Where the store, the configs and (for `up`) the node's pods and images live.
    /// Default: /var/lib/corral as root, ~/.local/share/corral otherwise.
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Address the API listens on.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7443")]
    listen: String,
    /// The cluster's IPv6 prefix (/32 to /64; each node gets a /64 of it),
    /// fixed at the first start. Default: a random RFC 4193 ULA /48.
    #[arg(long, value_name = "PREFIX")]
    cluster_prefix: Option<String>,
    /// Another name or address for the server's TLS certificate (repeat
    /// it). Loopback, the host name and the listen address (every local
    /// address when listening on all) are always in it.
    #[arg(long = "tls-san", value_name = "NAME")]
    tls_sans: Vec<String>,
    /// Where the cluster CA lives (`ca.pem`, `ca-key.pem`; made there if
    /// absent). Servers of one cluster share it. Default: DATA/tls.
    #[arg(long, value_name = "DIR")]
    tls_dir: Option<PathBuf>,
    /// Seconds without a heartbeat before a node is Silent.
    #[arg(long, value_name = "SECONDS", default_value_t = 20)]
    silent_after: u64,
    /// Seconds an `availability: ha` pod waits on a Silent node before it
    /// is placed elsewhere.
    #[arg(long, value_name = "SECONDS", default_value_t = 30)]
    ha_grace: u64,
    /// Seconds a node may stay Silent before it is Lost and its
    /// best-effort pods move too (default 7 days).
    #[arg(long, value_name = "SECONDS", default_value_t = 7 * 24 * 3600)]
    lost_after: u64,
    /// Which spec revisions history keeps, compacted at start and hourly:
    /// `last=N` (each object's newest N), `age=D` (younger than D: 30d,
    /// 12h), both (`last=10,age=30d`: either one keeps a revision), or
    /// `all`. A live object always keeps its newest 3 (rollbacks and the
    /// images nodes keep for them).
    #[arg(long, value_name = "POLICY", default_value = corral_server::retention::DEFAULT_KEEP)]
    history_keep: corral_api::history::CompactionPolicy,
    #[command(flatten)]
    datastore: super::datastore::DatastoreArgs,
}

impl ServerArgs {
    fn timing(&self) -> corral_controllers::lifecycle::Timing {
        let seconds = |s: u64| chrono::Duration::seconds(i64::try_from(s).unwrap_or(i64::MAX));
        corral_controllers::lifecycle::Timing {
            silent_after: seconds(self.silent_after),
            lost_after: seconds(self.lost_after),
            ha_grace: seconds(self.ha_grace),
        }
    }
}

#[derive(Debug, Args)]
pub struct UpArgs {
    #[command(flatten)]
    server: ServerArgs,
    /// This node's name. Default: the machine's hostname.
    #[arg(long, value_name = "NAME")]
    node_name: Option<String>,
    /// Address the node agent serves container logs and exec on (the API
    /// server proxies to it).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:0")]
    agent_listen: String,
    #[command(flatten)]
    network: NetworkArgs,
    #[command(flatten)]
    volumes: VolumeArgs,
}

/// The node's volume plugins (node-local settings, never in the API).
#[derive(Debug, Args)]
pub struct VolumeArgs {
    /// Where volume plugins are installed, besides DATA/plugins (searched
    /// first). A pod's `plugin: {driver: NAME}` runs the executable NAME.
    #[arg(long, value_name = "DIR", default_value = corral_agent::plugins::DEFAULT_PLUGIN_DIR)]
    volume_plugin_dir: PathBuf,
}

/// The node's pod network (node-local settings, never in the API).
#[derive(Debug, Args)]
pub struct NetworkArgs {
    /// No pod network: pods get loopback only.
    #[arg(long)]
    no_pod_network: bool,
    /// `node` turns on the node's IPv6 and IPv4 forwarding (needed to reach
    /// other nodes' pods and for IPv4 egress); `pod-links` forwards only on
    /// the pods' own veths and leaves the host's switches alone.
    /// Default: pod-links for `corral up`, node for `corral agent`.
    #[arg(long, value_name = "MODE")]
    forwarding: Option<ForwardingArg>,
    /// Give pods IPv4 egress, masqueraded out of this interface.
    #[arg(long, value_name = "IFACE")]
    egress_uplink: Option<String>,
    /// The pods' node-local IPv4 range (the same on every node).
    #[arg(long, value_name = "CIDR", default_value = corral_net::ipam::DEFAULT_EGRESS_RANGE)]
    egress_range: String,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum ForwardingArg {
    Node,
    PodLinks,
}

impl NetworkArgs {
    fn config(
        &self,
        default: corral_agent::network::Forwarding,
    ) -> anyhow::Result<Option<corral_agent::network::NetworkConfig>> {
        use corral_agent::network::Forwarding;
        if self.no_pod_network {
            return Ok(None);
        }
        Ok(Some(corral_agent::network::NetworkConfig {
            forwarding: match self.forwarding {
                Some(ForwardingArg::Node) => Forwarding::Node,
                Some(ForwardingArg::PodLinks) => Forwarding::PodLinks,
                None => default,
            },
            egress_uplink: self.egress_uplink.clone(),
            egress_range: self
                .egress_range
                .parse()
                .with_context(|| format!("--egress-range {}", self.egress_range))?,
            wireguard: None,
        }))
    }
}

#[derive(Debug, Args)]
pub struct AgentArgs {
    /// The API server's URL, e.g. https://10.0.0.1:7443.
    #[arg(long, value_name = "URL", required_unless_present = "config")]
    server: Option<String>,
    /// The cluster CA certificate (the server's DATA/tls/ca.pem) to trust
    /// the server with.
    #[arg(long, value_name = "PATH", required_unless_present = "config")]
    ca: Option<PathBuf>,
    /// A node token (`corral token create --node NAME`).
    #[arg(
        long,
        value_name = "TOKEN",
        env = "CORRAL_NODE_TOKEN",
        required_unless_present_any = ["config", "join_token"],
        conflicts_with = "join_token"
    )]
    token: Option<String>,
    /// A join token (`corral token create --join`): on first start the
    /// agent exchanges it for this node's own token and keeps that in
    /// DATA/node-NAME.json; later starts under the same --name use the
    /// kept one.
    #[arg(long, value_name = "TOKEN", env = "CORRAL_JOIN_TOKEN")]
    join_token: Option<String>,
    /// Read server and token from this client config instead.
    #[arg(long = "agent-config", id = "config", value_name = "PATH")]
    config: Option<PathBuf>,
    /// This node's name (the token's identity). Default: the hostname.
    #[arg(long, value_name = "NAME")]
    name: Option<String>,
    /// Where pod state, images and container files live.
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Address to serve container logs and exec on; the API server must
    /// reach it (e.g. 0.0.0.0:7444; the node's --address is advertised).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:0")]
    listen: String,
    /// The secret the API server presents for logs and exec (the server's
    /// DATA/agent-secret file). Without it the node serves neither.
    #[arg(long, value_name = "SECRET", env = "CORRAL_AGENT_SECRET")]
    agent_secret: Option<String>,
    /// The node's IPv6 address on the network between nodes; other nodes
    /// route this node's /64 via it.
    #[arg(long, value_name = "IPV6")]
    address: Option<String>,
    /// Carry pod traffic to other nodes that have a tunnel too through
    /// WireGuard (the kernel module when present, else wireguard-go); the
    /// key is kept in DATA/wireguard, the public key and endpoint are
    /// published in the node's status.
    #[arg(long, requires = "address")]
    wireguard: bool,
    /// The tunnel's UDP port.
    #[arg(long, value_name = "PORT", default_value_t = corral_agent::tunnel::DEFAULT_PORT)]
    wireguard_port: u16,
    #[command(flatten)]
    network: NetworkArgs,
    #[command(flatten)]
    volumes: VolumeArgs,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct ClusterSettings {
    prefix: String,
}

/// The parts of a running control plane.
struct ControlPlane {
    server: SharedServer,
    listener: TlsListener,
    url: String,
    /// The cluster CA (PEM) every client config carries.
    ca: String,
    controller_tokens: corral_server::ownership::BuiltinTokens,
    prefix: ClusterPrefix,
    timing: corral_controllers::lifecycle::Timing,
    history_keep: corral_api::history::CompactionPolicy,
    /// On etcd: the controllers run only while this server leads.
    leadership: Option<super::datastore::Leadership>,
}

async fn start_control_plane(args: &ServerArgs, data_dir: &Path) -> anyhow::Result<ControlPlane> {
    create_private_dir(data_dir)?;
    let datastore = args.datastore.datastore(data_dir)?;
    let opened = super::datastore::open(&datastore).await?;
    let tcp = TcpListener::bind(&args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let address = tcp.local_addr()?;
    let tls_dir = args.tls_dir.clone().unwrap_or_else(|| data_dir.join("tls"));
    let names = tls::server_names(address, &args.tls_sans);
    let tls = tokio::task::spawn_blocking(move || tls::load_or_create(&tls_dir, &names))
        .await?
        .context("cannot set up TLS for the API")?;
    let listener = TlsListener::new(tcp, &tls);
    // A client config needs an address to connect to, not "any".
    let host = if address.ip().is_unspecified() {
        std::net::IpAddr::from([127, 0, 0, 1])
    } else {
        address.ip()
    };
    let url = format!(
        "https://{}",
        std::net::SocketAddr::new(host, address.port())
    );
    let (store, leadership) = super::datastore::with_leadership(opened, &url);
    let server = Server::new(store);
    let controller_tokens = super::controllers::register_builtins(&server, data_dir).await?;
    if let Some(leadership) = &leadership {
        leadership.fence_authors(controller_tokens.keys().cloned());
    }
    let prefix = cluster_prefix(data_dir, args.cluster_prefix.as_deref())?;
    let _ = server.agent_secret.set(agent_secret(data_dir)?);

    let config_path = data_dir.join(ADMIN_CONFIG);
    let config = ClientConfig {
        server: url.clone(),
        token: identity_token(
            &server,
            &config_path,
            Identity::new("admin", Role::Operator),
        )
        .await?,
        ca: Some(tls.ca_pem.clone()),
    };
    config.save(&config_path)?;
    Ok(ControlPlane {
        server,
        listener,
        url,
        ca: tls.ca_pem,
        controller_tokens,
        prefix,
        timing: args.timing(),
        history_keep: args.history_keep,
        leadership,
    })
}

/// The cluster prefix: as stored at first start, or chosen now and stored.
fn cluster_prefix(data_dir: &Path, given: Option<&str>) -> anyhow::Result<ClusterPrefix> {
    let path = data_dir.join(CLUSTER_FILE);
    if let Ok(text) = std::fs::read_to_string(&path) {
        let settings: ClusterSettings = serde_json::from_str(&text)
            .with_context(|| format!("{} is corrupt", path.display()))?;
        let stored: ClusterPrefix = settings.prefix.parse()?;
        if let Some(given) = given {
            anyhow::ensure!(
                given.parse::<ClusterPrefix>()?.to_string() == stored.to_string(),
                "--cluster-prefix {given}: this cluster was created with {stored}, which cannot change"
            );
        }
        return Ok(stored);
    }
    let prefix = match given {
        Some(given) => given
            .parse()
            .with_context(|| format!("--cluster-prefix {given}"))?,
        None => ClusterPrefix::generate_ula(&mut rand::rng()),
    };
    let settings = ClusterSettings {
        prefix: prefix.to_string(),
    };
    std::fs::write(&path, serde_json::to_vec_pretty(&settings)?)
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(prefix)
}

/// The secret the server presents to node agents: as stored, or chosen
/// now and stored (readable by root only).
fn agent_secret(data_dir: &Path) -> anyhow::Result<String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = data_dir.join(AGENT_SECRET_FILE);
    if let Ok(text) = std::fs::read_to_string(&path)
        && !text.trim().is_empty()
    {
        return Ok(text.trim().to_string());
    }
    let mut bytes = [0u8; 24];
    rand::RngCore::fill_bytes(&mut rand::rng(), &mut bytes);
    let secret: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)
        .and_then(|mut file| file.write_all(secret.as_bytes()))
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(secret)
}

/// Spawns the built-in controllers and the workflow driver: at once on
/// SQLite, and on etcd whenever this server wins the leadership (stopping
/// them when it loses it).
fn spawn_controllers(plane: &ControlPlane, shutdown: &CancellationToken) -> anyhow::Result<()> {
    let clients = BuiltinClients {
        url: plane.url.clone(),
        ca: plane.ca.clone(),
        tokens: plane.controller_tokens.clone(),
        prefix: plane.prefix,
        timing: plane.timing,
        server: plane.server.clone(),
        history_keep: plane.history_keep,
    };
    let Some(leadership) = &plane.leadership else {
        return clients.spawn(shutdown);
    };
    tokio::spawn(
        leadership
            .clone()
            .lead(shutdown.clone(), move |term| clients.spawn(&term)),
    );
    Ok(())
}

/// What the leader needs to start the built-in controllers.
struct BuiltinClients {
    url: String,
    ca: String,
    tokens: corral_server::ownership::BuiltinTokens,
    prefix: ClusterPrefix,
    timing: corral_controllers::lifecycle::Timing,
    server: SharedServer,
    history_keep: corral_api::history::CompactionPolicy,
}

impl BuiltinClients {
    /// Starts every built-in controller, each with its own token, and the
    /// workflow driver, until `term` is cancelled.
    fn spawn(&self, term: &CancellationToken) -> anyhow::Result<()> {
        let client = |name: &str| -> anyhow::Result<Client> {
            let token = self
                .tokens
                .get(name)
                .with_context(|| format!("the built-in controller {name} has no token"))?;
            Ok(Client::new(&ClientConfig {
                server: self.url.clone(),
                token: token.clone(),
                ca: Some(self.ca.clone()),
            })?)
        };
        corral_controllers::spawn_all_timed(
            client("scheduler")?,
            client("ipam")?,
            client("node-lifecycle")?,
            self.prefix,
            self.timing,
            term.clone(),
        );
        corral_controllers::spawn_pinned(client(corral_controllers::pinned::NAME)?, term.clone());
        tokio::spawn(corral_server::workflows::drive(
            self.server.clone(),
            term.clone(),
        ));
        tokio::spawn(corral_server::retention::compact_loop(
            self.server.clone(),
            self.history_keep,
            corral_server::retention::COMPACTION_INTERVAL,
            term.clone(),
        ));
        self.server.metrics.set_leading(true);
        let (server, term) = (self.server.clone(), term.clone());
        tokio::spawn(async move {
            term.cancelled().await;
            server.metrics.set_leading(false);
        });
        Ok(())
    }
}

async fn serve(plane: ControlPlane, shutdown: CancellationToken) -> anyhow::Result<()> {
    corral_server::serve(plane.listener, plane.server, shutdown.clone())
        .await
        .context("the API server failed")?;
    shutdown.cancel();
    Ok(())
}

/// `corral up`: control plane, built-in controllers and a node agent.
pub async fn up(args: UpArgs) -> anyhow::Result<()> {
    init_logging();
    let data_dir = args
        .server
        .data_dir
        .clone()
        .unwrap_or_else(default_data_dir);
    let plane = start_control_plane(&args.server, &data_dir).await?;
    let node = args.node_name.clone().unwrap_or_else(hostname);
    let node_config = ClientConfig {
        server: plane.url.clone(),
        token: identity_token(
            &plane.server,
            &data_dir.join(NODE_CONFIG),
            Identity::new(node.clone(), Role::Node),
        )
        .await?,
        ca: Some(plane.ca.clone()),
    };
    node_config.save(&data_dir.join(NODE_CONFIG))?;
    println!(
        "export CORRAL_CONFIG={}",
        data_dir.join(ADMIN_CONFIG).display()
    );
    tracing::info!(api = %plane.url, data_dir = %data_dir.display(), node = %node, prefix = %plane.prefix, "corral is up");

    let shutdown = CancellationToken::new();
    tokio::spawn(stop_on_signal(shutdown.clone()));
    spawn_controllers(&plane, &shutdown)?;
    let endpoint =
        plane
            .server
            .agent_secret
            .get()
            .map(|secret| corral_agent::serve::EndpointConfig {
                listen: args.agent_listen.clone(),
                secret: secret.clone(),
            });
    let network = args
        .network
        .config(corral_agent::network::Forwarding::PodLinks)?;
    let agent = tokio::spawn(run_agent(
        AgentSetup {
            node,
            config: node_config,
            data_dir,
            endpoint,
            address: None,
            network,
            volume_plugin_dir: args.volumes.volume_plugin_dir.clone(),
        },
        shutdown.clone(),
    ));
    serve(plane, shutdown.clone()).await?;
    shutdown.cancel();
    agent.await.context("the agent task failed")??;
    tracing::info!("corral stopped; containers keep running until the next start");
    Ok(())
}

/// `corral server`: the control plane and built-in controllers, no agent.
pub async fn server(args: ServerArgs) -> anyhow::Result<()> {
    init_logging();
    let data_dir = args.data_dir.clone().unwrap_or_else(default_data_dir);
    let plane = start_control_plane(&args, &data_dir).await?;
    println!(
        "export CORRAL_CONFIG={}",
        data_dir.join(ADMIN_CONFIG).display()
    );
    tracing::info!(api = %plane.url, data_dir = %data_dir.display(), prefix = %plane.prefix, "corral server is up");
    let shutdown = CancellationToken::new();
    tokio::spawn(stop_on_signal(shutdown.clone()));
    spawn_controllers(&plane, &shutdown)?;
    serve(plane, shutdown).await
}

/// `corral agent`: one node, talking to a server elsewhere.
pub async fn agent(args: AgentArgs) -> anyhow::Result<()> {
    init_logging();
    let config = match &args.config {
        Some(path) => ClientConfig::load(path)?,
        None => ClientConfig {
            server: args.server.clone().unwrap_or_default(),
            token: args.token.clone().unwrap_or_default(),
            ca: match &args.ca {
                Some(path) => Some(std::fs::read_to_string(path).with_context(|| {
                    format!("--ca {}: cannot read the cluster CA", path.display())
                })?),
                None => None,
            },
        },
    };
    let data_dir = args.data_dir.clone().unwrap_or_else(default_data_dir);
    create_private_dir(&data_dir)?;
    let node = args.name.clone().unwrap_or_else(hostname);
    let config = match &args.join_token {
        Some(join_token) => node_identity(config, join_token, &node, &data_dir).await?,
        None => config,
    };
    let shutdown = CancellationToken::new();
    tokio::spawn(stop_on_signal(shutdown.clone()));
    let endpoint = args
        .agent_secret
        .clone()
        .map(|secret| corral_agent::serve::EndpointConfig {
            listen: args.listen.clone(),
            secret,
        });
    if endpoint.is_none() {
        tracing::warn!(
            "no --agent-secret: this node serves no container logs or exec (the server's DATA/{AGENT_SECRET_FILE} holds the secret)"
        );
    }
    if let Some(address) = &args.address {
        address
            .parse::<std::net::Ipv6Addr>()
            .with_context(|| format!("--address {address}: expected an IPv6 address"))?;
    }
    let mut network = args
        .network
        .config(corral_agent::network::Forwarding::Node)?;
    if args.wireguard {
        let Some(network) = &mut network else {
            anyhow::bail!("--wireguard needs the pod network (drop --no-pod-network)");
        };
        network.wireguard = Some(corral_agent::tunnel::TunnelConfig::for_data_dir(
            &data_dir,
            args.wireguard_port,
        ));
    }
    let setup = AgentSetup {
        node,
        config,
        data_dir,
        endpoint,
        address: args.address.clone(),
        network,
        volume_plugin_dir: args.volumes.volume_plugin_dir.clone(),
    };
    run_agent(setup, shutdown).await
}

/// What a node agent starts with.
struct AgentSetup {
    node: String,
    config: ClientConfig,
    data_dir: PathBuf,
    endpoint: Option<corral_agent::serve::EndpointConfig>,
    address: Option<String>,
    network: Option<corral_agent::network::NetworkConfig>,
    volume_plugin_dir: PathBuf,
}

async fn run_agent(setup: AgentSetup, shutdown: CancellationToken) -> anyhow::Result<()> {
    let client = Client::new(&setup.config)?;
    let agent_config = corral_agent::AgentConfig {
        node: setup.node,
        data_dir: setup.data_dir,
        address: setup.address,
        image_revisions: 3,
        heartbeat: Duration::from_secs(5),
        endpoint: setup.endpoint,
        network: setup.network,
        volume_plugin_dir: Some(setup.volume_plugin_dir),
    };
    let ctx = corral_agent::context(
        &agent_config,
        Some(client.clone()),
        Arc::new(corral_agent::steps::ClientSteps::new(client)),
    )
    .context("cannot set up the node agent")?;
    corral_agent::run(agent_config, ctx, shutdown)
        .await
        .context("the node agent failed")
}

/// A token for `identity`, kept in the config at `path` across restarts; a
/// new one if the config is missing or its token is unknown to this store.
async fn identity_token(
    server: &SharedServer,
    path: &Path,
    identity: Identity,
) -> anyhow::Result<String> {
    if let Ok(existing) = ClientConfig::load(path)
        && server.tokens.resolve(&existing.token).await?.as_ref() == Some(&identity)
    {
        return Ok(existing.token);
    }
    Ok(TokenIssuer::issue(&*server.store, &*server.clock, identity).await?)
}

/// The machine's hostname, lowercased, as a default node name.
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_ascii_lowercase())
        .ok()
        .filter(|h| corral_api::validate::is_dns_label(h))
        .unwrap_or_else(|| "node-1".to_string())
}

/// The node's own client config: the one kept from an earlier join, or a
/// new one for which `join_token` is exchanged now (kept, fsynced, before
/// it is used). A server that cannot be reached yet is retried; a refusal
/// (expired or unknown token, a name already taken) ends the agent.
async fn node_identity(
    join: ClientConfig,
    join_token: &str,
    node: &str,
    data_dir: &Path,
) -> anyhow::Result<ClientConfig> {
    // Named after the node: a changed --name joins again (and is refused
    // if that name belongs to a live node) instead of acting as the old one.
    let path = data_dir.join(format!("node-{node}.json"));
    if path.exists() {
        let kept = ClientConfig::load(&path)?;
        tracing::info!(path = %path.display(), "using the node identity kept from an earlier join");
        return Ok(ClientConfig {
            server: join.server,
            ca: join.ca.or(kept.ca),
            token: kept.token,
        });
    }
    let client = Client::new(&ClientConfig {
        token: join_token.to_string(),
        ..join.clone()
    })?;
    let joined = loop {
        match client.join(node).await {
            Ok(joined) => break joined,
            Err(error) if error.status().is_none() => {
                tracing::warn!(%error, "cannot reach the server to join yet; retrying");
                tokio::time::sleep(std::time::Duration::from_secs(2)).await;
            }
            Err(error) => {
                return Err(anyhow::Error::new(error))
                    .with_context(|| format!("joining the cluster as node {node}"));
            }
        }
    };
    let config = ClientConfig {
        token: joined.token,
        ..join
    };
    config.save(&path)?;
    tracing::info!(node, path = %path.display(), "joined the cluster; the node's identity is kept");
    Ok(config)
}

fn create_private_dir(path: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .with_context(|| format!("cannot create data dir {}", path.display()))
}

pub(crate) async fn stop_on_signal(shutdown: CancellationToken) {
    let (Ok(mut interrupt), Ok(mut terminate)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        tracing::error!("cannot install signal handlers; stop corral with SIGKILL");
        return;
    };
    tokio::select! {
        _ = interrupt.recv() => tracing::info!("SIGINT: stopping"),
        _ = terminate.recv() => tracing::info!("SIGTERM: stopping"),
    }
    shutdown.cancel();
}

pub(crate) fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("CORRAL_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

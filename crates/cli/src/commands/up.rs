//! `corral up` (a whole single-node cluster in one process), `corral
//! server` (the control plane alone) and `corral agent` (a node alone).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use corral_agent::node_identity::{default_node_name, node_identity};
use corral_agent::node_tls::NodeTls;
use corral_api::{Identity, Role};
use corral_client::{Client, ClientConfig};
use corral_server::control_plane::{ControlPlane, ControlPlaneConfig, NODE_CONFIG};
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

use super::default_data_dir;

#[derive(Debug, Args)]
#[command(after_help = "Examples:
  corral server --listen 10.0.0.1:7443            serve agents on other machines
  corral server --listen 10.0.0.1:7443 --tls-san corral.example.com   another name in the certificate
  corral server --datastore etcd://10.0.0.1:2379,10.0.0.2:2379 --cluster-prefix fd12:3456:789a::/48")]
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
    /// The keys that encrypt Secrets' values (made there if absent, mode
    /// 0600). Servers of one cluster share it; back it up with the store.
    /// Default: DATA/secrets-keyring.
    #[arg(long, value_name = "FILE")]
    secrets_keyring: Option<PathBuf>,
    /// Seconds without a heartbeat before a node is Silent.
    #[arg(long, value_name = "SECONDS", default_value_t = 20)]
    silent_after: u64,
    /// Seconds an `availability: ha` pod waits on a Silent node before it
    /// is placed elsewhere.
    #[arg(long, value_name = "SECONDS", default_value_t = 30)]
    ha_grace: u64,
    /// The fencing period every node lease grants: a node that cannot
    /// renew its lease for this long stops its `availability: ha` pods
    /// itself (its best-effort pods keep running). ha pods are placed
    /// elsewhere only after this plus a margin (1 %, +5 s to stop them,
    /// +2 s between servers) has passed since the node's last renewal.
    #[arg(long, value_name = "SECONDS", default_value_t = corral_api::fencing::DEFAULT_FENCE_AFTER_SECONDS, value_parser = clap::value_parser!(u64).range(1..))]
    fence_after: u64,
    /// Seconds a node may stay Silent before it is Lost and its
    /// best-effort pods move too (default 7 days).
    #[arg(long, value_name = "SECONDS", default_value_t = 7 * 24 * 3600)]
    lost_after: u64,
    /// Which spec revisions history keeps, compacted at start and hourly:
    /// `last=N` (each object's newest N), `age=D` (younger than D: 30d,
    /// 12h), both (`last=10,age=30d`: either one keeps a revision), or
    /// `all`. A live object always keeps its newest 3 (rollbacks and the
    /// images nodes keep for them). Unless `all`, the same pass trims each
    /// object's step log to its newest 1000 entries, and drops it once no
    /// revision of the object is left.
    #[arg(long, value_name = "POLICY", default_value = corral_server::retention::DEFAULT_KEEP)]
    history_keep: corral_api::history::CompactionPolicy,
    #[command(flatten)]
    datastore: super::datastore::DatastoreArgs,
}

impl ServerArgs {
    fn data_dir(&self) -> PathBuf {
        self.data_dir.clone().unwrap_or_else(default_data_dir)
    }

    fn control_plane(&self) -> ControlPlaneConfig {
        let seconds = |s: u64| chrono::Duration::seconds(i64::try_from(s).unwrap_or(i64::MAX));
        ControlPlaneConfig {
            data_dir: self.data_dir(),
            listen: self.listen.clone(),
            cluster_prefix: self.cluster_prefix.clone(),
            tls_sans: self.tls_sans.clone(),
            tls_dir: self.tls_dir.clone(),
            secrets_keyring: self.secrets_keyring.clone(),
            timing: corral_controllers::lifecycle::Timing {
                silent_after: seconds(self.silent_after),
                lost_after: seconds(self.lost_after),
                ha_grace: seconds(self.ha_grace),
                fence_after: seconds(self.fence_after),
            },
            history_keep: self.history_keep,
            datastore: self.datastore.config(),
        }
    }
}

#[derive(Debug, Args)]
#[command(after_help = "Examples:
  corral up                                  a cluster in the default data dir; prints the export line
  corral up --data-dir /tmp/corral --listen 127.0.0.1:8443   state in /tmp/corral, API on port 8443
  corral up --egress-uplink eth0             pods reach IPv4 addresses through eth0
  corral up --registry-auth /etc/corral/registry-auth.json --insecure-registry 10.0.0.5:5000
                                             pull with the node's credentials; 10.0.0.5:5000 over plain HTTP")]
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
    #[command(flatten)]
    registries: RegistryArgs,
}

/// How the node reaches image registries (node-local settings, never in
/// the API).
#[derive(Debug, Args)]
pub struct RegistryArgs {
    /// Speak plain HTTP to this registry (HOST[:PORT]; repeat the flag for
    /// more). Every other registry is reached over HTTPS; a loopback one
    /// that does not speak TLS falls back to HTTP by itself.
    #[arg(long = "insecure-registry", value_name = "HOST[:PORT]")]
    insecure_registries: Vec<String>,
    /// Trust the CA certificates DIR/HOST[:PORT]/*.crt (e.g. ca.crt) for
    /// that registry, besides the system's roots.
    #[arg(
        long,
        value_name = "DIR",
        default_value = corral_runtime::image::registry::DEFAULT_CERTS_DIR
    )]
    registry_certs_dir: PathBuf,
    /// The node's registry credentials: a Docker config.json
    /// ({"auths": {"HOST[:PORT]": {"auth": "base64 of user:password"}}};
    /// Docker Hub's key is https://index.docker.io/v1/). Read at each
    /// pull. Default: /etc/corral/registry-auth.json when it exists.
    #[arg(long, value_name = "FILE")]
    registry_auth: Option<PathBuf>,
}

impl RegistryArgs {
    /// The agent's settings; a named auth file must exist and parse now
    /// (a typo would otherwise surface only at the first pull).
    fn settings(&self) -> anyhow::Result<corral_agent::registries::RegistrySettings> {
        for host in &self.insecure_registries {
            if host.is_empty() || host.contains('/') {
                anyhow::bail!(
                    "--insecure-registry {host:?}: expected HOST[:PORT] as written in image names, without a scheme or path"
                );
            }
        }
        let mut settings = corral_agent::registries::RegistrySettings::default();
        if let Some(path) = &self.registry_auth {
            corral_runtime::image::AuthFile::load(path).context("--registry-auth")?;
            settings.auth_file = Some(path.clone());
        }
        settings.certs_dir.clone_from(&self.registry_certs_dir);
        settings.insecure.clone_from(&self.insecure_registries);
        Ok(settings)
    }
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
#[command(after_help = "Examples:
  corral agent --server https://10.0.0.1:7443 --ca ca.pem --join-token corral_… --name node-2
                                      join; later starts reuse node-2's own token
  corral agent --agent-config node-2.json --listen 0.0.0.0:7444
                                      serve container logs and exec to the server on all addresses
  corral agent --agent-config node-2.json --address fd00::2 --wireguard
                                      pod traffic to other nodes through WireGuard
  corral agent --agent-config node-2.json --registry-auth /etc/corral/registry-auth.json \\
      --registry-certs-dir /etc/corral/certs.d --insecure-registry registry.lan:5000
                                      credentials and CAs for pulls; registry.lan:5000 over plain HTTP")]
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
    /// Address to serve container logs and exec on, over TLS with the
    /// certificate the cluster CA issues to this node (kept in
    /// DATA/tls/node-NAME.json, renewed before it expires); only API
    /// servers' client certificates are accepted. The API server must
    /// reach it (e.g. 0.0.0.0:7444; the node's --address is advertised).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:0")]
    listen: String,
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
    #[command(flatten)]
    registries: RegistryArgs,
}

/// `corral up`: control plane, built-in controllers and a node agent.
pub async fn up(args: UpArgs) -> anyhow::Result<()> {
    init_logging();
    let data_dir = args.server.data_dir();
    corral_agent::check_data_dir(&data_dir)?;
    let plane = ControlPlane::start(args.server.control_plane()).await?;
    let node = args.node_name.clone().unwrap_or_else(default_node_name);
    let node_config = plane
        .client_config(
            &data_dir.join(NODE_CONFIG),
            Identity::new(node.clone(), Role::Node),
        )
        .await?;
    println!(
        "export CORRAL_CONFIG={}",
        plane.admin_config_path().display()
    );
    tracing::info!(api = %plane.url(), data_dir = %data_dir.display(), node = %node, prefix = %plane.prefix(), "corral is up");

    let shutdown = CancellationToken::new();
    tokio::spawn(stop_on_signal(shutdown.clone()));
    let endpoint = Some(corral_agent::serve::EndpointConfig {
        listen: args.agent_listen.clone(),
        tls: Arc::new(NodeTls::load(&node, &data_dir, node_config.ca.as_deref())?),
    });
    let network = args
        .network
        .config(corral_agent::network::Forwarding::PodLinks)?;
    let registries = args.registries.settings()?;
    let agent = tokio::spawn(run_agent(
        AgentSetup {
            node,
            config: node_config,
            data_dir,
            endpoint,
            address: None,
            network,
            volume_plugin_dir: args.volumes.volume_plugin_dir.clone(),
            registries,
        },
        shutdown.clone(),
    ));
    plane.run(shutdown.clone()).await?;
    agent.await.context("the agent task failed")??;
    tracing::info!("corral stopped; containers keep running until the next start");
    Ok(())
}

/// `corral server`: the control plane and built-in controllers, no agent.
pub async fn server(args: ServerArgs) -> anyhow::Result<()> {
    init_logging();
    let plane = ControlPlane::start(args.control_plane()).await?;
    println!(
        "export CORRAL_CONFIG={}",
        plane.admin_config_path().display()
    );
    tracing::info!(api = %plane.url(), data_dir = %args.data_dir().display(), prefix = %plane.prefix(), "corral server is up");
    let shutdown = CancellationToken::new();
    tokio::spawn(stop_on_signal(shutdown.clone()));
    Ok(plane.run(shutdown).await?)
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
    corral_agent::check_data_dir(&data_dir)?;
    std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
        .create(&data_dir)
        .with_context(|| format!("cannot create data dir {}", data_dir.display()))?;
    let node = args.name.clone().unwrap_or_else(default_node_name);
    let config = match &args.join_token {
        Some(join_token) => node_identity(config, join_token, &node, &data_dir).await?,
        None => config,
    };
    let shutdown = CancellationToken::new();
    tokio::spawn(stop_on_signal(shutdown.clone()));
    let endpoint = match config.ca.as_deref() {
        Some(ca) => Some(corral_agent::serve::EndpointConfig {
            listen: args.listen.clone(),
            tls: Arc::new(NodeTls::load(&node, &data_dir, Some(ca))?),
        }),
        None => {
            tracing::warn!(
                "the client config names no cluster CA (--ca): this node serves no container logs or exec"
            );
            None
        }
    };
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
        registries: args.registries.settings()?,
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
    registries: corral_agent::registries::RegistrySettings,
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
        registries: setup.registries,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn registry_args(insecure: &[&str], auth: Option<PathBuf>) -> RegistryArgs {
        RegistryArgs {
            insecure_registries: insecure.iter().map(|s| s.to_string()).collect(),
            registry_certs_dir: PathBuf::from("/etc/corral/certs.d"),
            registry_auth: auth,
        }
    }

    #[test]
    fn registry_flags_are_checked_at_start() {
        let settings = registry_args(&["registry.lan:5000"], None)
            .settings()
            .expect("settings");
        assert_eq!(settings.insecure, vec!["registry.lan:5000".to_string()]);
        let error = registry_args(&["http://registry.lan:5000"], None)
            .settings()
            .expect_err("a scheme");
        assert!(error.to_string().contains("HOST[:PORT]"), "{error}");

        let dir = tempfile::tempdir().expect("tempdir");
        let bad = dir.path().join("auth.json");
        std::fs::write(&bad, r#"{"auths": "hunter2"}"#).expect("write");
        let error = registry_args(&[], Some(bad))
            .settings()
            .expect_err("not a config.json");
        let chain = format!("{error:#}");
        assert!(chain.starts_with("--registry-auth"), "{chain}");
        assert!(!chain.contains("hunter2"), "{chain}");
        let missing = registry_args(&[], Some(dir.path().join("nope.json"))).settings();
        assert!(missing.is_err(), "a named file must exist");
    }
}

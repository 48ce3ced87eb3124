//! The node's WireGuard tunnel (`corral agent --wireguard`, design 0012):
//! a keypair kept in the data dir, one interface (the kernel module when
//! present, else `wireguard-go`) whose peers are every other node that
//! publishes a tunnel in `status.wireguard`, each allowed its node /64.
//! Routes to those nodes' /64s then go `dev <tunnel>` instead of via their
//! address, so pod traffic between them crosses the wire as WireGuard UDP.
//!
//! The interface comes up when the agent starts (a restarted agent adopts
//! the one still running, so pod traffic is not cut); the join step
//! `node/configure-tunnel` and then the routes loop keep the peers equal
//! to the `Node` objects. What to configure is decided by pure functions;
//! the `wg` calls sit behind [`TunnelOps`].

use std::collections::BTreeMap;
use std::net::{Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use corral_api::Object;
use corral_api::kinds::{NodeStatus, NodeWireguard};
use corral_net::wireguard::{Peer, PrivateKey, PublicKey, WireguardError, WireguardInterface};
use ipnet::Ipv6Net;
use sha2::Digest;

/// WireGuard's customary port.
pub const DEFAULT_PORT: u16 = 51820;
/// The private key's file in [`TunnelConfig::dir`].
pub const KEY_FILE: &str = "private.key";
/// The interface's name, kept in [`TunnelConfig::dir`] so `corral lab down`
/// can clean up after a killed wireguard-go.
pub const INTERFACE_FILE: &str = "interface";

/// The tunnel's node-local settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TunnelConfig {
    /// The interface name. wireguard-go's names are machine-wide, so two
    /// agents on one machine (a lab) need different ones.
    pub interface: String,
    /// The UDP port peers send to.
    pub port: u16,
    /// Holds the private key (mode 0600), the interface name and
    /// wireguard-go's log.
    pub dir: PathBuf,
}

impl TunnelConfig {
    /// The settings for an agent whose data dir is `data_dir`: files in
    /// `<data_dir>/wireguard`, interface `crwg` + 8 hex digits of the
    /// SHA-256 of the data dir's path (stable across restarts, distinct
    /// between agents).
    pub fn for_data_dir(data_dir: &Path, port: u16) -> TunnelConfig {
        let digest = sha2::Sha256::digest(data_dir.as_os_str().as_encoded_bytes());
        TunnelConfig {
            interface: format!("crwg{}", &hex::encode(digest)[..8]),
            port,
            dir: data_dir.join("wireguard"),
        }
    }
}

/// Why the tunnel could not be set up or changed.
#[derive(Debug, thiserror::Error)]
pub enum TunnelError {
    #[error("cannot keep the wireguard key in {path}")]
    Key {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the wireguard key in {path} is unreadable")]
    BadKey {
        path: PathBuf,
        #[source]
        source: WireguardError,
    },
    #[error(transparent)]
    Wireguard(#[from] WireguardError),
    #[error("the tunnel task failed: {0}")]
    Task(String),
}

/// The node's private key from `dir`, or a new one written there with
/// mode 0600 (the directory 0700).
pub fn load_or_create_key(dir: &Path) -> Result<PrivateKey, TunnelError> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
    let path = dir.join(KEY_FILE);
    let io = |source| TunnelError::Key {
        path: path.clone(),
        source,
    };
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).map_err(io)?;
            return text.parse().map_err(|source| TunnelError::BadKey {
                path: path.clone(),
                source,
            });
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => return Err(io(source)),
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io)?;
    let key = PrivateKey::generate(&mut rand::rng());
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .map_err(io)?;
    file.write_all(format!("{}\n", key.to_base64()).as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(io)?;
    Ok(key)
}

/// The `wg` operations the agent needs; the real one is a
/// [`WireguardInterface`], tests use a fake. Calls block (they run `wg`).
pub trait TunnelOps: Send + Sync {
    fn peers(&self) -> Result<Vec<Peer>, WireguardError>;
    fn set_peer(&self, peer: &Peer) -> Result<(), WireguardError>;
    fn remove_peer(&self, public_key: &PublicKey) -> Result<(), WireguardError>;
}

impl TunnelOps for WireguardInterface {
    fn peers(&self) -> Result<Vec<Peer>, WireguardError> {
        WireguardInterface::peers(self)
    }
    fn set_peer(&self, peer: &Peer) -> Result<(), WireguardError> {
        WireguardInterface::set_peer(self, peer)
    }
    fn remove_peer(&self, public_key: &PublicKey) -> Result<(), WireguardError> {
        WireguardInterface::remove_peer(self, public_key)
    }
}

/// Another node as this node's peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodePeer {
    pub node: String,
    pub peer: Peer,
}

/// What [`plan_peers`] decided.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerPlan {
    /// Peers to add or update (missing, or configured otherwise).
    pub set: Vec<Peer>,
    /// Peers no node publishes any more.
    pub remove: Vec<PublicKey>,
}

impl PeerPlan {
    pub fn is_empty(&self) -> bool {
        self.set.is_empty() && self.remove.is_empty()
    }
}

/// The node's running tunnel.
pub struct Tunnel {
    ops: Arc<dyn TunnelOps>,
    interface: String,
    public_key: PublicKey,
    port: u16,
    /// Which implementation carries it, for notes.
    backend: &'static str,
}

impl std::fmt::Debug for Tunnel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tunnel")
            .field("interface", &self.interface)
            .field("public_key", &self.public_key)
            .field("port", &self.port)
            .finish_non_exhaustive()
    }
}

impl Tunnel {
    /// Brings the interface up in the agent's namespace (or adopts it,
    /// still running from before a restart). It stays up when the agent
    /// stops.
    pub async fn start(config: &TunnelConfig) -> Result<Tunnel, TunnelError> {
        let key = load_or_create_key(&config.dir)?;
        let name_file = config.dir.join(INTERFACE_FILE);
        std::fs::write(&name_file, &config.interface).map_err(|source| TunnelError::Key {
            path: name_file,
            source,
        })?;
        let runtime = tokio::runtime::Handle::current();
        let (name, port, log) = (
            config.interface.clone(),
            config.port,
            config.dir.join("wireguard-go.log"),
        );
        let up_key = key.clone();
        let mut interface = tokio::task::spawn_blocking(move || {
            // The agent reaps orphans; hold the lock so `wg` is ours to wait for.
            let _spawning = corral_runtime::oci::reap::spawn_lock();
            runtime.block_on(WireguardInterface::ensure(
                &name,
                None,
                &up_key,
                port,
                Some(&log),
            ))
        })
        .await
        .map_err(|e| TunnelError::Task(e.to_string()))??;
        interface.keep_on_drop();
        let backend = match interface.backend() {
            corral_net::wireguard::Backend::Kernel => "kernel module",
            corral_net::wireguard::Backend::Userspace => "wireguard-go",
        };
        tracing::info!(interface = %config.interface, backend, port = config.port, "wireguard tunnel up");
        Ok(Tunnel {
            ops: Arc::new(interface),
            interface: config.interface.clone(),
            public_key: key.public_key(),
            port: config.port,
            backend,
        })
    }

    /// A tunnel over any [`TunnelOps`] (tests pass a fake).
    pub fn with_ops(
        ops: Arc<dyn TunnelOps>,
        interface: &str,
        public_key: PublicKey,
        port: u16,
    ) -> Tunnel {
        Tunnel {
            ops,
            interface: interface.to_string(),
            public_key,
            port,
            backend: "fake",
        }
    }

    pub fn interface(&self) -> &str {
        &self.interface
    }

    /// What the node publishes in `status.wireguard`.
    pub fn status(&self, address: Ipv6Addr) -> NodeWireguard {
        NodeWireguard {
            public_key: self.public_key.to_string(),
            endpoint: SocketAddr::new(address.into(), self.port).to_string(),
        }
    }

    /// Brings the peers in line with `nodes`; returns the wanted peers
    /// and what changed.
    pub async fn reconcile(
        &self,
        own: &str,
        nodes: &[Object],
        moved: &BTreeMap<String, Vec<Ipv6Net>>,
    ) -> Result<(Vec<NodePeer>, PeerPlan), TunnelError> {
        let desired = desired_peers(own, nodes, moved);
        let wanted: Vec<Peer> = desired.iter().map(|p| p.peer.clone()).collect();
        let ops = self.ops.clone();
        let plan = tokio::task::spawn_blocking(move || {
            let _spawning = corral_runtime::oci::reap::spawn_lock();
            let plan = plan_peers(&wanted, &ops.peers()?);
            for key in &plan.remove {
                ops.remove_peer(key)?;
            }
            for peer in &plan.set {
                ops.set_peer(peer)?;
            }
            Ok::<_, WireguardError>(plan)
        })
        .await
        .map_err(|e| TunnelError::Task(e.to_string()))??;
        Ok((desired, plan))
    }

    /// The join step's note: the interface and its peers.
    pub fn describe(&self, peers: &[NodePeer]) -> String {
        let peers = if peers.is_empty() {
            "no other node has a tunnel yet".to_string()
        } else {
            peers
                .iter()
                .map(|p| {
                    let allowed: Vec<String> =
                        p.peer.allowed_ips.iter().map(ToString::to_string).collect();
                    format!(
                        "{} at {} for {}",
                        p.node,
                        p.peer.endpoint,
                        allowed.join(",")
                    )
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        format!(
            "tunnel {} ({}) on UDP port {}, key {}; peers: {peers}",
            self.interface, self.backend, self.port, self.public_key
        )
    }
}

/// The node's tunnel identity as published, when complete and valid.
fn published(status: &NodeStatus) -> Option<(PublicKey, SocketAddr)> {
    let wireguard = status.wireguard.as_ref()?;
    Some((
        wireguard.public_key.parse().ok()?,
        wireguard.endpoint.parse().ok()?,
    ))
}

/// Whether `node` publishes a usable tunnel (then its /64 is routed
/// through ours).
pub fn has_tunnel(node: &Object) -> bool {
    node.typed_status::<NodeStatus>()
        .ok()
        .is_some_and(|status| published(&status).is_some())
}

/// The peers this node wants: every other node with a /64 and a published
/// tunnel, allowed exactly its /64 and the `/128`s of live-migrated VMs
/// whose guests it runs (`moved`, by node: [`crate::network::vm_routes`]).
/// Sorted by node name.
pub fn desired_peers(
    own: &str,
    nodes: &[Object],
    moved: &BTreeMap<String, Vec<Ipv6Net>>,
) -> Vec<NodePeer> {
    let mut peers: Vec<NodePeer> = nodes
        .iter()
        .filter(|node| node.metadata.name != own)
        .filter_map(|node| {
            let status: NodeStatus = node.typed_status().ok()?;
            let prefix: Ipv6Net = status.prefix.as_deref()?.parse().ok()?;
            let (public_key, endpoint) = published(&status)?;
            Some(NodePeer {
                node: node.metadata.name.clone(),
                peer: Peer {
                    public_key,
                    endpoint,
                    allowed_ips: std::iter::once(prefix)
                        .chain(
                            moved
                                .get(&node.metadata.name)
                                .into_iter()
                                .flatten()
                                .copied(),
                        )
                        .map(Into::into)
                        .collect(),
                    persistent_keepalive: None,
                },
            })
        })
        .collect();
    peers.sort_by(|a, b| a.node.cmp(&b.node));
    peers
}

/// Compares wanted and configured peers, by public key.
pub fn plan_peers(desired: &[Peer], existing: &[Peer]) -> PeerPlan {
    let have: BTreeMap<PublicKey, &Peer> = existing.iter().map(|p| (p.public_key, p)).collect();
    let wanted: BTreeMap<PublicKey, &Peer> = desired.iter().map(|p| (p.public_key, p)).collect();
    // The same allowed IPs in another order are the same peer (`wg show`
    // lists them in its own order).
    let same = |a: &Peer, b: &Peer| {
        let sorted = |peer: &Peer| {
            let mut ips = peer.allowed_ips.clone();
            ips.sort();
            ips
        };
        a.public_key == b.public_key
            && a.endpoint == b.endpoint
            && a.persistent_keepalive == b.persistent_keepalive
            && sorted(a) == sorted(b)
    };
    PeerPlan {
        set: wanted
            .iter()
            .filter(|(key, peer)| !have.get(key).is_some_and(|had| same(had, peer)))
            .map(|(_, peer)| (*peer).clone())
            .collect(),
        remove: have
            .keys()
            .filter(|key| !wanted.contains_key(key))
            .copied()
            .collect(),
    }
}

#[cfg(test)]
mod tests;

//! Optional WireGuard between nodes: keys, one interface per node, peers.
//!
//! Keys are x25519 in pure Rust. The interface uses the kernel module when
//! the kernel has one, else `wireguard-go` (a userspace TUN daemon). Peers
//! are configured with `wg set`, which speaks to either backend. With
//! wireguard-go every interface's control socket lives in
//! `/var/run/wireguard/<name>.sock`, shared by all namespaces, so interface
//! names must be unique on the machine; [`WireguardInterface::up`] refuses a
//! name whose socket already belongs to another namespace's interface.
//!
//! Pod traffic to another node's /64 is routed `dev <wg>`
//! ([`crate::datapath::NextHop::Interface`]); that peer's allowed IPs are its
//! node /64.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::str::FromStr;
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use ipnet::IpNet;
use rand::RngCore;
use rtnetlink::LinkWireguard;

use crate::datapath::{self, DatapathError};
use crate::netns::{self, NetnsError};

/// Where wireguard-go keeps its control sockets (machine-wide).
pub const USERSPACE_SOCKET_DIR: &str = "/var/run/wireguard";
const EOPNOTSUPP: i32 = 95;
const STARTUP_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a WireGuard operation failed.
#[derive(Debug, thiserror::Error)]
pub enum WireguardError {
    #[error("wireguard key {input:?} is not 32 bytes of base64")]
    InvalidKey { input: String },
    #[error(
        "wireguard interface name {name:?} is invalid: expected 1 to 15 letters, digits, '.', '_' or '-'"
    )]
    InterfaceName { name: String },
    #[error(
        "wireguard interface {name} already exists elsewhere on this machine (socket {USERSPACE_SOCKET_DIR}/{name}.sock)"
    )]
    NameInUse { name: String },
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error(transparent)]
    Datapath(#[from] DatapathError),
    #[error("run {program}")]
    Spawn {
        program: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("wireguard-go for {name} exited during startup: {stderr}")]
    UserspaceExited { name: String, stderr: String },
    #[error("wireguard-go for {name} did not open its control socket within {STARTUP_TIMEOUT:?}")]
    UserspaceTimeout { name: String },
    #[error("wg {args} failed: {stderr}")]
    Wg { args: String, stderr: String },
    #[error("unexpected line in `wg show transfer` output: {line:?}")]
    UnparsableTransfer { line: String },
    #[error("unexpected line in `wg show dump` output: {line:?}")]
    UnparsableDump { line: String },
}

/// A WireGuard private key (clamped x25519 scalar). Its `Debug` hides it.
#[derive(Clone, PartialEq, Eq)]
pub struct PrivateKey([u8; 32]);

/// A WireGuard public key.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PublicKey([u8; 32]);

fn decode_key(input: &str) -> Result<[u8; 32], WireguardError> {
    BASE64
        .decode(input.trim())
        .ok()
        .and_then(|bytes| <[u8; 32]>::try_from(bytes).ok())
        .ok_or_else(|| WireguardError::InvalidKey {
            input: input.to_string(),
        })
}

impl PrivateKey {
    /// A fresh key from `rng` (clamped as `wg genkey` does).
    pub fn generate(rng: &mut impl RngCore) -> Self {
        let mut bytes = [0u8; 32];
        rng.fill_bytes(&mut bytes);
        bytes[0] &= 248;
        bytes[31] = (bytes[31] & 127) | 64;
        PrivateKey(bytes)
    }

    /// The matching public key (what `wg pubkey` prints).
    pub fn public_key(&self) -> PublicKey {
        PublicKey(x25519_dalek::x25519(
            self.0,
            x25519_dalek::X25519_BASEPOINT_BYTES,
        ))
    }

    /// Base64, as `wg` reads it. Handle with care.
    pub fn to_base64(&self) -> String {
        BASE64.encode(self.0)
    }
}

impl FromStr for PrivateKey {
    type Err = WireguardError;
    fn from_str(input: &str) -> Result<Self, Self::Err> {
        decode_key(input).map(PrivateKey)
    }
}

impl fmt::Debug for PrivateKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PrivateKey(<redacted>)")
    }
}

impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&BASE64.encode(self.0))
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({self})")
    }
}

impl FromStr for PublicKey {
    type Err = WireguardError;
    fn from_str(input: &str) -> Result<Self, Self::Err> {
        decode_key(input).map(PublicKey)
    }
}

/// Another node as a WireGuard peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub public_key: PublicKey,
    /// The peer node's address and listen port.
    pub endpoint: SocketAddr,
    /// What may arrive from (and is sent to) this peer: its node /64.
    pub allowed_ips: Vec<IpNet>,
    pub persistent_keepalive: Option<u16>,
}

/// Bytes exchanged with one peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerTransfer {
    pub public_key: PublicKey,
    pub received: u64,
    pub sent: u64,
}

/// Which implementation carries an interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Kernel,
    Userspace,
}

/// The `wg set` arguments that add or update `peer` on `interface`.
pub fn peer_arguments(interface: &str, peer: &Peer) -> Vec<String> {
    let mut args = vec![
        "set".to_string(),
        interface.to_string(),
        "peer".to_string(),
        peer.public_key.to_string(),
        "endpoint".to_string(),
        peer.endpoint.to_string(),
        "allowed-ips".to_string(),
        peer.allowed_ips
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(","),
    ];
    if let Some(seconds) = peer.persistent_keepalive {
        args.extend(["persistent-keepalive".to_string(), seconds.to_string()]);
    }
    args
}

/// Parses `wg show <interface> transfer`: `<public key>\t<rx>\t<tx>` lines.
pub fn parse_transfer(output: &str) -> Result<Vec<PeerTransfer>, WireguardError> {
    output
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            let bad = || WireguardError::UnparsableTransfer {
                line: line.to_string(),
            };
            let fields: Vec<&str> = line.split_whitespace().collect();
            let [key, received, sent] = fields.as_slice() else {
                return Err(bad());
            };
            Ok(PeerTransfer {
                public_key: key.parse().map_err(|_| bad())?,
                received: received.parse().map_err(|_| bad())?,
                sent: sent.parse().map_err(|_| bad())?,
            })
        })
        .collect()
}

fn validate_name(name: &str) -> Result<(), WireguardError> {
    if crate::datapath::is_interface_name(name) {
        Ok(())
    } else {
        Err(WireguardError::InterfaceName {
            name: name.to_string(),
        })
    }
}

/// True when the kernel in `netns` can create WireGuard interfaces
/// (the equivalent of `ip link add type wireguard` succeeding).
pub async fn kernel_module_available(netns: Option<&Path>) -> Result<bool, WireguardError> {
    let handle = datapath::connect(netns).await?;
    let probe = format!("crwgp{}", std::process::id());
    match handle
        .link()
        .add(LinkWireguard::new(&probe).build())
        .execute()
        .await
    {
        Ok(()) => {
            if let Some(link) = datapath::netlink::find_link(&handle, &probe).await? {
                let _ = handle.link().del(link.header.index).execute().await;
            }
            Ok(true)
        }
        Err(e) if datapath::netlink::errno(&e) == Some(EOPNOTSUPP) => Ok(false),
        Err(source) => Err(DatapathError::Netlink {
            operation: "probe for the wireguard kernel module".into(),
            source,
        }
        .into()),
    }
}

fn run_wg(
    netns: Option<&Path>,
    args: &[String],
    stdin: Option<&str>,
) -> Result<String, WireguardError> {
    let mut command = Command::new("wg");
    command.args(args);
    let output = netns::output_with_input(netns, &mut command, stdin.map(str::as_bytes))?.map_err(
        |source| WireguardError::Spawn {
            program: "wg",
            source,
        },
    )?;
    if !output.status.success() {
        return Err(WireguardError::Wg {
            args: args.join(" "),
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// A node's WireGuard interface. Dropping it tears it down (best effort);
/// call [`WireguardInterface::down`] to see errors, or
/// [`WireguardInterface::detach`] to leave it running.
#[derive(Debug)]
pub struct WireguardInterface {
    name: String,
    netns: Option<PathBuf>,
    backend: Backend,
    userspace: Option<Child>,
    detached: bool,
}

impl WireguardInterface {
    /// Creates interface `name` in `netns` (or here), sets its key and port
    /// and brings it up. The backend is the kernel module when available.
    /// Same as [`WireguardInterface::ensure`] without a log file.
    pub async fn up(
        name: &str,
        netns: Option<&Path>,
        private_key: &PrivateKey,
        listen_port: u16,
    ) -> Result<Self, WireguardError> {
        Self::ensure(name, netns, private_key, listen_port, None).await
    }

    /// Like [`WireguardInterface::up`], but adopts interface `name` when it
    /// already runs in `netns` (a restarted agent keeps its tunnel), and
    /// removes a stale wireguard-go socket of that name (its daemon was
    /// killed). wireguard-go's messages go to `log` (appended) when given:
    /// a daemon that outlives its starter must not write to a dead pipe.
    pub async fn ensure(
        name: &str,
        netns: Option<&Path>,
        private_key: &PrivateKey,
        listen_port: u16,
        log: Option<&Path>,
    ) -> Result<Self, WireguardError> {
        validate_name(name)?;
        let backend = if kernel_module_available(netns).await? {
            Backend::Kernel
        } else {
            Backend::Userspace
        };
        let handle = datapath::connect(netns).await?;
        let mut interface = WireguardInterface {
            name: name.to_string(),
            netns: netns.map(Path::to_path_buf),
            backend,
            userspace: None,
            detached: false,
        };
        let existing = datapath::netlink::find_link(&handle, name).await?;
        match backend {
            Backend::Kernel if existing.is_some() => {}
            Backend::Kernel => handle
                .link()
                .add(LinkWireguard::new(name).build())
                .execute()
                .await
                .map_err(datapath::netlink::netlink_error(format!(
                    "add wireguard link {name}"
                )))?,
            Backend::Userspace => {
                let socket = interface.socket_path();
                match existing {
                    // Ours, still served by its daemon: adopt it.
                    Some(_) if socket_is_live(&socket) => {}
                    Some(_) => {
                        // A device whose daemon died: start over.
                        remove_interface(name, netns)?;
                        remove_stale_socket(name, Duration::ZERO);
                        interface.start_userspace(log)?;
                    }
                    None => {
                        remove_stale_socket(name, Duration::ZERO);
                        interface.start_userspace(log)?;
                    }
                }
            }
        }
        run_wg(
            netns,
            &[
                "set".into(),
                name.into(),
                "private-key".into(),
                "/dev/stdin".into(),
                "listen-port".into(),
                listen_port.to_string(),
            ],
            Some(&format!("{}\n", private_key.to_base64())),
        )?;
        let index = datapath::netlink::link_index(&handle, name, netns).await?;
        datapath::netlink::set_up(&handle, index, name).await?;
        Ok(interface)
    }

    fn socket_path(&self) -> PathBuf {
        Path::new(USERSPACE_SOCKET_DIR).join(format!("{}.sock", self.name))
    }

    fn start_userspace(&mut self, log: Option<&Path>) -> Result<(), WireguardError> {
        if self.socket_path().exists() {
            return Err(WireguardError::NameInUse {
                name: self.name.clone(),
            });
        }
        let spawn_error = |source| WireguardError::Spawn {
            program: "wireguard-go",
            source,
        };
        let stderr = match log {
            Some(path) => Stdio::from(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .map_err(spawn_error)?,
            ),
            None => Stdio::piped(),
        };
        let mut command = Command::new("wireguard-go");
        command
            .args(["-f", &self.name])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        let child = netns::spawn(self.netns.as_deref(), &mut command)?.map_err(spawn_error)?;
        let socket = self.socket_path();
        let child = self.userspace.insert(child);
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        while !socket.exists() {
            if let Ok(Some(_)) = child.try_wait() {
                let mut stderr = String::new();
                if let Some(mut pipe) = child.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut pipe, &mut stderr);
                } else if let Some(path) = log {
                    stderr = std::fs::read_to_string(path).unwrap_or_default();
                }
                self.userspace = None;
                return Err(WireguardError::UserspaceExited {
                    name: self.name.clone(),
                    stderr: stderr.trim().to_string(),
                });
            }
            if Instant::now() > deadline {
                return Err(WireguardError::UserspaceTimeout {
                    name: self.name.clone(),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Adds or updates a peer.
    pub fn set_peer(&self, peer: &Peer) -> Result<(), WireguardError> {
        run_wg(
            self.netns.as_deref(),
            &peer_arguments(&self.name, peer),
            None,
        )
        .map(drop)
    }

    /// Removes a peer; absent is fine.
    pub fn remove_peer(&self, public_key: &PublicKey) -> Result<(), WireguardError> {
        let args = [
            "set".to_string(),
            self.name.clone(),
            "peer".into(),
            public_key.to_string(),
            "remove".into(),
        ];
        run_wg(self.netns.as_deref(), &args, None).map(drop)
    }

    /// The peers as configured now (`wg show <name> dump`).
    pub fn peers(&self) -> Result<Vec<Peer>, WireguardError> {
        let args = ["show".to_string(), self.name.clone(), "dump".into()];
        parse_dump(&run_wg(self.netns.as_deref(), &args, None)?)
    }

    /// Bytes exchanged with each peer.
    pub fn transfer(&self) -> Result<Vec<PeerTransfer>, WireguardError> {
        let args = ["show".to_string(), self.name.clone(), "transfer".into()];
        parse_transfer(&run_wg(self.netns.as_deref(), &args, None)?)
    }

    /// Makes dropping this value leave the interface running, like
    /// [`WireguardInterface::detach`], while keeping it usable.
    pub fn keep_on_drop(&mut self) {
        self.detached = true;
    }

    /// Leaves the interface running after this value is dropped (the agent
    /// restarting must not cut pod traffic). Remove it later with
    /// [`remove_interface`].
    pub fn detach(mut self) {
        self.detached = true;
    }

    /// Tears the interface down: deletes the link (wireguard-go exits when
    /// its device goes) and reaps the daemon.
    pub fn down(mut self) -> Result<(), WireguardError> {
        self.teardown()
    }

    fn teardown(&mut self) -> Result<(), WireguardError> {
        let result = remove_interface(&self.name, self.netns.as_deref());
        if let Some(mut child) = self.userspace.take() {
            let deadline = Instant::now() + Duration::from_secs(2);
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        result
    }
}

impl Drop for WireguardInterface {
    fn drop(&mut self) {
        if !self.detached {
            let _ = self.teardown();
        }
    }
}

/// Whether a wireguard-go daemon answers on `socket`.
fn socket_is_live(socket: &Path) -> bool {
    std::os::unix::net::UnixStream::connect(socket).is_ok()
}

/// Removes wireguard-go's control socket for `name` once no daemon
/// answers on it (one killed without its cleanup), waiting up to
/// `patience` for a dying daemon to let go; a live one stays.
pub fn remove_stale_socket(name: &str, patience: Duration) {
    if validate_name(name).is_err() {
        return;
    }
    let socket = Path::new(USERSPACE_SOCKET_DIR).join(format!("{name}.sock"));
    let deadline = Instant::now() + patience;
    while socket.exists() {
        if !socket_is_live(&socket) {
            let _ = std::fs::remove_file(&socket);
            return;
        }
        if Instant::now() >= deadline {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Deletes WireGuard interface `name` in `netns` (or here); absent is fine.
/// Synchronous (it runs `ip link del`) so it can run from `Drop`.
pub fn remove_interface(name: &str, netns: Option<&Path>) -> Result<(), WireguardError> {
    validate_name(name)?;
    let mut command = Command::new("ip");
    command
        .args(["link", "del", "dev", name])
        .stderr(Stdio::null());
    netns::output(netns, &mut command)?.map_err(|source| WireguardError::Spawn {
        program: "ip",
        source,
    })?;
    Ok(())
}

mod dump;
pub use dump::parse_dump;

#[cfg(test)]
mod tests;

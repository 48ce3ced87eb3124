//! A VM's live migration, the node steps of its `migrate` workflow on both
//! ends. The scheduler has bound the VM to the target already
//! (`scheduler/rebind`, `status.migration.from` names the source), so the
//! target's steps are the bound node's and the source's are owned by
//! `migration-source` (this agent when it is `status.migration.from`).
//!
//! - target `node/prepare-incoming`: empty disks of the VM's sizes, QEMU
//!   started with `-incoming unix:DATA/vms/UID/incoming.sock` (waiting,
//!   the guest not booted), and a one-connection TCP relay on the node's
//!   address to that socket; the step's note names the endpoint and a
//!   one-time key. The relay carries only a connection that opens with
//!   that key (anyone else who connects is logged and dropped), so no
//!   other machine can feed the waiting QEMU a guest of its own.
//! - source `node/copy-disk`: a unix socket relayed to that endpoint,
//!   QEMU's block migration started into it; done when the disks are
//!   copied. `node/migrate-ram`: done when QEMU reports the migration
//!   completed (its note carries the guest's downtime).
//! - target `node/switch-over`: done when the target's QEMU runs the guest.
//! - source `node/cleanup-source`: QEMU quit, tap, files and disks removed,
//!   the VM forgotten here.
//!
//! QEMU runs inside the VM's network namespace, which has no address of
//! its own (it is bridged to the guest), so QEMU speaks unix sockets and
//! the agents, in the nodes' own namespaces, carry the bytes between the
//! nodes over the node network.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use corral_api::Object;
use corral_runtime::vm::migration::{self, MigrationInfo, Progress};
use corral_runtime::vm::process;
use corral_runtime::vm::qmp::{Monitor, QmpClient, QmpError, RunState};
use corral_workflow::{MIGRATION_SOURCE_OWNER, VmStep};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};

use super::workload::{VmWorkload, typed_spec};
use crate::steps::NodeWork;

/// How often a migration's progress is asked.
const POLL: Duration = Duration::from_millis(250);
/// How long the source tries to reach the target.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the target's QEMU may take to listen.
const INCOMING_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the target's relay waits for the source.
const ACCEPT_TIMEOUT: Duration = Duration::from_secs(1_800);
/// The words before the target's endpoint in its step note.
const ENDPOINT_WORDS: &str = "the source sends it to ";
/// The words before the relay's one-time key in the same note.
const KEY_WORDS: &str = " with key ";
/// The words before the guest's IPv4 egress address in the source's
/// `node/copy-disk` note.
const IPV4_WORDS: &str = "; the guest's IPv4 egress address is ";
/// The key's length in bytes (sent raw; hex in the note).
const KEY_BYTES: usize = 32;
/// How long a connection to the target's relay may take to send the key.
const KEY_TIMEOUT: Duration = Duration::from_secs(10);
const MIB: u64 = 1024 * 1024;

/// The node a VM migrates (or last migrated) from: `status.migration.from`.
pub fn migrated_from(vm: &Object) -> Option<&str> {
    vm.status.get("migration")?.get("from")?.as_str()
}

/// The endpoint a target's `node/prepare-incoming` note names.
pub fn endpoint_in(note: &str) -> Option<SocketAddr> {
    note.rsplit_once(ENDPOINT_WORDS)?
        .1
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The relay's key a target's `node/prepare-incoming` note names.
pub fn key_in(note: &str) -> Option<[u8; KEY_BYTES]> {
    let text = note.rsplit_once(KEY_WORDS)?.1.split_whitespace().next()?;
    hex::decode(text).ok()?.try_into().ok()
}

/// The guest's IPv4 egress address a source's `node/copy-disk` note names.
pub fn ipv4_in(note: &str) -> Option<Ipv4Addr> {
    note.rsplit_once(IPV4_WORDS)?
        .1
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// What the target's `node/switch-over` note says of IPv4 egress: the
/// guest was told `guest` at boot (on the source), this node gave the VM
/// `here`. A running guest cannot be told another address.
pub fn ipv4_after_move(guest: Option<Ipv4Addr>, here: Option<Ipv4Addr>) -> Option<String> {
    let guest = guest?;
    Some(match here {
        Some(here) if here == guest => format!("it keeps its IPv4 egress address {guest}"),
        Some(here) => format!(
            "its IPv4 egress does not work until its next boot: the guest keeps {guest} from its boot, which a workload here holds, and this node gave the VM {here}"
        ),
        None => format!(
            "its IPv4 egress does not work here: this node gives no IPv4 egress (the guest keeps {guest} from its boot)"
        ),
    })
}

/// A fresh one-time key for the target's relay.
fn new_key() -> [u8; KEY_BYTES] {
    rand::random()
}

/// Whether `presented` is `key`, in time independent of where they differ.
fn same_key(presented: &[u8; KEY_BYTES], key: &[u8; KEY_BYTES]) -> bool {
    presented
        .iter()
        .zip(key)
        .fold(0u8, |diff, (a, b)| diff | (a ^ b))
        == 0
}

/// Runs `call` on a fresh QMP connection at `socket` (a blocking task).
async fn qmp<T: Send + 'static>(
    socket: PathBuf,
    call: impl FnOnce(&mut QmpClient) -> Result<T, QmpError> + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(move || {
        let mut client = QmpClient::connect(&socket)?;
        call(&mut client)
    })
    .await
    .map_err(|e| e.to_string())?
    .map_err(|e| crate::chain(&e))
}

/// The first connection to `listener` that opens with `key`, within
/// [`ACCEPT_TIMEOUT`]; others are logged and dropped.
async fn accept_keyed(
    listener: &TcpListener,
    key: &[u8; KEY_BYTES],
) -> Option<(TcpStream, SocketAddr)> {
    let deadline = tokio::time::Instant::now() + ACCEPT_TIMEOUT;
    loop {
        let (mut tcp, peer) = match tokio::time::timeout_at(deadline, listener.accept()).await {
            Ok(Ok(accepted)) => accepted,
            Ok(Err(error)) => {
                tracing::warn!(%error, "migration relay: accept failed");
                continue;
            }
            Err(_) => {
                tracing::warn!("migration relay: no source came");
                return None;
            }
        };
        let mut presented = [0u8; KEY_BYTES];
        let read = tokio::time::timeout(KEY_TIMEOUT, tcp.read_exact(&mut presented)).await;
        if matches!(read, Ok(Ok(_))) && same_key(&presented, key) {
            return Some((tcp, peer));
        }
        tracing::warn!(%peer, "migration relay: refused a connection without the migration's key");
    }
}

/// The target's relay: the source's connection (the first to present
/// `key`), carried to the waiting QEMU's socket.
async fn receive(listener: TcpListener, key: [u8; KEY_BYTES], socket: PathBuf) {
    let Some((mut tcp, peer)) = accept_keyed(&listener, &key).await else {
        return;
    };
    drop(listener);
    let _ = tcp.set_nodelay(true);
    let mut unix = match UnixStream::connect(&socket).await {
        Ok(unix) => unix,
        Err(error) => {
            tracing::warn!(%error, socket = %socket.display(), "migration relay: QEMU does not listen");
            return;
        }
    };
    match tokio::io::copy_bidirectional(&mut tcp, &mut unix).await {
        Ok((sent, received)) => {
            tracing::info!(%peer, received = sent, sent = received, "migration stream received")
        }
        Err(error) => tracing::warn!(%peer, %error, "migration stream broke"),
    }
}

/// Opens the source's connection to the target's relay: the key first.
async fn connect_keyed(endpoint: SocketAddr, key: &[u8; KEY_BYTES]) -> Result<TcpStream, String> {
    let mut tcp = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(endpoint))
        .await
        .map_err(|_| format!("the target {endpoint} did not answer within {CONNECT_TIMEOUT:?}"))?
        .map_err(|error| format!("cannot reach the target {endpoint}: {error}"))?;
    tcp.write_all(key)
        .await
        .map_err(|error| format!("cannot send the migration's key to {endpoint}: {error}"))?;
    Ok(tcp)
}

/// The source's relay: QEMU's one connection to `listener`, carried to
/// the target over `tcp`.
async fn send(listener: UnixListener, mut tcp: TcpStream) {
    let mut unix = match tokio::time::timeout(CONNECT_TIMEOUT, listener.accept()).await {
        Ok(Ok((unix, _))) => unix,
        _ => {
            tracing::warn!("migration relay: QEMU did not connect");
            return;
        }
    };
    let _ = tcp.set_nodelay(true);
    match tokio::io::copy_bidirectional(&mut unix, &mut tcp).await {
        Ok((sent, _)) => tracing::info!(sent, "migration stream sent"),
        Err(error) => tracing::warn!(%error, "migration stream broke"),
    }
}

impl VmWorkload {
    /// Whether the VM is bound to this node (`status.node`).
    pub(super) fn bound_here(&self) -> bool {
        self.desired.status.get("node").and_then(|n| n.as_str())
            == Some(self.ctx.agent.node.as_str())
    }

    /// Whether this agent executes `owner`'s steps of this VM: the bound
    /// node's when it is bound here, a migration source's when it is
    /// `status.migration.from`.
    pub(super) fn acts_as(&self, owner: &str) -> bool {
        if owner == MIGRATION_SOURCE_OWNER {
            migrated_from(&self.desired) == Some(self.ctx.agent.node.as_str())
        } else {
            self.bound_here()
        }
    }

    fn stop_relay(&mut self) {
        if let Some(relay) = self.relay.take() {
            relay.abort();
        }
    }

    async fn query_migration(&self) -> Result<MigrationInfo, String> {
        qmp(self.qmp_socket(), migration::query).await
    }

    /// Target, `node/prepare-incoming`: empty disks, QEMU waiting for the
    /// guest, the relay listening on the node's address.
    pub(super) async fn prepare_incoming(&mut self) -> Result<String, String> {
        let address = self
            .ctx
            .migration_address
            .ok_or("this node has no address (agent --address) to receive a migration on")?;
        // A QEMU left waiting by an earlier attempt is replaced.
        self.stop_relay();
        if let Some(pid) = self.record.pid.take() {
            process::signal(pid, nix::sys::signal::Signal::SIGKILL)
                .map_err(|e| crate::chain(&e))?;
        }
        let disks = self
            .ensure_disk()
            .await?
            .unwrap_or_else(|| "no disk".into());
        let mut config = self.config().await?;
        let socket = self.ctx.vm_dir(&self.uid()).join("incoming.sock");
        let _ = std::fs::remove_file(&socket);
        config.incoming = Some(socket.clone());
        let (pid, offset) = self.spawn_qemu(config).await?;
        self.record.pid = Some(pid);
        self.record.started_at = Some(chrono::Utc::now());
        self.record.console_offset = offset;
        self.record.booted = false;
        self.record.migrated_away = false;
        self.released = false;
        self.incoming = true;
        self.save();
        // QEMU makes its socket a moment after it starts.
        let waited = std::time::Instant::now();
        while !socket.exists() {
            if let Some(code) = process::exit_status(pid) {
                self.record.pid = None;
                self.incoming = false;
                self.save();
                return Err(format!(
                    "QEMU exited (code {code:?}) before it listened for the guest"
                ));
            }
            if waited.elapsed() > INCOMING_TIMEOUT {
                return Err(format!(
                    "QEMU did not listen on {} within {INCOMING_TIMEOUT:?}",
                    socket.display()
                ));
            }
            tokio::time::sleep(POLL).await;
        }
        let listener = TcpListener::bind(SocketAddr::new(address, 0))
            .await
            .map_err(|error| format!("cannot listen on {address} for the migration: {error}"))?;
        let endpoint = listener
            .local_addr()
            .map_err(|error| format!("the migration listener has no address: {error}"))?;
        let key = new_key();
        self.relay = Some(tokio::spawn(receive(listener, key, socket)));
        tracing::info!(vm = %self.key(), pid, %endpoint, "waiting for a live migration");
        Ok(format!(
            "QEMU pid {pid} waits for the guest ({disks}); {ENDPOINT_WORDS}{endpoint}{KEY_WORDS}{}",
            hex::encode(key)
        ))
    }

    /// Source, `node/copy-disk`: starts the migration to the endpoint the
    /// target named and waits until the disks are copied.
    pub(super) async fn copy_disk(&mut self, work: &NodeWork) -> Result<String, String> {
        let incoming = work.note_of(VmStep::PrepareIncoming.as_str());
        let endpoint = incoming
            .and_then(endpoint_in)
            .ok_or("the target's node/prepare-incoming names no endpoint to send the guest to")?;
        let key = incoming
            .and_then(key_in)
            .ok_or("the target's node/prepare-incoming names no key for its relay")?;
        if self.record.pid.is_none() {
            return Err("QEMU does not run on this node: there is no guest to send".into());
        }
        let started = self.query_migration().await?;
        if matches!(
            migration::progress(&started),
            Progress::NotStarted | Progress::Failed(_)
        ) {
            let out = self.ctx.vm_dir(&self.uid()).join("migrate-out.sock");
            let _ = std::fs::remove_file(&out);
            let listener = UnixListener::bind(&out)
                .map_err(|error| format!("cannot listen on {}: {error}", out.display()))?;
            // QEMU, under the VM's own uid, connects to it.
            self.hand_to_qemu(&out)?;
            let tcp = connect_keyed(endpoint, &key).await?;
            self.stop_relay();
            self.relay = Some(tokio::spawn(send(listener, tcp)));
            qmp(self.qmp_socket(), move |client| {
                migration::start(client, &out)
            })
            .await?;
            tracing::info!(vm = %self.key(), %endpoint, "live migration started");
        }
        // QEMU stops reporting the disks once they are copied: the most
        // seen is what went.
        let mut disk = 0;
        loop {
            tokio::time::sleep(POLL).await;
            let info = self.query_migration().await?;
            disk = disk.max(info.disk.map_or(0, |d| d.transferred.max(d.total)));
            match migration::progress(&info) {
                Progress::CopyingDisk { .. } => continue,
                Progress::SendingMemory { .. } | Progress::Completed { .. } => {
                    let ipv4 = self
                        .record
                        .egress_ipv4
                        .map(|address| format!("{IPV4_WORDS}{address}"))
                        .unwrap_or_default();
                    return Ok(format!(
                        "{} MiB of disk copied to {endpoint} while the guest ran{ipv4}",
                        disk.div_ceil(MIB)
                    ));
                }
                Progress::Failed(why) => return Err(format!("QEMU's migration failed: {why}")),
                Progress::NotStarted => return Err("QEMU reports no migration".into()),
            }
        }
    }

    /// Source, `node/migrate-ram`: waits until QEMU reports the migration
    /// completed; the note carries the guest's downtime.
    pub(super) async fn migrate_ram(&mut self) -> Result<String, String> {
        loop {
            let info = self.query_migration().await?;
            match migration::progress(&info) {
                Progress::Completed {
                    downtime_ms,
                    total_ms,
                } => {
                    let ram = info.ram.map_or(0, |r| r.transferred);
                    tracing::info!(vm = %self.key(), downtime_ms, total_ms, "live migration completed");
                    return Ok(format!(
                        "downtime {downtime_ms} ms; migration {total_ms} ms in all, {} MiB of memory sent; the guest is paused here for good",
                        ram.div_ceil(MIB)
                    ));
                }
                Progress::Failed(why) => return Err(format!("QEMU's migration failed: {why}")),
                Progress::NotStarted => return Err("QEMU reports no migration".into()),
                Progress::CopyingDisk { .. } | Progress::SendingMemory { .. } => {
                    tokio::time::sleep(POLL).await;
                }
            }
        }
    }

    /// Target, `node/switch-over`: waits until the QEMU that received the
    /// guest runs it; the VM's revision is then admitted here. The note
    /// says whether the guest kept its IPv4 egress address.
    pub(super) async fn switch_over(&mut self, work: &NodeWork) -> Result<String, String> {
        let pid = self
            .record
            .pid
            .ok_or("no QEMU waits for the guest on this node")?;
        loop {
            if let Some(code) = process::exit_status(pid) {
                self.record.pid = None;
                self.record.last_exit = code;
                self.incoming = false;
                self.save();
                return Err(format!(
                    "the target's QEMU exited (code {code:?}) before the guest ran here"
                ));
            }
            let state = qmp(self.qmp_socket(), |client| client.query_status()).await;
            if let Ok(status) = state
                && status.status == RunState::Running
            {
                break;
            }
            tokio::time::sleep(POLL).await;
        }
        self.stop_relay();
        self.incoming = false;
        self.record.booted = true;
        self.record.vm = self.desired.clone();
        self.record.admitted_revision = self.desired.metadata.revision;
        self.save();
        let guest = work.note_of(VmStep::CopyDisk.as_str()).and_then(ipv4_in);
        let ipv4 = ipv4_after_move(guest, self.record.egress_ipv4)
            .map(|said| format!("; {said}"))
            .unwrap_or_default();
        Ok(format!(
            "the guest runs on {} (QEMU pid {pid}) without a reboot{ipv4}",
            self.ctx.agent.node
        ))
    }

    /// Source, `node/cleanup-source`: QEMU (paused for good) quit, the
    /// VM's tap, files and disks removed, the VM forgotten on this node.
    pub(super) async fn cleanup_source(&mut self) -> Result<String, String> {
        self.stop_relay();
        let stopped = match self.record.pid {
            Some(pid) => {
                let qmp = self.qmp_socket();
                tokio::task::spawn_blocking(move || process::stop(pid, &qmp, Duration::ZERO))
                    .await
                    .map_err(|e| e.to_string())?
                    .map_err(|e| crate::chain(&e))?
                    .to_string()
            }
            None => "was not running".to_string(),
        };
        self.record.pid = None;
        self.record.migrated_away = true;
        self.save();
        self.remove_network().await?;
        let spec = typed_spec(&self.desired).ok_or("the VM's spec does not decode")?;
        // The disks now live on the target: a `local` volume's copy here
        // is stale.
        let volume_disks: Vec<PathBuf> = spec
            .disk
            .iter()
            .filter_map(|disk| disk.volume.as_ref())
            .chain(spec.data_disks.iter().filter_map(|d| d.volume.as_ref()))
            .map(|volume| self.ctx.volumes_dir.join(volume).join("disk.qcow2"))
            .collect();
        for path in &volume_disks {
            match std::fs::remove_file(path) {
                Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
                    return Err(format!("cannot remove {}: {error}", path.display()));
                }
                _ => {}
            }
        }
        self.release_disk().await?;
        if let Err(error) = self.ctx.state.remove(&self.key()) {
            tracing::warn!(vm = %self.key(), error = %crate::chain(&error), "cannot forget the VM");
        }
        Ok(format!(
            "QEMU on {} {stopped}; its tap, files and disks are removed",
            self.ctx.agent.node
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_guests_ipv4_address_travels_in_the_sources_note() {
        let note =
            format!("9 MiB of disk copied to [fd00::1]:7 while the guest ran{IPV4_WORDS}10.87.0.9");
        assert_eq!(ipv4_in(&note), Some(Ipv4Addr::new(10, 87, 0, 9)));
        assert_eq!(ipv4_in("9 MiB of disk copied"), None);
        let (a, b) = (Ipv4Addr::new(10, 87, 0, 9), Ipv4Addr::new(10, 87, 0, 2));
        assert_eq!(ipv4_after_move(None, Some(b)), None);
        let kept = ipv4_after_move(Some(a), Some(a)).expect("a note");
        assert!(
            kept.contains("keeps its IPv4 egress address 10.87.0.9"),
            "{kept}"
        );
        let lost = ipv4_after_move(Some(a), Some(b)).expect("a note");
        assert!(lost.contains("does not work until its next boot"), "{lost}");
        assert!(lost.contains("10.87.0.2"), "{lost}");
        let none = ipv4_after_move(Some(a), None).expect("a note");
        assert!(none.contains("gives no IPv4 egress"), "{none}");
    }

    #[test]
    fn the_target_endpoint_travels_in_its_note() {
        let note =
            format!("QEMU pid 7 waits for the guest (created x); {ENDPOINT_WORDS}[fd00::1]:40123");
        assert_eq!(
            endpoint_in(&note),
            Some("[fd00::1]:40123".parse().expect("an address"))
        );
        assert_eq!(
            endpoint_in(&format!("{ENDPOINT_WORDS}10.0.0.2:7")),
            Some("10.0.0.2:7".parse().expect("an address"))
        );
        assert_eq!(endpoint_in("QEMU pid 7 waits"), None);
        assert_eq!(endpoint_in(&format!("{ENDPOINT_WORDS}nowhere")), None);
    }

    #[test]
    fn the_relay_key_travels_in_the_same_note() {
        let key = new_key();
        let note = format!(
            "QEMU pid 7 waits for the guest (created x); {ENDPOINT_WORDS}[fd00::1]:40123{KEY_WORDS}{}",
            hex::encode(key)
        );
        assert_eq!(
            endpoint_in(&note),
            Some("[fd00::1]:40123".parse().expect("an address"))
        );
        assert_eq!(key_in(&note), Some(key));
        assert_ne!(new_key(), key, "a key is drawn for every migration");
        assert_eq!(key_in(&format!("{ENDPOINT_WORDS}[fd00::1]:1")), None);
        assert_eq!(key_in(&format!("{KEY_WORDS}abcd")), None, "too short");
    }

    /// The target's relay carries only a connection that opens with the
    /// migration's key to QEMU's socket; one without it reaches nothing
    /// and does not use up the relay.
    #[tokio::test]
    async fn the_relay_carries_only_the_keyed_connection() {
        let dir = tempfile::tempdir().expect("temp dir");
        let socket = dir.path().join("incoming.sock");
        let qemu = UnixListener::bind(&socket).expect("QEMU's socket");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("relay");
        let endpoint = listener.local_addr().expect("address");
        let key = new_key();
        let relay = tokio::spawn(receive(listener, key, socket));

        let mut stranger = TcpStream::connect(endpoint).await.expect("connect");
        stranger
            .write_all(&[7u8; KEY_BYTES])
            .await
            .expect("wrong key");
        stranger
            .write_all(b"a guest of my own")
            .await
            .expect("payload");
        let mut answer = Vec::new();
        let closed =
            tokio::time::timeout(Duration::from_secs(10), stranger.read_to_end(&mut answer))
                .await
                .expect("the relay drops a connection with the wrong key");
        assert!(closed.is_err() || answer.is_empty(), "{answer:?}");

        let mut source = connect_keyed(endpoint, &key)
            .await
            .expect("the source connects");
        source.write_all(b"the guest").await.expect("payload");
        drop(source);
        let (mut received, _) = tokio::time::timeout(Duration::from_secs(10), qemu.accept())
            .await
            .expect("the keyed connection reaches QEMU")
            .expect("accept");
        let mut bytes = Vec::new();
        received.read_to_end(&mut bytes).await.expect("read");
        assert_eq!(bytes, b"the guest", "only the source's bytes reach QEMU");
        drop(received);
        tokio::time::timeout(Duration::from_secs(10), relay)
            .await
            .expect("the relay ends with its stream")
            .expect("relay task");
    }
}

//! A lab: N "nodes" on one machine, each a network namespace, all joined by
//! a bridge that lives in the lab's own hub namespace. The basis of
//! `corral lab up/down` and of this crate's integration tests.
//!
//! ```text
//!  <dir>/hub     br0 ── n0 ─┐  n1 ─┐  ...
//!  <dir>/node-0             └ eth0 <v6 prefix>::1/64, <v4 subnet>.1/24
//!  <dir>/node-1                   └ eth0 <v6 prefix>::2/64, <v4 subnet>.2/24
//! ```
//!
//! Every namespace is a file under the lab's directory, so [`remove`] can
//! tear a lab down from another process (`corral lab down`): it kills every
//! process still inside a lab namespace, then unmounts and deletes them;
//! the links die with their namespaces. [`Lab`] does the same on drop.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use ipnet::{Ipv4Net, Ipv6Net};
use rtnetlink::{Handle, LinkBridge, LinkUnspec, LinkVeth};

use crate::datapath::netlink::{add_address, link_index, set_up, write_sysctl};
use crate::datapath::{self, DatapathError, netlink::netlink_error};
use crate::netns::{self, NetnsError};

/// Name of the hub namespace file inside a lab directory.
pub const HUB: &str = "hub";
/// The bridge in the hub namespace.
pub const BRIDGE: &str = "br0";
/// Each node's interface on the bridge.
pub const UPLINK: &str = "eth0";

/// Why a lab could not be built or removed.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error(transparent)]
    Datapath(#[from] DatapathError),
    #[error("lab network {what} {net} is too small for {hosts} hosts")]
    TooSmall {
        what: &'static str,
        net: String,
        hosts: usize,
    },
    #[error(
        "lab host name {name:?} is invalid or taken: expected letters, digits and '-', unique, not {HUB:?}"
    )]
    HostName { name: String },
    #[error("read lab directory {path}")]
    ReadDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// What to build.
#[derive(Debug, Clone)]
pub struct LabConfig {
    /// Directory holding the namespace files, unique per lab
    /// (e.g. `/run/corral/lab/<id>`).
    pub dir: PathBuf,
    /// Node count; nodes are called `node-0` … `node-<N-1>`.
    pub nodes: usize,
    /// The bridge's IPv6 /64 (a ULA of the lab's own).
    pub ipv6: Ipv6Net,
    /// The bridge's private IPv4 /24, used only inside these namespaces.
    pub ipv4: Ipv4Net,
}

/// One namespace on the lab bridge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabHost {
    pub name: String,
    pub netns: PathBuf,
    /// Its interface on the bridge ([`UPLINK`]).
    pub uplink: String,
    pub ipv6: Ipv6Addr,
    pub ipv4: Ipv4Addr,
}

/// A running lab; dropping it removes everything it made.
#[derive(Debug)]
pub struct Lab {
    config: LabConfig,
    hub: Handle,
    nodes: Vec<LabHost>,
    extra: Vec<LabHost>,
    removed: bool,
}

impl Lab {
    /// Builds the hub, the bridge and `config.nodes` nodes.
    pub async fn up(config: LabConfig) -> Result<Lab, LabError> {
        let hub_path = config.dir.join(HUB);
        let hub = match netns::create(&hub_path) {
            Ok(()) => datapath::connect(Some(&hub_path)).await,
            Err(e) => Err(e.into()),
        };
        let hub = match hub {
            Ok(hub) => hub,
            Err(e) => {
                let _ = remove(&config.dir);
                return Err(e.into());
            }
        };
        // From here on a failure drops `lab`, which removes what exists.
        let mut lab = Lab {
            config,
            hub,
            nodes: Vec::new(),
            extra: Vec::new(),
            removed: false,
        };
        lab.create_bridge(&hub_path).await?;
        for index in 0..lab.config.nodes {
            let host = lab.attach(&format!("node-{index}")).await?;
            lab.nodes.push(host);
        }
        Ok(lab)
    }

    /// The nodes, in order.
    pub fn nodes(&self) -> &[LabHost] {
        &self.nodes
    }

    /// The lab's directory.
    pub fn dir(&self) -> &Path {
        &self.config.dir
    }

    /// Adds another namespace on the bridge (e.g. an "outside" host).
    pub async fn add_host(&mut self, name: &str) -> Result<LabHost, LabError> {
        let valid = !name.is_empty()
            && name != HUB
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
            && !self.hosts().any(|h| h.name == name);
        if !valid {
            return Err(LabError::HostName {
                name: name.to_string(),
            });
        }
        let host = self.attach(name).await?;
        self.extra.push(host.clone());
        Ok(host)
    }

    fn hosts(&self) -> impl Iterator<Item = &LabHost> {
        self.nodes.iter().chain(&self.extra)
    }

    async fn create_bridge(&self, hub_path: &Path) -> Result<(), LabError> {
        let hub_ns = Some(hub_path);
        self.hub
            .link()
            .add(LinkBridge::new(BRIDGE).mcast_snooping(false).build())
            .execute()
            .await
            .map_err(netlink_error(format!("add bridge {BRIDGE}")))?;
        let bridge = link_index(&self.hub, BRIDGE, hub_ns).await?;
        set_up(&self.hub, bridge, BRIDGE).await?;
        let lo = link_index(&self.hub, "lo", hub_ns).await?;
        set_up(&self.hub, lo, "lo").await?;
        Ok(())
    }

    /// Creates namespace `name` with a veth onto the bridge and addresses.
    async fn attach(&mut self, name: &str) -> Result<LabHost, LabError> {
        let ordinal = self.nodes.len() + self.extra.len() + 1;
        let host = LabHost {
            name: name.to_string(),
            netns: self.config.dir.join(name),
            uplink: UPLINK.to_string(),
            ipv6: nth_v6(self.config.ipv6, ordinal)?,
            ipv4: nth_v4(self.config.ipv4, ordinal)?,
        };
        let hub_path = self.config.dir.join(HUB);
        netns::create(&host.netns)?;
        let ns = Some(host.netns.as_path());
        write_sysctl(ns, "/proc/sys/net/ipv6/conf/default/accept_dad", "0")?;

        let port = format!("n{ordinal}");
        let peer = format!("n{ordinal}p");
        self.hub
            .link()
            .add(LinkVeth::new(&port, &peer).build())
            .execute()
            .await
            .map_err(netlink_error(format!(
                "add veth {port} for lab host {name}"
            )))?;
        let bridge = link_index(&self.hub, BRIDGE, Some(&hub_path)).await?;
        let port_index = link_index(&self.hub, &port, Some(&hub_path)).await?;
        self.hub
            .link()
            .set(
                LinkUnspec::new_with_index(port_index)
                    .controller(bridge)
                    .build(),
            )
            .execute()
            .await
            .map_err(netlink_error(format!("attach {port} to {BRIDGE}")))?;
        set_up(&self.hub, port_index, &port).await?;
        let peer_index = link_index(&self.hub, &peer, Some(&hub_path)).await?;
        let target = netns::open(&host.netns)?;
        self.hub
            .link()
            .set(
                LinkUnspec::new_with_index(peer_index)
                    .setns_by_fd(std::os::fd::AsRawFd::as_raw_fd(&target))
                    .build(),
            )
            .execute()
            .await
            .map_err(netlink_error(format!("move {peer} into lab host {name}")))?;
        drop(target);

        let handle = datapath::connect(ns).await?;
        let moved = link_index(&handle, &peer, ns).await?;
        handle
            .link()
            .set(LinkUnspec::new_with_index(moved).name(UPLINK).build())
            .execute()
            .await
            .map_err(netlink_error(format!(
                "rename {peer} to {UPLINK} in {name}"
            )))?;
        let lo = link_index(&handle, "lo", ns).await?;
        set_up(&handle, lo, "lo").await?;
        write_sysctl(
            ns,
            &format!("/proc/sys/net/ipv6/conf/{UPLINK}/accept_dad"),
            "0",
        )?;
        set_up(&handle, moved, UPLINK).await?;
        let v6_len = self.config.ipv6.prefix_len();
        add_address(&handle, moved, IpAddr::V6(host.ipv6), v6_len, UPLINK).await?;
        let v4_len = self.config.ipv4.prefix_len();
        add_address(&handle, moved, IpAddr::V4(host.ipv4), v4_len, UPLINK).await?;
        Ok(host)
    }

    /// Leaves the lab in place past this value (and this process): a later
    /// [`remove`] of its directory takes it down.
    pub fn keep(mut self) {
        self.removed = true;
    }

    /// Removes the lab now, reporting errors (drop does it silently).
    pub fn down(mut self) -> Result<(), LabError> {
        self.removed = true;
        remove(&self.config.dir)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if !self.removed {
            let _ = remove(&self.config.dir);
        }
    }
}

fn nth_v6(net: Ipv6Net, ordinal: usize) -> Result<Ipv6Addr, LabError> {
    let addr = u128::from(net.network()) + ordinal as u128;
    let candidate = Ipv6Addr::from(addr);
    if ordinal as u128 >= (1u128 << (128 - u32::from(net.prefix_len()))).saturating_sub(1)
        || !net.contains(&candidate)
    {
        return Err(LabError::TooSmall {
            what: "IPv6",
            net: net.to_string(),
            hosts: ordinal,
        });
    }
    Ok(candidate)
}

fn nth_v4(net: Ipv4Net, ordinal: usize) -> Result<Ipv4Addr, LabError> {
    let candidate = u32::from(net.network()).checked_add(ordinal as u32);
    match candidate.map(Ipv4Addr::from) {
        Some(addr) if addr < net.broadcast() => Ok(addr),
        _ => Err(LabError::TooSmall {
            what: "IPv4",
            net: net.to_string(),
            hosts: ordinal,
        }),
    }
}

/// Tears down the lab in `dir`: kills processes inside its namespaces,
/// unmounts and deletes every namespace file, removes the directory.
/// Absent labs are fine.
pub fn remove(dir: &Path) -> Result<(), LabError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(LabError::ReadDir {
                path: dir.to_path_buf(),
                source,
            });
        }
    };
    let mut first_error = None;
    for entry in entries.flatten() {
        let path = entry.path();
        kill_processes_in(&path);
        if let Err(e) = netns::delete(&path) {
            first_error.get_or_insert(LabError::from(e));
        }
    }
    let _ = std::fs::remove_dir(dir);
    first_error.map_or(Ok(()), Err)
}

/// SIGKILLs every process whose network namespace is the one at `path`.
pub fn kill_processes_in(path: &Path) {
    let Ok(target) = std::fs::metadata(path) else {
        return;
    };
    if !netns::exists(path) {
        return;
    }
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return;
    };
    let me = std::process::id();
    for entry in procs.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        if pid as u32 == me {
            continue;
        }
        let Ok(ns) = std::fs::metadata(entry.path().join("ns/net")) else {
            continue;
        };
        if ns.dev() == target.dev() && ns.ino() == target.ino() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_addresses_count_from_one() {
        let v6: Ipv6Net = "fd00:99::/64".parse().unwrap();
        assert_eq!(
            nth_v6(v6, 1).unwrap(),
            "fd00:99::1".parse::<Ipv6Addr>().unwrap()
        );
        let v4: Ipv4Net = "192.168.77.0/24".parse().unwrap();
        assert_eq!(nth_v4(v4, 3).unwrap(), Ipv4Addr::new(192, 168, 77, 3));
        assert!(matches!(nth_v4(v4, 255), Err(LabError::TooSmall { .. })));
        let tiny: Ipv6Net = "fd00:99::/127".parse().unwrap();
        assert!(matches!(nth_v6(tiny, 1), Err(LabError::TooSmall { .. })));
    }

    #[test]
    fn removing_an_absent_lab_is_fine() {
        remove(Path::new("/nonexistent/corral-lab-test")).unwrap();
    }
}

//! Shared helpers for the root-only integration tests: unique names, tool
//! checks that fail loudly, and sockets opened inside test namespaces.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use corral_net::lab::{Lab, LabConfig};
use corral_net::netns;

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A name unique to this process and call: `<prefix><pid>x<n>`.
pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}{}x{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// Fails (never skips) when not root or a tool is missing.
pub fn require_root_and_tools(tools: &[&str]) {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root (network namespaces, veths, nftables); run it as root"
    );
    for tool in tools {
        assert!(
            corral_runtime::find_binary(tool).is_some(),
            "this test needs `{tool}` on PATH; install it (see .ci)"
        );
    }
}

/// A fresh lab with `nodes` nodes under a unique directory.
pub async fn lab(nodes: usize) -> Lab {
    let dir = PathBuf::from("/run/corral/test-labs").join(unique("lab"));
    Lab::up(LabConfig {
        dir,
        nodes,
        ipv6: "fd00:1ab::/64".parse().expect("lab IPv6 prefix"),
        ipv4: "192.168.77.0/24".parse().expect("lab IPv4 subnet"),
    })
    .await
    .expect("build lab")
}

/// A TCP listener bound inside `ns`.
pub fn listen_in(ns: &Path, addr: SocketAddr) -> TcpListener {
    netns::run_in(ns, move || TcpListener::bind(addr))
        .expect("enter namespace")
        .expect("bind listener")
}

/// Connects from inside `ns`, sends a line, and returns the peer address the
/// listener saw, or the connect error.
pub fn connect_from(
    ns: &Path,
    listener: &TcpListener,
    to: SocketAddr,
) -> std::io::Result<SocketAddr> {
    let stream = netns::run_in(ns, move || {
        TcpStream::connect_timeout(&to, Duration::from_secs(3))
    })
    .expect("enter namespace")?;
    let mut stream = stream;
    stream.write_all(b"hello\n")?;
    listener.set_nonblocking(false)?;
    let (mut accepted, peer) = listener.accept()?;
    let mut buf = [0u8; 6];
    accepted.read_exact(&mut buf)?;
    assert_eq!(&buf, b"hello\n");
    Ok(peer)
}

//! Readiness and liveness probes: exec (a command in the container), TCP
//! (a connection to a port) and HTTP (a GET answered 2xx or 3xx), the
//! network ones made from inside the pod's network namespace on loopback,
//! so they need no route to the pod, or, for a pod on gVisor's own network
//! stack (whose loopback is inside the sandbox), to the pod's address from
//! the node. Blocking; run on the blocking pool.

use std::io::{Read, Write};
use std::net::{Ipv6Addr, SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

use corral_api::kinds::Probe;
use corral_runtime::oci::{ExecSpec, OciRuntime};

/// How long one probe may take.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// Seconds between probes when the probe names no period.
pub const DEFAULT_PERIOD_SECONDS: u32 = 2;
/// Failures in a row before a probe counts as failed, by default.
pub const DEFAULT_FAILURE_THRESHOLD: u32 = 3;

/// Where TCP and HTTP probes connect.
#[derive(Debug, Clone)]
pub enum ProbeTarget {
    /// Loopback inside the pod's network namespace.
    Loopback(std::path::PathBuf),
    /// The pod's address, from the node: a pod on gVisor's own network
    /// stack (its loopback is gVisor's); `None` when it has none.
    Address(Option<Ipv6Addr>),
}

/// Runs one probe; `Err` says why it failed.
pub fn run(
    probe: &Probe,
    runtime: &dyn OciRuntime,
    container_id: &str,
    target: &ProbeTarget,
) -> Result<(), String> {
    if let Some(exec) = &probe.exec {
        let spec = ExecSpec {
            args: exec.command.clone(),
            ..ExecSpec::default()
        };
        // The runtime tracks the exec'd child, so the orphan sweep leaves it
        // to us (it takes the spawn lock itself: never hold it here).
        let output = runtime
            .exec_output(container_id, &spec)
            .map_err(|error| format!("exec {:?}: {error}", exec.command))?;
        return if output.status.success() {
            Ok(())
        } else {
            Err(format!(
                "exec {:?} exited with {}: {}",
                exec.command,
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ))
        };
    }
    let (port, http_path) = match (&probe.tcp, &probe.http) {
        (Some(tcp), _) => (tcp.port, None),
        (None, Some(http)) => (http.port, Some(http.path.clone())),
        (None, None) => return Err("the probe names no exec, tcp or http check".into()),
    };
    match target {
        ProbeTarget::Loopback(netns) => run_in(netns, port, http_path),
        ProbeTarget::Address(Some(address)) => {
            connect(&[(*address, port).into()], port, http_path.as_deref())
        }
        ProbeTarget::Address(None) => Err(format!(
            "port {port} of a pod on gVisor's network stack is probed on the pod's address, and it has none (the node has no pod network)"
        )),
    }
}

fn run_in(netns: &Path, port: u16, http_path: Option<String>) -> Result<(), String> {
    let loopback: [SocketAddr; 2] = [
        ([127, 0, 0, 1], port).into(),
        ([0u16, 0, 0, 0, 0, 0, 0, 1], port).into(),
    ];
    corral_net::netns::run_in(netns, move || {
        connect(&loopback, port, http_path.as_deref())
    })
    .map_err(|error| format!("cannot enter the pod's network namespace: {error}"))?
}

fn connect(addresses: &[SocketAddr], port: u16, http_path: Option<&str>) -> Result<(), String> {
    let mut last_error = String::new();
    for address in addresses {
        match TcpStream::connect_timeout(address, PROBE_TIMEOUT) {
            Ok(stream) => return http_path.map_or(Ok(()), |path| http_get(stream, port, path)),
            Err(error) => last_error = format!("connect to port {port}: {error}"),
        }
    }
    Err(last_error)
}

fn http_get(mut stream: TcpStream, port: u16, path: &str) -> Result<(), String> {
    let _ = stream.set_read_timeout(Some(PROBE_TIMEOUT));
    let _ = stream.set_write_timeout(Some(PROBE_TIMEOUT));
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: localhost:{port}\r\nUser-Agent: corral-probe\r\n\r\n"
    )
    .map_err(|error| format!("send GET {path}: {error}"))?;
    let mut head = [0u8; 64];
    let read = stream
        .read(&mut head)
        .map_err(|error| format!("read the answer to GET {path}: {error}"))?;
    let line = String::from_utf8_lossy(&head[..read]);
    let status: Option<u16> = line
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok());
    match status {
        Some(code) if (200..400).contains(&code) => Ok(()),
        Some(code) => Err(format!("GET {path} answered {code}")),
        None => Err(format!("GET {path} got no HTTP answer")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn http_status_decides() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            for answer in [
                "HTTP/1.0 200 OK\r\n\r\n",
                "HTTP/1.0 503 Unavailable\r\n\r\n",
            ] {
                let (mut stream, _) = listener.accept().unwrap();
                // Read the whole request: closing with unread bytes would
                // reset the connection and lose the answer.
                let mut request = Vec::new();
                let mut buffer = [0u8; 256];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    let read = stream.read(&mut buffer).unwrap();
                    if read == 0 {
                        break;
                    }
                    request.extend_from_slice(&buffer[..read]);
                }
                stream.write_all(answer.as_bytes()).unwrap();
            }
        });
        let at: [SocketAddr; 1] = [([127, 0, 0, 1], port).into()];
        assert_eq!(connect(&at, port, Some("/")), Ok(()));
        assert_eq!(
            connect(&at, port, Some("/health")),
            Err("GET /health answered 503".to_string())
        );
        server.join().unwrap();
    }

    #[test]
    fn closed_ports_fail() {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let at: [SocketAddr; 1] = [([127, 0, 0, 1], port).into()];
        assert!(
            connect(&at, port, None)
                .unwrap_err()
                .contains("connect to port")
        );
    }

    #[test]
    fn a_gvisor_stack_pod_without_an_address_says_so() {
        let probe: Probe =
            serde_json::from_value(serde_json::json!({"tcp": {"port": 80}})).expect("probe");
        let runtime = corral_runtime::oci::RuncCli::new("runc", "/nonexistent");
        let error = run(&probe, &runtime, "c", &ProbeTarget::Address(None)).unwrap_err();
        assert!(error.contains("has none"), "{error}");
    }
}

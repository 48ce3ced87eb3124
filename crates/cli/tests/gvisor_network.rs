//! gVisor pods on gVisor's own network stack (netstack), end to end on
//! one node: a default gVisor pod serves and reaches over its IPv6 address
//! (from the host, from a runc pod, by DNS name), after an init container
//! and after a restart; runsc, not the kernel, holds its address (the
//! pod's namespace shows none on `eth0` while it answers); the host stack
//! is a two-party relaxation (`host-network-stack`) refused without a
//! Policy and shown by `explain-security`. Needs root, runc, runsc and
//! busybox-static; fails (never skips) without them.

#![allow(clippy::unwrap_used)]

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::Duration;

use common::{Cluster, wait_for};

/// A pod serving `/etc` on port 8080 with busybox httpd, ready once an
/// HTTP probe on that port is answered.
fn httpd_pod(name: &str, spec_extra: &str) -> String {
    format!(
        "kind: Pod
metadata: {{name: {name}}}
spec:
{spec_extra}  containers:
    - name: web
      image: local/busybox:1
      command: [httpd, -f, -p, \"8080\", -h, /etc]
      readiness: {{http: {{port: 8080, path: /passwd}}, periodSeconds: 1}}
"
    )
}

/// GET `/passwd` through `corral port-forward pod/NAME 0:8080`.
fn through_port_forward(cluster: &Cluster, name: &str) -> String {
    use std::io::BufRead;
    let mut child = Command::new(common::CORRAL)
        .args(["port-forward", &format!("pod/{name}"), "0:8080"])
        .env("CORRAL_CONFIG", &cluster.config)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    // "forwarding 127.0.0.1:PORT to pod/default/NAME port 8080"
    let port: Option<u16> = first
        .split_whitespace()
        .nth(1)
        .and_then(|address| address.rsplit(':').next())
        .and_then(|port| port.parse().ok());
    let answer = port.and_then(|port| {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .ok()?;
        stream.write_all(b"GET /passwd HTTP/1.0\r\n\r\n").ok()?;
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        Some(answer)
    });
    let _ = child.kill();
    let _ = child.wait();
    answer.unwrap_or_else(|| panic!("no port in {first:?}"))
}

/// The pod's address once it runs.
fn running_address(cluster: &Cluster, name: &str) -> String {
    wait_for(
        &format!("pod/{name} running with an address"),
        Duration::from_secs(90),
        || {
            let pod = cluster.get_json(&format!("pod/{name}"));
            (pod["status"]["phase"] == "Running"
                && pod["status"]["containers"][0]["state"] == "running")
                .then(|| pod["status"]["address"].as_str().map(str::to_string))
                .flatten()
        },
    )
}

/// GET `path` on `[address]:8080` from the test (the host), if answered.
fn get(address: &str, path: &str) -> Option<String> {
    let to: SocketAddr = format!("[{address}]:8080").parse().unwrap();
    let mut stream = TcpStream::connect_timeout(&to, Duration::from_secs(2)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\n\r\n").ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    let status = answer.lines().next().unwrap_or_default();
    (status.starts_with("HTTP/1.") && status.contains(" 200")).then_some(answer)
}

/// `wget` of `url` inside pod `name` (bounded by `timeout`).
fn fetch_in(cluster: &Cluster, name: &str, url: &str) -> Result<String, String> {
    let output = cluster.corral(&[
        "exec",
        &format!("pod/{name}"),
        "--",
        "busybox",
        "timeout",
        "10",
        "wget",
        "-qO-",
        url,
    ]);
    let text = String::from_utf8_lossy(&output.stdout).to_string();
    if output.status.success() {
        Ok(text)
    } else {
        Err(format!("{text}{}", String::from_utf8_lossy(&output.stderr)))
    }
}

/// The pid runsc reports for the pod's running container: its sandbox.
fn sandbox_pid(cluster: &Cluster, name: &str) -> u32 {
    let pod = cluster.get_json(&format!("pod/{name}"));
    let uid = pod["metadata"]["uid"].as_str().unwrap().to_string();
    let short: String = uid
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(12)
        .collect();
    let output = Command::new("runsc")
        .arg(format!(
            "--root={}",
            cluster.data_dir.path().join("runsc").display()
        ))
        .args(["list", "--format=json"])
        .output()
        .unwrap();
    let listed: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    listed
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| {
            c["status"] == "running" && c["id"].as_str().is_some_and(|id| id.contains(&short))
        })
        .and_then(|c| c["pid"].as_u64())
        .map(|pid| u32::try_from(pid).unwrap())
        .unwrap_or_else(|| panic!("no running runsc container of pod/{name} ({uid}): {listed}"))
}

/// The addresses the kernel has on `eth0` in the namespace of `pid`.
fn kernel_addresses(pid: u32) -> String {
    let output = Command::new("nsenter")
        .arg(format!("--net=/proc/{pid}/ns/net"))
        .args(["ip", "-o", "addr", "show", "dev", "eth0"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    String::from_utf8_lossy(&output.stdout).to_string()
}

fn sandbox_cmdline(pid: u32) -> String {
    String::from_utf8_lossy(&std::fs::read(format!("/proc/{pid}/cmdline")).unwrap())
        .replace('\0', " ")
}

#[test]
fn gvisor_pods_use_their_own_network_stack() {
    corral_testkit::require_tool("runsc");
    corral_testkit::require_tool("nsenter");
    let cluster = &common::start_node();
    wait_for("the node to report gVisor", Duration::from_secs(30), || {
        let node = cluster.ok(&["get", "node", "-o", "json"]);
        node.contains("\"gvisor\"").then_some(())
    });

    // A gVisor pod with an init container before its server: each is a
    // sandbox of its own, and the server's still finds the address.
    let boxed = httpd_pod(
        "boxed",
        "  runtime: gvisor
  initContainers:
    - name: first
      image: local/busybox:1
      command: ['true']
",
    );
    let client = httpd_pod("client", "");
    cluster.ok(&["apply", "-f", &cluster.manifest("boxed.yaml", &boxed)]);
    cluster.ok(&["apply", "-f", &cluster.manifest("client.yaml", &client)]);
    let address = running_address(cluster, "boxed");
    let client_address = running_address(cluster, "client");

    // Served over its address: to the host, to a runc pod, by DNS name;
    // and it reaches the runc pod.
    let answer = wait_for("boxed to answer the host", Duration::from_secs(20), || {
        get(&address, "/passwd")
    });
    assert!(answer.contains("root:"), "{answer}");
    let fetched = fetch_in(
        cluster,
        "client",
        &format!("http://[{address}]:8080/passwd"),
    )
    .unwrap();
    assert!(fetched.contains("root:"), "{fetched}");
    let by_name = wait_for(
        "boxed by DNS name from client",
        Duration::from_secs(20),
        || {
            fetch_in(
                cluster,
                "client",
                "http://boxed.default.pod.corral:8080/passwd",
            )
            .ok()
        },
    );
    assert!(by_name.contains("root:"), "{by_name}");
    let back = fetch_in(
        cluster,
        "boxed",
        &format!("http://[{client_address}]:8080/group"),
    )
    .unwrap();
    assert!(back.contains("root:"), "{back}");
    let resolved = wait_for(
        "a name resolved inside boxed",
        Duration::from_secs(20),
        || {
            fetch_in(
                cluster,
                "boxed",
                "http://client.default.pod.corral:8080/group",
            )
            .ok()
        },
    );
    assert!(resolved.contains("root:"), "{resolved}");

    // gVisor's stack holds the address, not the kernel: the namespace's
    // eth0 has none (runsc took them) while the sandbox's eth0 has it, and
    // the sandbox runs without `--network=host`.
    let pid = sandbox_pid(cluster, "boxed");
    let kernel = kernel_addresses(pid);
    assert!(!kernel.contains(&format!("{address}/")), "{kernel}");
    assert!(
        !kernel.contains("inet"),
        "the kernel keeps no address: {kernel}"
    );
    let inside = cluster.ok(&["exec", "pod/boxed", "--", "cat", "/proc/net/if_inet6"]);
    let hex: String = address
        .parse::<std::net::Ipv6Addr>()
        .unwrap()
        .octets()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert!(
        inside.contains(&hex),
        "gVisor's eth0 has {address}: {inside}"
    );
    assert!(
        !sandbox_cmdline(pid).contains("--network=host"),
        "{}",
        sandbox_cmdline(pid)
    );
    let explained = cluster.ok(&["explain-security", "pod/boxed"]);
    assert!(explained.contains("gVisor netstack"), "{explained}");

    // Probes and port-forward reach it on its address (its loopback is
    // gVisor's, not the namespace's).
    wait_for(
        "boxed ready by its HTTP probe",
        Duration::from_secs(20),
        || {
            let pod = cluster.get_json("pod/boxed");
            (pod["status"]["containers"][0]["ready"] == true).then_some(())
        },
    );
    let forwarded = through_port_forward(cluster, "boxed");
    assert!(forwarded.contains("root:"), "{forwarded}");

    // A restart starts a new sandbox: it finds the address again. (The
    // exec ends with the sandbox it runs in, so its status says nothing.)
    cluster.corral(&["exec", "pod/boxed", "--", "kill", "1"]);
    wait_for(
        "boxed restarted and answering",
        Duration::from_secs(60),
        || {
            let pod = cluster.get_json("pod/boxed");
            let restarted = pod["status"]["containers"][0]["restarts"].as_u64() >= Some(1)
                && pod["status"]["containers"][0]["state"] == "running";
            restarted.then(|| get(&address, "/passwd")).flatten()
        },
    );

    // Two long-running containers cannot share gVisor's stack.
    let two = "kind: Pod
metadata: {name: two}
spec:
  runtime: gvisor
  containers:
    - {name: a, image: local/busybox:1, command: [sleep, '3600']}
    - {name: b, image: local/busybox:1, command: [sleep, '3600']}
";
    let refused = cluster.fails(&["apply", "-f", &cluster.manifest("two.yaml", two)]);
    assert!(
        refused.contains("2 containers under gVisor") && refused.contains("host-network-stack"),
        "{refused}"
    );

    // The host stack is a relaxation: refused without a Policy, naming
    // the missing half; granted, the kernel keeps the address.
    let host = httpd_pod(
        "hoststack",
        "  runtime: gvisor
  security: {relax: [host-network-stack]}
",
    );
    let path = cluster.manifest("hoststack.yaml", &host);
    let refused = cluster.fails(&["apply", "-f", &path]);
    assert!(
        refused.contains(
            "pod asks for host-network-stack but no Policy grants it to namespace default"
        ),
        "{refused}"
    );
    common::grant(cluster, "kernel-stack", &["host-network-stack"]);
    cluster.ok(&["apply", "-f", &path]);
    let host_address = running_address(cluster, "hoststack");
    let answer = wait_for("hoststack to answer", Duration::from_secs(20), || {
        get(&host_address, "/passwd")
    });
    assert!(answer.contains("root:"), "{answer}");
    let pid = sandbox_pid(cluster, "hoststack");
    let kernel = kernel_addresses(pid);
    assert!(kernel.contains(&format!("{host_address}/")), "{kernel}");
    assert!(
        sandbox_cmdline(pid).contains("--network=host"),
        "{}",
        sandbox_cmdline(pid)
    );
    let explained = cluster.ok(&["explain-security", "pod/hoststack"]);
    assert!(
        explained.contains("host kernel (through the pod's namespace)")
            && explained.contains("Policy kernel-stack (host-network-stack)"),
        "{explained}"
    );
}

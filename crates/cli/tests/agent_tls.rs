//! End-to-end acceptance of the agent channel with a real `corral up`:
//! the agent serves logs and exec over TLS with the certificate the cluster
//! CA issued to its node, and lets in only the API server. `curl` plays
//! every other caller: plain HTTP, TLS without a client certificate, the
//! node's own certificate, the old shared secret — each refused before
//! any request is read. The certificate survives a restart, and a node
//! without one (it joined before) gets one on its next start. On a
//! two-node lab, one node's certificate does not open the other's agent.
//! Needs root, runc, curl, ip and busybox-static; fails (never skips)
//! without them.

#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use common::{Cluster, wait_for};

const POD: &str = "kind: Pod
metadata: {name: tls}
spec:
  containers:
    - name: main
      image: local/busybox:1
      command: [sh, -c, \"echo marker-9127; exec sleep 3600\"]
";

/// The node's name and the port of its agent endpoint, once the pod runs.
fn node_and_port(cluster: &Cluster) -> (String, u16) {
    let node = wait_for("pod/tls to run", Duration::from_secs(60), || {
        let pod = cluster.get_json("pod/tls");
        (pod["status"]["phase"] == "Running")
            .then(|| pod["status"]["node"].as_str().map(str::to_string))
            .flatten()
    });
    let endpoint = cluster.get_json(&format!("node/{node}"))["status"]["agentEndpoint"]
        .as_str()
        .unwrap()
        .to_string();
    let port = endpoint
        .strip_prefix("https://127.0.0.1:")
        .unwrap_or_else(|| panic!("the agent endpoint is https on loopback: {endpoint}"))
        .parse()
        .unwrap();
    (node, port)
}

/// `corral logs` and `exec` reach the pod (retried while the node comes back).
fn logs_and_exec_work(cluster: &Cluster) {
    wait_for(
        "logs through the agent channel",
        Duration::from_secs(30),
        || {
            let output = cluster.corral(&["logs", "pod/tls"]);
            String::from_utf8_lossy(&output.stdout)
                .contains("marker-9127")
                .then_some(())
        },
    );
    let said = cluster.ok(&["exec", "pod/tls", "--", "echo", "through-tls"]);
    assert_eq!(said.trim(), "through-tls");
}

fn kept_certificate(data_dir: &Path, node: &str) -> (PathBuf, serde_json::Value) {
    let path = data_dir.join("tls").join(format!("node-{node}.json"));
    let kept = wait_for("the node's certificate", Duration::from_secs(30), || {
        std::fs::read(&path)
            .ok()
            .and_then(|bytes| serde_json::from_slice::<serde_json::Value>(&bytes).ok())
    });
    (path, kept)
}

/// `curl` to the agent's `GET /v1/images` as node `node`'s name, with `extra` flags.
fn curl(data_dir: &Path, node: &str, port: u16, scheme: &str, extra: &[&str]) -> Output {
    let name = format!("{node}.node.corral");
    Command::new("curl")
        .args(["-sS", "--max-time", "10", "--cacert"])
        .arg(data_dir.join("tls").join("ca.pem"))
        .arg("--resolve")
        .arg(format!("{name}:{port}:127.0.0.1"))
        .args(extra)
        .arg(format!("{scheme}://{name}:{port}/v1/images"))
        .output()
        .expect("run curl")
}

/// Refused by the agent's TLS alert: curl verified the agent's certificate
/// (cluster CA, the node's name) and the agent then refused the client.
fn refused_by_the_agent(output: &Output, what: &str) {
    refused(output, what);
    let said = String::from_utf8_lossy(&output.stderr).to_lowercase();
    assert!(
        said.contains("alert"),
        "{what}: refused by the agent's TLS alert, after curl verified the agent: {said}"
    );
}

fn refused(output: &Output, what: &str) {
    assert!(
        !output.status.success() && output.stdout.is_empty(),
        "{what} must be refused: exit {:?}, stdout {:?}, stderr {:?}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn only_the_api_server_reaches_an_agent() {
    corral_testkit::require_tool("curl");
    let mut cluster = common::start_node();
    let data_dir = cluster.data_dir.path().to_path_buf();
    cluster.ok(&["apply", "-f", &cluster.manifest("tls.yaml", POD)]);
    let (node, port) = node_and_port(&cluster);
    logs_and_exec_work(&cluster);

    let (path, kept) = kept_certificate(&data_dir, &node);
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(
        mode & 0o777,
        0o600,
        "the node's key is readable by root only"
    );
    assert!(
        !data_dir.join("agent-secret").exists(),
        "no shared secret is kept"
    );

    // The agent's certificate is the cluster CA's for this node: curl
    // verifies it for NAME.node.corral and gets as far as the client
    // certificate, which it does not have.
    let anonymous = curl(&data_dir, &node, port, "https", &[]);
    refused_by_the_agent(&anonymous, "TLS without a client certificate");

    refused(&curl(&data_dir, &node, port, "http", &[]), "plain HTTP");
    refused(
        &curl(
            &data_dir,
            &node,
            port,
            "http",
            &["-H", "Authorization: Bearer anything"],
        ),
        "plain HTTP with a bearer secret",
    );

    // The node's own certificate, as another node would present its own.
    let dir = tempfile::tempdir().unwrap();
    let certificate = dir.path().join("node.pem");
    let key = dir.path().join("node-key.pem");
    std::fs::write(&certificate, kept["certificate"].as_str().unwrap()).unwrap();
    std::fs::write(&key, kept["key"].as_str().unwrap()).unwrap();
    refused_by_the_agent(
        &curl(
            &data_dir,
            &node,
            port,
            "https",
            &[
                "--cert",
                certificate.to_str().unwrap(),
                "--key",
                key.to_str().unwrap(),
            ],
        ),
        "a node's certificate as a client certificate",
    );

    // A restart serves the kept certificate.
    assert!(cluster.terminate(), "corral up stops cleanly");
    cluster.restart();
    logs_and_exec_work(&cluster);
    let (_, after_restart) = kept_certificate(&data_dir, &node);
    assert_eq!(after_restart["certificate"], kept["certificate"]);

    // A node that joined before the agent channel had certificates: no
    // certificate, an old shared secret. The next start removes the secret
    // and gets a certificate.
    assert!(cluster.terminate(), "corral up stops cleanly");
    std::fs::remove_file(&path).unwrap();
    std::fs::write(data_dir.join("agent-secret"), "old-shared-secret").unwrap();
    cluster.restart();
    logs_and_exec_work(&cluster);
    let (_, renewed) = kept_certificate(&data_dir, &node);
    assert_ne!(renewed["certificate"], kept["certificate"]);
    assert!(
        !data_dir.join("agent-secret").exists(),
        "the old secret is removed"
    );
}

/// Two machines: node-1 holds a certificate from the same cluster CA, but
/// it is a node's, and node-0's agent refuses it; the server still reaches
/// node-1's pod.
#[test]
fn a_node_cannot_call_another_nodes_agent() {
    corral_testkit::require_root();
    for tool in ["runc", "ip", "curl"] {
        corral_testkit::require_tool(tool);
    }
    let images = tempfile::tempdir().unwrap();
    let tar =
        corral_testkit::busybox_image_tar(images.path(), corral_testkit::ImageFormat::OciLayout);
    let lab = common::lab::Lab::up("agenttls", 2, &tar, &[]);
    let manifest = lab.dir.join("web.yaml");
    std::fs::write(&manifest, common::lab::httpd_pod("web", "node-1")).unwrap();
    lab.corral(&["apply", "-f", manifest.to_str().unwrap()]);
    lab.running_address("web");
    let said = lab.corral(&["exec", "pod/web", "--", "echo", "across-nodes"]);
    assert_eq!(said.trim(), "across-nodes");

    let endpoint = lab.json("node/node-0").unwrap()["status"]["agentEndpoint"]
        .as_str()
        .unwrap()
        .to_string();
    let address = endpoint
        .strip_prefix("https://")
        .and_then(|rest| rest.rsplit_once(':'))
        .map(|(host, port)| (host.to_string(), port.to_string()))
        .unwrap_or_else(|| panic!("an https endpoint: {endpoint}"));
    let (node_1, _) = kept_certificate(&lab.dir.join("node-1"), "node-1");
    let kept: serde_json::Value = serde_json::from_slice(&std::fs::read(node_1).unwrap()).unwrap();
    let certificate = lab.dir.join("node-1-cert.pem");
    let key = lab.dir.join("node-1-key.pem");
    std::fs::write(&certificate, kept["certificate"].as_str().unwrap()).unwrap();
    std::fs::write(&key, kept["key"].as_str().unwrap()).unwrap();
    let ca = lab.dir.join("server").join("tls").join("ca.pem");
    let resolve = format!("node-0.node.corral:{}:{}", address.1, address.0);
    let url = format!("https://node-0.node.corral:{}/v1/images", address.1);
    let curl = |extra: &[&str]| {
        let mut command = vec!["curl", "-sS", "--max-time", "10", "--cacert"];
        command.push(ca.to_str().unwrap());
        command.extend(["--resolve", &resolve]);
        command.extend_from_slice(extra);
        command.push(&url);
        lab.exec("node-1", &command)
    };
    refused_by_the_agent(
        &curl(&[
            "--cert",
            certificate.to_str().unwrap(),
            "--key",
            key.to_str().unwrap(),
        ]),
        "node-1's certificate at node-0's agent",
    );
    refused_by_the_agent(&curl(&[]), "node-1 without a client certificate");
}

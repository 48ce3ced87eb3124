//! End-to-end acceptance of container I/O with real runc containers:
//! `corral logs` (whole, tail, follow) and `corral exec` (output, exit
//! codes, stdin, a TTY), through the API server's proxy to the agent's
//! endpoint. Needs root, runc and busybox-static; fails (never skips)
//! without them.

#![allow(clippy::unwrap_used)]

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::{CORRAL, Cluster, wait_for};

/// `web` echoes a marker then ticks every second; `side` only sleeps.
const POD: &str = "kind: Pod
metadata: {name: web}
spec:
  containers:
    - name: web
      image: local/busybox:1
      command: [sh, -c, \"echo marker-4711; i=0; while true; do echo tick $i; i=$((i+1)); sleep 1; done\"]
    - name: side
      image: local/busybox:1
      command: [sh, -c, \"echo side-says-hi; exec sleep 3600\"]
";

fn running(cluster: &Cluster) {
    wait_for("pod/web to run", Duration::from_secs(60), || {
        let pod = cluster.get_json("pod/web");
        let states: Vec<_> = pod["status"]["containers"]
            .as_array()
            .map(|all| all.iter().map(|c| c["state"].clone()).collect())
            .unwrap_or_default();
        (pod["status"]["phase"] == "Running"
            && states.len() == 2
            && states.iter().all(|s| s == "running"))
        .then_some(())
    });
}

#[test]
fn logs_and_exec_reach_the_containers() {
    let cluster = &common::start_node();
    cluster.ok(&["apply", "-f", &cluster.manifest("web.yaml", POD)]);
    running(cluster);
    let node_json = cluster.get_json(&format!(
        "node/{}",
        cluster.get_json("pod/web")["status"]["node"]
            .as_str()
            .unwrap()
    ));
    assert!(
        node_json["status"]["agentEndpoint"]
            .as_str()
            .is_some_and(|e| e.starts_with("https://127.0.0.1:")),
        "{node_json}"
    );

    // Two containers: logs and exec must name one, and the error lists them.
    let ambiguous = cluster.fails(&["logs", "pod/web"]);
    assert!(ambiguous.contains("web, side"), "{ambiguous}");
    let unknown = cluster.fails(&["logs", "pod/web", "-c", "nope"]);
    assert!(
        unknown.contains("no container \"nope\"") && unknown.contains("web, side"),
        "{unknown}"
    );
    let unknown = cluster.fails(&["exec", "pod/web", "-c", "nope", "--", "id"]);
    assert!(unknown.contains("no container \"nope\""), "{unknown}");
    let missing = cluster.fails(&["logs", "pod/absent", "-c", "x"]);
    assert!(missing.contains("does not exist"), "{missing}");

    // Whole log, and its tail.
    let logs = wait_for("the marker in the log", Duration::from_secs(30), || {
        let logs = cluster.ok(&["logs", "pod/web", "-c", "web"]);
        logs.contains("tick 1").then_some(logs)
    });
    assert!(logs.starts_with("marker-4711\n"), "{logs}");
    let side = cluster.ok(&["logs", "pod/web", "-c", "side"]);
    assert_eq!(side, "side-says-hi\n");
    let tail = cluster.ok(&["logs", "pod/web", "-c", "web", "--tail", "1"]);
    assert_eq!(tail.lines().count(), 1, "{tail}");
    assert!(tail.starts_with("tick "), "{tail}");

    // Follow: lines written after the command started arrive.
    let mut follower = Command::new(CORRAL)
        .args(["logs", "pod/web", "-c", "web", "-f", "--tail", "0"])
        .env("CORRAL_CONFIG", &cluster.config)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = follower.stdout.take().unwrap();
    let (lines, received) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let first = received.recv_timeout(Duration::from_secs(10));
    let second = received.recv_timeout(Duration::from_secs(10));
    let _ = follower.kill();
    let _ = follower.wait();
    let (first, second) = (first.unwrap(), second.unwrap());
    assert!(
        first.starts_with("tick ") && second.starts_with("tick "),
        "{first} {second}"
    );
    let number = |line: &str| line["tick ".len()..].parse::<u64>().unwrap();
    assert_eq!(number(&second), number(&first) + 1);

    // Exec: output, exit codes, stdin, a TTY.
    let id = cluster.ok(&["exec", "pod/web", "-c", "web", "--", "id"]);
    assert!(id.starts_with("uid="), "{id}");
    let failed = cluster.corral(&[
        "exec",
        "pod/web",
        "-c",
        "side",
        "--",
        "sh",
        "-c",
        "echo out; echo err >&2; exit 3",
    ]);
    assert_eq!(failed.status.code(), Some(3));
    assert_eq!(String::from_utf8_lossy(&failed.stdout), "out\n");
    assert_eq!(String::from_utf8_lossy(&failed.stderr), "err\n");
    let echoed = cluster.corral_with_stdin(
        &["exec", "-i", "pod/web", "-c", "web", "--", "cat"],
        Some("hi\n"),
    );
    assert!(echoed.status.success(), "{echoed:?}");
    assert_eq!(String::from_utf8_lossy(&echoed.stdout), "hi\n");
    // Without -i the command reads end of file at once.
    let closed = cluster.ok(&["exec", "pod/web", "-c", "web", "--", "cat"]);
    assert_eq!(closed, "");
    let tty = cluster.corral(&[
        "exec",
        "-t",
        "pod/web",
        "-c",
        "web",
        "--",
        "sh",
        "-c",
        "tty; stty size; exit 4",
    ]);
    assert_eq!(tty.status.code(), Some(4), "{tty:?}");
    let text = String::from_utf8_lossy(&tty.stdout);
    assert!(
        text.contains("/dev/pts/") && text.contains("24 80"),
        "{text}"
    );
    let not_found = cluster.corral(&["exec", "pod/web", "-c", "web", "--", "no-such-command"]);
    assert_ne!(not_found.status.code(), Some(0));
    assert!(
        String::from_utf8_lossy(&not_found.stderr).contains("no-such-command"),
        "{not_found:?}"
    );
}

#[test]
fn a_single_container_is_the_default_and_nodes_cannot_exec() {
    let cluster = &common::start_node();
    let pod = "kind: Pod
metadata: {name: solo}
spec:
  containers:
    - name: solo
      image: local/busybox:1
      command: [sh, -c, \"echo solo-marker; exec sleep 3600\"]
";
    cluster.ok(&["apply", "-f", &cluster.manifest("solo.yaml", pod)]);
    let logs = wait_for("the solo marker", Duration::from_secs(60), || {
        let output = cluster.corral(&["logs", "pod/solo"]);
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        text.contains("solo-marker").then_some(text)
    });
    assert_eq!(logs, "solo-marker\n");
    let id = cluster.ok(&["exec", "pod/solo", "--", "id", "-u"]);
    assert!(id.trim().parse::<u32>().is_ok(), "{id}");

    // The node's own token is refused: exec and logs are for people.
    let node_config = cluster.data_dir.path().join("node.json");
    let refused = Command::new(CORRAL)
        .args(["exec", "pod/solo", "--", "id"])
        .env("CORRAL_CONFIG", &node_config)
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(message.contains("for people"), "{message}");
}

/// `corral port-forward pod/fwd 0:PORT` running; killed when dropped.
struct Forwarder {
    child: std::process::Child,
    port: u16,
}

impl Forwarder {
    fn start(cluster: &Cluster, remote: u16) -> Forwarder {
        let mut child = Command::new(CORRAL)
            .args(["port-forward", "pod/fwd", &format!("0:{remote}")])
            .env("CORRAL_CONFIG", &cluster.config)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut first = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut first)
            .unwrap();
        // "forwarding 127.0.0.1:PORT to pod/default/fwd port REMOTE"
        let port = first
            .split_whitespace()
            .nth(1)
            .and_then(|address| address.rsplit(':').next())
            .and_then(|port| port.parse().ok())
            .unwrap_or_else(|| panic!("no port in {first:?}"));
        Forwarder { child, port }
    }

    /// Sends `request` through the forwarder and reads until it closes.
    fn exchange(&self, request: &str) -> String {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        stream.write_all(request.as_bytes()).unwrap();
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        answer
    }

    fn stop(mut self) -> String {
        use std::io::Read;
        let _ = self.child.kill();
        let _ = self.child.wait();
        let mut stderr = String::new();
        if let Some(mut pipe) = self.child.stderr.take() {
            let _ = pipe.read_to_string(&mut stderr);
        }
        stderr
    }

    /// Stops it once its stderr has a line containing `needle` (or after
    /// 10 s): the reason for a refused connection is printed after the
    /// local connection closes, so killing it at once can lose it.
    fn stop_once_it_says(mut self, needle: &str) -> String {
        let pipe = self.child.stderr.take().unwrap();
        let (seen_tx, seen_rx) = mpsc::channel();
        let needle = needle.to_string();
        let reader = std::thread::spawn(move || {
            let mut seen = String::new();
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                seen.push_str(&line);
                seen.push('\n');
                if line.contains(&needle) {
                    break;
                }
            }
            let _ = seen_tx.send(seen);
        });
        let seen = seen_rx.recv_timeout(Duration::from_secs(10));
        let _ = self.child.kill();
        let _ = self.child.wait();
        // The pipe is closed now: the reader ends.
        let _ = reader.join();
        seen.unwrap_or_default()
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn port_forward_reaches_a_port_on_the_pods_loopback() {
    let cluster = &common::start_node();
    // httpd listens on the pod's loopback only: no route from outside the
    // pod reaches it, port-forward does.
    let pod = "kind: Pod
metadata: {name: fwd}
spec:
  containers:
    - name: web
      image: local/busybox:1
      command: [sh, -c, \"mkdir -p /tmp/www && echo hello-from-the-pod > /tmp/www/index.html && exec httpd -f -p 127.0.0.1:8080 -h /tmp/www\"]
";
    cluster.ok(&["apply", "-f", &cluster.manifest("fwd.yaml", pod)]);
    wait_for("pod/fwd to run", Duration::from_secs(60), || {
        (cluster.get_json("pod/fwd")["status"]["phase"] == "Running").then_some(())
    });
    let forwarder = Forwarder::start(cluster, 8080);
    let answer = wait_for(
        "httpd to answer through the forward",
        Duration::from_secs(20),
        || {
            let answer = forwarder.exchange("GET /index.html HTTP/1.0\r\n\r\n");
            answer.contains("hello-from-the-pod").then_some(answer)
        },
    );
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
    // Two connections at once are two streams.
    let (first, second) = std::thread::scope(|scope| {
        let a = scope.spawn(|| forwarder.exchange("GET /index.html HTTP/1.0\r\n\r\n"));
        let b = scope.spawn(|| forwarder.exchange("GET /index.html HTTP/1.0\r\n\r\n"));
        (a.join().unwrap(), b.join().unwrap())
    });
    assert!(first.contains("hello-from-the-pod") && second.contains("hello-from-the-pod"));
    forwarder.stop();

    // Nothing on the port: the connection closes and the reason is printed.
    let nothing = Forwarder::start(cluster, 9999);
    assert_eq!(nothing.exchange("hello"), "");
    let stderr = nothing.stop_once_it_says("nothing accepts connections");
    assert!(
        stderr.contains("nothing accepts connections on port 9999 in pod/fwd"),
        "{stderr}"
    );
    cluster.ok(&["delete", "pod/fwd"]);
}

//! End to end through the real binary: `corral up`, a controller that
//! registers `acme/slow-mount` before `storage`, a pod, the step driven
//! through the HTTP API with the controller's own token, and what `why`,
//! `logs --steps`, `analyze` and `apply --wait` say about it.

use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use corral_api::ObjectKey;
use corral_api::workflow::LogLevel;
use corral_client::{Client, ClientConfig};
use serde_json::Value;

mod common;

/// The shared `corral up` harness with a real node (its containers, mounts
/// and cgroups are removed when it drops, even on failure).
struct Node {
    cluster: common::Cluster,
}

impl std::ops::Deref for Node {
    type Target = common::Cluster;

    fn deref(&self) -> &common::Cluster {
        &self.cluster
    }
}

impl Node {
    /// A node that is Ready and has the busybox image.
    fn start() -> Node {
        let node = Node {
            cluster: common::start_node(),
        };
        common::wait_for("the node to be Ready", Duration::from_secs(30), || {
            let nodes: Value =
                serde_json::from_str(&node.ok(&["get", "nodes", "-o", "json"])).ok()?;
            (nodes["items"][0]["status"]["phase"] == "Ready").then_some(())
        });
        node
    }

    fn write(&self, name: &str, text: &str) -> String {
        self.manifest(name, text)
    }

    fn node_name(&self) -> String {
        let nodes: Value =
            serde_json::from_str(&self.ok(&["get", "nodes", "-o", "json"])).expect("nodes json");
        nodes["items"][0]["metadata"]["name"]
            .as_str()
            .expect("a node")
            .to_string()
    }

    fn client(&self, token: &str) -> Client {
        let mut config = ClientConfig::load(&self.config).expect("client config");
        config.token = token.trim().to_string();
        Client::new(&config).expect("client")
    }
}

/// Graphviz must be installed for the dot check; missing, the test fails.
fn require_dot() {
    let found = Command::new("dot")
        .arg("-V")
        .output()
        .is_ok_and(|output| output.status.success());
    assert!(
        found,
        "this test needs Graphviz's `dot` (apt-get install graphviz)"
    );
}

fn render_svg(dot: &str) -> Output {
    let mut child = Command::new("dot")
        .arg("-Tsvg")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("dot starts");
    child
        .stdin
        .take()
        .expect("piped stdin")
        .write_all(dot.as_bytes())
        .expect("feed dot");
    child.wait_with_output().expect("dot finishes")
}

fn line_with<'a>(text: &'a str, needle: &str) -> &'a str {
    text.lines()
        .find(|line| line.contains(needle))
        .unwrap_or_else(|| panic!("no line with {needle:?} in:\n{text}"))
}

fn json_step<'a>(why: &'a Value, name: &str) -> &'a Value {
    why["steps"]
        .as_array()
        .and_then(|steps| steps.iter().find(|step| step["name"] == name))
        .unwrap_or_else(|| panic!("no step {name} in {why}"))
}

const CONTROLLER: &str = "kind: Controller
metadata: {name: acme-storage}
spec:
  steps:
    - {name: acme/slow-mount, kind: Pod, workflow: start, before: [storage], timeout: 10m}
";

fn pod_manifest(name: &str) -> String {
    format!(
        "kind: Pod
metadata: {{name: {name}, namespace: default}}
spec:
  containers:
    - {{name: web, image: local/busybox:1, command: [httpd, -f, -p, '8080']}}
"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn why_logs_and_analyze_explain_a_registered_step_end_to_end() {
    require_dot();
    let cluster = Node::start();
    let controller = cluster.write("controller.yaml", CONTROLLER);
    cluster.ok(&["apply", "-f", &controller]);
    let pod = cluster.write("pod.yaml", &pod_manifest("web"));
    let applied = cluster.ok(&["apply", "-f", &pod, "-m", "first version"]);
    assert!(
        applied.contains("pod/web created (revision 1)"),
        "{applied}"
    );
    let token = cluster.ok(&["token", "create", "--controller", "acme-storage"]);
    let acme = cluster.client(&token);
    let web = ObjectKey::new(corral_api::Kind::Pod, Some("default"), "web");

    // Unclaimed: why names the step, how long it has been ready, and whose it is.
    let why = cluster.ok(&["why", "pod/web"]);
    assert!(
        why.starts_with("pod/web (revision 1) is not running: "),
        "{why}"
    );
    let line = line_with(&why, "○ acme/slow-mount");
    assert!(
        line.contains("ready for")
            && line.contains("not yet claimed")
            && line.contains("(owner acme-storage)"),
        "{line}"
    );
    assert!(
        line_with(&why, "storage (target)").contains("waiting on"),
        "{why}"
    );

    // Claimed: the verdict names it, how long it has run, and its timeout.
    acme.claim_step(&web, "acme/slow-mount")
        .await
        .expect("claim");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let why = cluster.ok(&["why", "pod/web"]);
    let verdict = why.lines().next().unwrap_or_default();
    assert!(
        verdict
            .starts_with("pod/web (revision 1) is not running: step acme/slow-mount running for ")
            && verdict.ends_with("(timeout 10m)"),
        "{verdict}"
    );
    let line = line_with(&why, "● acme/slow-mount");
    assert!(
        line.contains("running") && line.contains("of 10m") && line.contains("left"),
        "{line}"
    );

    let json: Value =
        serde_json::from_str(&cluster.ok(&["why", "pod/web", "-o", "json"])).expect("why json");
    assert_eq!(json["verdict"]["step"], "acme/slow-mount");
    let step = json_step(&json, "acme/slow-mount");
    assert_eq!(step["owner"], "acme-storage");
    assert_eq!(step["state"], "running");
    assert_eq!(step["timeoutMs"], 600_000);
    for field in ["startedAt", "since", "durationMs", "timeLeftMs"] {
        assert!(!step[field].is_null(), "{field} missing in {step}");
    }
    for step in json["steps"].as_array().expect("steps") {
        for field in ["name", "owner", "state", "kind"] {
            assert!(step[field].is_string(), "{field} missing in {step}");
        }
    }

    // Another controller (the scheduler) is refused on acme's step.
    let scheduler_token = cluster.ok(&["token", "create", "--controller", "scheduler"]);
    let scheduler = cluster.client(&scheduler_token);

    // A non-owner is refused, naming the owner.
    let refused = scheduler
        .fail_step(&web, "acme/slow-mount", "not mine")
        .await
        .expect_err("the scheduler does not own acme/slow-mount");
    assert_eq!(refused.status(), Some(403), "{refused}");
    assert!(
        refused.to_string().contains("controller acme-storage"),
        "{refused}"
    );

    // The owner logs and fails it: why shows the failure and the blocked dependents.
    acme.log_step(
        &web,
        "acme/slow-mount",
        LogLevel::Warn,
        "nfs-1 answers slowly",
    )
    .await
    .expect("log");
    // While it runs, why shows the owner's newest line.
    let why = cluster.ok(&["why", "pod/web"]);
    assert!(
        why.contains("At work now:\n  acme/slow-mount: nfs-1 answers slowly\n"),
        "{why}"
    );
    acme.fail_step(&web, "acme/slow-mount", "mount.nfs: connection refused")
        .await
        .expect("fail");
    let why = cluster.ok(&["why", "pod/web"]);
    let verdict = why.lines().next().unwrap_or_default();
    assert_eq!(
        verdict,
        "pod/web (revision 1) is not running: step acme/slow-mount failed: mount.nfs: connection refused (attempt 1 of 1)"
    );
    assert!(
        line_with(&why, "✗ acme/slow-mount").contains("failed: mount.nfs: connection refused"),
        "{why}"
    );
    assert!(
        line_with(&why, "storage (target)").contains("blocked: required acme/slow-mount failed"),
        "{why}"
    );
    assert!(
        line_with(&why, "node/start-containers").contains("blocked"),
        "{why}"
    );
    assert!(
        line_with(&why, "✓ scheduler/place").contains(&cluster.node_name()),
        "{why}"
    );
    let json: Value =
        serde_json::from_str(&cluster.ok(&["why", "pod/web", "-o", "json"])).expect("why json");
    let step = json_step(&json, "acme/slow-mount");
    assert_eq!(step["state"], "failed");
    assert_eq!(step["error"], "mount.nfs: connection refused");
    assert!(
        step["finishedAt"].is_string() && step["durationMs"].is_i64(),
        "{step}"
    );
    assert_eq!(json_step(&json, "storage")["state"], "blocked");
    assert_eq!(json_step(&json, "storage")["blockedBy"], "acme/slow-mount");

    // The step log: the owner's line and the failure, with the owner, in order.
    let logs = cluster.ok(&["logs", "pod/web", "--steps"]);
    let failure = line_with(&logs, "mount.nfs: connection refused");
    assert!(
        failure.contains("acme-storage")
            && failure.contains("error")
            && failure.contains("start-1"),
        "{failure}"
    );
    let owned = cluster.ok(&[
        "logs",
        "pod/web",
        "--steps",
        "--step",
        "acme/slow-mount",
        "--owner",
        "acme-storage",
    ]);
    let order: Vec<usize> = [
        "ready",
        "claimed by acme-storage",
        "nfs-1 answers slowly",
        "connection refused",
    ]
    .iter()
    .map(|needle| {
        owned
            .find(needle)
            .unwrap_or_else(|| panic!("{needle:?} missing in:\n{owned}"))
    })
    .collect();
    assert!(
        order.windows(2).all(|pair| pair[0] < pair[1]),
        "out of order:\n{owned}"
    );
    assert!(!owned.contains("scheduler/place"), "filtered:\n{owned}");
    let entries: Value =
        serde_json::from_str(&cluster.ok(&["logs", "pod/web", "--steps", "-o", "json"]))
            .expect("logs json");
    let entry = entries
        .as_array()
        .and_then(|all| all.iter().find(|e| e["message"] == "nfs-1 answers slowly"))
        .expect("the owner's line");
    assert_eq!(entry["owner"], "acme-storage");
    assert_eq!(entry["level"], "warn");
    assert_eq!(entry["step"], "acme/slow-mount");
    assert!(
        entry["time"].is_string() && entry["objectUid"].is_string(),
        "{entry}"
    );

    // Analyses.
    let blame = cluster.ok(&["analyze", "blame", "pod/web"]);
    assert!(
        blame.contains("acme/slow-mount") && blame.contains("scheduler/place"),
        "{blame}"
    );
    let chain = cluster.ok(&["analyze", "critical-chain", "pod/web"]);
    assert!(
        line_with(&chain, "running (target)").contains("blocked"),
        "{chain}"
    );
    let dot = cluster.ok(&["analyze", "dot", "pod/web"]);
    let svg = render_svg(&dot);
    assert!(
        svg.status.success(),
        "dot -Tsvg refused it: {}\n{dot}",
        String::from_utf8_lossy(&svg.stderr)
    );
    assert!(String::from_utf8_lossy(&svg.stdout).contains("<svg"));
    let dot_json: Value =
        serde_json::from_str(&cluster.ok(&["analyze", "dot", "pod/web", "-o", "json"]))
            .expect("dot json");
    assert!(
        dot_json["dot"]
            .as_str()
            .is_some_and(|text| text.starts_with("digraph")),
        "{dot_json}"
    );

    // apply --wait, not on a terminal: plain lines, then the verdict, non-zero on timeout.
    let other = cluster.write("cache.yaml", &pod_manifest("cache"));
    let waited = cluster.corral(&["apply", "-f", &other, "--wait", "--timeout", "2s"]);
    let stdout = String::from_utf8_lossy(&waited.stdout);
    let stderr = String::from_utf8_lossy(&waited.stderr);
    assert!(
        !waited.status.success(),
        "a workflow nobody drives cannot succeed in 2s"
    );
    assert!(
        stdout.contains("pod/cache: following start workflow start-1"),
        "{stdout}"
    );
    assert!(
        stdout.contains("pod/cache start-1: acme/slow-mount ready, for acme-storage to claim"),
        "{stdout}"
    );
    assert!(
        stderr.contains("gave up waiting: pod/cache (revision 1) is not running"),
        "{stderr}"
    );

    // Without the registration, a new pod's workflow runs to the end on the
    // real node; its critical chain has a time and a duration per step.
    cluster.ok(&["delete", "controller/acme-storage"]);
    let fine = cluster.write("fine.yaml", &pod_manifest("fine"));
    let waited = cluster.corral(&["apply", "-f", &fine, "--wait", "--timeout", "60s"]);
    assert!(
        waited.status.success(),
        "{}{}",
        String::from_utf8_lossy(&waited.stdout),
        String::from_utf8_lossy(&waited.stderr)
    );
    let chain = cluster.ok(&["analyze", "critical-chain", "pod/fine"]);
    let place = line_with(&chain, "scheduler/place");
    assert!(place.contains(" @") && place.contains(" +"), "{chain}");
    assert!(
        line_with(&chain, "scheduled (target)").contains(" @"),
        "{chain}"
    );
    let chain_json: Value =
        serde_json::from_str(&cluster.ok(&["analyze", "critical-chain", "pod/fine", "-o", "json"]))
            .expect("chain json");
    let link = chain_json["chain"]
        .as_array()
        .and_then(|links| links.iter().find(|l| l["name"] == "scheduler/place"))
        .expect("scheduler/place in the chain");
    assert!(
        link["atMs"].is_i64() && link["durationMs"].is_i64(),
        "{link}"
    );
}

/// The first line of `corral why TARGET`.
fn why_line(cluster: &Node, target: &str) -> String {
    cluster
        .ok(&["why", target])
        .lines()
        .next()
        .unwrap_or_default()
        .to_string()
}

/// The `get pods` row of `name`, split into columns.
fn get_row(cluster: &Node, name: &str) -> Vec<String> {
    let table = cluster.ok(&["get", "pods"]);
    let header: Vec<&str> = table
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        &header[..6],
        ["NAME", "REVISION", "STATUS", "READY", "RESTARTS", "NODE"],
        "{table}"
    );
    table
        .lines()
        .find(|line| line.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("no row for {name}:\n{table}"))
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// `corral get pods -w` running in the background; its lines so far.
struct GetWatch {
    child: std::process::Child,
    lines: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl GetWatch {
    fn start(cluster: &Node) -> GetWatch {
        let mut child = Command::new(common::CORRAL)
            .args(["get", "pods", "-w"])
            .env("CORRAL_CONFIG", &cluster.config)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn corral get pods -w");
        let stdout = child.stdout.take().expect("its stdout");
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = lines.clone();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                sink.lock().expect("lines").push(line);
            }
        });
        GetWatch { child, lines }
    }

    /// The lines printed for pod `name`, split into columns.
    fn rows(&self, name: &str) -> Vec<Vec<String>> {
        self.lines
            .lock()
            .expect("lines")
            .iter()
            .filter(|line| line.split_whitespace().next() == Some(name))
            .map(|line| line.split_whitespace().map(str::to_string).collect())
            .collect()
    }
}

impl Drop for GetWatch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn why_answers_for_a_pods_health_after_its_start_succeeded() {
    let cluster = Node::start();
    let watch = GetWatch::start(&cluster);
    let manifest = cluster.write(
        "unhealthy.yaml",
        "kind: Pod
metadata: {name: crashing, namespace: default}
spec:
  containers:
    - {name: app, image: local/busybox:1, command: [sh, -c, 'echo starting; sleep 1; exit 3']}
---
kind: Pod
metadata: {name: unlive, namespace: default}
spec:
  containers:
    - name: app
      image: local/busybox:1
      command: [sleep, '3600']
      liveness: {exec: {command: ['false']}, periodSeconds: 1, failureThreshold: 1}
---
kind: Pod
metadata: {name: hungry, namespace: default}
spec:
  containers:
    - name: app
      image: local/busybox:1
      command: [busybox, dd, if=/dev/zero, of=/dev/null, bs=64M, count=1]
      resources: {memory: 16Mi}
---
kind: Pod
metadata: {name: unready, namespace: default}
spec:
  containers:
    - name: app
      image: local/busybox:1
      command: [sh, -c, 'touch /tmp/ready; sleep 4; rm /tmp/ready; exec sleep 3600']
      readiness: {exec: {command: [sh, -c, 'test -e /tmp/ready']}, periodSeconds: 1, failureThreshold: 1}
---
kind: Pod
metadata: {name: healthy, namespace: default}
spec:
  containers:
    - {name: app, image: local/busybox:1, command: [sleep, '3600']}
",
    );
    cluster.ok(&["apply", "-f", &manifest]);

    // A container that exits 3 in a loop: why names the exit, the restarts
    // and when the next one is due, though its start workflow succeeded.
    let line = common::wait_for(
        "crashing to be called unhealthy",
        Duration::from_secs(60),
        || {
            let line = why_line(&cluster, "pod/crashing");
            line.contains("restarted").then_some(line)
        },
    );
    assert!(
        line.starts_with(
            "pod/crashing (revision 1) is not healthy: container app exited with code 3 "
        ),
        "{line}"
    );
    assert!(
        line.contains("next restart in") || line.contains("next restart due now"),
        "{line}"
    );
    let why = cluster.ok(&["why", "pod/crashing"]);
    assert!(
        why.contains("start workflow start-1"),
        "the steps follow:\n{why}"
    );
    let json: Value = serde_json::from_str(&cluster.ok(&["why", "pod/crashing", "-o", "json"]))
        .expect("why json");
    assert_eq!(json["verdict"]["state"], "unhealthy", "{json}");
    let pod = cluster.get_json("pod/crashing");
    let app = &pod["status"]["containers"][0];
    assert_eq!(app["lastExit"]["code"], 3, "{pod}");
    assert!(app["restarts"].as_u64().unwrap_or(0) >= 1, "{pod}");
    // Each exited generation left the runtime: at most the current one is
    // known to runc, however often it restarted.
    let pod = common::wait_for("two restarts", Duration::from_secs(30), || {
        let pod = cluster.get_json("pod/crashing");
        (pod["status"]["containers"][0]["restarts"].as_u64()? >= 2).then_some(pod)
    });
    let id = pod["status"]["containers"][0]["containerId"]
        .as_str()
        .expect("a container id")
        .to_string();
    let prefix = &id[..id.rfind('-').expect("generation suffix") + 1];
    let listed = Command::new("runc")
        .arg("--root")
        .arg(cluster.data_dir.path().join("runc"))
        .args(["list", "-q"])
        .output()
        .expect("runc list");
    let generations: Vec<String> = String::from_utf8_lossy(&listed.stdout)
        .lines()
        .filter(|line| line.starts_with(prefix))
        .map(str::to_string)
        .collect();
    assert!(
        generations.len() <= 1,
        "exited generations pile up: {generations:?}"
    );
    let row = get_row(&cluster, "crashing");
    assert!(
        matches!(row[2].as_str(), "CrashLoop" | "Running"),
        "{row:?}"
    );
    common::wait_for("get pods to say CrashLoop", Duration::from_secs(30), || {
        (get_row(&cluster, "crashing")[2] == "CrashLoop").then_some(())
    });

    // describe sums the pod up in a screen: health, containers, revisions,
    // the last events; not the raw workflow.
    let described = cluster.ok(&["describe", "pod/crashing"]);
    let health = line_with(&described, "Health:");
    assert!(
        health.contains("not healthy: container app exited with code 3"),
        "{described}"
    );
    for needle in [
        "Kind:        Pod",
        "Status:      ",
        "Containers:",
        "    image:     local/busybox:1",
        "    last exit: code 3",
        "Workflow:    start-1 (revision 1) succeeded",
        "Recent revisions (of 1;",
        "Recent events (of ",
    ] {
        assert!(described.contains(needle), "no {needle:?} in:\n{described}");
    }
    assert!(
        !described.contains("definition:"),
        "no raw workflow:\n{described}"
    );
    assert!(described.lines().count() < 50, "{described}");
    let node = cluster.ok(&["describe", "node", &cluster.node_name()]);
    assert!(
        node.contains("Kind:        Node") && node.contains("Status:\n"),
        "{node}"
    );

    // A container its liveness probe kills: why says the probe did it.
    let line = common::wait_for(
        "unlive to be called unhealthy",
        Duration::from_secs(60),
        || {
            let line = why_line(&cluster, "pod/unlive");
            line.contains("is not healthy").then_some(line)
        },
    );
    assert!(
        line.starts_with(
            "pod/unlive (revision 1) is not healthy: container app was killed: its liveness probe failed"
        ),
        "{line}"
    );

    // A container the kernel kills for its memory: why says the kernel did.
    let line = common::wait_for(
        "hungry to be called unhealthy",
        Duration::from_secs(60),
        || {
            let line = why_line(&cluster, "pod/hungry");
            line.contains("is not healthy").then_some(line)
        },
    );
    assert!(
        line.starts_with(
            "pod/hungry (revision 1) is not healthy: container app was killed by the kernel: out of memory (memory limit 16Mi)"
        ),
        "{line}"
    );
    common::wait_for(
        "get pods to say OutOfMemory",
        Duration::from_secs(30),
        || (get_row(&cluster, "hungry")[2] == "OutOfMemory").then_some(()),
    );

    // A container that was ready and stops being so: why names the probe.
    let line = common::wait_for(
        "unready to be called unhealthy",
        Duration::from_secs(60),
        || {
            let line = why_line(&cluster, "pod/unready");
            line.contains("is not healthy").then_some(line)
        },
    );
    assert!(
        line.starts_with(
            "pod/unready (revision 1) is not healthy: container app is not ready: its readiness probe fails: "
        ),
        "{line}"
    );
    assert_eq!(
        &get_row(&cluster, "unready")[2..5],
        ["NotReady", "0/1", "0"]
    );

    // A healthy pod keeps the workflow's verdict, and its row reads 1/1 ready.
    let line = common::wait_for("healthy to run", Duration::from_secs(30), || {
        let line = why_line(&cluster, "pod/healthy");
        line.contains("is running").then_some(line)
    });
    assert!(
        line.starts_with("pod/healthy (revision 1) is running"),
        "{line}"
    );
    assert_eq!(&get_row(&cluster, "healthy")[2..5], ["Running", "1/1", "0"]);

    // `get pods -w` printed the pod's rows as they changed, ending ready.
    let rows = common::wait_for(
        "get -w to print healthy as ready",
        Duration::from_secs(10),
        || {
            let rows = watch.rows("healthy");
            rows.last()
                .is_some_and(|row| row[2..5] == ["Running", "1/1", "0"])
                .then_some(rows)
        },
    );
    assert!(
        rows.len() >= 2 && rows[0][3] == "0/0",
        "the watch printed the pod before it ran, then the change: {rows:?}"
    );
    assert!(
        watch
            .rows("crashing")
            .iter()
            .any(|row| row[2] == "CrashLoop"),
        "{:?}",
        watch.rows("crashing")
    );
    // --sort-by a column: RESTARTS ascending; an unknown column is named.
    let sorted = cluster.ok(&["get", "pods", "--sort-by", "restarts"]);
    let restarts: Vec<u64> = sorted
        .lines()
        .skip(1)
        .map(|line| {
            line.split_whitespace()
                .nth(4)
                .unwrap_or("x")
                .parse()
                .expect("a count")
        })
        .collect();
    assert!(restarts.windows(2).all(|w| w[0] <= w[1]), "{sorted}");
    assert_eq!(restarts.len(), 5, "{sorted}");
    let refused = cluster.fails(&["get", "pods", "--sort-by", "colour"]);
    assert!(refused.contains("RESTARTS"), "{refused}");
    // `get all` names each object KIND/NAME.
    let all = cluster.ok(&["get", "all"]);
    assert!(all.lines().any(|l| l.starts_with("pod/healthy ")), "{all}");

    for pod in [
        "pod/crashing",
        "pod/unlive",
        "pod/hungry",
        "pod/unready",
        "pod/healthy",
    ] {
        cluster.ok(&["delete", pod]);
    }
    // The watch says when a pod is deleting, and when it is gone (after
    // its stop workflow: the grace period of a shell that ignores SIGTERM).
    common::wait_for(
        "get -w to print the deletion",
        Duration::from_secs(60),
        || {
            watch
                .rows("healthy")
                .iter()
                .any(|row| row[2] == "Deleted")
                .then_some(())
        },
    );
}

#[test]
fn a_pending_pod_fixed_and_applied_again_is_placed_and_runs() {
    let cluster = Node::start();
    let huge = "kind: Pod
metadata: {name: pending, namespace: default}
spec:
  containers:
    - {name: app, image: local/busybox:1, command: [sleep, '3600'], resources: {memory: 1000Ti}}
";
    cluster.ok(&["apply", "-f", &cluster.write("huge.yaml", huge)]);
    let line = common::wait_for(
        "the pod to be called unschedulable",
        Duration::from_secs(30),
        || {
            let line = why_line(&cluster, "pod/pending");
            line.contains("insufficient memory").then_some(line)
        },
    );
    assert!(line.contains("scheduler/place"), "{line}");

    // The request fixed: the new revision is placed, not left waiting for
    // node steps of a node nobody chose.
    let fixed = huge.replace(", resources: {memory: 1000Ti}", "");
    cluster.ok(&[
        "apply",
        "-f",
        &cluster.write("fixed.yaml", &fixed),
        "-m",
        "ask for less memory",
    ]);
    common::wait_for("the fixed pod to run", Duration::from_secs(60), || {
        let row = get_row(&cluster, "pending");
        (row[2] == "Running").then_some(())
    });
    let row = get_row(&cluster, "pending");
    assert_eq!(row[1], "2", "{row:?}");
    assert_eq!(row[5], cluster.node_name(), "{row:?}");
    let why = cluster.ok(&["why", "pod/pending"]);
    assert!(why.contains("start workflow start-2"), "{why}");
    assert!(line_with(&why, "scheduler/place").contains('✓'), "{why}");
}

#[test]
fn why_names_the_cancelled_updates_step_the_node_is_still_finishing() {
    let cluster = Node::start();
    // `sleep` as PID 1 ignores SIGTERM: stopping it takes the grace period.
    let pod = |value: &str| {
        format!(
            "kind: Pod
metadata: {{name: stubborn, namespace: default}}
spec:
  terminationGraceSeconds: 8
  containers:
    - {{name: app, image: local/busybox:1, command: [sleep, '3600'], env: {{V: '{value}'}}}}
"
        )
    };
    let apply = |value: &str| {
        let path = cluster.write(&format!("stubborn-{value}.yaml"), &pod(value));
        cluster.ok(&["apply", "-f", &path]);
    };
    apply("0");
    common::wait_for("the pod to run", Duration::from_secs(60), || {
        (get_row(&cluster, "stubborn")[2] == "Running").then_some(())
    });
    apply("1");
    common::wait_for(
        "the node to stop the container for update-2",
        Duration::from_secs(30),
        || {
            let why = cluster.ok(&["why", "pod/stubborn"]);
            line_with(&why, "node/stop-changed-containers")
                .contains("running")
                .then_some(())
        },
    );
    apply("2");
    let why = cluster.ok(&["why", "pod/stubborn"]);
    assert!(why.contains("update workflow update-3"), "{why}");
    assert!(why.contains("Held up by a cancelled operation:"), "{why}");
    let held = line_with(&why, "of update-2");
    assert!(
        held.contains("node/stop-changed-containers of update-2 (cancelled"),
        "{why}"
    );
    assert!(
        held.contains("claimed by node") && held.contains("a step of update-3"),
        "{why}"
    );
    let json: Value =
        serde_json::from_str(&cluster.ok(&["why", "pod/stubborn", "-o", "json"])).expect("json");
    assert_eq!(json["heldUpBy"][0]["workflowId"], "update-2", "{json}");
    assert_eq!(
        json["heldUpBy"][0]["step"], "node/stop-changed-containers",
        "{json}"
    );
    // The dashboard's object page says the same under its verdict.
    let part = dashboard_part(&cluster, "why/pods/stubborn");
    assert!(part.contains("id=\"held-up\""), "{part}");
    assert!(
        part.contains("node/stop-changed-containers of update-2"),
        "{part}"
    );

    // Once the node has stopped it, the newest revision runs and nothing
    // is held up any more.
    common::wait_for("revision 3 to run", Duration::from_secs(60), || {
        let row = get_row(&cluster, "stubborn");
        (row[1] == "3" && row[2] == "Running").then_some(())
    });
    let why = common::wait_for("update-3 to finish", Duration::from_secs(30), || {
        let why = cluster.ok(&["why", "pod/stubborn"]);
        why.contains("finished").then_some(why)
    });
    assert!(!why.contains("Held up"), "{why}");
}

/// A dashboard fragment (`/ui/part/PART`), signed in with the admin token.
fn dashboard_part(cluster: &Node, part: &str) -> String {
    let config = cluster.client_config();
    let (server, token) = (
        config["server"].as_str().expect("server"),
        config["token"].as_str().expect("token"),
    );
    let ca = config["ca"].as_str().expect("a CA in the config");
    let http = reqwest::blocking::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(ca.as_bytes()).expect("CA"))
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(20))
        .build()
        .expect("client");
    let signed = http
        .post(format!("{server}/ui/login"))
        .form(&[("token", token)])
        .send()
        .expect("sign in");
    assert_eq!(signed.status(), 303);
    let cookie = signed.headers()["set-cookie"]
        .to_str()
        .expect("cookie")
        .split(';')
        .next()
        .unwrap_or_default()
        .to_string();
    let response = http
        .get(format!("{server}/ui/part/{part}"))
        .header("cookie", cookie)
        .send()
        .expect("part");
    assert!(response.status().is_success(), "{}", response.status());
    response.text().expect("part text")
}

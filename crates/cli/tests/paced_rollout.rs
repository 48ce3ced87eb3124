//! End-to-end acceptance of paced rollouts on a real node with runc: a
//! template edit of a 4-replica PinnedDeployment with maxUnavailable 1
//! never has more than one pod unready at once (sampled through a watch of
//! the pods), and a template whose readiness probe always fails halts the
//! rollout after one pod, with the reason in `why pd/…`.
//! Needs root, runc and busybox-static; fails (never skips) without them.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{CORRAL, Cluster, wait_for};
use serde_json::Value;

fn deployment(version: &str, probe: &str) -> String {
    format!(
        "kind: PinnedDeployment
metadata: {{name: web}}
spec:
  replicas: 4
  replicasPercentNext: 100
  maxUnavailable: 1
  progressDeadlineSeconds: 15
  selector: {{app: web}}
  templates:
    previous:
      metadata: {{labels: {{app: web}}}}
      spec:
        terminationGraceSeconds: 0
        containers:
          - {{name: web, image: local/busybox:1, command: [sleep, \"3600\"]}}
    next:
      metadata: {{labels: {{app: web}}}}
      spec:
        terminationGraceSeconds: 0
        containers:
          - name: web
            image: local/busybox:1
            command: [sh, -c, \"sleep 1; touch /tmp/ready; sleep 3600\"]
            env: {{VERSION: {version}}}
            readiness: {{exec: {{command: [{probe}]}}, periodSeconds: 1}}
"
    )
}

/// Ready as the controller counts it: running its current revision with
/// every container ready.
fn ready(pod: &Value) -> bool {
    let status = &pod["status"];
    let containers = status["containers"].as_array().cloned().unwrap_or_default();
    status["phase"] == "Running"
        && status["observedRevision"] == pod["metadata"]["revision"]
        && !containers.is_empty()
        && containers.iter().all(|c| c["ready"] == true)
}

/// `corral get pods -w -o json`, replayed: the most pods of pd/web unready
/// at once, counting from when all four were first seen.
struct PodWatch {
    child: std::process::Child,
    seen: Arc<Mutex<Vec<Value>>>,
}

impl PodWatch {
    fn start(cluster: &Cluster) -> PodWatch {
        let mut child = Command::new(CORRAL)
            .args(["get", "pods", "-w", "-o", "json"])
            .env("CORRAL_CONFIG", &cluster.config)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the watch");
        let stdout = child.stdout.take().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = seen.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Ok(value) = serde_json::from_str::<Value>(&line) {
                    sink.lock().unwrap().push(value);
                }
            }
        });
        PodWatch { child, seen }
    }

    /// (most unready at once, events replayed).
    fn most_unready(&self) -> (usize, usize) {
        let mut readiness: BTreeMap<String, bool> = BTreeMap::new();
        let mut most = 0;
        let events = self.seen.lock().unwrap();
        for event in events.iter() {
            if event["metadata"]["annotations"]["corral.dev/pinned-deployment"] != "web" {
                continue;
            }
            let name = event["metadata"]["name"].as_str().unwrap().to_string();
            readiness.insert(name, ready(event));
            if readiness.len() == 4 {
                most = most.max(readiness.values().filter(|r| !**r).count());
            }
        }
        (most, events.len())
    }
}

impl Drop for PodWatch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// name → (env VERSION, ready).
fn pods(cluster: &Cluster) -> BTreeMap<String, (String, bool)> {
    let listed: Value =
        serde_json::from_str(&cluster.ok(&["get", "pods", "-l", "app=web", "-o", "json"])).unwrap();
    listed["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|pod| {
            (
                pod["metadata"]["name"].as_str().unwrap().to_string(),
                (
                    pod["spec"]["containers"][0]["env"]["VERSION"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    ready(pod),
                ),
            )
        })
        .collect()
}

#[test]
fn a_template_edit_takes_one_pod_down_at_a_time_and_halts_when_never_ready() {
    let cluster = &common::start_node();
    let apply = |version: &str, probe: &str| {
        let path = cluster.manifest(&format!("web-{version}.yaml"), &deployment(version, probe));
        cluster.ok(&["apply", "-f", &path]);
    };
    apply("one", "sh, -c, \"test -f /tmp/ready\"");
    let out = cluster.ok(&["rollout", "status", "pd/web", "--timeout", "120"]);
    assert!(out.contains("rollout settled"), "{out}");

    let watch = PodWatch::start(cluster);
    wait_for(
        "the watch to list the pods",
        Duration::from_secs(10),
        || (watch.most_unready().1 >= 4).then_some(()),
    );
    apply("two", "sh, -c, \"test -f /tmp/ready\"");
    let out = cluster.ok(&["rollout", "status", "pd/web", "--timeout", "120"]);
    assert!(out.contains("rollout settled"), "{out}");
    let now = pods(cluster);
    assert!(
        now.values()
            .all(|(version, ready)| version == "two" && *ready),
        "{now:?}"
    );
    let (most, events) = watch.most_unready();
    assert_eq!(
        most, 1,
        "one pod at a time was down, never two ({events} events sampled)"
    );

    // A template that never becomes ready: one pod goes, then the rollout halts.
    apply("three", "sh, -c, \"exit 1\"");
    let why = wait_for("the rollout to halt", Duration::from_secs(90), || {
        let why = cluster.ok(&["why", "pd/web"]);
        why.contains("rollout halted").then_some(why)
    });
    assert!(
        why.starts_with("pd/web (revision 3) rollout halted: pod web-0 (next) not ready 15s after the last progress"),
        "{why}"
    );
    assert!(why.contains("container web"), "the pod's own reason: {why}");
    let now = pods(cluster);
    let converted: Vec<&String> = now
        .iter()
        .filter(|(_, (version, _))| version == "three")
        .map(|(name, _)| name)
        .collect();
    assert_eq!(converted, ["web-0"], "{now:?}");
    let still_ready = now
        .values()
        .filter(|(v, ready)| v == "two" && *ready)
        .count();
    assert_eq!(still_ready, 3, "{now:?}");
    let refused = cluster.fails(&["rollout", "status", "pd/web", "--timeout", "30"]);
    assert!(refused.contains("rollout halted: pod web-0"), "{refused}");
    // Still halted a while later: nothing else was converted.
    std::thread::sleep(Duration::from_secs(3));
    let later = pods(cluster);
    assert_eq!(
        later.values().filter(|(v, _)| v == "three").count(),
        1,
        "{later:?}"
    );

    // Fixing the template (a new revision) ends the halt and rolls on.
    apply("four", "sh, -c, \"test -f /tmp/ready\"");
    let out = cluster.ok(&["rollout", "status", "pd/web", "--timeout", "120"]);
    assert!(out.contains("rollout settled"), "{out}");

    // Paused, moving the share converts nothing; resumed, it goes on.
    let out = cluster.ok(&["rollout", "pause", "pd/web"]);
    assert!(out.contains("paused"), "{out}");
    cluster.ok(&["rollout", "pd/web", "--percent", "0"]);
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        pods(cluster).values().all(|(v, _)| v == "four"),
        "paused: {:?}",
        pods(cluster)
    );
    let why = cluster.ok(&["why", "pd/web"]);
    assert!(why.contains("rollout is paused"), "{why}");
    cluster.ok(&["rollout", "resume", "pd/web"]);
    let out = cluster.ok(&["rollout", "status", "pd/web", "--timeout", "120"]);
    assert!(out.contains("rollout settled"), "{out}");
    // On previous now, which sets no VERSION.
    assert!(pods(cluster).values().all(|(v, r)| v.is_empty() && *r));
    cluster.ok(&["delete", "pd/web"]);
}

//! End-to-end acceptance of Jobs on a real node with runc: completions 3,
//! parallelism 2 finishes with 3 successes and never more than 2 pods
//! active (sampled through a watch); `logs job/…` shows each pod's output;
//! a Job whose pod exits 1 retries up to its backoff limit and ends
//! Failed with the exit code in `why job/…`; a scheduled Job makes runs.
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

/// Follows `corral get pods -w -o json`: every pod's phases as seen, in
/// order, and the most pods of `job` active (Pending or Running) at once.
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

    /// The most pods of `job` that were active at once, replaying the
    /// events in order.
    fn most_active(&self, job: &str) -> usize {
        let mut phases: BTreeMap<String, String> = BTreeMap::new();
        let mut most = 0;
        for event in self.seen.lock().unwrap().iter() {
            if event["metadata"]["labels"]["corral.dev/job"] != job {
                continue;
            }
            let name = event["metadata"]["name"].as_str().unwrap().to_string();
            if event["deleted"] == true {
                phases.remove(&name);
            } else {
                let phase = event["status"]["phase"].as_str().unwrap_or("Pending");
                phases.insert(name, phase.to_string());
            }
            let active = phases
                .values()
                .filter(|p| *p == "Pending" || *p == "Running")
                .count();
            most = most.max(active);
        }
        most
    }

    fn events(&self) -> usize {
        self.seen.lock().unwrap().len()
    }
}

impl Drop for PodWatch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn job_status(cluster: &Cluster, job: &str) -> Value {
    cluster.get_json(&format!("job/{job}"))["status"].clone()
}

fn wait_finished(cluster: &Cluster, job: &str) -> Value {
    wait_for(
        &format!("job/{job} to finish"),
        Duration::from_secs(120),
        || {
            let status = job_status(cluster, job);
            matches!(status["phase"].as_str(), Some("Complete" | "Failed")).then_some(status)
        },
    )
}

/// The pods of `job`, name → phase.
fn job_pods(cluster: &Cluster, job: &str) -> BTreeMap<String, String> {
    let selector = format!("corral.dev/job={job}");
    let listed: Value =
        serde_json::from_str(&cluster.ok(&["get", "pods", "-l", &selector, "-o", "json"])).unwrap();
    listed["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|pod| {
            (
                pod["metadata"]["name"].as_str().unwrap().to_string(),
                pod["status"]["phase"].as_str().unwrap_or("-").to_string(),
            )
        })
        .collect()
}

const BATCH: &str = "kind: Job
metadata: {name: batch}
spec:
  completions: 3
  parallelism: 2
  template:
    metadata: {labels: {app: batch}}
    spec:
      restartPolicy: Never
      terminationGraceSeconds: 0
      containers:
        - {name: work, image: local/busybox:1, command: [sh, -c, \"echo working on $HOSTNAME; sleep 2\"]}
";

#[test]
fn a_job_runs_three_completions_two_at_a_time() {
    let cluster = &common::start_node();
    let watch = PodWatch::start(cluster);
    // The watch prints nothing for an empty list: give it a moment to list.
    std::thread::sleep(Duration::from_secs(1));
    cluster.ok(&["apply", "-f", &cluster.manifest("batch.yaml", BATCH)]);
    let status = wait_finished(cluster, "batch");
    assert_eq!(status["phase"], "Complete", "{status}");
    assert_eq!(status["succeeded"], 3, "{status}");
    assert_eq!(status["failed"], 0, "{status}");
    assert_eq!(status["active"], 0, "{status}");
    assert_eq!(status["reason"], "3 of 3 pods succeeded", "{status}");
    let pods = job_pods(cluster, "batch");
    assert_eq!(
        pods,
        BTreeMap::from([
            ("batch-0".to_string(), "Succeeded".to_string()),
            ("batch-1".to_string(), "Succeeded".to_string()),
            ("batch-2".to_string(), "Succeeded".to_string()),
        ])
    );
    // Sampled through the watch: never more than parallelism at once, and
    // two did run together.
    wait_for(
        "the watch to see the last pod finish",
        Duration::from_secs(10),
        || (watch.most_active("batch") > 0 && watch.events() >= 6).then_some(()),
    );
    assert_eq!(watch.most_active("batch"), 2, "parallelism 2");

    let table = cluster.ok(&["get", "jobs"]);
    assert!(table.contains("COMPLETIONS"), "{table}");
    let row = table.lines().find(|l| l.starts_with("batch")).unwrap();
    assert!(row.contains("Complete") && row.contains("3/3"), "{table}");
    let why = cluster.ok(&["why", "job/batch"]);
    assert!(
        why.starts_with("job/batch (revision 1) is complete: 3 of 3 pods succeeded"),
        "{why}"
    );
    assert!(why.contains("pod/batch-2: succeeded"), "{why}");
    let logs = cluster.ok(&["logs", "job/batch"]);
    for index in 0..3 {
        assert!(
            logs.contains(&format!("==> pod/batch-{index} <==\nworking on")),
            "{logs}"
        );
    }
    // Pods were made by the job controller, named in their history.
    let history: Value =
        serde_json::from_str(&cluster.ok(&["history", "pod/batch-1", "-o", "json"])).unwrap();
    assert_eq!(history[0]["author"], "job", "{history}");
    let history: Value =
        serde_json::from_str(&cluster.ok(&["history", "job/batch", "-o", "json"])).unwrap();
    assert_eq!(history.as_array().unwrap().len(), 1, "{history}");

    // Deleting the Job deletes its pods.
    cluster.ok(&["delete", "job/batch"]);
    wait_for("the job's pods to go", Duration::from_secs(30), || {
        job_pods(cluster, "batch").is_empty().then_some(())
    });
}

const FAILING: &str = "kind: Job
metadata: {name: flaky}
spec:
  backoffLimit: 2
  template:
    spec:
      restartPolicy: Never
      terminationGraceSeconds: 0
      containers:
        - {name: work, image: local/busybox:1, command: [sh, -c, \"echo trying; exit 1\"]}
";

#[test]
fn a_failing_job_retries_to_its_backoff_limit_and_why_names_the_exit_code() {
    let cluster = &common::start_node();
    cluster.ok(&["apply", "-f", &cluster.manifest("flaky.yaml", FAILING)]);
    let status = wait_finished(cluster, "flaky");
    assert_eq!(status["phase"], "Failed", "{status}");
    assert_eq!(
        status["failed"], 3,
        "the first try and two retries: {status}"
    );
    assert_eq!(status["succeeded"], 0, "{status}");
    let pods = job_pods(cluster, "flaky");
    assert_eq!(
        pods.keys().collect::<Vec<_>>(),
        ["flaky-0", "flaky-1", "flaky-2"],
        "no pod after the limit: {pods:?}"
    );
    assert!(pods.values().all(|p| p == "Failed"), "{pods:?}");
    let why = cluster.ok(&["why", "job/flaky"]);
    assert!(
        why.starts_with(
            "job/flaky (revision 1) failed: pod flaky-2: container work exited 1; backoff limit 2 reached"
        ),
        "{why}"
    );
    assert!(
        why.contains("pod/flaky-0: failed: container work exited 1"),
        "{why}"
    );
    let table = cluster.ok(&["get", "jobs"]);
    let row = table.lines().find(|l| l.starts_with("flaky")).unwrap();
    assert!(row.contains("Failed") && row.contains("0/1"), "{table}");
    // It stays failed: no pod comes after a while.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(job_pods(cluster, "flaky").len(), 3);
    cluster.ok(&["delete", "job/flaky"]);
}

const NIGHTLY: &str = "kind: Job
metadata: {name: tick}
spec:
  schedule: \"* * * * *\"
  concurrencyPolicy: Forbid
  ttlSecondsAfterFinished: 600
  template:
    spec:
      restartPolicy: Never
      terminationGraceSeconds: 0
      containers:
        - {name: work, image: local/busybox:1, command: [echo, tick]}
";

#[test]
fn a_scheduled_job_makes_a_run_that_completes() {
    let cluster = &common::start_node();
    cluster.ok(&["apply", "-f", &cluster.manifest("tick.yaml", NIGHTLY)]);
    let status = wait_for("job/tick to be scheduled", Duration::from_secs(30), || {
        let status = job_status(cluster, "tick");
        (status["phase"] == "Scheduled").then_some(status)
    });
    assert!(status["nextScheduleAt"].is_string(), "{status}");
    let run = wait_for("a run of job/tick", Duration::from_secs(75), || {
        job_status(cluster, "tick")["lastRun"]
            .as_str()
            .map(str::to_string)
    });
    assert!(run.starts_with("tick-"), "{run}");
    let finished = wait_finished(cluster, &run);
    assert_eq!(finished["phase"], "Complete", "{finished}");
    let child = cluster.get_json(&format!("job/{run}"));
    assert_eq!(child["metadata"]["owner"]["name"], "tick", "{child}");
    assert!(child["spec"].get("schedule").is_none(), "{child}");
    let why = cluster.ok(&["why", "job/tick"]);
    assert!(why.contains("is scheduled (* * * * *)"), "{why}");
    assert!(why.contains(&format!("last run job/{run}")), "{why}");
    // Deleting the scheduled Job deletes its runs and their pods.
    cluster.ok(&["delete", "job/tick"]);
    let gone = cluster.fails(&["get", &format!("job/{run}")]);
    assert!(gone.contains("not found"), "{gone}");
}

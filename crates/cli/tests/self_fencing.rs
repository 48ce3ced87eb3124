//! Self-fencing end to end on a 3-node `corral lab` with short clocks: a
//! firewall rule inside node-1's namespace cuts it off from the server
//! (its agent keeps running); node-1 stops its `availability: ha` pod by
//! itself while cut off, the control plane starts it on another node only
//! after node-1's fencing deadline, and runc's state on every node, sampled
//! every 200 ms throughout, never shows two running copies. The
//! best-effort pod on node-1 keeps running. Healed, node-1 does not start
//! the moved pod again, and `why`/`history` on the node and the pod say
//! what happened. A second, shorter partition (past the fencing period,
//! short of the replace deadline) stops the ha pod and node-1 starts it
//! again itself on return. Needs root, runc, nft and busybox; fails without.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::lab::Lab;
use common::wait_for;
use serde_json::Value;

/// The lab's clocks: a 6 s fencing period (renewals every 2 s), Silent
/// after 6 s, a 1 s ha grace.
const FENCE_AFTER: u64 = 6;
const SERVER_ARGS: [&str; 3] = [
    "--server-arg=--fence-after=6",
    "--server-arg=--silent-after=6",
    "--server-arg=--ha-grace=1",
];

/// The nftables table the test adds in node-1's namespace (removed with
/// the namespace by `lab down` even if the test fails).
const TABLE: &str = "corral_selffence_test";

fn pod(name: &str, availability: &str) -> String {
    format!(
        "kind: Pod\nmetadata: {{name: {name}}}\nspec:\n  availability: {availability}\n  terminationGraceSeconds: 1\n  containers:\n    - {{name: main, image: local/busybox:1, command: [sleep, \"3600\"]}}\n"
    )
}

fn node_spec(name: &str, unschedulable: bool) -> String {
    format!("kind: Node\nmetadata: {{name: {name}}}\nspec: {{unschedulable: {unschedulable}}}\n")
}

fn apply(lab: &Lab, file: &str, text: &str) {
    let path = lab.dir.join(file);
    std::fs::write(&path, text).expect("write manifest");
    lab.corral(&["apply", "-f", &path.to_string_lossy()]);
}

/// (node, phase) of a pod.
fn placed(lab: &Lab, name: &str) -> Option<(String, String)> {
    let pod = lab.json(&format!("pod/{name}"))?;
    Some((
        pod["status"]["node"].as_str()?.to_string(),
        pod["status"]["phase"].as_str()?.to_string(),
    ))
}

/// The runc containers running now under `root` whose id starts with
/// `prefix` (`c<uid prefix>-`).
fn running(root: &Path, prefix: &str) -> Vec<String> {
    let output = Command::new("runc")
        .arg(format!("--root={}", root.display()))
        .args(["list", "--format", "json"])
        .output()
        .expect("run runc list");
    assert!(output.status.success(), "runc list: {output:?}");
    // An empty root lists as `null`.
    let listed: Value = serde_json::from_slice(&output.stdout).unwrap_or(Value::Null);
    listed
        .as_array()
        .map(|containers| {
            containers
                .iter()
                .filter(|c| c["status"] == "running")
                .filter_map(|c| c["id"].as_str())
                .filter(|id| id.starts_with(prefix))
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// The `c<uid prefix>-` of the runtime ids of a pod's containers.
fn id_prefix(uid: &str) -> String {
    let short: String = uid
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(12)
        .collect();
    format!("c{short}-")
}

/// One sample of every node: which nodes run a copy of the ha pod, and
/// whether node-1 runs the best-effort pod.
#[derive(Debug, Clone)]
struct Sample {
    at: Duration,
    ha_on: Vec<String>,
    best_on_node1: bool,
}

/// Samples every node's runc state every 200 ms until [`Sampler::finish`].
struct Sampler {
    samples: Arc<Mutex<Vec<Sample>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Sampler {
    fn start(began: Instant, roots: &[(String, PathBuf)], ha: &str, best: &str) -> Sampler {
        let samples = Arc::new(Mutex::new(Vec::<Sample>::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (into, stopped, roots, ha, best) = (
            samples.clone(),
            stop.clone(),
            roots.to_vec(),
            ha.to_string(),
            best.to_string(),
        );
        let thread = std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                let at = began.elapsed();
                let ha_on: Vec<String> = roots
                    .iter()
                    .filter(|(_, root)| !running(root, &ha).is_empty())
                    .map(|(node, _)| node.clone())
                    .collect();
                let best_on_node1 = !running(&roots[1].1, &best).is_empty();
                into.lock().expect("samples").push(Sample {
                    at,
                    ha_on,
                    best_on_node1,
                });
                // Every 200 ms, whatever the runc calls took.
                let next = at + Duration::from_millis(200);
                std::thread::sleep(next.saturating_sub(began.elapsed()));
            }
        });
        Sampler {
            samples,
            stop,
            thread: Some(thread),
        }
    }

    fn finish(mut self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            thread.join().expect("the sampler");
        }
        self.samples.lock().expect("samples").clone()
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Cuts node-1 off from the API on node-0 (`off: true`) or heals it: a
/// table of drop rules inside node-1's namespace (removed with the
/// namespace by `lab down` even if the test fails).
fn cut(lab: &Lab, off: bool) {
    let server = lab.node_field(0, "ipv6");
    let nft = |command: &str| {
        lab.run("node-1", &["sh", "-c", &format!("nft '{command}'")]);
    };
    if !off {
        nft(&format!("delete table inet {TABLE}"));
        return;
    }
    nft(&format!("add table inet {TABLE}"));
    nft(&format!(
        "add chain inet {TABLE} out {{ type filter hook output priority 0 ; policy accept ; }}"
    ));
    nft(&format!(
        "add chain inet {TABLE} in {{ type filter hook input priority 0 ; policy accept ; }}"
    ));
    nft(&format!(
        "add rule inet {TABLE} out ip6 daddr {server} tcp dport 7443 drop"
    ));
    nft(&format!(
        "add rule inet {TABLE} in ip6 saddr {server} tcp sport 7443 drop"
    ));
}

/// Places pod `name` (`availability`) on node-1: the others are cordoned
/// while it is placed.
fn place_on_node1(lab: &Lab, name: &str, availability: &str) {
    apply(lab, "cordon0.yaml", &node_spec("node-0", true));
    apply(lab, "cordon2.yaml", &node_spec("node-2", true));
    apply(lab, &format!("{name}.yaml"), &pod(name, availability));
    wait_for(
        &format!("{name} to run on node-1"),
        Duration::from_secs(90),
        || (placed(lab, name)? == ("node-1".into(), "Running".into())).then_some(()),
    );
    apply(lab, "uncordon0.yaml", &node_spec("node-0", false));
    apply(lab, "uncordon2.yaml", &node_spec("node-2", false));
}

#[test]
fn a_cut_off_node_fences_its_ha_pod_before_it_runs_elsewhere() {
    corral_testkit::require_root();
    for tool in ["runc", "nft", "ip"] {
        corral_testkit::require_tool(tool);
    }
    let images = tempfile::tempdir().expect("temp dir");
    let tar =
        corral_testkit::busybox_image_tar(images.path(), corral_testkit::ImageFormat::OciLayout);
    let lab = Lab::up("selffence", 3, &tar, &SERVER_ARGS);

    // Both pods on node-1.
    place_on_node1(&lab, "ha", "ha");
    place_on_node1(&lab, "best", "best-effort");
    let uid = |name: &str| {
        lab.json(&format!("pod/{name}")).expect("the pod")["metadata"]["uid"]
            .as_str()
            .expect("a uid")
            .to_string()
    };
    let (ha, best) = (id_prefix(&uid("ha")), id_prefix(&uid("best")));
    let roots: Vec<(String, PathBuf)> = (0..3)
        .map(|i| {
            (
                format!("node-{i}"),
                lab.dir.join(format!("node-{i}")).join("runc"),
            )
        })
        .collect();
    assert_eq!(running(&roots[1].1, &ha).len(), 1, "one ha copy on node-1");

    // Sample every node's runc state every 200 ms from now to the end.
    let began = Instant::now();
    let sampler = Sampler::start(began, &roots, &ha, &best);

    // Cut node-1 off from the server: its packets to and from the API
    // port on node-0 are dropped inside node-1's namespace.
    cut(&lab, true);
    let cut_at = began.elapsed();

    // The pod runs elsewhere within the fencing period + 15 s.
    let moved_to = wait_for(
        "pod/ha to run on another node",
        Duration::from_secs(FENCE_AFTER + 15),
        || match placed(&lab, "ha")? {
            (node, phase) if node != "node-1" && phase == "Running" => Some(node),
            _ => None,
        },
    );
    let elsewhere_after = began.elapsed() - cut_at;
    wait_for(
        "the moved copy to show in runc",
        Duration::from_secs(10),
        || {
            let root = &roots.iter().find(|(n, _)| *n == moved_to)?.1;
            (!running(root, &ha).is_empty()).then_some(())
        },
    );
    assert_eq!(placed(&lab, "best").expect("pod/best").0, "node-1");
    // While node-1 is still cut off, the node and the pod say why.
    let why_node = lab.corral(&["why", "node/node-1"]);
    assert!(
        why_node.contains("is silent since") && why_node.contains("(self-fencing)"),
        "{why_node}"
    );
    let history: Vec<Value> =
        serde_json::from_str(&lab.corral(&["history", "pod/ha", "-o", "json"])).expect("json");
    let last = history.last().expect("a history record");
    let message = last["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("moved off node-1: the node is silent since")
            && message.contains("the node has stopped its copy itself (self-fencing)"),
        "{history:?}"
    );
    assert_eq!(last["author"], "scheduler", "{history:?}");

    // Heal: node-1 reaches the server again.
    cut(&lab, false);
    let healed = began.elapsed();
    wait_for(
        "node-1 to report its self-fence",
        Duration::from_secs(60),
        || {
            let node = lab.json("node/node-1")?;
            (node["status"]["phase"] == "Ready"
                && node["status"]["lastFence"]["returnedAt"].is_string())
            .then_some(())
        },
    );
    // Let the sampler see a few seconds after the report.
    std::thread::sleep(Duration::from_secs(4));
    let samples = sampler.finish();

    // No moment with two copies; the best-effort pod never stopped.
    let twice: Vec<&Sample> = samples.iter().filter(|s| s.ha_on.len() > 1).collect();
    assert!(twice.is_empty(), "two copies ran at once: {twice:?}");
    let best_gone: Vec<&Sample> = samples.iter().filter(|s| !s.best_on_node1).collect();
    assert!(
        best_gone.is_empty(),
        "the best-effort pod stopped: {best_gone:?}"
    );
    // node-1 stopped its copy while still cut off, and before the move.
    let stopped = samples
        .iter()
        .find(|s| s.at > cut_at && !s.ha_on.contains(&"node-1".to_string()))
        .expect("a sample without node-1's copy")
        .at;
    assert!(
        stopped < healed,
        "node-1 stopped its copy only after healing"
    );
    let started_elsewhere = samples
        .iter()
        .find(|s| s.ha_on.iter().any(|n| *n != "node-1"))
        .expect("a sample with the moved copy")
        .at;
    assert!(stopped <= started_elsewhere);
    // After healing exactly one copy runs, on the node it moved to.
    let last = samples.last().expect("samples");
    assert_eq!(last.ha_on, vec![moved_to.clone()], "{last:?}");
    assert!(running(&roots[1].1, &ha).is_empty());
    assert_eq!(
        placed(&lab, "ha"),
        Some((moved_to.clone(), "Running".into()))
    );
    assert_eq!(
        placed(&lab, "best"),
        Some(("node-1".into(), "Running".into()))
    );

    // What happened, in the node's history and in `why`.
    let node_history: Vec<Value> =
        serde_json::from_str(&lab.corral(&["history", "node/node-1", "-o", "json"])).expect("json");
    let fenced = node_history
        .iter()
        .rev()
        .find(|r| {
            r["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("fenced itself at"))
        })
        .unwrap_or_else(|| panic!("no self-fence in the node's history: {node_history:?}"));
    let summary = fenced["message"].as_str().unwrap_or_default();
    assert!(
        summary.contains("stopped its ha pods default/ha")
            && summary.contains("moved meanwhile, not started again: default/ha"),
        "{summary}"
    );
    assert!(!summary.contains("default/best"), "{summary}");
    let why_node = lab.corral(&["why", "node/node-1"]);
    assert!(
        why_node.contains("Self-fencing:\n  fenced itself at"),
        "{why_node}"
    );
    let why_pod = lab.corral(&["why", "pod/ha"]);
    assert!(
        why_pod.contains("fenced by its node node-1 at")
            && why_pod.contains(&format!("; replaced on {moved_to}")),
        "{why_pod}"
    );
    eprintln!(
        "self-fencing: {} samples over {:?}; node-1 stopped its copy {:?} after the cut, \
         it ran on {moved_to} {:?} after the cut (seen by the API {elsewhere_after:?}); healed at {:?}",
        samples.len(),
        last.at,
        stopped - cut_at,
        started_elsewhere - cut_at,
        healed - cut_at,
    );

    // A partition longer than the fencing period but shorter than the
    // replace deadline: node-1 stops its ha pod, nothing moves it, and
    // back in contact node-1 starts it again itself.
    place_on_node1(&lab, "ha2", "ha");
    let ha2 = id_prefix(&uid("ha2"));
    let began = Instant::now();
    let sampler = Sampler::start(began, &roots, &ha2, &best);
    cut(&lab, true);
    let cut_at = began.elapsed();
    wait_for(
        "node-1 to stop pod/ha2 by itself",
        Duration::from_secs(FENCE_AFTER + 5),
        || running(&roots[1].1, &ha2).is_empty().then_some(()),
    );
    let fenced_after = began.elapsed() - cut_at;
    let still = placed(&lab, "ha2").expect("pod/ha2");
    assert_eq!(still.0, "node-1", "not moved yet");
    cut(&lab, false);
    wait_for(
        "node-1 to start pod/ha2 again",
        Duration::from_secs(60),
        || {
            let node = lab.json("node/node-1")?;
            let restarted = node["status"]["lastFence"]["restarted"]
                .as_array()?
                .iter()
                .any(|p| p == "default/ha2");
            (restarted && running(&roots[1].1, &ha2).len() == 1).then_some(())
        },
    );
    let back_after = began.elapsed() - cut_at;
    std::thread::sleep(Duration::from_secs(3));
    let samples = sampler.finish();
    let elsewhere: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.ha_on.iter().any(|n| n != "node-1"))
        .collect();
    assert!(elsewhere.is_empty(), "pod/ha2 ran elsewhere: {elsewhere:?}");
    let best_gone: Vec<&Sample> = samples.iter().filter(|s| !s.best_on_node1).collect();
    assert!(
        best_gone.is_empty(),
        "the best-effort pod stopped: {best_gone:?}"
    );
    assert!(
        samples.iter().any(|s| s.ha_on.is_empty()),
        "no sample saw pod/ha2 stopped"
    );
    assert_eq!(
        samples.last().expect("samples").ha_on,
        vec!["node-1".to_string()]
    );
    assert_eq!(
        placed(&lab, "ha2"),
        Some(("node-1".into(), "Running".into()))
    );
    let why = lab.corral(&["why", "pod/ha2"]);
    assert!(
        why.contains("fenced by its node node-1 at")
            && why.contains("started again there on its return (it had not been moved)")
            && why.contains("restarted: stopped by its node: self-fencing after"),
        "{why}"
    );
    eprintln!(
        "short partition: node-1 stopped pod/ha2 {fenced_after:?} after the cut and ran it again {back_after:?} after the cut"
    );
}

//! The HA control plane end to end: real `corral server` processes on a
//! real etcd cluster (Debian's `etcd-server`) on loopback.
//!
//! - apply, history and rollback behave the same on SQLite and on etcd
//!   (one check, run against both backends);
//! - three servers on a three-member etcd serve one cluster: an object
//!   applied through one is seen, with the same resourceVersion, through
//!   the others;
//! - under a stream of applies through a client that knows every server,
//!   one etcd member and one corral server are killed: every acknowledged
//!   revision is in history afterwards (checked against the client's log),
//!   and a sampler reading every live server's `/metrics` all along never
//!   sees two servers running the built-in controllers (the scheduler among
//!   them) at once;
//! - `corral migrate` copies a SQLite cluster to etcd with its whole history.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Cluster, wait_for};
use corral_testkit::etcd::EtcdCluster;
use serde_json::Value;

fn pod(command: &str) -> String {
    format!(
        "kind: Pod\nmetadata: {{name: web}}\nspec:\n  containers:\n    - name: web\n      image: local/busybox:1\n      command: [{command}]\n"
    )
}

/// Apply, edit, history, rollback, watch: the same answers whatever the
/// backend.
fn apply_history_rollback(cluster: &Cluster) {
    cluster.ok(&[
        "apply",
        "-f",
        &cluster.manifest("v1.yaml", &pod("httpd, -f")),
        "-m",
        "first",
    ]);
    cluster.ok(&[
        "apply",
        "-f",
        &cluster.manifest("v2.yaml", &pod("httpd, -f, -v")),
        "-m",
        "verbose",
    ]);
    cluster.ok(&["rollback", "pod/web", "--to", "1", "-m", "back to quiet"]);
    let history: Vec<Value> =
        serde_json::from_str(&cluster.ok(&["history", "pod/web", "-o", "json"])).expect("json");
    let summary: Vec<(u64, String, String)> = history
        .iter()
        .map(|record| {
            (
                record["revision"].as_u64().unwrap_or_default(),
                record["author"].as_str().unwrap_or_default().to_string(),
                record["message"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            (1, "admin".into(), "first".into()),
            (2, "admin".into(), "verbose".into()),
            (
                3,
                "admin".into(),
                "rollback to revision 1: back to quiet".into()
            ),
        ],
        "{history:?}"
    );
    let web = cluster.get_json("pod/web");
    assert_eq!(web["metadata"]["revision"], 3);
    assert_eq!(
        web["spec"]["containers"][0]["command"],
        serde_json::json!(["httpd", "-f"])
    );
    let diff = cluster.ok(&["diff", "pod/web", "1", "2"]);
    assert!(diff.contains("-v"), "{diff}");

    // A watch from the beginning replays the pod's three writes in order,
    // then sees a live one.
    let config = cluster.client_config();
    let client = corral_client::Client::new(&corral_client::ClientConfig {
        server: server_url(cluster),
        token: config["token"].as_str().expect("token").to_string(),
        ca: config["ca"].as_str().map(str::to_string),
    })
    .expect("a client");
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    let revisions = runtime.block_on(async {
        use futures::StreamExt;
        let stream = client
            .watch(corral_api::Kind::Pod, Some("default"), Some("web"), 0)
            .await
            .expect("watch");
        let mut stream = std::pin::pin!(stream);
        let mut revisions = Vec::new();
        let mut last = 0;
        let mut applied = false;
        while revisions.last() != Some(&4) {
            if revisions.len() == 3 && !applied {
                applied = true;
                cluster.ok(&[
                    "apply",
                    "-f",
                    &cluster.manifest("v4.yaml", &pod("httpd, -f, -vv")),
                ]);
            }
            let event = tokio::time::timeout(Duration::from_secs(10), stream.next())
                .await
                .expect("an event within 10 s")
                .expect("the watch goes on")
                .expect("a watch event");
            assert!(event.resource_version() > last, "events come in order");
            last = event.resource_version();
            let revision = event.object.metadata.revision;
            if revisions.last() != Some(&revision) {
                revisions.push(revision);
            }
        }
        revisions
    });
    assert_eq!(revisions, [1, 2, 3, 4]);
}

#[test]
fn apply_history_and_rollback_on_sqlite() {
    apply_history_rollback(&Cluster::start_with(&["server"]));
}

#[test]
fn apply_history_and_rollback_on_etcd() {
    let etcd = EtcdCluster::start(3);
    apply_history_rollback(&Cluster::start_with(&[
        "server",
        "--datastore",
        &etcd.datastore_url(),
    ]));
}

/// The `server` URL of a started cluster's admin config.
fn server_url(cluster: &Cluster) -> String {
    cluster.client_config()["server"]
        .as_str()
        .expect("server in the admin config")
        .to_string()
}

/// Since when (unix ms) the server at `url` runs the built-in controllers
/// (`corral_controllers_leading_since_seconds`): `Some(None)` when it does
/// not lead, `None` when it does not answer.
fn leading_since(url: &str, ca: &std::path::Path) -> Option<Option<u64>> {
    let output = std::process::Command::new("curl")
        .args(["-sS", "--max-time", "2", "--cacert"])
        .arg(ca)
        .arg(format!("{url}/metrics"))
        .output()
        .expect("run curl (installed by scripts/setup)");
    if !output.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let value: f64 = text
        .lines()
        .find_map(|line| line.strip_prefix("corral_controllers_leading_since_seconds "))?
        .trim()
        .parse()
        .ok()?;
    let millis = (value * 1000.0).round() as u64;
    Some((millis > 0).then_some(millis))
}

fn leads(url: &str, ca: &std::path::Path) -> bool {
    matches!(leading_since(url, ca), Some(Some(_)))
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as u64
}

/// One server seen leading: asked at `asked`, answered at `answered`,
/// leading since `since` (all unix ms, one machine's clock).
#[derive(Debug, Clone, Copy)]
struct Seen {
    server: usize,
    asked: u64,
    answered: u64,
    since: u64,
}

/// Two servers proven to run the controllers at the same moment: `b` led
/// from `b.since` without a break until it was seen (the same term), so if
/// that began before `a` was asked and `b` was seen after `a` answered, `b`
/// led at the moment `a` said it led.
fn overlap(a: &Seen, b: &Seen) -> bool {
    a.server != b.server && b.since < a.asked && b.asked > a.answered
}

#[test]
fn the_overlap_check_finds_only_proven_overlaps() {
    let seen = |server, asked, since| Seen {
        server,
        asked,
        answered: asked + 10,
        since,
    };
    // B led since 100 and was still leading at 300: A, seen leading at 200, overlapped.
    assert!(overlap(&seen(0, 200, 50), &seen(1, 300, 100)));
    // B's term began after A was asked: a clean handover between the two reads.
    assert!(!overlap(&seen(0, 200, 50), &seen(1, 300, 205)));
    // B seen before A answered: nothing proven.
    assert!(!overlap(&seen(0, 200, 50), &seen(1, 205, 100)));
    // One server never overlaps itself.
    assert!(!overlap(&seen(0, 200, 50), &seen(0, 300, 50)));
}

/// Samples every server's leadership until stopped.
struct LeaderSampler {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Vec<Seen>>>,
    rounds: Arc<Mutex<Vec<Vec<usize>>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl LeaderSampler {
    fn start(urls: Vec<String>, ca: std::path::PathBuf) -> LeaderSampler {
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let rounds = Arc::new(Mutex::new(Vec::new()));
        let thread = {
            let (stop, seen, rounds) = (stop.clone(), seen.clone(), rounds.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    let mut round = Vec::new();
                    for (server, url) in urls.iter().enumerate() {
                        let asked = now_ms();
                        let answer = leading_since(url, &ca);
                        let answered = now_ms();
                        if let Some(Some(since)) = answer {
                            round.push(server);
                            seen.lock().expect("seen").push(Seen {
                                server,
                                asked,
                                answered,
                                since,
                            });
                        }
                    }
                    rounds.lock().expect("rounds").push(round);
                    std::thread::sleep(Duration::from_millis(20));
                }
            })
        };
        LeaderSampler {
            stop,
            seen,
            rounds,
            thread: Some(thread),
        }
    }

    /// Whether a finished round saw a server other than `killed` lead.
    fn saw_another_lead(&self, killed: usize) -> bool {
        self.rounds
            .lock()
            .expect("rounds")
            .iter()
            .any(|round| round.iter().any(|&server| server != killed))
    }

    /// Every sighting, and per round the servers seen leading.
    fn finish(mut self) -> (Vec<Seen>, Vec<Vec<usize>>) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            thread.join().expect("the sampler thread");
        }
        (
            std::mem::take(&mut *self.seen.lock().expect("seen")),
            std::mem::take(&mut *self.rounds.lock().expect("rounds")),
        )
    }
}

impl Drop for LeaderSampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

#[test]
fn three_servers_on_three_etcd_members_survive_losing_one_of_each() {
    let mut etcd = EtcdCluster::start(3);
    let url = etcd.datastore_url();
    // One cluster, one CA: every server's certificate chains to it.
    let tls = tempfile::tempdir().expect("a shared CA dir");
    let tls_dir = tls.path().to_str().expect("utf-8 path");
    let mut servers: Vec<Cluster> = (0..3)
        .map(|_| {
            Cluster::start_with(&[
                "server",
                "--datastore",
                &url,
                "--cluster-prefix",
                "fd00:c0:ff::/48",
                "--tls-dir",
                tls_dir,
            ])
        })
        .collect();

    // One cluster: what one server wrote, another serves at the same version.
    servers[0].ok(&[
        "apply",
        "-f",
        &servers[0].manifest("v1.yaml", &pod("httpd, -f")),
    ]);
    let through_first = servers[0].get_json("pod/web");
    let through_third = servers[2].get_json("pod/web");
    assert_eq!(
        through_first["metadata"]["uid"],
        through_third["metadata"]["uid"]
    );
    assert!(
        through_third["metadata"]["resourceVersion"].as_u64()
            >= through_first["metadata"]["resourceVersion"].as_u64(),
        "resourceVersion is global"
    );

    // A client that knows every server, used with server 0's admin token.
    let urls: Vec<String> = servers.iter().map(server_url).collect();
    let mut config = servers[0].client_config();
    config["server"] = Value::String(urls.join(","));
    let config_path = servers[0].data_dir.path().join("ha-client.json");
    std::fs::write(&config_path, serde_json::to_vec(&config).expect("json")).expect("write config");
    let manifests = tempfile::tempdir().expect("manifest dir");
    let apply = |index: usize| -> Option<u64> {
        let manifest = manifests.path().join(format!("stream-{index}.yaml"));
        std::fs::write(
            &manifest,
            pod(&format!("httpd, -f, -p, \"{}\"", 8000 + index)),
        )
        .expect("write manifest");
        let manifest = manifest.display().to_string();
        let output = std::process::Command::new(common::CORRAL)
            .args(["apply", "-f", &manifest, "-m", &format!("stream {index}")])
            .env("CORRAL_CONFIG", &config_path)
            .output()
            .expect("run corral apply");
        if !output.status.success() {
            eprintln!(
                "apply {index} failed: {}",
                String::from_utf8_lossy(&output.stderr)
            );
            return None;
        }
        // `pod/web configured (revision N)`
        let stdout = String::from_utf8_lossy(&output.stdout);
        let revision = stdout.split("(revision ").nth(1)?;
        revision.trim().trim_end_matches(')').parse().ok()
    };

    // The client-side log of acknowledged (revision, message) pairs.
    let mut acknowledged: Vec<(u64, String)> = Vec::new();
    let mut failures = 0;
    let ca_path = servers[0].data_dir.path().join("ha-ca.pem");
    std::fs::write(&ca_path, config["ca"].as_str().expect("ca in the config")).expect("write ca");
    // Exactly one server leads once the election settled.
    wait_for(
        "one server to lead the controllers",
        Duration::from_secs(20),
        || {
            let leaders = urls.iter().filter(|url| leads(url, &ca_path)).count();
            (leaders == 1).then_some(())
        },
    );
    let sampler = LeaderSampler::start(urls.clone(), ca_path.clone());
    let started = Instant::now();
    let (mut etcd_killed, mut killed) = (false, None);
    for index in 0..40 {
        if index == 10 {
            etcd.kill_member(2);
            etcd_killed = true;
        }
        if index == 20 {
            // The leading server, so the controllers must change hands.
            // (The etcd kill may have just moved the lease: wait for it.)
            let leader = wait_for("a server to lead", Duration::from_secs(20), || {
                urls.iter().position(|url| leads(url, &ca_path))
            });
            servers[leader].kill9();
            killed = Some(leader);
        }
        match apply(index) {
            Some(revision) => acknowledged.push((revision, format!("stream {index}"))),
            None => failures += 1,
        }
    }
    assert!(etcd_killed);
    let killed = killed.expect("a server was killed");
    let live: Vec<usize> = (0..servers.len()).filter(|&i| i != killed).collect();
    // Leadership settles on a live server, and at no sample did two lead.
    wait_for(
        "a live server to lead the controllers",
        Duration::from_secs(30),
        || {
            let leaders = live.iter().filter(|&&i| leads(&urls[i], &ca_path)).count();
            (leaders == 1).then_some(())
        },
    );
    // The sampler's rounds see it too before it stops (a round can take
    // seconds on a loaded machine: it may not have asked since).
    wait_for(
        "the sampler to see a live server lead",
        Duration::from_secs(30),
        || sampler.saw_another_lead(killed).then_some(()),
    );
    let (seen, samples) = sampler.finish();
    // Enough samples to span the kills (a sample waits up to 2 s on a
    // server stalled by the etcd failover, so on a loaded machine there
    // are fewer of them).
    assert!(samples.len() >= 10, "the sampler ran: {samples:?}");
    let overlapping: Vec<(&Seen, &Seen)> = seen
        .iter()
        .flat_map(|a| seen.iter().map(move |b| (a, b)))
        .filter(|(a, b)| overlap(a, b))
        .collect();
    assert!(
        overlapping.is_empty(),
        "two servers ran the controllers at once: {overlapping:?}"
    );
    let mut handovers: Vec<&Vec<usize>> = Vec::new();
    for sample in &samples {
        if handovers.last() != Some(&sample) {
            handovers.push(sample);
        }
    }
    println!(
        "leaders over {} samples (server {killed} killed): {handovers:?}",
        samples.len()
    );
    assert!(
        handovers
            .iter()
            .any(|leaders| leaders.iter().any(|&i| i != killed)),
        "the controllers changed hands: {handovers:?}"
    );
    assert!(
        failures <= 2,
        "clients fail over: {failures} of 40 applies failed"
    );
    let history: Vec<Value> =
        serde_json::from_str(&servers[live[0]].ok(&["history", "pod/web", "-o", "json"]))
            .expect("json");
    for (revision, message) in &acknowledged {
        let kept = history.iter().any(|record| {
            record["revision"].as_u64() == Some(*revision) && record["message"] == *message
        });
        assert!(
            kept,
            "acknowledged revision {revision} ({message}) is lost: {history:?}"
        );
    }
    println!(
        "{} applies acknowledged, {failures} failed, in {:?}",
        acknowledged.len(),
        started.elapsed()
    );
    // Watches resume on any server: a watch from the version the first
    // server returned before the kills, opened on a surviving server,
    // replays what was written since, in order.
    let version = through_first["metadata"]["resourceVersion"]
        .as_u64()
        .expect("version");
    let third = corral_client::Client::new(&corral_client::ClientConfig {
        server: server_url(&servers[live[1]]),
        token: config["token"].as_str().expect("token").to_string(),
        ca: config["ca"].as_str().map(str::to_string),
    })
    .expect("client of a surviving server");
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    runtime.block_on(async {
        use futures::StreamExt;
        let stream = third
            .watch(corral_api::Kind::Pod, Some("default"), Some("web"), version)
            .await
            .expect("watch on a surviving server");
        let mut stream = std::pin::pin!(stream);
        let mut last = version;
        for _ in 0..3 {
            let event = tokio::time::timeout(Duration::from_secs(10), stream.next())
                .await
                .expect("an event within 10 s")
                .expect("the watch goes on")
                .expect("a watch event");
            assert!(event.resource_version() > last, "events come in order");
            last = event.resource_version();
        }
    });
    wait_for(
        "the third server to answer",
        Duration::from_secs(10),
        || {
            servers[live[1]]
                .corral(&["get", "pod/web"])
                .status
                .success()
                .then_some(())
        },
    );
}

/// `corral migrate` moves a SQLite cluster to etcd: a server started on
/// the etcd store answers `history` exactly as the SQLite one did (every
/// revision, author and message), serves the same objects, honours the old
/// tokens; bad input and a second migration are refused without writing.
#[test]
fn migrate_moves_a_sqlite_cluster_to_etcd_with_its_history() {
    let mut old = Cluster::start_with(&["server"]);
    old.ok(&[
        "apply",
        "-f",
        &old.manifest("v1.yaml", &pod("httpd, -f")),
        "-m",
        "first",
    ]);
    for (index, flag) in ["-v", "-vv", "-vvv"].iter().enumerate() {
        old.ok(&[
            "apply",
            "-f",
            &old.manifest(
                &format!("v{}.yaml", index + 2),
                &pod(&format!("httpd, -f, {flag}")),
            ),
            "-m",
            &format!("louder {index}"),
        ]);
    }
    old.ok(&["rollback", "pod/web", "--to", "2", "-m", "too loud"]);
    old.ok(&[
        "token",
        "create",
        "--user",
        "alice",
        "--namespace",
        "team-a",
    ]);
    let history_before = old.ok(&["history", "pod/web", "-o", "json"]);
    let cluster_before = old.ok(&["history", "--since", "1h", "-o", "json"]);
    let web_before = old.get_json("pod/web");
    old.kill9();

    let etcd = EtcdCluster::start(1);
    let url = etcd.datastore_url();
    let store = old.data_dir.path().join("store.db");
    let from = format!("sqlite:{}", store.display());
    let migrate = |from: &str| {
        std::process::Command::new(common::CORRAL)
            .args(["migrate", "--from", from, "--to", &url])
            .output()
            .expect("run corral migrate")
    };

    // A missing source is refused, and nothing is created.
    let missing = old.data_dir.path().join("nothing-here.db");
    let output = migrate(&format!("sqlite:{}", missing.display()));
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("no SQLite store at"), "{stderr}");
    assert!(!missing.exists(), "a refused migration creates no file");

    let output = migrate(&from);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "migrate: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.starts_with("migrated "), "{stdout}");

    // A second migration into the same prefix is refused.
    let output = migrate(&from);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("migrate only into an empty prefix"),
        "{stderr}"
    );

    let tls_dir = old.data_dir.path().join("tls");
    let new = Cluster::start_with(&[
        "server",
        "--datastore",
        &url,
        "--tls-dir",
        tls_dir.to_str().expect("utf-8 path"),
    ]);
    assert_eq!(
        new.ok(&["history", "pod/web", "-o", "json"]),
        history_before
    );
    let cluster_after = new.ok(&["history", "--since", "1h", "-o", "json"]);
    let records = |text: &str| -> Vec<Value> {
        serde_json::from_str::<Vec<Value>>(text)
            .expect("json")
            .into_iter()
            // The new server's own start (its controllers registering) is
            // history made after the migration.
            .filter(|record| record["kind"] == "Pod")
            .collect()
    };
    assert_eq!(records(&cluster_after), records(&cluster_before));
    let history: Vec<Value> = serde_json::from_str(&history_before).expect("json");
    let messages: Vec<&str> = history
        .iter()
        .filter_map(|record| record["message"].as_str())
        .collect();
    assert_eq!(
        messages,
        [
            "first",
            "louder 0",
            "louder 1",
            "louder 2",
            "rollback to revision 2: too loud"
        ]
    );
    let web_after = new.get_json("pod/web");
    for field in ["uid", "revision", "createdAt"] {
        assert_eq!(
            web_after["metadata"][field], web_before["metadata"][field],
            "{field}"
        );
    }
    assert_eq!(web_after["spec"], web_before["spec"]);

    // The old admin token, issued by the SQLite server, works on etcd.
    let mut config = old.client_config();
    config["server"] = new.client_config()["server"].clone();
    let config_path = new.data_dir.path().join("old-admin.json");
    std::fs::write(&config_path, serde_json::to_vec(&config).expect("json")).expect("write config");
    let output = std::process::Command::new(common::CORRAL)
        .arg("whoami")
        .env("CORRAL_CONFIG", &config_path)
        .output()
        .expect("run corral whoami");
    assert!(
        output.status.success() && String::from_utf8_lossy(&output.stdout).contains("admin"),
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

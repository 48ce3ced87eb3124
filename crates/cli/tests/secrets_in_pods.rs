//! End to end through the real binary with runc: a pod mounts a Secret and
//! a Config and reads them; updating the Secret changes the mounted file
//! inside the running container (not restarted), and restarts alone the
//! container that takes the value as env, which sees the new value. The
//! values are found nowhere they must not be: the SQLite files (`store.db*`),
//! history, diff, a watch stream, the step log, the agent's state and the node's
//! disk. A pod reading a missing key fails `node/prepare-volumes`, and
//! `why` names the key.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::Duration;

use corral_testkit::unique_name;
use serde_json::Value;

mod common;

/// Values that must never show outside a container or `reveal`.
const FIRST: &str = "first-pa55-3141-never-shown";
const SECOND: &str = "second-pa55-2718-never-shown";

fn secret(name: &str, password: &str) -> String {
    format!(
        "kind: Secret\nmetadata: {{name: {name}}}\nspec:\n  stringData: {{password: {password}, user: app}}\n"
    )
}

fn pod(name: &str, db: &str, app: &str, key: &str) -> String {
    format!(
        "kind: Pod\nmetadata: {{name: {name}}}\nspec:\n  volumes:\n    - {{name: db, secret: {{name: {db}}}}}\n    - {{name: app, config: {{name: {app}}}}}\n  containers:\n    - name: reader\n      image: local/busybox:1\n      command: [sleep, \"3600\"]\n      mounts: [{{volume: db, path: /etc/db}}, {{volume: app, path: /etc/app}}]\n    - name: envy\n      image: local/busybox:1\n      command: [sleep, \"3600\"]\n      env: {{DB_PASS: {{secret: {db}, key: {key}}}, MODE: {{config: {app}, key: mode}}, PLAIN: text}}\n"
    )
}

fn container<'a>(pod: &'a Value, name: &str) -> &'a Value {
    pod["status"]["containers"]
        .as_array()
        .and_then(|all| all.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("no container {name} in {pod}"))
}

fn assert_hidden(what: &str, text: &str) {
    for value in [FIRST, SECOND] {
        assert!(!text.contains(value), "{what} shows a secret value");
    }
}

/// Every regular file below `dir` as text, skipping mount points (the
/// pod's tmpfs, container root filesystems).
fn files_below(dir: &std::path::Path, found: &mut Vec<(String, String)>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.is_dir() {
            if !corral_runtime::mounts::is_mount_point(&path) {
                files_below(&path, found);
            }
        } else if meta.is_file() && meta.len() < 16 * 1024 * 1024 {
            let bytes = std::fs::read(&path).unwrap_or_default();
            found.push((
                path.display().to_string(),
                String::from_utf8_lossy(&bytes).into_owned(),
            ));
        }
    }
}

#[test]
fn pods_read_secrets_and_configs_updated_in_place_and_values_stay_hidden() {
    let cluster = common::start_node();
    let (db, app, name) = (unique_name("db"), unique_name("app"), unique_name("sp"));
    let target = format!("pod/{name}");
    let path = cluster.manifest("db.yaml", &secret(&db, FIRST));
    cluster.ok(&["apply", "-f", &path]);
    let path = cluster.manifest(
        "app.yaml",
        &format!("kind: Config\nmetadata: {{name: {app}}}\nspec:\n  data: {{mode: fast}}\n"),
    );
    cluster.ok(&["apply", "-f", &path]);

    // A watch of Secrets from before the change to after it.
    let mut watch = Command::new(common::CORRAL)
        .args(["get", "secrets", "-w", "-o", "json"])
        .env("CORRAL_CONFIG", &cluster.config)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn corral get -w");

    let path = cluster.manifest("pod.yaml", &pod(&name, &db, &app, "password"));
    cluster.ok(&["apply", "-f", &path]);
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    let running = loop {
        let pod = cluster.get_json(&target);
        if pod["status"]["phase"] == "Running" {
            break pod;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the pod is not running after 90 s: {}\n{pod}",
            cluster.ok(&["why", &target])
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let cat = |file: &str| cluster.ok(&["exec", &target, "-c", "reader", "--", "cat", file]);
    assert_eq!(cat("/etc/db/password"), FIRST);
    assert_eq!(cat("/etc/db/user"), "app");
    assert_eq!(cat("/etc/app/mode"), "fast");
    let env = |var: &str| {
        cluster
            .ok(&[
                "exec",
                &target,
                "-c",
                "envy",
                "--",
                "sh",
                "-c",
                &format!("echo ${var}"),
            ])
            .trim()
            .to_string()
    };
    assert_eq!(env("DB_PASS"), FIRST);
    assert_eq!(env("MODE"), "fast");
    assert_eq!(env("PLAIN"), "text");
    // Read-only, owned by the pod's root; on the host only root and the
    // pod's root pass through the tmpfs.
    let listing = cluster.ok(&[
        "exec", &target, "-c", "reader", "--", "ls", "-ln", "/etc/db",
    ]);
    let password: Vec<&str> = listing
        .lines()
        .find(|line| line.ends_with(" password"))
        .map(|line| line.split_whitespace().collect())
        .unwrap_or_default();
    assert_eq!(
        password.get(..4),
        Some(&["-r--r--r--", "1", "0", "0"][..]),
        "{listing}"
    );
    let uid = running["metadata"]["uid"]
        .as_str()
        .expect("a uid")
        .to_string();
    let data = cluster.data_dir.path().join("pods").join(&uid).join("data");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&data)
            .expect("the pod's data")
            .permissions(),
    );
    assert_eq!(mode & 0o777, 0o710);
    let write = cluster.corral(&[
        "exec",
        &target,
        "-c",
        "reader",
        "--",
        "sh",
        "-c",
        "echo x > /etc/db/password",
    ]);
    assert!(!write.status.success(), "the secret volume is writable");

    // A new password: the file changes in the running reader; envy alone
    // restarts, with the new value.
    let path = cluster.manifest("db.yaml", &secret(&db, SECOND));
    cluster.ok(&["apply", "-f", &path]);
    common::wait_for(
        "the mounted file to change",
        Duration::from_secs(30),
        || (cat("/etc/db/password") == SECOND).then_some(()),
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let updated = loop {
        let pod = cluster.get_json(&target);
        if container(&pod, "envy")["containerId"] != container(&running, "envy")["containerId"]
            && container(&pod, "envy")["state"] == "running"
        {
            break pod;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "envy did not restart within 60 s: {pod}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    for field in ["containerId", "startedAt"] {
        assert_eq!(
            container(&updated, "reader")[field],
            container(&running, "reader")[field],
            "the reader was restarted"
        );
    }
    assert_eq!(env("DB_PASS"), SECOND);
    assert_eq!(env("MODE"), "fast");
    let message = container(&updated, "envy")["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        message.contains(&format!(
            "restarted: secret/{db} revision 2 changed DB_PASS"
        )),
        "{updated}"
    );
    assert_eq!(
        container(&updated, "envy")["restarts"],
        0,
        "not counted as a crash"
    );
    let why = cluster.ok(&["why", &target]);
    assert!(
        why.contains(&format!(
            "Restarted in place:\n  envy: restarted: secret/{db} revision 2 changed DB_PASS"
        )),
        "{why}"
    );

    // The values are nowhere they must not be.
    std::thread::sleep(Duration::from_secs(1));
    let _ = watch.kill();
    let mut events = String::new();
    watch
        .stdout
        .take()
        .expect("watch stdout")
        .read_to_string(&mut events)
        .expect("read the watch");
    let _ = watch.wait();
    assert!(events.contains(&db), "the watch saw the secret: {events}");
    assert_hidden("the watch stream", &events);
    let secret_target = format!("secret/{db}");
    assert_hidden(
        "history",
        &cluster.ok(&["history", &secret_target, "-o", "json"]),
    );
    let diff = cluster.ok(&["diff", &secret_target, "1", "2"]);
    assert!(diff.contains("password"), "the diff names the key: {diff}");
    assert_hidden("diff", &diff);
    assert_hidden("the step log", &cluster.ok(&["logs", &target, "--steps"]));
    assert_hidden("get", &cluster.ok(&["get", &target, "-o", "json"]));
    let mut files = Vec::new();
    files_below(cluster.data_dir.path(), &mut files);
    assert!(
        files.iter().any(|(path, _)| path.contains("store.db")),
        "the store's files (store.db*) are below the data dir"
    );
    let manifests = cluster.data_dir.path().join("db.yaml");
    for (path, text) in &files {
        // The test's own manifest holds the value, as a person's would.
        if *path != manifests.display().to_string() {
            assert_hidden(path, text);
        }
    }

    // A pod reading a key the Secret lacks: why names the step and the key.
    let broken = unique_name("sp");
    let path = cluster.manifest("broken.yaml", &pod(&broken, &db, &app, "nope"));
    cluster.ok(&["apply", "-f", &path]);
    let why = common::wait_for("why names the missing key", Duration::from_secs(60), || {
        let why = cluster.ok(&["why", &format!("pod/{broken}")]);
        why.contains(&format!("secret {db} has no key nope"))
            .then_some(why)
    });
    assert!(why.contains("node/prepare-volumes"), "{why}");

    // Deleting the pod unmounts its tmpfs.
    assert!(corral_runtime::mounts::is_mount_point(&data));
    cluster.ok(&["delete", &target]);
    common::wait_for("the pod's data to go", Duration::from_secs(60), || {
        (!data.exists()).then_some(())
    });
}

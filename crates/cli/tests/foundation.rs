//! End-to-end acceptance of the foundation: `corral up`, apply, revisions,
//! history and its filters, diff, rollback, optimistic concurrency, bad
//! manifests, and durability across `kill -9`. Drives the real binary.

mod common;

use std::time::Duration;

use common::{Cluster, pod_manifest, wait_for, wait_for_explained};
use serde_json::Value;

#[test]
fn up_prints_its_config_line_within_two_seconds() {
    let mut cluster = Cluster::start();
    assert!(
        cluster.startup < Duration::from_secs(2),
        "corral up took {:?} to print its config line",
        cluster.startup
    );
    assert!(
        cluster
            .ok(&["whoami"])
            .starts_with("admin (operator, external)")
    );
    assert!(
        cluster.terminate(),
        "corral up did not stop cleanly on SIGTERM"
    );
}

#[test]
fn revisions_history_diff_and_rollback() {
    let cluster = Cluster::start();
    let v1 = cluster.manifest("v1.yaml", &pod_manifest("web", "local/busybox:1"));
    let v2 = cluster.manifest("v2.yaml", &pod_manifest("web", "local/busybox:2"));

    assert_eq!(
        cluster.ok(&["apply", "-f", &v1]).trim(),
        "pod/web created (revision 1)"
    );
    let first = cluster.get_json("pod/web");
    assert_eq!(first["metadata"]["revision"], 1);
    for field in [
        "name",
        "namespace",
        "uid",
        "revision",
        "resourceVersion",
        "labels",
    ] {
        assert!(
            !first["metadata"][field].is_null(),
            "metadata.{field} missing: {first}"
        );
    }

    assert_eq!(
        cluster.ok(&["apply", "-f", &v2, "-m", "bump"]).trim(),
        "pod/web configured (revision 2)"
    );
    let second = cluster.get_json("pod/web");
    assert_eq!(second["metadata"]["revision"], 2);
    assert_eq!(second["metadata"]["uid"], first["metadata"]["uid"]);
    assert_eq!(second["spec"]["containers"][0]["image"], "local/busybox:2");

    // Applying the same manifest again changes nothing.
    assert_eq!(
        cluster.ok(&["apply", "-f", &v2]).trim(),
        "pod/web unchanged (revision 2)"
    );

    let history: Vec<Value> =
        serde_json::from_str(&cluster.ok(&["history", "pod/web", "-o", "json"])).unwrap();
    assert_eq!(history.len(), 2, "{history:?}");
    for (index, entry) in history.iter().enumerate() {
        assert_eq!(entry["revision"], index as u64 + 1);
        assert_eq!(entry["class"], "external");
        assert_eq!(entry["author"], "admin");
        assert_eq!(entry["kind"], "Pod");
        assert_eq!(entry["name"], "web");
        assert!(entry["time"].is_string());
    }
    assert_eq!(history[1]["message"], "bump");

    let diff = cluster.ok(&["diff", "pod/web", "1", "2"]);
    assert!(diff.contains("-  image: local/busybox:1"), "{diff}");
    assert!(diff.contains("+  image: local/busybox:2"), "{diff}");

    let rolled = cluster.ok(&["rollback", "pod/web", "--to", "1"]);
    assert!(rolled.contains("now revision 3"), "{rolled}");
    let third = cluster.get_json("pod/web");
    assert_eq!(third["metadata"]["revision"], 3);
    assert_eq!(third["spec"], first["spec"]);
    let history: Vec<Value> =
        serde_json::from_str(&cluster.ok(&["history", "pod/web", "-o", "json"])).unwrap();
    assert_eq!(history[2]["message"], "rollback to revision 1");
    assert_eq!(history[2]["author"], "admin");
    // The newest N alone, oldest first; with a filter, the newest N that match.
    let newest = |args: &[&str]| -> Vec<u64> {
        let text = cluster.ok(&[&["history", "pod/web", "-o", "json"], args].concat());
        let records: Vec<Value> = serde_json::from_str(&text).unwrap();
        records
            .iter()
            .map(|r| r["revision"].as_u64().unwrap())
            .collect()
    };
    assert_eq!(newest(&["--limit", "2"]), [2, 3]);
    assert_eq!(newest(&["--limit", "1", "--author", "admin"]), [3]);
    let refused = cluster.fails(&["history", "pod/web", "--limit", "0"]);
    assert!(refused.contains("--limit"), "{refused}");
}

#[test]
fn history_filters_by_author_and_class() {
    let cluster = Cluster::start();
    let alice_token = cluster.ok(&[
        "token",
        "create",
        "--user",
        "alice",
        "--namespace",
        "default",
    ]);
    let alice_config = cluster.manifest(
        "alice.json",
        &serde_json::json!({
            "server": cluster.client_config()["server"],
            "token": alice_token.trim(),
            "ca": cluster.client_config()["ca"],
        })
        .to_string(),
    );
    let admins = cluster.manifest("a.yaml", &pod_manifest("by-admin", "busybox"));
    let alices = cluster.manifest("b.yaml", &pod_manifest("by-alice", "busybox"));
    cluster.ok(&["apply", "-f", &admins, "-m", "admin's"]);
    cluster.ok(&[
        "--config",
        &alice_config,
        "apply",
        "-f",
        &alices,
        "-m",
        "alice's",
    ]);

    let names = |args: &[&str]| -> Vec<String> {
        let records: Vec<Value> = serde_json::from_str(&cluster.ok(args)).unwrap();
        records
            .iter()
            .map(|r| {
                format!(
                    "{}:{}",
                    r["author"].as_str().unwrap(),
                    r["name"].as_str().unwrap()
                )
            })
            .collect()
    };
    assert_eq!(
        names(&["history", "--since", "1h", "--kind", "pod", "-o", "json"]),
        vec!["admin:by-admin", "alice:by-alice"]
    );
    assert_eq!(
        names(&[
            "history",
            "--since",
            "1h",
            "--exclude-author",
            "admin",
            "--external",
            "-o",
            "json"
        ]),
        vec!["alice:by-alice"]
    );
    assert_eq!(
        names(&[
            "history", "--since", "1h", "--author", "admin", "-o", "json"
        ]),
        vec!["admin:by-admin"]
    );
    assert_eq!(
        names(&[
            "history",
            "--author",
            "admin",
            "--author",
            "alice",
            "--exclude-author",
            "alice",
            "-o",
            "json"
        ]),
        vec!["admin:by-admin"]
    );
    // The system changes are the built-in controllers registering
    // themselves, each under its own name, the node registering itself, and
    // the workflow engine storing each workflow definition it runs.
    let system = names(&["history", "--since", "1h", "--system", "-o", "json"]);
    assert_eq!(
        system[..5],
        [
            "workflow:workflow",
            "scheduler:scheduler",
            "ipam:ipam",
            "node-lifecycle:node-lifecycle",
            "pinned-deployment:pinned-deployment"
        ]
    );
    assert!(
        system[5..].iter().all(|entry| entry
            .split_once(':')
            .is_some_and(|(author, name)| author == name || author == "workflow")),
        "{system:?}"
    );
    assert_eq!(names(&["history", "--external", "-o", "json"]).len(), 2);
    let table = cluster.ok(&["history", "--since", "1h"]);
    assert!(
        table.contains("pod/by-alice") && table.contains("alice's"),
        "{table}"
    );
}

#[test]
fn stale_resource_version_is_refused() {
    let cluster = Cluster::start();
    let path = cluster.manifest("web.yaml", &pod_manifest("web", "busybox:1"));
    cluster.ok(&["apply", "-f", &path]);
    let mut stale = cluster.get_json("pod/web");
    cluster.ok(&[
        "apply",
        "-f",
        &cluster.manifest("v2.yaml", &pod_manifest("web", "busybox:2")),
    ]);

    stale["spec"]["containers"][0]["image"] = "busybox:3".into();
    stale.as_object_mut().unwrap().remove("status");
    let stale_path = cluster.manifest("stale.json", &stale.to_string());
    let error = cluster.fails(&["apply", "-f", &stale_path]);
    assert!(error.contains("was changed by someone else"), "{error}");
    assert!(error.contains("resourceVersion"), "{error}");
    assert_eq!(
        cluster.get_json("pod/web")["spec"]["containers"][0]["image"],
        "busybox:2"
    );

    // The API answers 409 to the same write.
    let config = cluster.client_config();
    let url = format!(
        "{}/v1/namespaces/default/pods/web",
        config["server"].as_str().unwrap()
    );
    let status = std::process::Command::new("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "-X",
            "PUT",
            "-H",
        ])
        .arg(format!(
            "Authorization: Bearer {}",
            config["token"].as_str().unwrap()
        ))
        .args(["-H", "Content-Type: application/json", "--data-binary"])
        .arg(format!("@{stale_path}"))
        .arg("--cacert")
        .arg(cluster.data_dir.path().join("tls").join("ca.pem"))
        .arg(&url)
        .output()
        .expect("curl is installed");
    assert_eq!(String::from_utf8_lossy(&status.stdout), "409");
}

/// The API speaks TLS only, with a certificate from the cluster CA that
/// `corral up` made; the client config carries that CA.
#[test]
fn the_api_is_tls_only() {
    let cluster = Cluster::start();
    let config = cluster.client_config();
    let https = config["server"].as_str().unwrap().to_string();
    assert!(https.starts_with("https://127.0.0.1:"), "{https}");
    assert!(
        config["ca"]
            .as_str()
            .unwrap()
            .starts_with("-----BEGIN CERTIFICATE-----"),
        "{config}"
    );
    let ca = cluster.data_dir.path().join("tls").join("ca.pem");
    let curl = |args: &[&str]| {
        let output = std::process::Command::new("curl")
            .args([
                "-s",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "--max-time",
                "5",
            ])
            .args(args)
            .output()
            .expect("curl is installed");
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
        )
    };
    let healthz = format!("{https}/healthz");
    let (code, status) = curl(&["--cacert", ca.to_str().unwrap(), &healthz]);
    assert_eq!(
        (code, status.as_str()),
        (Some(0), "200"),
        "HTTPS with the CA works"
    );
    // Without the cluster CA the certificate is not trusted (curl: 60).
    let (code, status) = curl(&[&healthz]);
    assert_eq!((code, status.as_str()), (Some(60), "000"));
    // Plain HTTP gets no HTTP answer at all.
    let plain = healthz.replace("https://", "http://");
    let (code, status) = curl(&[&plain]);
    assert_ne!(code, Some(0), "plain HTTP is refused");
    assert_eq!(status, "000", "no HTTP status came back over plain HTTP");
    // And the server keeps serving after the refused connection.
    let (_, status) = curl(&["--cacert", ca.to_str().unwrap(), &healthz]);
    assert_eq!(status, "200");
}

#[test]
fn bad_manifests_change_nothing_and_say_where() {
    let cluster = Cluster::start();
    let cases = [
        (
            "unknown-kind",
            "kind: Blob\nmetadata: {name: x}\nspec: {}\n",
            "unknown kind \"Blob\"",
        ),
        (
            "missing-name",
            "kind: Pod\nmetadata: {labels: {a: b}}\nspec: {containers: [{name: c, image: i}]}\n",
            "metadata.name: is required",
        ),
        (
            "wrong-type",
            "kind: Pod\nmetadata: {name: x}\nspec: {containers: [{name: c, image: i, ports: [http]}]}\n",
            "spec.containers[0].ports[0]",
        ),
        (
            "unknown-field",
            "kind: Pod\nmetadata: {name: x}\nspec: {containers: [{name: c, image: i, imagee: j}]}\n",
            "unknown field `imagee`",
        ),
        (
            "empty-image",
            "kind: Pod\nmetadata: {name: x}\nspec: {containers: [{name: c, image: ''}]}\n",
            "spec.containers[0].image: must not be empty",
        ),
        (
            "invalid-yaml",
            "kind: Pod\nmetadata: {name: x\nspec: [\n",
            "line",
        ),
        (
            "second-bad",
            "kind: Pod\nmetadata: {name: good}\nspec: {containers: [{name: c, image: i}]}\n---\nkind: Pod\nmetadata: {name: bad}\nspec: {}\n",
            "document 2 (pod/bad)",
        ),
    ];
    for (name, text, expected) in cases {
        let path = cluster.manifest(&format!("{name}.yaml"), text);
        let error = cluster.fails(&["apply", "-f", &path]);
        assert!(
            error.contains(expected),
            "{name}: expected {expected:?} in {error:?}"
        );
    }
    let listed: Value =
        serde_json::from_str(&cluster.ok(&["get", "pods", "-A", "-o", "json"])).unwrap();
    assert_eq!(
        listed["items"],
        serde_json::json!([]),
        "a bad manifest stored something"
    );
    let history: Vec<Value> =
        serde_json::from_str(&cluster.ok(&["history", "--kind", "pod", "-o", "json"])).unwrap();
    assert!(history.is_empty(), "{history:?}");
}

#[test]
fn acknowledged_apply_survives_kill_9() {
    let mut cluster = Cluster::start();
    let path = cluster.manifest("web.yaml", &pod_manifest("web", "busybox:1"));
    cluster.ok(&["apply", "-f", &path, "-m", "first"]);
    let path = cluster.manifest("web2.yaml", &pod_manifest("web", "busybox:2"));
    cluster.ok(&["apply", "-f", &path, "-m", "acknowledged"]);
    cluster.kill9();
    cluster.restart();
    let pod = cluster.get_json("pod/web");
    assert_eq!(pod["metadata"]["revision"], 2);
    assert_eq!(pod["spec"]["containers"][0]["image"], "busybox:2");
    let history: Vec<Value> =
        serde_json::from_str(&cluster.ok(&["history", "pod/web", "-o", "json"])).unwrap();
    assert_eq!(history[1]["message"], "acknowledged");
}

#[test]
fn stdin_manifests_namespaces_and_delete() {
    let cluster = Cluster::start();
    let output = cluster.corral_with_stdin(
        &["apply", "-f", "-", "-n", "team-a"],
        Some(&pod_manifest("web", "busybox")),
    );
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(cluster.fails(&["get", "pod/web"]).contains("not found"));
    let pod: Value =
        serde_json::from_str(&cluster.ok(&["get", "pod/web", "-n", "team-a", "-o", "json"]))
            .unwrap();
    assert_eq!(pod["metadata"]["namespace"], "team-a");
    let wide = cluster.ok(&["get", "pods", "-A"]);
    assert!(wide.contains("team-a") && wide.contains("web"), "{wide}");
    // A pod its node took stops through its stop workflow; --wait
    // returns once it is gone. (Deleted before the scheduler placed it, it
    // would be removed at once, with nothing to stop.)
    // The node may still be joining: placement waits for it. Should it
    // not come, the failure says why the pod is not placed and how the
    // node stands.
    wait_for_explained(
        "the scheduler to place pod/team-a/web",
        Duration::from_secs(60),
        || {
            let pod: Value = serde_json::from_str(
                &cluster.ok(&["get", "pod/web", "-n", "team-a", "-o", "json"]),
            )
            .unwrap();
            pod["status"]["node"]
                .as_str()
                .filter(|node| !node.is_empty())
                .map(|_| ())
        },
        || {
            let shown = |args: &[&str]| {
                let output = cluster.corral(args);
                format!(
                    "$ corral {}\n{}{}",
                    args.join(" "),
                    String::from_utf8_lossy(&output.stdout),
                    String::from_utf8_lossy(&output.stderr)
                )
            };
            shown(&["why", "pod/web", "-n", "team-a"]) + &shown(&["get", "nodes"])
        },
    );
    let deleted = cluster.ok(&["delete", "pod/web", "-n", "team-a", "--wait"]);
    let last = deleted.trim().lines().last().unwrap_or_default();
    assert!(
        last.ends_with("deleted: its stop workflow stop-1 finished") && last.contains("web"),
        "{deleted}"
    );
    assert!(
        cluster
            .fails(&["get", "pod/web", "-n", "team-a"])
            .contains("not found")
    );
}

/// Group commit shares one fsync among concurrent writes: every write
/// acknowledged to any of four concurrent writers is there after the server
/// is killed in the middle of their stream.
#[test]
fn concurrent_acknowledged_writes_survive_kill_9() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};

    let mut cluster = Cluster::start_with(&["server"]);
    let stop = Arc::new(AtomicBool::new(false));
    // (writer, image version) of every acknowledged apply.
    let acknowledged = Arc::new(Mutex::new(Vec::<(usize, usize)>::new()));
    std::thread::scope(|scope| {
        for writer in 0..4 {
            let (cluster, stop, acknowledged) = (&cluster, stop.clone(), acknowledged.clone());
            scope.spawn(move || {
                for version in 1.. {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let manifest =
                        pod_manifest(&format!("w{writer}"), &format!("busybox:{version}"));
                    let output = cluster.corral_with_stdin(&["apply", "-f", "-"], Some(&manifest));
                    if !output.status.success() {
                        break; // the server is gone
                    }
                    acknowledged.lock().expect("acks").push((writer, version));
                }
            });
        }
        // Kill the server while all four still write.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while acknowledged.lock().expect("acks").len() < 40 {
            assert!(
                std::time::Instant::now() < deadline,
                "the writers never got going"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let pid = cluster.pid().expect("the server runs").to_string();
        let killed = std::process::Command::new("kill")
            .args(["-KILL", &pid])
            .status()
            .expect("run kill");
        assert!(killed.success());
        stop.store(true, Ordering::SeqCst);
    });
    cluster.kill9(); // reaps the killed process
    cluster.restart();
    let acknowledged = acknowledged.lock().expect("acks").clone();
    for writer in 0..4 {
        let Some(last) = acknowledged
            .iter()
            .filter(|(w, _)| *w == writer)
            .map(|(_, version)| *version)
            .max()
        else {
            continue;
        };
        let pod = cluster.get_json(&format!("pod/w{writer}"));
        let revision = pod["metadata"]["revision"].as_u64().expect("revision");
        assert!(
            revision >= last as u64,
            "writer {writer}: {last} applies were acknowledged, the pod is at revision {revision}"
        );
        let history: Vec<Value> = serde_json::from_str(&cluster.ok(&[
            "history",
            &format!("pod/w{writer}"),
            "-o",
            "json",
        ]))
        .expect("history");
        assert!(history.len() >= last, "writer {writer}: {history:?}");
    }
}

/// `corral edit TARGET` with `EDITOR` set to `editor`.
fn edit_with(cluster: &Cluster, editor: &std::path::Path, target: &str) -> std::process::Output {
    std::process::Command::new(common::CORRAL)
        .args(["edit", target, "-m", "edited"])
        .env("CORRAL_CONFIG", &cluster.config)
        .env("EDITOR", editor)
        .env_remove("VISUAL")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run corral edit")
}

/// An editor script whose Nth run does `steps[N-1]` (shell, `$f` is the file).
fn scripted_editor(dir: &std::path::Path, steps: &[&str]) -> std::path::PathBuf {
    let mut script = format!(
        "#!/bin/sh\nf=\"$1\"\nn=$(cat {dir}/count 2>/dev/null || echo 0)\nn=$((n+1))\necho $n > {dir}/count\ncp \"$f\" {dir}/seen-$n.yaml\ncase $n in\n",
        dir = dir.display()
    );
    for (index, step) in steps.iter().enumerate() {
        script.push_str(&format!("{}) {step} ;;\n", index + 1));
    }
    script.push_str("esac\n");
    let path = dir.join("editor.sh");
    std::fs::write(&path, script).expect("write the editor");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    path
}

#[test]
fn a_refused_edit_reopens_the_editor_with_the_reason_and_the_buffer() {
    let cluster = Cluster::start();
    let v1 = cluster.manifest("v1.yaml", &pod_manifest("web", "local/busybox:1"));
    cluster.ok(&["apply", "-f", &v1]);

    // First save is invalid (an empty image); the editor opens again on the
    // same text with the reason on top; the second save fixes it.
    let dir = tempfile::tempdir().expect("a temp dir");
    let editor = scripted_editor(
        dir.path(),
        &[
            r#"sed -i 's|image: local/busybox:1|image: ""|' "$f""#,
            r#"sed -i 's|image: ""|image: local/busybox:2|' "$f""#,
        ],
    );
    let output = edit_with(&cluster, &editor, "pod/web");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{output:?}");
    assert_eq!(stdout.trim(), "pod/web edited (revision 2)");
    let second = std::fs::read_to_string(dir.path().join("seen-2.yaml")).expect("second round");
    assert!(second.starts_with("# The edit was refused"), "{second}");
    assert!(
        second.contains("image"),
        "the reason names the field:\n{second}"
    );
    assert!(
        second.contains("image: \"\""),
        "the buffer is the person's edit:\n{second}"
    );
    let pod = cluster.get_json("pod/web");
    assert_eq!(pod["spec"]["containers"][0]["image"], "local/busybox:2");

    // Giving up (saving the refused buffer unchanged) keeps the edit in a
    // file and changes nothing.
    let dir = tempfile::tempdir().expect("a temp dir");
    let editor = scripted_editor(
        dir.path(),
        &[
            r#"sed -i 's|image: local/busybox:2|image: ""|' "$f""#,
            "true",
        ],
    );
    let output = edit_with(&cluster, &editor, "pod/web");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{output:?}");
    let kept = stderr
        .split("your edit is kept in ")
        .nth(1)
        .map(str::trim)
        .unwrap_or_else(|| panic!("{stderr}"));
    let kept_text = std::fs::read_to_string(kept).expect("the kept edit");
    assert!(kept_text.contains("image: \"\""), "{kept_text}");
    let _ = std::fs::remove_file(kept);
    assert_eq!(cluster.get_json("pod/web")["metadata"]["revision"], 2);
}

#[test]
fn a_token_becomes_a_client_config_and_named_configs_switch_clusters() {
    let cluster = Cluster::start();
    let config = cluster.ok(&[
        "token", "create", "--user", "bob", "-n", "dev", "-o", "config",
    ]);
    let parsed: Value = serde_json::from_str(&config).expect("a client config");
    assert!(
        parsed["server"]
            .as_str()
            .unwrap_or("")
            .starts_with("https://"),
        "{config}"
    );
    assert!(parsed["ca"].is_string(), "{config}");
    let home = tempfile::tempdir().expect("a temp dir");
    let bob = home.path().join("bob.json");
    std::fs::write(&bob, &config).expect("save bob's config");

    // Commands in a shell with no --config and no $CORRAL_CONFIG.
    let corral = |args: &[&str]| {
        let output = std::process::Command::new(common::CORRAL)
            .args(args)
            .env_remove("CORRAL_CONFIG")
            .env("XDG_CONFIG_HOME", home.path())
            .stdin(std::process::Stdio::null())
            .output()
            .expect("run corral");
        (
            output.status.success(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let (ok, out, err) = corral(&["--config", &bob.to_string_lossy(), "whoami"]);
    assert!(ok && out.starts_with("bob (user, external)"), "{out}{err}");

    let (ok, out, err) = corral(&["config", "add", "bob", &bob.to_string_lossy()]);
    assert!(ok, "{out}{err}");
    std::fs::remove_file(&bob).expect("the original may go");
    let (ok, out, err) = corral(&["config", "use", "bob"]);
    assert!(ok && out.contains("using config bob"), "{out}{err}");
    let (ok, out, err) = corral(&["whoami"]);
    assert!(ok && out.starts_with("bob (user, external)"), "{out}{err}");
    let (_, list, _) = corral(&["config", "list"]);
    let row = list
        .lines()
        .find(|l| l.contains("bob"))
        .expect("bob is listed");
    assert!(row.starts_with('*'), "bob is current:\n{list}");
    assert!(
        row.contains(parsed["server"].as_str().unwrap_or("?")),
        "{list}"
    );
    // An explicit --config still wins over the named one.
    let (ok, out, err) = corral(&["--config", &cluster.config.to_string_lossy(), "whoami"]);
    assert!(ok && out.starts_with("admin"), "{out}{err}");
    let (ok, _, err) = corral(&["config", "use", "nobody"]);
    assert!(!ok && err.contains("no config named nobody"), "{err}");
    let (ok, _, _) = corral(&["config", "use", "--none"]);
    assert!(ok);
    let (_, list, _) = corral(&["config", "list"]);
    assert!(!list.lines().any(|l| l.starts_with('*')), "{list}");
}

#[test]
fn dry_runs_and_diffs_against_a_file_write_nothing() {
    let cluster = Cluster::start();
    let v1 = cluster.manifest("v1.yaml", &pod_manifest("web", "local/busybox:1"));
    let v2 = cluster.manifest("v2.yaml", &pod_manifest("web", "local/busybox:2"));
    let other = cluster.manifest("api.yaml", &pod_manifest("api", "local/busybox:1"));
    cluster.ok(&["apply", "-f", &v1]);

    let dry = cluster.ok(&["apply", "-f", &v2, "--dry-run"]);
    assert!(
        dry.starts_with("pod/web would change (revision 1 → 2):"),
        "{dry}"
    );
    assert!(dry.contains("\n-  image: local/busybox:1\n"), "{dry}");
    assert!(dry.contains("\n+  image: local/busybox:2\n"), "{dry}");
    assert!(dry.contains("containers: web restarts"), "{dry}");
    assert_eq!(cluster.get_json("pod/web")["metadata"]["revision"], 1);

    let diff = cluster.corral(&["diff", "-f", &v2]);
    assert_eq!(diff.status.code(), Some(1), "{diff:?}");
    assert!(String::from_utf8_lossy(&diff.stdout).contains("containers: web restarts"));
    let same = cluster.corral(&["diff", "-f", &v1]);
    assert_eq!(same.status.code(), Some(0), "{same:?}");
    assert!(String::from_utf8_lossy(&same.stdout).starts_with("pod/web unchanged (revision 1)"));
    let new = cluster.ok(&["apply", "-f", &other, "--dry-run"]);
    assert_eq!(new.trim(), "pod/api would be created");
    assert!(cluster.fails(&["get", "pod/api"]).contains("api"));
}

#[test]
fn node_forget_and_remember_change_the_spec_despite_status_writes() {
    let cluster = Cluster::start();
    let name = wait_for("the node to register", Duration::from_secs(30), || {
        let nodes: Value =
            serde_json::from_str(&cluster.ok(&["get", "nodes", "-o", "json"])).ok()?;
        nodes["items"][0]["metadata"]["name"]
            .as_str()
            .map(str::to_string)
    });
    let out = cluster.ok(&["node", "forget", &name]);
    assert!(out.contains("forgotten"), "{out}");
    let node = cluster.get_json(&format!("node/{name}"));
    assert_eq!(node["spec"]["forgotten"], true, "{node}");
    let out = cluster.ok(&["node", "remember", &name]);
    assert!(out.contains("remembered"), "{out}");
    let node = cluster.get_json(&format!("node/{name}"));
    assert_ne!(node["spec"]["forgotten"], true, "{node}");
    let history = cluster.ok(&["history", &format!("node/{name}")]);
    assert!(
        history.contains("node forget: declared lost by an operator"),
        "{history}"
    );
}

#[test]
fn up_refuses_a_data_dir_pod_users_cannot_reach_and_says_how_to_fix_it() {
    use std::os::unix::fs::PermissionsExt;
    let closed = tempfile::tempdir().expect("a temp dir");
    std::fs::set_permissions(closed.path(), std::fs::Permissions::from_mode(0o700))
        .expect("chmod 0700, like mktemp -d");
    let data = closed.path().join("data");
    let mut child = std::process::Command::new(common::CORRAL)
        .args(["up", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&data)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run corral up");
    let began = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if began.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("corral up started below a 0700 directory instead of refusing");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let output = child.wait_with_output().expect("its output");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!status.success());
    assert!(
        stderr.contains(&format!("chmod o+x {}", closed.path().display())),
        "{stderr}"
    );
    assert!(
        !data.exists(),
        "nothing was started or written: {}",
        data.display()
    );
}

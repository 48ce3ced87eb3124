use super::*;

fn output(code: Option<i32>, stdout: &str, stderr: &str) -> PluginOutput {
    PluginOutput {
        code,
        stdout: stdout.into(),
        stderr: stderr.into(),
    }
}

fn message(result: Result<PluginReply, PluginError>) -> String {
    match result {
        Err(PluginError::Failed { message, .. }) => message,
        other => panic!("expected a failure, got {other:?}"),
    }
}

#[test]
fn a_zero_exit_with_ok_is_the_reply() {
    let reply = interpret(
        "dirvol",
        Verb::Prepare,
        &output(Some(0), "{\"ok\":true,\"path\":\"/x\"}\n", "noise\n"),
    )
    .unwrap();
    assert_eq!(reply.path.as_deref(), Some(Path::new("/x")));
}

#[test]
fn failures_carry_the_plugins_message_first() {
    let said = output(Some(0), r#"{"ok":false,"message":"disk full"}"#, "");
    assert_eq!(message(interpret("p", Verb::Mount, &said)), "disk full");
    let exit = output(Some(3), r#"{"ok":true,"message":"quota"}"#, "");
    assert_eq!(message(interpret("p", Verb::Mount, &exit)), "quota");
    let stderr = output(Some(1), "", "starting\nno such export\n\n");
    assert_eq!(
        message(interpret("p", Verb::Mount, &stderr)),
        "no such export"
    );
    let bare = output(Some(7), "", "");
    assert_eq!(
        message(interpret("p", Verb::Mount, &bare)),
        "it exited with status 7"
    );
    let killed = output(None, "", "");
    assert_eq!(
        message(interpret("p", Verb::Mount, &killed)),
        "it was killed"
    );
    let silent = output(Some(0), r#"{"ok":false}"#, "");
    assert!(message(interpret("p", Verb::Mount, &silent)).contains("without a message"));
}

#[test]
fn a_zero_exit_without_json_is_a_bad_reply() {
    assert!(matches!(
        interpret("p", Verb::Prepare, &output(Some(0), "done", "")),
        Err(PluginError::BadReply { .. })
    ));
}

#[test]
fn steps_name_their_plugin_and_verb() {
    assert_eq!(
        Verb::of_step("dirvol/prepare"),
        Some(("dirvol", Verb::Prepare))
    );
    assert_eq!(Verb::of_step("dirvol/mount"), Some(("dirvol", Verb::Mount)));
    assert_eq!(
        Verb::of_step("dirvol/release"),
        Some(("dirvol", Verb::Release))
    );
    assert_eq!(Verb::of_step("dirvol/format"), None);
    assert_eq!(Verb::of_step("prepare"), None);
}

#[test]
fn plugin_names_are_plain_file_names() {
    assert!(is_plugin_name("dirvol"));
    assert!(is_plugin_name("acme-nfs_2.1"));
    for bad in ["", ".", "..", "a/b", "../x", "a b"] {
        assert!(!is_plugin_name(bad), "{bad}");
    }
}

#[test]
fn host_paths_need_a_covering_relaxation() {
    let dir = Path::new("/d/pods/u1/volumes/v");
    let none = BTreeSet::new();
    let accept = |answered: &str, relax: &BTreeSet<Relaxation>| {
        accept_path("p", "v", dir, Some(Path::new(answered)), relax)
    };
    assert_eq!(accept_path("p", "v", dir, None, &none).unwrap(), dir);
    assert!(accept("/d/pods/u1/volumes/v/sub", &none).is_ok());
    assert!(matches!(
        accept("/srv/export", &none),
        Err(PluginError::HostPath { .. })
    ));
    assert!(accept("/d/pods/u1/volumes/v/../../../../etc", &none).is_err());
    assert!(accept("relative", &none).is_err());
    let granted: BTreeSet<Relaxation> = ["host-path:/srv".parse().unwrap()].into();
    assert_eq!(
        accept("/srv/export", &granted).unwrap(),
        Path::new("/srv/export")
    );
    assert!(accept("/srvx", &granted).is_err());
}

#[test]
fn a_symlink_inside_the_volume_does_not_lead_out_of_it() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("volumes").join("v");
    std::fs::create_dir_all(dir.join("real")).unwrap();
    std::os::unix::fs::symlink("/etc", dir.join("escape")).unwrap();
    let none = BTreeSet::new();
    assert!(accept_path("p", "v", &dir, Some(&dir.join("real")), &none).is_ok());
    assert!(matches!(
        accept_path("p", "v", &dir, Some(&dir.join("escape")), &none),
        Err(PluginError::HostPath { .. })
    ));
    let granted: BTreeSet<Relaxation> = ["host-path:/etc".parse().unwrap()].into();
    assert!(accept_path("p", "v", &dir, Some(&dir.join("escape")), &granted).is_ok());
}

struct Fake(std::sync::Mutex<Vec<(String, String)>>, PluginOutput);

impl PluginExec for Fake {
    fn run(
        &self,
        executable: &Path,
        verb: Verb,
        input: &[u8],
        _timeout: Duration,
    ) -> std::io::Result<PluginOutput> {
        let request: PluginRequest = serde_json::from_slice(input).expect("request");
        self.0.lock().unwrap().push((
            format!("{} {}", executable.display(), verb.as_str()),
            request.volume,
        ));
        Ok(self.1.clone())
    }
}

fn request() -> PluginRequest {
    PluginRequest {
        volume: "data".into(),
        pod: "web".into(),
        namespace: "default".into(),
        uid: "u1".into(),
        options: BTreeMap::new(),
        dir: "/d/pods/u1/volumes/data".into(),
        host_uid: Some(1 << 20),
        path: None,
    }
}

#[test]
fn calls_find_the_plugin_in_the_first_directory_that_has_it() {
    let first = tempfile::tempdir().unwrap();
    let second = tempfile::tempdir().unwrap();
    std::fs::write(second.path().join("dirvol"), "").unwrap();
    let fake = std::sync::Arc::new(Fake(
        Default::default(),
        output(Some(0), r#"{"ok":true}"#, "made it\n"),
    ));
    let plugins = Plugins {
        dirs: vec![first.path().into(), second.path().into()],
        exec: fake.clone(),
        timeout: CALL_TIMEOUT,
    };
    let called = plugins.call("dirvol", Verb::Prepare, &request()).unwrap();
    assert!(called.reply.ok);
    let calls = fake.0.lock().unwrap().clone();
    assert_eq!(
        calls,
        [(
            format!("{} prepare", second.path().join("dirvol").display()),
            "data".to_string()
        )]
    );
    assert_eq!(
        log_lines("dirvol", Verb::Prepare, &called.output),
        [
            "dirvol prepare stdout: {\"ok\":true}",
            "dirvol prepare stderr: made it"
        ]
    );
    let missing = plugins.call("nfs", Verb::Prepare, &request()).unwrap_err();
    assert!(matches!(missing.error, PluginError::NotInstalled { .. }));
    let bad = plugins.call("../x", Verb::Prepare, &request()).unwrap_err();
    assert!(matches!(bad.error, PluginError::BadName(_)));
}

#[test]
fn a_real_process_gets_the_request_and_its_streams_are_kept() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("echo");
    std::fs::write(
        &script,
        "#!/bin/sh\nread -r line\necho \"$1 saw $line\" >&2\necho '{\"ok\":false,\"message\":\"on purpose\"}'\nexit 2\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let plugins = Plugins::new(vec![dir.path().into()]);
    let failure = plugins.call("echo", Verb::Unmount, &request()).unwrap_err();
    assert!(matches!(
        &failure.error,
        PluginError::Failed { message, verb: "unmount", .. } if message == "on purpose"
    ));
    assert_eq!(failure.output.code, Some(2));
    assert!(
        failure
            .output
            .stderr
            .starts_with("unmount saw {\"volume\":\"data\"")
    );
}

#[test]
fn a_process_a_plugin_leaves_running_does_not_hold_the_call() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("leaves");
    std::fs::write(
        &script,
        "#!/bin/sh\nsleep 29 &\necho '{\"ok\": true, \"message\": \"done\"}'\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let plugins = Plugins::new(vec![dir.path().into()]);
    let started = Instant::now();
    let reply = plugins
        .call("leaves", Verb::Prepare, &request())
        .unwrap_or_else(|failure| panic!("{}", failure.error));
    let elapsed = started.elapsed();
    // What it left may be legitimate (a FUSE daemon); this one is not ours to keep.
    let _ = std::process::Command::new("pkill")
        .args(["-f", "^sleep 29$"])
        .status();
    assert!(elapsed < Duration::from_secs(10));
    assert_eq!(reply.reply.message.as_deref(), Some("done"));
}

#[test]
fn a_plugin_past_its_timeout_is_killed_with_what_it_started() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("slower");
    std::fs::write(&script, "#!/bin/sh\nsleep 31 &\nexec sleep 30\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut plugins = Plugins::new(vec![dir.path().into()]);
    plugins.timeout = Duration::from_millis(200);
    let started = Instant::now();
    let failure = plugins
        .call("slower", Verb::Prepare, &request())
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(failure.error.to_string().contains("killed after"));
    let left = std::process::Command::new("pgrep")
        .args(["-f", "^sleep 31$"])
        .output()
        .unwrap();
    assert!(
        !left.status.success(),
        "the plugin's background process was killed too"
    );
}

#[test]
fn a_plugin_past_its_timeout_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("slow");
    std::fs::write(&script, "#!/bin/sh\nexec sleep 30\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut plugins = Plugins::new(vec![dir.path().into()]);
    plugins.timeout = Duration::from_millis(200);
    let started = Instant::now();
    let failure = plugins.call("slow", Verb::Prepare, &request()).unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(failure.output.code, None);
    assert!(failure.error.to_string().contains("killed after"));
}

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixListener;
use std::process::{Command, Stdio};

use super::*;

/// A scripted QEMU: greets, then answers each request line with the next
/// scripted lines (events may precede the reply).
fn fake_qemu(script: Vec<Vec<&'static str>>) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("qmp.sock");
    let listener = UnixListener::bind(&path).unwrap();
    std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        let mut writer = stream.try_clone().unwrap();
        let mut reader = BufReader::new(stream);
        writeln!(
            writer,
            r#"{{"QMP": {{"version": {{}}, "capabilities": []}}}}"#
        )
        .unwrap();
        for replies in script {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap() == 0 {
                return;
            }
            for reply in replies {
                writeln!(writer, "{reply}").unwrap();
            }
        }
    });
    (dir, path)
}

#[test]
fn the_handshake_then_typed_replies_with_events_kept() {
    let (_dir, path) = fake_qemu(vec![
        vec![r#"{"return": {}}"#],
        vec![
            r#"{"event": "POWERDOWN", "data": {}, "timestamp": {"seconds": 1, "microseconds": 2}}"#,
            r#"{"return": {"status": "running", "singlestep": false, "running": true}}"#,
        ],
        vec![r#"{"return": {"status": "save-vm", "running": false}}"#],
        vec![r#"{"return": {"status": "some-new-state", "running": false}}"#],
        // Keeps the connection while the client waits for events.
        vec![],
    ]);
    let mut client = QmpClient::connect(&path).unwrap();
    let status = client.query_status().unwrap();
    assert_eq!(
        status,
        RunStatus {
            status: RunState::Running,
            running: true
        }
    );
    assert_eq!(client.query_status().unwrap().status, RunState::SaveVm);
    assert_eq!(client.query_status().unwrap().status, RunState::Other);
    // The event read while waiting for a reply is still there.
    let event = client
        .next_event(Duration::from_millis(10))
        .unwrap()
        .unwrap();
    assert_eq!(event.name, "POWERDOWN");
    assert_eq!(client.next_event(Duration::from_millis(10)).unwrap(), None);
}

#[test]
fn refusals_and_failed_human_commands_are_errors() {
    let (_dir, path) = fake_qemu(vec![
        vec![r#"{"return": {}}"#],
        vec![r#"{"error": {"class": "GenericError", "desc": "nope"}}"#],
        vec![r#"{"return": "Error: Device 'disk0' does not have the requested snapshot 'x'\r\n"}"#],
        vec![r#"{"return": "List of snapshots present on all disks:\r\n"}"#],
        vec![r#"{"event": "SHUTDOWN", "data": {"guest": true, "reason": "guest-shutdown"}}"#],
    ]);
    let mut client = QmpClient::connect(&path).unwrap();
    match client.system_reset() {
        Err(QmpError::Refused {
            command,
            class,
            desc,
        }) => {
            assert_eq!(
                (command.as_str(), class.as_str(), desc.as_str()),
                ("system_reset", "GenericError", "nope")
            );
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert!(matches!(
        client.human("loadvm x"),
        Err(QmpError::Human { .. })
    ));
    assert!(
        client
            .human("info snapshots")
            .unwrap()
            .contains("List of snapshots")
    );
    // QEMU going away before its reply fails the command; the event it
    // sent first is kept.
    client.system_powerdown().unwrap_err();
    let event = client
        .next_event(Duration::from_millis(100))
        .unwrap()
        .unwrap();
    assert!(event.guest_initiated());
    assert!(matches!(
        client.next_event(Duration::from_millis(100)),
        Err(QmpError::Closed { .. })
    ));
}

#[test]
fn a_silent_qemu_times_out() {
    // It reads the request, answers nothing and keeps the connection.
    let (_dir, path) = fake_qemu(vec![vec![r#"{"return": {}}"#], vec![], vec![]]);
    let mut client = QmpClient::connect(&path)
        .unwrap()
        .slow(Duration::from_millis(200));
    let began = Instant::now();
    assert!(matches!(
        client.query_status(),
        Err(QmpError::Timeout { .. })
    ));
    assert!(began.elapsed() < Duration::from_secs(2));
}

/// The real QEMU: a machine held before it starts (`-S`) is `prelaunch`,
/// `cont` runs it, `quit` ends the process.
#[test]
fn a_real_qemu_answers() {
    corral_testkit::require_tool("qemu-system-x86_64");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("qmp.sock");
    let mut qemu = Command::new("qemu-system-x86_64")
        .args([
            "-S",
            "-M",
            "none",
            "-nodefaults",
            "-display",
            "none",
            "-qmp",
        ])
        .arg(format!("unix:{},server=on,wait=off", path.display()))
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut client = loop {
        match QmpClient::connect(&path) {
            Ok(client) => break client,
            Err(error) if Instant::now() > deadline => {
                let _ = qemu.kill();
                panic!("QEMU's QMP socket never answered: {error}");
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    let status = client.query_status().unwrap();
    assert_eq!(
        (status.status, status.running),
        (RunState::Prelaunch, false)
    );
    client.execute::<Value>("cont", None).unwrap();
    assert!(client.query_status().unwrap().running);
    assert!(client.human("info status").unwrap().contains("running"));
    client.quit().unwrap();
    let exit = qemu.wait().unwrap();
    assert!(exit.success(), "{exit}");
}

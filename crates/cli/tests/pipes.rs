//! The CLI as one stage of a shell pipeline: a reader that stops early
//! (`corral … | head`) ends it quietly, with the status a SIGPIPE would give.

use std::io::Read;
use std::process::{Command, Stdio};

#[test]
fn a_closed_stdout_ends_the_cli_quietly() {
    // `openapi` needs no cluster and prints far more than a pipe holds.
    let mut child = Command::new(env!("CARGO_BIN_EXE_corral"))
        .arg("openapi")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn corral openapi");
    let mut stdout = child.stdout.take().expect("its stdout");
    let mut first = [0u8; 16];
    stdout.read_exact(&mut first).expect("the first bytes");
    drop(stdout);
    let output = child.wait_with_output().expect("wait for corral");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(stderr, "", "nothing to say about a reader that left");
    assert_eq!(output.status.code(), Some(141), "{:?}", output.status);
}

//! `corral completion`: the bash script loads in a real bash and completes
//! subcommands; the zsh and fish scripts are printed (and, where those
//! shells are installed, parse). No root, no cluster.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::{Command, Output};

/// `corral completion SHELL`'s script.
fn completion(shell: &str) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_corral"))
        .args(["completion", shell])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "corral completion {shell} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// Runs `program ARGS… FILE`; None if the program is not installed.
fn run(program: &str, args: &[&str], file: &Path) -> Option<Output> {
    match Command::new(program).args(args).arg(file).output() {
        Ok(output) => Some(output),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
        Err(error) => panic!("cannot run {program}: {error}"),
    }
}

/// Runs `script` in a plain bash, with `file` as `$1`.
fn bash(script: &str, file: &Path) -> Output {
    run(
        "bash",
        &["--norc", "--noprofile", "-c", script, "bash"],
        file,
    )
    .expect("bash is installed")
}

fn text(output: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[test]
fn the_bash_script_loads_and_completes_subcommands() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("corral.bash");
    std::fs::write(&file, completion("bash")).unwrap();

    let loaded = bash(r#"source "$1" && complete -p corral"#, &file);
    assert!(loaded.status.success(), "{}", text(&loaded));
    let registered = String::from_utf8_lossy(&loaded.stdout);
    assert!(
        registered.starts_with("complete ") && registered.trim_end().ends_with(" corral"),
        "no completion registered for corral: {}",
        text(&loaded)
    );

    // Call the registered function as bash would for `corral comp<TAB>`
    // and `corral node <TAB>`.
    let complete = r#"
        source "$1" || exit 1
        function=$(complete -p corral | sed -n 's/.* -F \([^ ]*\) .*/\1/p')
        [ -n "$function" ] || exit 2
        COMP_WORDS=(corral comp); COMP_CWORD=1; COMP_LINE="corral comp"; COMP_POINT=${#COMP_LINE}
        "$function" corral comp corral
        echo "first: ${COMPREPLY[*]}"
        COMP_WORDS=(corral node ""); COMP_CWORD=2; COMP_LINE="corral node "; COMP_POINT=${#COMP_LINE}
        "$function" corral "" node
        echo "node: ${COMPREPLY[*]}"
    "#;
    let completed = bash(complete, &file);
    assert!(completed.status.success(), "{}", text(&completed));
    let stdout = String::from_utf8_lossy(&completed.stdout);
    let line = |prefix: &str| {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(prefix))
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    assert_eq!(line("first: "), ["completion"], "{}", text(&completed));
    let node = line("node: ");
    assert!(
        node.iter().any(|w| w == "forget") && node.iter().any(|w| w == "remember"),
        "{}",
        text(&completed)
    );
}

#[test]
fn zsh_and_fish_scripts_name_corral() {
    let dir = tempfile::tempdir().unwrap();
    for (shell, check) in [
        ("zsh", ["-f", "-n"]),
        ("fish", ["--no-config", "--no-execute"]),
    ] {
        let script = completion(shell);
        assert!(!script.trim().is_empty(), "{shell}: an empty script");
        assert!(script.contains("corral"), "{shell}: no mention of corral");
        assert!(script.contains("completion"), "{shell}: no subcommands");
        let file = dir.path().join(format!("corral.{shell}"));
        std::fs::write(&file, &script).unwrap();
        // The syntax check only where the shell is installed.
        if let Some(output) = run(shell, &check, &file) {
            assert!(output.status.success(), "{shell}: {}", text(&output));
        }
    }
}

//! `corral completion bash|zsh|fish`: prints a script that teaches the
//! shell corral's subcommands and flags, generated from the same clap
//! definition that parses the command line, so it cannot drift from it.

use std::io::Write;

use anyhow::Context;
use clap::{Args, ValueEnum};
use clap_complete::Shell;

#[derive(Debug, Args)]
#[command(after_help = "Examples:
  source <(corral completion bash)      bash, in this shell
  corral completion bash > ~/.local/share/bash-completion/completions/corral
                                        bash, in every new shell (with bash-completion)
  corral completion zsh > \"${fpath[1]}/_corral\"
                                        zsh: any directory on $fpath; compinit loads it
  corral completion fish > ~/.config/fish/completions/corral.fish
                                        fish: every new shell loads it")]
pub struct CompletionArgs {
    /// The shell to print the script for.
    #[arg(value_enum)]
    shell: CompletionShell,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum CompletionShell {
    Bash,
    Zsh,
    Fish,
}

impl From<CompletionShell> for Shell {
    fn from(shell: CompletionShell) -> Shell {
        match shell {
            CompletionShell::Bash => Shell::Bash,
            CompletionShell::Zsh => Shell::Zsh,
            CompletionShell::Fish => Shell::Fish,
        }
    }
}

/// Prints the completion script for `command`, the whole `corral` CLI.
pub fn completion(args: &CompletionArgs, command: &mut clap::Command) -> anyhow::Result<()> {
    // Generated into memory first: clap_complete panics on a failed write,
    // and `corral completion bash | head` closes the pipe early.
    let mut script = Vec::new();
    clap_complete::generate(Shell::from(args.shell), command, "corral", &mut script);
    match std::io::stdout().lock().write_all(&script) {
        // The reader has all it wanted.
        Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        written => written.context("cannot write the completion script"),
    }
}

//! `corral exec pod/NAME [-c C] [-i] [-t] -- CMD…`: runs a command in a
//! running container, through the API to the agent of the pod's node.
//! Like kubectl: `-i` forwards this terminal's stdin (otherwise the command
//! reads end of file), `-t` gives it a pseudo-terminal (this terminal goes
//! to raw mode while it runs; stdout and stderr then arrive as one
//! stream). corral exits with the command's exit code.

use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::bail;
use clap::Args;
use corral_api::Kind;
use corral_client::{ExecEvent, ExecInput, ExecRequest};
use nix::sys::termios::{self, SetArg, Termios};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::commands::connect;
use crate::target::Target;

#[derive(Debug, Args)]
#[command(after_help = "Examples:
  corral exec pod/web -- id                     run id in the pod's only container
  corral exec pod/web -c side -- ls /           in container side
  echo hi | corral exec -i pod/web -- cat       forward stdin
  corral exec -it pod/web -- sh                 an interactive shell")]
pub struct ExecArgs {
    /// The pod: pod/NAME.
    target: String,
    #[arg(short = 'n', long, value_name = "NS", default_value = "default")]
    namespace: String,
    /// The container; needed when the pod has several.
    #[arg(short = 'c', long, value_name = "NAME")]
    container: Option<String>,
    /// Forward this process's stdin to the command.
    #[arg(short = 'i', long)]
    stdin: bool,
    /// Run the command on a pseudo-terminal.
    #[arg(short = 't', long)]
    tty: bool,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<String>,
}

/// Puts the terminal on stdin in raw mode until dropped.
pub(crate) struct RawMode {
    saved: Termios,
}

impl RawMode {
    pub(crate) fn enter() -> Option<RawMode> {
        let stdin = std::io::stdin();
        if !stdin.is_terminal() {
            return None;
        }
        let saved = termios::tcgetattr(&stdin).ok()?;
        let mut raw = saved.clone();
        termios::cfmakeraw(&mut raw);
        termios::tcsetattr(&stdin, SetArg::TCSANOW, &raw).ok()?;
        Some(RawMode { saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = termios::tcsetattr(std::io::stdin(), SetArg::TCSANOW, &self.saved);
    }
}

nix::ioctl_read_bad!(window_size, nix::libc::TIOCGWINSZ, nix::pty::Winsize);

/// The size of the terminal on stdout: (columns, rows).
fn terminal_size() -> Option<(u16, u16)> {
    let stdout = std::io::stdout();
    if !stdout.is_terminal() {
        return None;
    }
    let mut size = nix::pty::Winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one Winsize into `size`, which lives
    // through the call; fd 1 is open (it is this process's stdout).
    unsafe { window_size(std::os::fd::AsRawFd::as_raw_fd(&stdout), &mut size) }.ok()?;
    (size.ws_col > 0 && size.ws_row > 0).then_some((size.ws_col, size.ws_row))
}

/// Copies this process's stdin to the command until end of file.
async fn forward_stdin(mut input: ExecInput) -> std::io::Result<()> {
    let mut stdin = tokio::io::stdin();
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        let read = stdin.read(&mut buffer).await?;
        if read == 0 {
            return input.close_stdin().await;
        }
        input.send_stdin(&buffer[..read]).await?;
    }
}

/// Runs the command; returns its exit code.
pub async fn exec(config: Option<PathBuf>, args: ExecArgs) -> anyhow::Result<i32> {
    let key = Target::parse(&args.target, None)?.key(Some(&args.namespace))?;
    if key.kind != Kind::Pod {
        bail!(
            "only pods have containers to exec in; {} is a {}",
            args.target,
            key.kind
        );
    }
    let client = connect(config)?;
    let request = ExecRequest {
        container: args.container,
        command: args.command,
        tty: args.tty,
        terminal_size: if args.tty { terminal_size() } else { None },
    };
    let (mut output, mut input) = client.exec(&key, &request).await?;
    let raw = if args.tty { RawMode::enter() } else { None };
    let (feeder, _idle_input) = if args.stdin {
        (Some(tokio::spawn(forward_stdin(input))), None)
    } else {
        input.close_stdin().await?;
        (None, Some(input))
    };
    let mut stdout = tokio::io::stdout();
    let mut stderr = tokio::io::stderr();
    let result = loop {
        match output.next_event().await {
            Ok(ExecEvent::Stdout(bytes)) => {
                stdout.write_all(&bytes).await?;
                stdout.flush().await?;
            }
            Ok(ExecEvent::Stderr(bytes)) => {
                stderr.write_all(&bytes).await?;
                stderr.flush().await?;
            }
            Ok(ExecEvent::Exit(code)) => break Ok(code),
            Err(error) => break Err(error),
        }
    };
    if let Some(feeder) = feeder {
        feeder.abort();
    }
    drop(raw);
    Ok(result?)
}

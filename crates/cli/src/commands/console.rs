//! `corral console vm/NAME`: attaches this terminal to a VM's serial
//! console, through the API to the agent of the VM's node. On a terminal,
//! it goes to raw mode and Ctrl-] detaches; with piped input, the input is
//! typed on the console and the session ends once it is all sent and the
//! console has been quiet for a moment (so `echo cmd | corral console`
//! shows the answer). What the console printed before attaching is in
//! `corral logs vm/NAME`.

use std::path::PathBuf;

use anyhow::bail;
use clap::Args;
use corral_api::Kind;
use corral_client::{ExecEvent, ExecInput};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::commands::connect;
use crate::commands::exec::RawMode;
use crate::target::Target;

/// The byte Ctrl-] sends: detach.
const DETACH: u8 = 0x1d;

#[derive(Debug, Args)]
#[command(after_help = "Examples:
  corral console vm/builder                      attach (Ctrl-] detaches)
  echo 'uname -a' | corral console vm/builder    type a line, show the answer")]
pub struct ConsoleArgs {
    /// The VM: vm/NAME.
    target: String,
    #[arg(short = 'n', long, value_name = "NS", default_value = "default")]
    namespace: String,
}

/// Copies stdin to the console until end of file (then detaches once the
/// console is quiet) or, on a terminal, Ctrl-] (then at once).
async fn forward_stdin(mut input: ExecInput, interactive: bool) -> std::io::Result<bool> {
    let mut stdin = tokio::io::stdin();
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        let read = stdin.read(&mut buffer).await?;
        if read == 0 {
            input.close_stdin().await?;
            return Ok(false);
        }
        let chunk = &buffer[..read];
        if interactive && let Some(at) = chunk.iter().position(|b| *b == DETACH) {
            input.send_stdin(&chunk[..at]).await?;
            return Ok(true);
        }
        input.send_stdin(chunk).await?;
    }
}

/// Runs the session; returns the exit code (0 once detached).
pub async fn console(config: Option<PathBuf>, args: ConsoleArgs) -> anyhow::Result<i32> {
    let key = Target::parse(&args.target, None)?.key(Some(&args.namespace))?;
    if key.kind != Kind::VirtualMachine {
        bail!(
            "only VMs have a serial console; {} is a {} (`corral exec` runs a command in a pod)",
            args.target,
            key.kind
        );
    }
    let client = connect(config)?;
    let (mut output, input) = client.console(&key).await?;
    let raw = RawMode::enter();
    let interactive = raw.is_some();
    if interactive {
        eprint!("attached to {}; Ctrl-] detaches\r\n", args.target);
    }
    let mut feeder = tokio::spawn(forward_stdin(input, interactive));
    let mut stdout = tokio::io::stdout();
    let mut feeding = true;
    let result = loop {
        tokio::select! {
            event = output.next_event() => match event {
                Ok(ExecEvent::Stdout(bytes)) | Ok(ExecEvent::Stderr(bytes)) => {
                    stdout.write_all(&bytes).await?;
                    stdout.flush().await?;
                }
                Ok(ExecEvent::Exit(code)) => break Ok(code),
                Err(error) => break Err(error),
            },
            detached = &mut feeder, if feeding => {
                feeding = false;
                if matches!(detached, Ok(Ok(true))) {
                    break Ok(0);
                }
            }
        }
    };
    feeder.abort();
    drop(raw);
    if interactive {
        eprintln!();
    }
    Ok(result?)
}

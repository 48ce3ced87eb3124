//! One exec session on the agent: the upgraded connection's frames
//! ([`corral_client::exec_protocol`]) to and from a `runc exec` process,
//! and the pseudo-terminal runc needs for a TTY. The process is reaped by
//! pid (the runtime tracks it, so the agent's orphan sweeps leave it).

use std::os::fd::OwnedFd;
use std::pin::Pin;
use std::time::Duration;

use corral_client::exec_protocol::{self, Frame};
use corral_runtime::oci::reap;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// How long a command gets between SIGTERM and SIGKILL when its client
/// went away or the agent stops.
pub const KILL_GRACE: Duration = Duration::from_secs(3);
/// How long to drain a command's output after it exited (a background
/// child may hold the pipes open forever).
const DRAIN: Duration = Duration::from_secs(2);

pub(crate) type Waiter = tokio::task::JoinHandle<Result<reap::ExitStatus, reap::ReapError>>;
/// Where the client's stdin goes: the command's stdin pipe, or a terminal.
pub(crate) type Input = Pin<Box<dyn AsyncWrite + Send>>;

/// A pseudo-terminal in raw mode (no echo, no line editing: the
/// container's own terminal does that), `cols` x `rows`: (master, slave).
pub(crate) fn open_terminal(cols: u16, rows: u16) -> nix::Result<(OwnedFd, OwnedFd)> {
    use nix::sys::termios;
    let size = nix::pty::Winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    let pty = nix::pty::openpty(Some(&size), None)?;
    let mut attributes = termios::tcgetattr(&pty.slave)?;
    termios::cfmakeraw(&mut attributes);
    termios::tcsetattr(&pty.slave, termios::SetArg::TCSANOW, &attributes)?;
    Ok((pty.master, pty.slave))
}

/// SIGTERM to the runtime's exec process (it forwards signals to the
/// command), then SIGKILL after [`KILL_GRACE`]; returns once it is reaped.
pub(crate) async fn terminate(pid: u32, mut waiter: Waiter) -> Option<reap::ExitStatus> {
    let target = nix::unistd::Pid::from_raw(pid as i32);
    let _ = nix::sys::signal::kill(target, nix::sys::signal::Signal::SIGTERM);
    if let Ok(done) = tokio::time::timeout(KILL_GRACE, &mut waiter).await {
        return done.ok().and_then(Result::ok);
    }
    let _ = nix::sys::signal::kill(target, nix::sys::signal::Signal::SIGKILL);
    waiter.await.ok().and_then(Result::ok)
}

/// Copies a pipe into frames of `kind` until it ends.
async fn pump(mut pipe: impl AsyncRead + Unpin, kind: u8, frames: mpsc::Sender<Frame>) {
    let mut buffer = vec![0u8; exec_protocol::MAX_PAYLOAD];
    loop {
        match pipe.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(read) => {
                if frames
                    .send(Frame::new(kind, buffer[..read].to_vec()))
                    .await
                    .is_err()
                {
                    return;
                }
            }
        }
    }
}

/// Client frames into the command's stdin; returns when the client's side
/// of the connection ends (it went away).
async fn feed_stdin(mut connection: impl AsyncRead + Unpin, mut stdin: Option<Input>) {
    while let Ok(Some(frame)) = exec_protocol::read_frame(&mut connection).await {
        match frame.kind {
            exec_protocol::STDIN => {
                let written = match &mut stdin {
                    Some(pipe) => {
                        pipe.write_all(&frame.payload).await.is_ok() && pipe.flush().await.is_ok()
                    }
                    None => true,
                };
                if !written {
                    stdin = None; // the command closed its stdin
                }
            }
            exec_protocol::STDIN_EOF => stdin = None,
            _ => {}
        }
    }
}

/// Runs one exec session over the upgraded connection until the command
/// exits (then sends its exit code), the client goes away, or the agent
/// stops (both end the command). The client's stdin goes to `terminal`
/// when given, else to the command's stdin pipe.
pub(crate) async fn run_session<C>(
    connection: C,
    mut child: std::process::Child,
    terminal: Option<Input>,
    shutdown: CancellationToken,
) where
    C: AsyncRead + AsyncWrite + Send + 'static,
{
    let pid = child.id();
    let pipe = child
        .stdin
        .take()
        .and_then(|pipe| tokio::process::ChildStdin::from_std(pipe).ok())
        .map(|pipe| Box::pin(pipe) as Input);
    let stdin = terminal.or(pipe);
    let stdout = child
        .stdout
        .take()
        .and_then(|pipe| tokio::process::ChildStdout::from_std(pipe).ok());
    let stderr = child
        .stderr
        .take()
        .and_then(|pipe| tokio::process::ChildStderr::from_std(pipe).ok());
    // Reaped by pid (it is tracked, so orphan sweeps leave it alone).
    drop(child);
    let mut waiter: Waiter = tokio::task::spawn_blocking(move || reap::wait_for_exit(pid));

    let (reader, mut writer) = tokio::io::split(connection);
    let (frames, mut outgoing) = mpsc::channel::<Frame>(32);
    let send_task = tokio::spawn(async move {
        while let Some(frame) = outgoing.recv().await {
            if writer.write_all(&frame.encode()).await.is_err() || writer.flush().await.is_err() {
                return;
            }
        }
        let _ = writer.shutdown().await;
    });
    let mut pumps = Vec::new();
    if let Some(stdout) = stdout {
        pumps.push(tokio::spawn(pump(
            stdout,
            exec_protocol::STDOUT,
            frames.clone(),
        )));
    }
    if let Some(stderr) = stderr {
        pumps.push(tokio::spawn(pump(
            stderr,
            exec_protocol::STDERR,
            frames.clone(),
        )));
    }
    let mut stdin_task = tokio::spawn(feed_stdin(reader, stdin));

    let exit = tokio::select! {
        done = &mut waiter => done.ok().and_then(Result::ok),
        _ = &mut stdin_task => {
            tracing::debug!(pid, "exec: the client went away; ending the command");
            terminate(pid, waiter).await;
            None
        }
        () = shutdown.cancelled() => terminate(pid, waiter).await,
    };
    stdin_task.abort();
    let drained = tokio::time::timeout(DRAIN, futures::future::join_all(pumps)).await;
    if drained.is_err() {
        tracing::debug!(
            pid,
            "exec: output still open after the command exited; not waiting"
        );
    }
    let last = match exit {
        Some(status) => Frame::exit(status.code()),
        None if shutdown.is_cancelled() => {
            Frame::new(exec_protocol::ERROR, b"the node agent is stopping".to_vec())
        }
        None => Frame::new(
            exec_protocol::ERROR,
            b"the command's exit status is unknown".to_vec(),
        ),
    };
    let _ = frames.send(last).await;
    drop(frames);
    let _ = send_task.await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn sessions_relay_stdin_output_and_the_exit_code() {
        let guard = reap::spawn_lock();
        let child = std::process::Command::new("sh")
            .args(["-c", "read line; echo got $line; echo oops >&2; exit 3"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        reap::track(child.id());
        drop(guard);
        let (agent_side, mut client) = tokio::io::duplex(1024);
        let session = tokio::spawn(run_session(
            agent_side,
            child,
            None,
            CancellationToken::new(),
        ));
        exec_protocol::write_frames(&mut client, exec_protocol::STDIN, b"hi\n")
            .await
            .unwrap();
        exec_protocol::write_frames(&mut client, exec_protocol::STDIN_EOF, b"")
            .await
            .unwrap();
        let mut stdout = Vec::new();
        let mut stderr = Vec::new();
        let mut code = None;
        while let Some(frame) = exec_protocol::read_frame(&mut client).await.unwrap() {
            match frame.kind {
                exec_protocol::STDOUT => stdout.extend(frame.payload),
                exec_protocol::STDERR => stderr.extend(frame.payload),
                exec_protocol::EXIT => code = frame.exit_code(),
                other => panic!("unexpected frame {other}"),
            }
        }
        session.await.unwrap();
        assert_eq!(String::from_utf8_lossy(&stdout), "got hi\n");
        assert_eq!(String::from_utf8_lossy(&stderr), "oops\n");
        assert_eq!(code, Some(3));
    }

    #[tokio::test]
    async fn a_client_that_goes_away_ends_the_command() {
        let guard = reap::spawn_lock();
        let child = std::process::Command::new("sleep")
            .arg("30")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        reap::track(child.id());
        drop(guard);
        let (agent_side, client) = tokio::io::duplex(1024);
        let session = tokio::spawn(run_session(
            agent_side,
            child,
            None,
            CancellationToken::new(),
        ));
        drop(client);
        tokio::time::timeout(Duration::from_secs(10), session)
            .await
            .expect("the session ends soon after its client")
            .unwrap();
    }
}

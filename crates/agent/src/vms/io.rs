//! A VM's console through the agent's endpoint (the API server proxies
//! `corral logs vm/NAME` and `corral console vm/NAME` here):
//!
//! - `logs` streams `DATA/vms/UID/console.log` (everything the serial
//!   console printed, across QEMU restarts) like a container log: all of
//!   it or its last `tail` lines, then with `follow` what is appended.
//! - `console` attaches to the serial console's unix socket
//!   (`DATA/vms/UID/console.sock`) over the exec upgrade and frames
//!   ([`corral_client::exec_protocol`]): `STDIN` frames are typed on the
//!   console, what the guest prints arrives as `STDOUT`. `STDIN_EOF`
//!   detaches once the console has been quiet for [`QUIET`] (at most
//!   [`LINGER`] later), ending with exit code 0, so piped input sees its
//!   answer; the console going away (QEMU stopped) ends with an `ERROR`.
//!   QEMU serves one console client at a time; a second waits for the first.

use std::path::PathBuf;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, RawQuery, Request, State};
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use corral_api::{Kind, ObjectKey};
use corral_client::exec_protocol::{self, Frame};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::state::{VmRecord, VmState};
use crate::logs::LogReader;
use crate::serve::{
    EndpointError, Shared, flag, parse_query, require_upgrade, switching_protocols, tail,
};

/// After the client's stdin ends, the session lasts until the console has
/// printed nothing for this long…
pub const QUIET: Duration = Duration::from_secs(2);
/// …or this long after the end of stdin, whichever is first.
pub const LINGER: Duration = Duration::from_secs(15);

/// The VM's record on this node and its directory.
async fn find_vm(
    endpoint: &Shared,
    namespace: &str,
    name: &str,
) -> Result<(VmRecord, PathBuf), EndpointError> {
    let key = ObjectKey::new(Kind::VirtualMachine, Some(namespace), name);
    let data_dir = endpoint.ctx.data_dir.clone();
    let records = tokio::task::spawn_blocking(move || {
        VmState::open(super::state_dir(&data_dir)).and_then(|state| state.load_all())
    })
    .await
    .map_err(|error| EndpointError::Internal(error.to_string()))?
    .map_err(|error| EndpointError::Internal(crate::chain(&error)))?;
    let record = records
        .into_iter()
        .find(|record| record.vm.key() == key)
        .ok_or_else(|| {
            EndpointError::NotFound(format!(
                "vm {namespace}/{name} does not run on node {}",
                endpoint.ctx.node
            ))
        })?;
    let dir = super::vms_dir(&endpoint.ctx.data_dir).join(&record.vm.metadata.uid);
    Ok((record, dir))
}

/// `GET /v1/vms/{namespace}/{name}/logs`: the console log.
pub(crate) async fn logs(
    State(endpoint): State<Shared>,
    Path((namespace, name)): Path<(String, String)>,
    RawQuery(query): RawQuery,
) -> Result<Response, EndpointError> {
    let params = parse_query(query.as_deref());
    let follow = flag(&params, "follow")?;
    let tail = tail(&params)?;
    let (_record, dir) = find_vm(&endpoint, &namespace, &name).await?;
    let reader = LogReader::new(
        dir.join("console.log"),
        tail,
        follow,
        endpoint.shutdown.clone(),
    );
    let stream = futures::stream::unfold(reader, |mut reader| async move {
        match reader.next_chunk().await {
            Ok(Some(chunk)) => Some((Ok(chunk), reader)),
            Ok(None) => None,
            Err(error) => Some((Err(error), reader)),
        }
    });
    Ok((
        [(CONTENT_TYPE, "text/plain; charset=utf-8")],
        Body::from_stream(stream),
    )
        .into_response())
}

/// `POST /v1/vms/{namespace}/{name}/console`: attaches to the serial
/// console (an upgrade to the exec frames).
pub(crate) async fn console(
    State(endpoint): State<Shared>,
    Path((namespace, name)): Path<(String, String)>,
    mut request: Request,
) -> Result<Response, EndpointError> {
    require_upgrade(request.headers(), "console")?;
    let (record, dir) = find_vm(&endpoint, &namespace, &name).await?;
    if record.pid.is_none() {
        return Err(EndpointError::Conflict(format!(
            "vm/{name} is not running on node {} (see `corral why vm/{name}`)",
            endpoint.ctx.node
        )));
    }
    let socket = dir.join("console.sock");
    let console = UnixStream::connect(&socket).await.map_err(|error| {
        EndpointError::Conflict(format!(
            "cannot attach to vm/{name}'s console at {}: {error}",
            socket.display()
        ))
    })?;
    let upgrade = hyper::upgrade::on(&mut request);
    let shutdown = endpoint.shutdown.clone();
    tokio::spawn(async move {
        match upgrade.await {
            Ok(upgraded) => console_session(TokioIo::new(upgraded), console, shutdown).await,
            Err(error) => tracing::warn!(%error, "console: the connection was not upgraded"),
        }
    });
    Ok(switching_protocols())
}

/// Relays one console session (see the module doc) until the client
/// detaches or goes away, the console closes, or the agent stops.
pub async fn console_session<C, S>(connection: C, console: S, shutdown: CancellationToken)
where
    C: AsyncRead + AsyncWrite + Send + 'static,
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (mut from_client, mut to_client) = tokio::io::split(connection);
    let (mut from_vm, mut to_vm) = tokio::io::split(console);
    // Reading a frame is not cancel-safe: a task reads them in order.
    let (inputs, mut input) = mpsc::channel::<Frame>(16);
    let reader = tokio::spawn(async move {
        while let Ok(Some(frame)) = exec_protocol::read_frame(&mut from_client).await {
            if inputs.send(frame).await.is_err() {
                return;
            }
        }
    });
    let mut buffer = vec![0u8; exec_protocol::MAX_PAYLOAD];
    let mut stdin_ended: Option<Instant> = None;
    let mut last_output = Instant::now();
    let last = loop {
        let detach_at = stdin_ended.map(|ended| (last_output + QUIET).min(ended + LINGER));
        tokio::select! {
            read = from_vm.read(&mut buffer) => match read {
                Ok(0) | Err(_) => {
                    break Some(Frame::new(
                        exec_protocol::ERROR,
                        b"the VM's console closed (QEMU stopped)".to_vec(),
                    ));
                }
                Ok(read) => {
                    let frame = Frame::new(exec_protocol::STDOUT, buffer[..read].to_vec());
                    if to_client.write_all(&frame.encode()).await.is_err()
                        || to_client.flush().await.is_err()
                    {
                        break None; // the client went away
                    }
                    last_output = Instant::now();
                }
            },
            frame = input.recv(), if stdin_ended.is_none() => match frame {
                Some(frame) if frame.kind == exec_protocol::STDIN => {
                    if to_vm.write_all(&frame.payload).await.is_err()
                        || to_vm.flush().await.is_err()
                    {
                        break Some(Frame::new(
                            exec_protocol::ERROR,
                            b"the VM's console closed (QEMU stopped)".to_vec(),
                        ));
                    }
                }
                Some(frame) if frame.kind == exec_protocol::STDIN_EOF => {
                    stdin_ended = Some(Instant::now());
                    last_output = Instant::now();
                }
                Some(_) => {}
                None => break None, // the client went away
            },
            () = sleep_until(detach_at), if detach_at.is_some() => break Some(Frame::exit(0)),
            () = shutdown.cancelled() => {
                break Some(Frame::new(
                    exec_protocol::ERROR,
                    b"the node agent is stopping".to_vec(),
                ));
            }
        }
    };
    reader.abort();
    if let Some(frame) = last {
        let _ = to_client.write_all(&frame.encode()).await;
        let _ = to_client.flush().await;
    }
    let _ = to_client.shutdown().await;
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake guest: echoes each line it gets as `got LINE`.
    async fn echo_guest(mut guest: tokio::io::DuplexStream) {
        let mut buffer = [0u8; 256];
        let mut line = Vec::new();
        while let Ok(read) = guest.read(&mut buffer).await {
            if read == 0 {
                return;
            }
            for byte in &buffer[..read] {
                if *byte == b'\n' {
                    let reply = format!("got {}\r\n", String::from_utf8_lossy(&line));
                    if guest.write_all(reply.as_bytes()).await.is_err() {
                        return;
                    }
                    line.clear();
                } else {
                    line.push(*byte);
                }
            }
        }
    }

    async fn read_all(client: &mut tokio::io::DuplexStream) -> (Vec<u8>, Option<Frame>) {
        let mut output = Vec::new();
        let mut last = None;
        while let Some(frame) = exec_protocol::read_frame(client).await.unwrap() {
            match frame.kind {
                exec_protocol::STDOUT => output.extend(frame.payload),
                _ => last = Some(frame),
            }
        }
        (output, last)
    }

    #[tokio::test]
    async fn input_reaches_the_console_and_the_session_ends_after_stdin_and_quiet() {
        let (console, guest) = tokio::io::duplex(1024);
        tokio::spawn(echo_guest(guest));
        let (agent_side, mut client) = tokio::io::duplex(1024);
        let session = tokio::spawn(console_session(
            agent_side,
            console,
            CancellationToken::new(),
        ));
        exec_protocol::write_frames(&mut client, exec_protocol::STDIN, b"echo hi\n")
            .await
            .unwrap();
        exec_protocol::write_frames(&mut client, exec_protocol::STDIN_EOF, b"")
            .await
            .unwrap();
        let (output, last) = read_all(&mut client).await;
        session.await.unwrap();
        assert_eq!(String::from_utf8_lossy(&output), "got echo hi\r\n");
        assert_eq!(last.and_then(|f| f.exit_code()), Some(0));
    }

    #[tokio::test]
    async fn a_closed_console_ends_the_session_with_an_error() {
        let (console, guest) = tokio::io::duplex(1024);
        drop(guest);
        let (agent_side, mut client) = tokio::io::duplex(1024);
        let session = tokio::spawn(console_session(
            agent_side,
            console,
            CancellationToken::new(),
        ));
        let (_, last) = read_all(&mut client).await;
        session.await.unwrap();
        let last = last.unwrap();
        assert_eq!(last.kind, exec_protocol::ERROR);
        assert!(String::from_utf8_lossy(&last.payload).contains("QEMU stopped"));
    }

    #[tokio::test]
    async fn a_client_that_goes_away_ends_the_session() {
        let (console, _guest) = tokio::io::duplex(1024);
        let (agent_side, client) = tokio::io::duplex(1024);
        let session = tokio::spawn(console_session(
            agent_side,
            console,
            CancellationToken::new(),
        ));
        drop(client);
        tokio::time::timeout(Duration::from_secs(10), session)
            .await
            .expect("the session ends soon after its client")
            .unwrap();
    }
}

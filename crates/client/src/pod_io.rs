//! A pod's container I/O through the API: log streams and `exec` sessions
//! (an HTTP/1.1 upgrade to the frames of [`crate::exec_protocol`]); a VM's
//! console log and serial console the same ways.

use bytes::Bytes;
use corral_api::ObjectKey;
use futures::{Stream, StreamExt};
use reqwest::header::{CONNECTION, UPGRADE};
use reqwest::{Method, StatusCode};
use tokio::io::{ReadHalf, WriteHalf};

use crate::exec_protocol::{self, UPGRADE_PROTOCOL};
use crate::{Client, ClientError, api_error, object_path};

/// Which container's log to read, and how.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogsQuery {
    /// The container; the server picks the pod's only one when `None`.
    pub container: Option<String>,
    /// Keep streaming what the container writes until the stream is dropped.
    pub follow: bool,
    /// Only the last this many lines (then what follows, with `follow`).
    pub tail: Option<u64>,
}

/// A command to run in a pod's container.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecRequest {
    /// The container; the server picks the pod's only one when `None`.
    pub container: Option<String>,
    pub command: Vec<String>,
    /// Run it on a pseudo-terminal (stdout and stderr become one stream).
    pub tty: bool,
    /// The terminal's columns and rows (default 80x24).
    pub terminal_size: Option<(u16, u16)>,
}

/// What an exec session delivers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecEvent {
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    /// The command ended with this code (128 + signal when killed); last.
    Exit(i32),
}

/// The receiving half of an exec session.
#[derive(Debug)]
pub struct ExecOutput {
    reader: ReadHalf<reqwest::Upgraded>,
}

/// The sending half of an exec session: the command's stdin.
#[derive(Debug)]
pub struct ExecInput {
    writer: WriteHalf<reqwest::Upgraded>,
}

impl ExecOutput {
    /// The next output or the exit code. Fails when the agent reports an
    /// error or the connection ends without an exit code.
    pub async fn next_event(&mut self) -> Result<ExecEvent, ClientError> {
        loop {
            let frame = exec_protocol::read_frame(&mut self.reader)
                .await
                .map_err(|error| ClientError::Exec(chain(&error)))?;
            let Some(frame) = frame else {
                return Err(ClientError::Exec(
                    "the connection closed before the command's exit code arrived".into(),
                ));
            };
            match frame.kind {
                exec_protocol::STDOUT => return Ok(ExecEvent::Stdout(frame.payload)),
                exec_protocol::STDERR => return Ok(ExecEvent::Stderr(frame.payload)),
                exec_protocol::EXIT => {
                    let code = frame.exit_code().ok_or_else(|| {
                        ClientError::Exec("malformed exit frame from the agent".into())
                    })?;
                    return Ok(ExecEvent::Exit(code));
                }
                exec_protocol::ERROR => {
                    return Err(ClientError::Exec(
                        String::from_utf8_lossy(&frame.payload).into_owned(),
                    ));
                }
                _ => continue, // a newer agent's frame this client does not know
            }
        }
    }
}

impl ExecInput {
    /// Sends bytes to the command's stdin.
    pub async fn send_stdin(&mut self, data: &[u8]) -> std::io::Result<()> {
        exec_protocol::write_frames(&mut self.writer, exec_protocol::STDIN, data).await
    }

    /// Closes the command's stdin (it reads end of file).
    pub async fn close_stdin(&mut self) -> std::io::Result<()> {
        exec_protocol::write_frames(&mut self.writer, exec_protocol::STDIN_EOF, &[]).await
    }
}

impl Client {
    /// A container's log as a byte stream. With `follow` the stream goes on
    /// until dropped (or the node's agent stops).
    pub async fn logs(
        &self,
        key: &ObjectKey,
        query: &LogsQuery,
    ) -> Result<impl Stream<Item = Result<Bytes, ClientError>> + Send + use<>, ClientError> {
        let path = format!("{}/logs", object_path(key));
        let mut params = vec![("follow", query.follow.to_string())];
        if let Some(container) = &query.container {
            params.push(("container", container.clone()));
        }
        if let Some(tail) = query.tail {
            params.push(("tail", tail.to_string()));
        }
        let response = self
            .request(Method::GET, &path)
            .query(&params)
            .send()
            .await
            .map_err(|source| self.transport(source))?;
        let status = response.status();
        if !status.is_success() {
            let body = response.bytes().await.unwrap_or_default();
            return Err(api_error(status, &body));
        }
        let server = self.server().to_string();
        Ok(response.bytes_stream().map(move |chunk| {
            chunk.map_err(|source| ClientError::Transport {
                server: server.clone(),
                source,
            })
        }))
    }

    /// Starts a command in a pod's container and returns the session's two
    /// halves. Stdin stays open until [`ExecInput::close_stdin`].
    pub async fn exec(
        &self,
        key: &ObjectKey,
        request: &ExecRequest,
    ) -> Result<(ExecOutput, ExecInput), ClientError> {
        let path = format!("{}/exec", object_path(key));
        let mut params = vec![("tty", request.tty.to_string())];
        if let Some(container) = &request.container {
            params.push(("container", container.clone()));
        }
        if let Some((cols, rows)) = request.terminal_size {
            params.push(("cols", cols.to_string()));
            params.push(("rows", rows.to_string()));
        }
        params.extend(request.command.iter().map(|arg| ("cmd", arg.clone())));
        self.upgrade(&path, &params).await
    }

    /// Attaches to a VM's serial console: what it prints arrives as
    /// [`ExecEvent::Stdout`]; [`ExecInput::send_stdin`] types on it;
    /// [`ExecInput::close_stdin`] detaches once the console is quiet (the
    /// session then ends with exit code 0).
    pub async fn console(&self, key: &ObjectKey) -> Result<(ExecOutput, ExecInput), ClientError> {
        self.upgrade(&format!("{}/console", object_path(key)), &[])
            .await
    }

    /// Opens a TCP connection to `port` inside a pod's network namespace
    /// (its loopback), relayed by the API server and the pod's node: the
    /// bytes of the returned stream are the connection's, unframed.
    pub async fn port_forward(
        &self,
        key: &ObjectKey,
        port: u16,
    ) -> Result<reqwest::Upgraded, ClientError> {
        let path = format!("{}/portforward", object_path(key));
        self.upgraded(&path, &[("port", port.to_string())]).await
    }

    async fn upgrade(
        &self,
        path: &str,
        params: &[(&str, String)],
    ) -> Result<(ExecOutput, ExecInput), ClientError> {
        let upgraded = self.upgraded(path, params).await?;
        let (reader, writer) = tokio::io::split(upgraded);
        Ok((ExecOutput { reader }, ExecInput { writer }))
    }

    async fn upgraded(
        &self,
        path: &str,
        params: &[(&str, String)],
    ) -> Result<reqwest::Upgraded, ClientError> {
        let response = self
            .request(Method::POST, path)
            .query(params)
            .header(CONNECTION, "Upgrade")
            .header(UPGRADE, UPGRADE_PROTOCOL)
            .send()
            .await
            .map_err(|source| self.transport(source))?;
        let status = response.status();
        if status != StatusCode::SWITCHING_PROTOCOLS {
            let body = response.bytes().await.unwrap_or_default();
            return Err(api_error(status, &body));
        }
        response
            .upgrade()
            .await
            .map_err(|source| self.transport(source))
    }
}

/// The error and its sources, joined with `: `.
fn chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

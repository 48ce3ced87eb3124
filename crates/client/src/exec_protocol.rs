//! The byte protocol of `exec` after the HTTP/1.1 upgrade
//! (`Upgrade: corral-exec`), shared by the node agent (which speaks it), the
//! API server (which only relays bytes) and the CLI.
//!
//! Both directions carry frames: one type byte, the payload length as a
//! big-endian `u32`, then the payload (at most [`MAX_PAYLOAD`] bytes).
//!
//! | type | direction | payload |
//! |---|---|---|
//! | [`STDIN`] | client → agent | bytes for the process's stdin |
//! | [`STDIN_EOF`] | client → agent | empty: close the process's stdin |
//! | [`STDOUT`] | agent → client | process stdout (with a TTY: the terminal) |
//! | [`STDERR`] | agent → client | process stderr (never with a TTY) |
//! | [`EXIT`] | agent → client | `i32` big-endian: the exit code (128 + signal); last frame |
//! | [`ERROR`] | agent → client | UTF-8 message: the session failed; last frame |
//!
//! The agent closes the connection after the last frame. A client that
//! goes away ends the process (SIGTERM, then SIGKILL).

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The `Upgrade` header's protocol name.
pub const UPGRADE_PROTOCOL: &str = "corral-exec";

pub const STDIN: u8 = 0;
pub const STDOUT: u8 = 1;
pub const STDERR: u8 = 2;
pub const EXIT: u8 = 3;
pub const STDIN_EOF: u8 = 4;
pub const ERROR: u8 = 5;

/// The largest payload of one frame; writers split larger data.
pub const MAX_PAYLOAD: usize = 64 * 1024;

/// One frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub kind: u8,
    pub payload: Vec<u8>,
}

impl Frame {
    pub fn new(kind: u8, payload: impl Into<Vec<u8>>) -> Self {
        Frame {
            kind,
            payload: payload.into(),
        }
    }

    /// The `EXIT` frame for `code`.
    pub fn exit(code: i32) -> Self {
        Frame::new(EXIT, code.to_be_bytes().to_vec())
    }

    /// The frame's bytes on the wire.
    pub fn encode(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(5 + self.payload.len());
        bytes.push(self.kind);
        // INVARIANT: payloads are at most MAX_PAYLOAD bytes, far below u32::MAX.
        bytes.extend_from_slice(&(self.payload.len() as u32).to_be_bytes());
        bytes.extend_from_slice(&self.payload);
        bytes
    }

    /// The exit code an `EXIT` frame carries.
    pub fn exit_code(&self) -> Option<i32> {
        let bytes: [u8; 4] = self.payload.as_slice().try_into().ok()?;
        (self.kind == EXIT).then(|| i32::from_be_bytes(bytes))
    }
}

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("the exec connection failed")]
    Io(#[from] std::io::Error),
    #[error("exec frame of {0} bytes exceeds the limit of {MAX_PAYLOAD}")]
    TooLarge(usize),
}

/// Reads the next frame; `None` at a clean end of stream (between frames).
pub async fn read_frame<R: AsyncRead + Unpin>(reader: &mut R) -> Result<Option<Frame>, FrameError> {
    let mut header = [0u8; 5];
    let mut filled = 0;
    while filled < header.len() {
        let read = reader.read(&mut header[filled..]).await?;
        if read == 0 {
            if filled == 0 {
                return Ok(None);
            }
            return Err(FrameError::Io(std::io::ErrorKind::UnexpectedEof.into()));
        }
        filled += read;
    }
    let length = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
    if length > MAX_PAYLOAD {
        return Err(FrameError::TooLarge(length));
    }
    let mut payload = vec![0u8; length];
    reader.read_exact(&mut payload).await?;
    Ok(Some(Frame {
        kind: header[0],
        payload,
    }))
}

/// Writes `data` as frames of `kind`, split at [`MAX_PAYLOAD`].
pub async fn write_frames<W: AsyncWrite + Unpin>(
    writer: &mut W,
    kind: u8,
    data: &[u8],
) -> std::io::Result<()> {
    if data.is_empty() {
        writer
            .write_all(&Frame::new(kind, Vec::new()).encode())
            .await?;
    }
    for chunk in data.chunks(MAX_PAYLOAD) {
        writer.write_all(&Frame::new(kind, chunk).encode()).await?;
    }
    writer.flush().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn frames_round_trip_and_split() {
        let mut wire = Vec::new();
        write_frames(&mut wire, STDOUT, b"hello").await.unwrap();
        write_frames(&mut wire, STDIN_EOF, b"").await.unwrap();
        let big = vec![7u8; MAX_PAYLOAD + 3];
        write_frames(&mut wire, STDERR, &big).await.unwrap();
        wire.extend(Frame::exit(-3).encode());
        let mut reader = wire.as_slice();
        let mut frames = Vec::new();
        while let Some(frame) = read_frame(&mut reader).await.unwrap() {
            frames.push(frame);
        }
        assert_eq!(frames.len(), 5);
        assert_eq!(frames[0], Frame::new(STDOUT, b"hello".to_vec()));
        assert_eq!(frames[1], Frame::new(STDIN_EOF, Vec::new()));
        assert_eq!(frames[2].payload.len(), MAX_PAYLOAD);
        assert_eq!(frames[3].payload, vec![7u8; 3]);
        assert_eq!(frames[4].exit_code(), Some(-3));
        assert_eq!(frames[0].exit_code(), None);
    }

    #[tokio::test]
    async fn truncated_and_oversized_frames_fail() {
        let wire = Frame::new(STDOUT, b"abc".to_vec()).encode();
        assert!(read_frame(&mut &wire[..2]).await.is_err());
        assert!(read_frame(&mut &wire[..6]).await.is_err());
        let mut huge = vec![STDOUT];
        huge.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(
            read_frame(&mut huge.as_slice()).await,
            Err(FrameError::TooLarge(_))
        ));
    }
}

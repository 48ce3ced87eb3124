//! Container log files (`DATA/pods/<uid>/logs/<container>.log`): size-based
//! rotation, and reading them for the agent's endpoint — the last lines,
//! then the bytes appended later, across rotations.
//!
//! Rotation is copy-truncate: the runtime opened each file with `O_APPEND`
//! and the container keeps that descriptor, so after the truncate its next
//! write lands at the new end of the same file. One older generation is
//! kept as `<container>.log.1`. Bytes written between the copy and the
//! truncate are lost; with a 10 MiB limit that window is a few
//! milliseconds per 10 MiB.

use std::fs::{self, File};
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio_util::sync::CancellationToken;

/// A log file larger than this is rotated.
pub const MAX_LOG_BYTES: u64 = 10 * 1024 * 1024;
/// How often the agent looks for logs to rotate.
pub const ROTATE_EVERY: Duration = Duration::from_secs(30);
/// How often a follower looks for new bytes at the end of the file.
const FOLLOW_POLL: Duration = Duration::from_millis(200);
/// The largest chunk a follower reads at once.
const CHUNK: usize = 64 * 1024;

/// The rotated generation of a log file: `web.log` → `web.log.1`.
pub fn rotated_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_os_string();
    name.push(".1");
    PathBuf::from(name)
}

/// Rotates `path` if it is larger than `max_bytes`: copies it over
/// `path.1` and truncates it. Returns whether it rotated.
pub fn rotate_file(path: &Path, max_bytes: u64) -> io::Result<bool> {
    let size = fs::metadata(path)?.len();
    if size <= max_bytes {
        return Ok(false);
    }
    fs::copy(path, rotated_path(path))?;
    fs::OpenOptions::new().write(true).open(path)?.set_len(0)?;
    Ok(true)
}

/// Rotates every `*.log` in `pods_dir/*/logs/` larger than `max_bytes`;
/// returns the files rotated. Failures are logged and skipped.
pub fn rotate_all(pods_dir: &Path, max_bytes: u64) -> Vec<PathBuf> {
    let mut rotated = Vec::new();
    let pods = fs::read_dir(pods_dir).into_iter().flatten().flatten();
    for pod in pods {
        let logs = fs::read_dir(pod.path().join("logs"))
            .into_iter()
            .flatten()
            .flatten();
        for entry in logs {
            let path = entry.path();
            if path.extension().and_then(|e| e.to_str()) != Some("log") {
                continue;
            }
            match rotate_file(&path, max_bytes) {
                Ok(true) => rotated.push(path),
                Ok(false) => {}
                Err(error) => {
                    tracing::warn!(path = %path.display(), %error, "cannot rotate a container log");
                }
            }
        }
    }
    rotated
}

/// Rotates the node's container logs every [`ROTATE_EVERY`] until cancelled.
pub async fn rotate_loop(pods_dir: PathBuf, shutdown: CancellationToken) {
    loop {
        let dir = pods_dir.clone();
        let rotated = tokio::task::spawn_blocking(move || rotate_all(&dir, MAX_LOG_BYTES))
            .await
            .unwrap_or_default();
        for path in rotated {
            tracing::info!(path = %path.display(), "rotated a container log");
        }
        tokio::select! {
            () = tokio::time::sleep(ROTATE_EVERY) => {}
            () = shutdown.cancelled() => return,
        }
    }
}

/// Where the last `lines` lines of a `len`-byte file begin. A final
/// newline ends the last line; it does not start an empty one.
pub fn tail_offset<R: Read + Seek>(reader: &mut R, len: u64, lines: u64) -> io::Result<u64> {
    if lines == 0 {
        return Ok(len);
    }
    const BLOCK: u64 = 8192;
    let mut end = len;
    let mut seen = 0u64;
    let mut buffer = vec![0u8; BLOCK as usize];
    while end > 0 {
        let start = end.saturating_sub(BLOCK);
        let block = &mut buffer[..(end - start) as usize];
        reader.seek(SeekFrom::Start(start))?;
        reader.read_exact(block)?;
        for (index, byte) in block.iter().enumerate().rev() {
            let at = start + index as u64;
            if *byte != b'\n' || at + 1 == len {
                continue;
            }
            seen += 1;
            if seen == lines {
                return Ok(at + 1);
            }
        }
        end = start;
    }
    Ok(0)
}

/// The identity of a file, to notice it was replaced.
fn file_id(metadata: &fs::Metadata) -> (u64, u64) {
    (metadata.dev(), metadata.ino())
}

/// Reads one container log: from the start or its last lines, then (when
/// following) whatever is appended, reopening after a rotation.
#[derive(Debug)]
pub struct LogReader {
    path: PathBuf,
    file: Option<tokio::fs::File>,
    id: (u64, u64),
    position: u64,
    follow: bool,
    /// Lines to start from when the file is first opened.
    tail: Option<u64>,
    shutdown: CancellationToken,
}

impl LogReader {
    pub fn new(
        path: PathBuf,
        tail: Option<u64>,
        follow: bool,
        shutdown: CancellationToken,
    ) -> Self {
        LogReader {
            path,
            file: None,
            id: (0, 0),
            position: 0,
            follow,
            tail,
            shutdown,
        }
    }

    /// Opens the file at its tail offset; `None` when it does not exist.
    async fn open(&mut self) -> io::Result<bool> {
        let path = self.path.clone();
        let tail = self.tail.take();
        let opened = tokio::task::spawn_blocking(move || -> io::Result<Option<_>> {
            let mut file = match File::open(&path) {
                Ok(file) => file,
                Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
                Err(error) => return Err(error),
            };
            let metadata = file.metadata()?;
            let start = match tail {
                Some(lines) => tail_offset(&mut file, metadata.len(), lines)?,
                None => 0,
            };
            file.seek(SeekFrom::Start(start))?;
            Ok(Some((file, file_id(&metadata), start)))
        })
        .await
        .map_err(io::Error::other)??;
        let Some((file, id, start)) = opened else {
            return Ok(false);
        };
        self.file = Some(tokio::fs::File::from_std(file));
        self.id = id;
        self.position = start;
        Ok(true)
    }

    /// Whether the file was rotated or replaced since it was opened; then
    /// reading starts over (from its beginning).
    async fn check_rotation(&mut self) -> io::Result<()> {
        let metadata = match tokio::fs::metadata(&self.path).await {
            Ok(metadata) => metadata,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(error) => return Err(error),
        };
        if file_id(&metadata) != self.id {
            self.file = None; // replaced: open the new file from the start
        } else if metadata.len() < self.position
            && let Some(file) = &mut self.file
        {
            file.seek(SeekFrom::Start(0)).await?; // truncated in place
            self.position = 0;
        }
        Ok(())
    }

    /// The next chunk of the log; `None` at its end (without `follow`), or
    /// when the agent stops.
    pub async fn next_chunk(&mut self) -> io::Result<Option<Bytes>> {
        loop {
            if self.shutdown.is_cancelled() {
                return Ok(None);
            }
            if self.file.is_none() && !self.open().await? && !self.follow {
                return Ok(None);
            }
            if let Some(file) = &mut self.file {
                let mut buffer = vec![0u8; CHUNK];
                let read = file.read(&mut buffer).await?;
                if read > 0 {
                    buffer.truncate(read);
                    self.position += read as u64;
                    return Ok(Some(Bytes::from(buffer)));
                }
            }
            if !self.follow {
                return Ok(None);
            }
            tokio::select! {
                () = tokio::time::sleep(FOLLOW_POLL) => {}
                () = self.shutdown.cancelled() => return Ok(None),
            }
            if self.file.is_some() {
                self.check_rotation().await?;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Cursor, Write};

    fn offset(text: &str, lines: u64) -> usize {
        let bytes = text.as_bytes();
        tail_offset(&mut Cursor::new(bytes), bytes.len() as u64, lines).unwrap() as usize
    }

    #[test]
    fn tail_offsets_count_lines_from_the_end() {
        assert_eq!(offset("a\nb\nc\n", 1), 4);
        assert_eq!(offset("a\nb\nc\n", 2), 2);
        assert_eq!(offset("a\nb\nc\n", 3), 0);
        assert_eq!(offset("a\nb\nc\n", 10), 0);
        assert_eq!(offset("a\nb\nc\n", 0), 6);
        assert_eq!(offset("a\nb\npartial", 1), 4);
        assert_eq!(offset("", 3), 0);
        // Across the 8 KiB blocks.
        let long: String = (0..5000).map(|i| format!("line {i}\n")).collect();
        let start = offset(&long, 2);
        assert_eq!(&long[start..], "line 4998\nline 4999\n");
    }

    #[test]
    fn rotation_copies_then_truncates_only_big_files() {
        let dir = tempfile::tempdir().unwrap();
        let logs = dir.path().join("uid-1").join("logs");
        fs::create_dir_all(&logs).unwrap();
        let big = logs.join("web.log");
        let small = logs.join("side.log");
        fs::write(&big, "0123456789abcdef").unwrap();
        fs::write(&small, "tiny").unwrap();
        fs::write(logs.join("web.log.1"), "older").unwrap();
        // A writer holding the file with O_APPEND, as the container does.
        let mut writer = fs::OpenOptions::new().append(true).open(&big).unwrap();

        assert_eq!(rotate_all(dir.path(), 10), vec![big.clone()]);
        assert_eq!(
            fs::read_to_string(rotated_path(&big)).unwrap(),
            "0123456789abcdef"
        );
        assert_eq!(fs::read_to_string(&big).unwrap(), "");
        assert_eq!(fs::read_to_string(&small).unwrap(), "tiny");
        assert!(!rotated_path(&small).exists());

        writer.write_all(b"after\n").unwrap();
        assert_eq!(fs::read_to_string(&big).unwrap(), "after\n");
        assert!(rotate_all(dir.path(), 10).is_empty());
        assert!(rotate_all(Path::new("/nonexistent-corral-pods"), 10).is_empty());
    }

    async fn collect(reader: &mut LogReader) -> String {
        let mut text = Vec::new();
        while let Some(chunk) = reader.next_chunk().await.unwrap() {
            text.extend_from_slice(&chunk);
        }
        String::from_utf8(text).unwrap()
    }

    #[tokio::test]
    async fn reads_whole_files_tails_and_missing_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("web.log");
        let token = CancellationToken::new();
        let mut missing = LogReader::new(path.clone(), None, false, token.clone());
        assert_eq!(collect(&mut missing).await, "");
        fs::write(&path, "one\ntwo\nthree\n").unwrap();
        let mut whole = LogReader::new(path.clone(), None, false, token.clone());
        assert_eq!(collect(&mut whole).await, "one\ntwo\nthree\n");
        let mut tail = LogReader::new(path, Some(2), false, token);
        assert_eq!(collect(&mut tail).await, "two\nthree\n");
    }

    async fn expect(reader: &mut LogReader, wanted: &str) {
        let mut text = String::new();
        while text.len() < wanted.len() {
            let chunk = tokio::time::timeout(Duration::from_secs(5), reader.next_chunk())
                .await
                .expect("the follower delivers within 5 s")
                .unwrap()
                .expect("the follower goes on");
            text.push_str(std::str::from_utf8(&chunk).unwrap());
        }
        assert_eq!(text, wanted);
    }

    #[tokio::test]
    async fn follows_appends_truncation_and_replacement() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("web.log");
        let token = CancellationToken::new();
        let mut follower = LogReader::new(path.clone(), Some(1), true, token.clone());
        // Waits for the file to appear.
        let mut file = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .unwrap();
        file.write_all(b"first\n").unwrap();
        expect(&mut follower, "first\n").await;
        file.write_all(b"second\n").unwrap();
        expect(&mut follower, "second\n").await;

        // Copy-truncate rotation: the follower starts over at the new end.
        rotate_file(&path, 1).unwrap();
        tokio::time::sleep(FOLLOW_POLL * 2).await;
        file.write_all(b"third\n").unwrap();
        expect(&mut follower, "third\n").await;

        // Replaced by a new file.
        fs::rename(&path, dir.path().join("old.log")).unwrap();
        fs::write(&path, "fourth\n").unwrap();
        expect(&mut follower, "fourth\n").await;

        token.cancel();
        assert_eq!(follower.next_chunk().await.unwrap(), None);
    }
}

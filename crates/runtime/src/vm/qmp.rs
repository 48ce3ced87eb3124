//! A small typed client of the QEMU Machine Protocol over the unix socket
//! every VM's QEMU serves (`-qmp unix:…,server=on,wait=off`).
//!
//! QMP is line-delimited JSON: QEMU greets (`{"QMP": …}`), the client
//! leaves negotiation mode with `qmp_capabilities`, then each command
//! (`{"execute": NAME, "arguments": …}`) gets one `{"return": …}` or
//! `{"error": {"class", "desc"}}`, with asynchronous events
//! (`{"event": NAME, "data": …, "timestamp": …}`) interleaved anywhere.
//! The client is blocking (the agent calls it from a blocking task), sets
//! a timeout on every read and write, and keeps the events it reads while
//! waiting for a reply so [`Monitor::next_event`] still sees them.
//!
//! The agent's logic sees QEMU only through [`Monitor`], so it is
//! unit-tested with a fake.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

/// Why a QMP exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum QmpError {
    #[error("cannot connect to QMP at {path}")]
    Connect {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("QMP connection failed during {during}")]
    Io {
        during: String,
        #[source]
        source: std::io::Error,
    },
    #[error("QEMU closed the QMP connection during {during}")]
    Closed { during: String },
    #[error("QEMU sent a line that is not QMP during {during}: {line}")]
    Protocol { during: String, line: String },
    #[error("QEMU refused {command}: {class}: {desc}")]
    Refused {
        command: String,
        class: String,
        desc: String,
    },
    #[error("the reply to {command} does not decode")]
    Reply {
        command: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("QEMU did not answer {command} within {timeout:?}")]
    Timeout { command: String, timeout: Duration },
    #[error("the monitor command `{command}` failed: {output}")]
    Human { command: String, output: String },
}

/// QEMU's run state (`query-status`), as QAPI's `RunState` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RunState {
    Running,
    Paused,
    Prelaunch,
    Inmigrate,
    Postmigrate,
    FinishMigrate,
    RestoreVm,
    SaveVm,
    Shutdown,
    Suspended,
    Watchdog,
    GuestPanicked,
    IoError,
    InternalError,
    Debug,
    Colo,
    /// A state this client does not know (a newer QEMU).
    #[serde(other)]
    Other,
}

impl RunState {
    /// The state as QEMU spells it (`other` for one this client does not know).
    pub fn as_str(self) -> &'static str {
        match self {
            RunState::Running => "running",
            RunState::Paused => "paused",
            RunState::Prelaunch => "prelaunch",
            RunState::Inmigrate => "inmigrate",
            RunState::Postmigrate => "postmigrate",
            RunState::FinishMigrate => "finish-migrate",
            RunState::RestoreVm => "restore-vm",
            RunState::SaveVm => "save-vm",
            RunState::Shutdown => "shutdown",
            RunState::Suspended => "suspended",
            RunState::Watchdog => "watchdog",
            RunState::GuestPanicked => "guest-panicked",
            RunState::IoError => "io-error",
            RunState::InternalError => "internal-error",
            RunState::Debug => "debug",
            RunState::Colo => "colo",
            RunState::Other => "other",
        }
    }
}

impl std::fmt::Display for RunState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The reply to `query-status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct RunStatus {
    pub status: RunState,
    /// Whether guest CPUs execute.
    pub running: bool,
}

/// An asynchronous QMP event (`SHUTDOWN`, `POWERDOWN`, `RESET`, `STOP`, …).
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub name: String,
    pub data: Value,
}

impl Event {
    /// For `SHUTDOWN`: whether the guest asked for it (it powered itself
    /// off) rather than the host (`quit`, a signal).
    pub fn guest_initiated(&self) -> bool {
        self.data.get("guest").and_then(Value::as_bool) == Some(true)
    }
}

/// What the agent asks of a running QEMU.
pub trait Monitor: Send {
    /// QEMU's run state.
    fn query_status(&mut self) -> Result<RunStatus, QmpError>;
    /// Presses the ACPI power button: a guest that handles it shuts down.
    fn system_powerdown(&mut self) -> Result<(), QmpError>;
    /// Resets the machine, like its reset button.
    fn system_reset(&mut self) -> Result<(), QmpError>;
    /// QEMU exits at once (its disks flushed; the guest is not asked).
    fn quit(&mut self) -> Result<(), QmpError>;
    /// Grows the disk `device` (its `-drive id`) to `bytes` while the guest
    /// runs.
    fn block_resize(&mut self, device: &str, bytes: u64) -> Result<(), QmpError>;
    /// A human monitor (HMP) command line through QMP; its output text.
    /// Used for what QMP has no synchronous command for (`savevm`,
    /// `loadvm`, `delvm`, `info snapshots`).
    fn human(&mut self, command_line: &str) -> Result<String, QmpError>;
    /// The next event, waiting at most `timeout`; `None` if none came.
    fn next_event(&mut self, timeout: Duration) -> Result<Option<Event>, QmpError>;
}

/// How long a command may take unless it says otherwise. `savevm` and
/// `loadvm` copy the guest's memory and take longer ([`QmpClient::slow`]).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// A QMP connection in command mode.
#[derive(Debug)]
pub struct QmpClient {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    events: VecDeque<Event>,
    timeout: Duration,
}

/// One line from QEMU, sorted.
enum Message {
    Greeting,
    Return(Value),
    Error { class: String, desc: String },
    Event(Event),
}

fn parse(line: &str, during: &str) -> Result<Message, QmpError> {
    let protocol = || QmpError::Protocol {
        during: during.to_string(),
        line: line.trim().to_string(),
    };
    let value: Value = serde_json::from_str(line).map_err(|_| protocol())?;
    if value.get("QMP").is_some() {
        return Ok(Message::Greeting);
    }
    if let Some(returned) = value.get("return") {
        return Ok(Message::Return(returned.clone()));
    }
    if let Some(error) = value.get("error") {
        let text = |field: &str| {
            error
                .get(field)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        return Ok(Message::Error {
            class: text("class"),
            desc: text("desc"),
        });
    }
    if let Some(name) = value.get("event").and_then(Value::as_str) {
        return Ok(Message::Event(Event {
            name: name.to_string(),
            data: value.get("data").cloned().unwrap_or(Value::Null),
        }));
    }
    Err(protocol())
}

impl QmpClient {
    /// Connects to the QMP socket at `path`, reads the greeting and leaves
    /// negotiation mode.
    pub fn connect(path: &Path) -> Result<Self, QmpError> {
        let stream = UnixStream::connect(path).map_err(|source| QmpError::Connect {
            path: path.to_path_buf(),
            source,
        })?;
        let writer = stream.try_clone().map_err(|source| QmpError::Connect {
            path: path.to_path_buf(),
            source,
        })?;
        let mut client = QmpClient {
            reader: BufReader::new(stream),
            writer,
            events: VecDeque::new(),
            timeout: DEFAULT_TIMEOUT,
        };
        match client.read_message("the greeting", DEFAULT_TIMEOUT)? {
            Message::Greeting => {}
            _ => {
                return Err(QmpError::Protocol {
                    during: "the greeting".into(),
                    line: "a message before the greeting".into(),
                });
            }
        }
        client.execute::<Value>("qmp_capabilities", None)?;
        Ok(client)
    }

    /// The timeout for the next commands.
    pub fn slow(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    fn read_message(&mut self, during: &str, timeout: Duration) -> Result<Message, QmpError> {
        let io = |source| QmpError::Io {
            during: during.to_string(),
            source,
        };
        self.reader
            .get_ref()
            .set_read_timeout(Some(timeout.max(Duration::from_millis(1))))
            .map_err(io)?;
        let mut line = String::new();
        match self.reader.read_line(&mut line) {
            Ok(0) => Err(QmpError::Closed {
                during: during.to_string(),
            }),
            Ok(_) => parse(&line, during),
            Err(error)
                if matches!(
                    error.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                Err(QmpError::Timeout {
                    command: during.to_string(),
                    timeout,
                })
            }
            Err(error) => Err(io(error)),
        }
    }

    /// Runs `command` with `arguments` and decodes its reply.
    pub fn execute<T: DeserializeOwned>(
        &mut self,
        command: &str,
        arguments: Option<Value>,
    ) -> Result<T, QmpError> {
        let mut request = json!({ "execute": command });
        if let Some(arguments) = arguments {
            request["arguments"] = arguments;
        }
        let mut line = request.to_string();
        line.push('\n');
        let io = |source| QmpError::Io {
            during: command.to_string(),
            source,
        };
        self.writer
            .set_write_timeout(Some(self.timeout))
            .map_err(io)?;
        self.writer.write_all(line.as_bytes()).map_err(io)?;
        let deadline = Instant::now() + self.timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(QmpError::Timeout {
                    command: command.to_string(),
                    timeout: self.timeout,
                });
            }
            match self.read_message(command, left)? {
                Message::Return(value) => {
                    return serde_json::from_value(value).map_err(|source| QmpError::Reply {
                        command: command.to_string(),
                        source,
                    });
                }
                Message::Error { class, desc } => {
                    return Err(QmpError::Refused {
                        command: command.to_string(),
                        class,
                        desc,
                    });
                }
                Message::Event(event) => self.events.push_back(event),
                Message::Greeting => {}
            }
        }
    }
}

impl Monitor for QmpClient {
    fn query_status(&mut self) -> Result<RunStatus, QmpError> {
        self.execute("query-status", None)
    }

    fn system_powerdown(&mut self) -> Result<(), QmpError> {
        self.execute::<Value>("system_powerdown", None).map(drop)
    }

    fn system_reset(&mut self) -> Result<(), QmpError> {
        self.execute::<Value>("system_reset", None).map(drop)
    }

    fn quit(&mut self) -> Result<(), QmpError> {
        match self.execute::<Value>("quit", None) {
            // QEMU may close the socket before its reply reaches us.
            Ok(_) | Err(QmpError::Closed { .. }) => Ok(()),
            Err(error) => Err(error),
        }
    }

    fn block_resize(&mut self, device: &str, bytes: u64) -> Result<(), QmpError> {
        self.execute::<Value>(
            "block_resize",
            Some(json!({ "device": device, "size": bytes })),
        )
        .map(drop)
    }

    fn human(&mut self, command_line: &str) -> Result<String, QmpError> {
        let output: String = self.execute(
            "human-monitor-command",
            Some(json!({ "command-line": command_line })),
        )?;
        // HMP reports failure only in its text.
        let failed = output
            .lines()
            .any(|line| line.starts_with("Error") || line.contains("rror: "));
        if failed {
            return Err(QmpError::Human {
                command: command_line.to_string(),
                output: output.trim().to_string(),
            });
        }
        Ok(output)
    }

    fn next_event(&mut self, timeout: Duration) -> Result<Option<Event>, QmpError> {
        if let Some(event) = self.events.pop_front() {
            return Ok(Some(event));
        }
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            match self.read_message("waiting for an event", left) {
                Ok(Message::Event(event)) => return Ok(Some(event)),
                Ok(_) => {}
                Err(QmpError::Timeout { .. }) => return Ok(None),
                Err(error) => return Err(error),
            }
        }
    }
}

#[cfg(test)]
mod tests;

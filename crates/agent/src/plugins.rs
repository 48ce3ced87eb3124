//! Volume plugins: executables installed on the node that make a pod's
//! `plugin` volumes. The agent speaks one protocol to them and nothing
//! else: `PLUGIN VERB` (`prepare`, `mount`, `unmount`, `release`) with one
//! JSON [`PluginRequest`] on stdin and one JSON [`PluginReply`] on stdout;
//! stderr is free text for the step log. A non-zero exit or `ok: false`
//! is a failure carrying the plugin's message.
//!
//! A plugin named `NAME` is the file `NAME` in the first plugin directory
//! that has it (`DATA/plugins`, then `--volume-plugin-dir`). The volume
//! lives in the pod's directory (`dir`, created and handed to the pod's id
//! range before the plugin runs) unless the plugin answers another `path`:
//! a host path is accepted only when the pod's admitted relaxations hold
//! `host-path:/PREFIX` covering it (two-party opt-in: the pod asks, an
//! operator's Policy grants). Which step runs which verb is the worker's
//! business; this module neither knows workflows nor talks to the API.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use corral_api::security::Relaxation;
use serde::{Deserialize, Serialize};

/// How long one plugin call may run before it is killed.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(120);

/// Where plugins are looked for besides `DATA/plugins`.
pub const DEFAULT_PLUGIN_DIR: &str = "/usr/lib/corral/volume-plugins";

/// A verb of the protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Prepare,
    Mount,
    Unmount,
    Release,
}

impl Verb {
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Prepare => "prepare",
            Verb::Mount => "mount",
            Verb::Unmount => "unmount",
            Verb::Release => "release",
        }
    }

    /// The verb a delegated step `PLUGIN/VERB` runs: `prepare` and
    /// `mount` in a pod's start, move or update workflow, `unmount` and
    /// `release` in its stop workflow.
    pub fn of_step(step: &str) -> Option<(&str, Verb)> {
        let (plugin, verb) = step.split_once('/')?;
        match verb {
            "prepare" => Some((plugin, Verb::Prepare)),
            "mount" => Some((plugin, Verb::Mount)),
            "unmount" => Some((plugin, Verb::Unmount)),
            "release" => Some((plugin, Verb::Release)),
            _ => None,
        }
    }

    /// Whether the verb undoes a volume (runs when the pod stops).
    pub fn is_teardown(self) -> bool {
        matches!(self, Verb::Unmount | Verb::Release)
    }
}

/// What the agent tells a plugin, as JSON on its stdin.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PluginRequest {
    /// The volume's name in the pod spec.
    pub volume: String,
    pub pod: String,
    pub namespace: String,
    /// The pod's uid: unique per pod, stable across agent restarts.
    pub uid: String,
    pub options: BTreeMap<String, String>,
    /// The directory the node made for the volume, owned by the pod's
    /// root; the volume is bound into containers from here unless the
    /// plugin answers another `path`.
    pub dir: PathBuf,
    /// The host uid (and gid) of the pod's root, when the pod has its own
    /// user namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_uid: Option<u32>,
    /// The path an earlier verb answered (`mount` gets `prepare`'s,
    /// `unmount` and `release` get `mount`'s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
}

/// What a plugin answers, as JSON on its stdout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PluginReply {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Where the volume is now (for `prepare` and `mount`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
}

/// What one run of a plugin produced.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PluginOutput {
    /// The exit code; `None` when killed by a signal (or the timeout).
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

/// Why a plugin call failed.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("{0:?} is not a volume plugin name (a file name: letters, digits, '-', '_', '.')")]
    BadName(String),
    #[error("volume plugin {plugin} is not installed on this node (looked in {searched})")]
    NotInstalled { plugin: String, searched: String },
    #[error("cannot run volume plugin {plugin}")]
    Spawn {
        plugin: String,
        #[source]
        source: std::io::Error,
    },
    #[error("volume plugin {plugin} {verb} failed: {message}")]
    Failed {
        plugin: String,
        verb: &'static str,
        message: String,
    },
    #[error("volume plugin {plugin} {verb} answered no valid JSON reply ({reason})")]
    BadReply {
        plugin: String,
        verb: &'static str,
        reason: String,
    },
    #[error(
        "volume plugin {plugin} put volume {volume} at {path}, outside the pod's directory; a host path needs the pod's host-path relaxation covering it (asked in spec.security.relax, granted by a Policy)"
    )]
    HostPath {
        plugin: String,
        volume: String,
        path: PathBuf,
    },
}

/// Runs an executable with input on stdin, collecting its output.
pub trait PluginExec: Send + Sync {
    fn run(
        &self,
        executable: &Path,
        verb: Verb,
        input: &[u8],
        timeout: Duration,
    ) -> std::io::Result<PluginOutput>;
}

/// Runs plugins as child processes of the agent.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessExec;

impl PluginExec for ProcessExec {
    fn run(
        &self,
        executable: &Path,
        verb: Verb,
        input: &[u8],
        timeout: Duration,
    ) -> std::io::Result<PluginOutput> {
        use std::os::unix::process::CommandExt;
        // The agent is a subreaper: the child is tracked from its spawn (under
        // the spawn lock) so the orphan reaper never takes its status; the
        // lock is not held while the plugin runs.
        let spawning = corral_runtime::oci::reap::spawn_lock();
        let mut child = Command::new(executable)
            .arg(verb.as_str())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own process group, so a timeout ends what it started too.
            .process_group(0)
            .spawn()?;
        let pid = child.id();
        corral_runtime::oci::reap::track(pid);
        drop(spawning);
        let readers = [
            child.stdout.take().map(drain),
            child.stderr.take().map(drain),
        ];
        if let Some(mut stdin) = child.stdin.take() {
            // From a thread: a plugin that does not read a large input must
            // not block the agent. One that does not read closes the pipe.
            let input = input.to_vec();
            std::thread::spawn(move || {
                let _ = stdin.write_all(&input);
            });
        }
        let started = Instant::now();
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break Some(status),
                Ok(None) => {}
                Err(error) => {
                    corral_runtime::oci::reap::untrack(pid);
                    return Err(error);
                }
            }
            if started.elapsed() >= timeout {
                kill_group(pid);
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        corral_runtime::oci::reap::untrack(pid);
        // Something the plugin left running may hold its output open: wait
        // for the rest of the output briefly, then take what came.
        let deadline = Instant::now() + OUTPUT_GRACE;
        let [stdout, stderr] = readers.map(|reader| {
            let Some((thread, buffer)) = reader else {
                return String::new();
            };
            while !thread.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            let bytes = buffer.lock().map(|b| b.clone()).unwrap_or_default();
            String::from_utf8_lossy(&bytes).into_owned()
        });
        Ok(PluginOutput {
            code: status.and_then(|s| s.code()),
            stdout,
            stderr: match status {
                Some(_) => stderr,
                None => format!("{stderr}killed after {}ms\n", timeout.as_millis()),
            },
        })
    }
}

/// How long the output of a finished plugin may take to close.
const OUTPUT_GRACE: Duration = Duration::from_secs(2);

/// SIGKILL to the plugin's process group (it leads it).
fn kill_group(pid: u32) {
    if let Ok(pid) = i32::try_from(pid) {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

/// Reads a pipe to its end on a thread, keeping what it read so far
/// where the caller can take it without waiting for the end.
fn drain(
    mut pipe: impl Read + Send + 'static,
) -> (
    std::thread::JoinHandle<()>,
    std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
) {
    let buffer = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let kept = buffer.clone();
    let thread = std::thread::spawn(move || {
        let mut chunk = [0u8; 8192];
        loop {
            match pipe.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => match kept.lock() {
                    Ok(mut kept) => kept.extend_from_slice(&chunk[..n]),
                    Err(_) => break,
                },
            }
        }
    });
    (thread, buffer)
}

/// A completed call: the reply and the plugin's output for the step log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Called {
    pub reply: PluginReply,
    pub output: PluginOutput,
}

/// A failed call, with whatever output the plugin produced.
#[derive(Debug)]
pub struct CallFailure {
    pub error: PluginError,
    pub output: PluginOutput,
}

/// The node's plugins: where to find them and how to run them.
#[derive(Clone)]
pub struct Plugins {
    pub dirs: Vec<PathBuf>,
    pub exec: std::sync::Arc<dyn PluginExec>,
    pub timeout: Duration,
}

impl std::fmt::Debug for Plugins {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugins")
            .field("dirs", &self.dirs)
            .finish_non_exhaustive()
    }
}

impl Plugins {
    /// Plugins found in `dirs`, run as child processes.
    pub fn new(dirs: Vec<PathBuf>) -> Self {
        Plugins {
            dirs,
            exec: std::sync::Arc::new(ProcessExec),
            timeout: CALL_TIMEOUT,
        }
    }

    /// The executable of plugin `name`.
    pub fn find(&self, name: &str) -> Result<PathBuf, PluginError> {
        if !is_plugin_name(name) {
            return Err(PluginError::BadName(name.to_string()));
        }
        self.dirs
            .iter()
            .map(|dir| dir.join(name))
            .find(|path| path.is_file())
            .ok_or_else(|| PluginError::NotInstalled {
                plugin: name.to_string(),
                searched: self
                    .dirs
                    .iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }

    /// Runs `plugin verb` with `request`.
    pub fn call(
        &self,
        plugin: &str,
        verb: Verb,
        request: &PluginRequest,
    ) -> Result<Called, Box<CallFailure>> {
        let no_output = |error| {
            Box::new(CallFailure {
                error,
                output: PluginOutput::default(),
            })
        };
        let executable = self.find(plugin).map_err(no_output)?;
        let input = serde_json::to_vec(request)
            .expect("INVARIANT: a request of strings, paths and numbers serializes");
        let output = self
            .exec
            .run(&executable, verb, &input, self.timeout)
            .map_err(|source| {
                no_output(PluginError::Spawn {
                    plugin: plugin.to_string(),
                    source,
                })
            })?;
        match interpret(plugin, verb, &output) {
            Ok(reply) => Ok(Called { reply, output }),
            Err(error) => Err(Box::new(CallFailure { error, output })),
        }
    }
}

/// A plugin name is one plain file name.
pub fn is_plugin_name(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// What a run means under the protocol (pure): the reply when it exited 0
/// with `ok: true`; otherwise the plugin's message, else the last line of
/// its stderr, else its exit status.
pub fn interpret(
    plugin: &str,
    verb: Verb,
    output: &PluginOutput,
) -> Result<PluginReply, PluginError> {
    let reply = serde_json::from_str::<PluginReply>(output.stdout.trim());
    let failed = |message: String| PluginError::Failed {
        plugin: plugin.to_string(),
        verb: verb.as_str(),
        message,
    };
    match (output.code, reply) {
        (Some(0), Ok(reply)) if reply.ok => Ok(reply),
        (
            _,
            Ok(PluginReply {
                message: Some(message),
                ..
            }),
        ) if !message.trim().is_empty() => Err(failed(message)),
        (Some(0), Err(error)) => Err(PluginError::BadReply {
            plugin: plugin.to_string(),
            verb: verb.as_str(),
            reason: error.to_string(),
        }),
        (code, _) => {
            let last = output.stderr.lines().rev().find(|l| !l.trim().is_empty());
            Err(failed(match (last, code) {
                (Some(line), _) => line.trim().to_string(),
                (None, Some(0)) => "it answered ok: false without a message".to_string(),
                (None, Some(code)) => format!("it exited with status {code}"),
                (None, None) => "it was killed".to_string(),
            }))
        }
    }
}

/// Where the volume is bound from (pure): `dir` when the plugin named no
/// path; a path inside `dir`; or a host path a `host-path` relaxation of
/// the pod covers.
pub fn accept_path(
    plugin: &str,
    volume: &str,
    dir: &Path,
    answered: Option<&Path>,
    relax: &BTreeSet<Relaxation>,
) -> Result<PathBuf, PluginError> {
    let Some(path) = answered else {
        return Ok(dir.to_path_buf());
    };
    let plain = path.is_absolute()
        && path
            .components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
    let granted = || {
        let wanted = Relaxation::HostPath(path.to_string_lossy().into_owned());
        relax.iter().any(|r| r.covers(&wanted))
    };
    // A path that exists is judged by where it leads: a symlink inside
    // `dir` (which the pod owns) must not reach the host.
    let resolved = match (std::fs::canonicalize(path), std::fs::canonicalize(dir)) {
        (Ok(path), Ok(dir)) => Some((path, dir)),
        _ => None,
    };
    let inside = match &resolved {
        Some((path, dir)) => path.starts_with(dir),
        None => path.starts_with(dir),
    };
    let granted = || match &resolved {
        Some((path, _)) => {
            let wanted = Relaxation::HostPath(path.to_string_lossy().into_owned());
            relax.iter().any(|r| r.covers(&wanted))
        }
        None => granted(),
    };
    if plain && (inside || granted()) {
        return Ok(path.to_path_buf());
    }
    Err(PluginError::HostPath {
        plugin: plugin.to_string(),
        volume: volume.to_string(),
        path: path.to_path_buf(),
    })
}

/// The plugin's output as step-log lines: `stdout: …` and `stderr: …`.
pub fn log_lines(plugin: &str, verb: Verb, output: &PluginOutput) -> Vec<String> {
    let mut lines = Vec::new();
    for (stream, text) in [("stdout", &output.stdout), ("stderr", &output.stderr)] {
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            lines.push(format!("{plugin} {} {stream}: {line}", verb.as_str()));
        }
    }
    lines
}

#[cfg(test)]
mod tests;

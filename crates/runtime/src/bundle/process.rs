//! What a container runs: the image config merged with the pod's overrides
//! the way Kubernetes does it, and the image `User` resolved to ids.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::Path;

use crate::image::ImageConfig;

/// `PATH` given to containers whose image sets none (Docker's default).
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The pod's say over the process (fields of the API's `Container`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessOverrides {
    /// Replaces the image Entrypoint (and drops its Cmd) when non-empty.
    pub command: Vec<String>,
    /// Replaces the image Cmd when non-empty.
    pub args: Vec<String>,
    /// Added to (and overriding by name) the image Env.
    pub env: BTreeMap<String, String>,
    pub working_dir: Option<String>,
}

/// The process after the merge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MergedProcess {
    pub args: Vec<String>,
    /// `NAME=value`, image order first, then the pod's additions.
    pub env: Vec<String>,
    pub cwd: String,
}

/// Why a process or user could not be worked out.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProcessError {
    #[error("container has no command: the image sets no Entrypoint or Cmd and the pod gives none")]
    NoCommand,
    #[error("working directory {0:?} is not absolute")]
    RelativeWorkingDir(String),
    #[error("user {0:?} is not in the image's /etc/passwd")]
    UnknownUser(String),
    #[error("group {0:?} is not in the image's /etc/group")]
    UnknownGroup(String),
    #[error("failed to read {path} from the image")]
    ReadImageFile { path: String, kind: io::ErrorKind },
}

/// Merges like Kubernetes: `command` replaces Entrypoint and then only
/// `args` follow it; `args` alone replaces Cmd; neither keeps both.
pub fn merge_process(
    image: &ImageConfig,
    overrides: &ProcessOverrides,
) -> Result<MergedProcess, ProcessError> {
    let image_entrypoint = image.entrypoint.clone().unwrap_or_default();
    let image_cmd = image.cmd.clone().unwrap_or_default();
    let args: Vec<String> = match (overrides.command.is_empty(), overrides.args.is_empty()) {
        (false, _) => [overrides.command.clone(), overrides.args.clone()].concat(),
        (true, false) => [image_entrypoint, overrides.args.clone()].concat(),
        (true, true) => [image_entrypoint, image_cmd].concat(),
    };
    if args.is_empty() {
        return Err(ProcessError::NoCommand);
    }

    let mut env: Vec<(String, String)> = image
        .env
        .iter()
        .flatten()
        .map(|kv| match kv.split_once('=') {
            Some((k, v)) => (k.to_string(), v.to_string()),
            None => (kv.clone(), String::new()),
        })
        .collect();
    for (key, value) in &overrides.env {
        match env.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = value.clone(),
            None => env.push((key.clone(), value.clone())),
        }
    }
    if !env.iter().any(|(k, _)| k == "PATH") {
        env.insert(0, ("PATH".to_string(), DEFAULT_PATH.to_string()));
    }

    let cwd = overrides
        .working_dir
        .clone()
        .or_else(|| image.working_dir.clone().filter(|w| !w.is_empty()))
        .unwrap_or_else(|| "/".to_string());
    if !cwd.starts_with('/') {
        return Err(ProcessError::RelativeWorkingDir(cwd));
    }
    Ok(MergedProcess {
        args,
        env: env.into_iter().map(|(k, v)| format!("{k}={v}")).collect(),
        cwd,
    })
}

/// Numeric user and group a process runs as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UserIds {
    pub uid: u32,
    pub gid: u32,
}

/// Resolves an image `User` (`""`, `uid`, `uid:gid`, `name`, `name:group`)
/// against the contents of the image's `/etc/passwd` and `/etc/group`.
pub fn resolve_user(spec: &str, passwd: &str, group: &str) -> Result<UserIds, ProcessError> {
    let (user, grp) = match spec.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (spec, None),
    };
    let passwd_entry = |name: &str| {
        passwd.lines().find_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            (fields.len() >= 4 && fields[0] == name)
                .then(|| (fields[2].parse::<u32>().ok(), fields[3].parse::<u32>().ok()))
        })
    };
    let (uid, primary_gid) = if user.is_empty() {
        (0, Some(0))
    } else if let Ok(uid) = user.parse::<u32>() {
        // A numeric uid need not exist; its primary group comes from passwd if it does.
        let primary = passwd.lines().find_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            (fields.len() >= 4 && fields[2].parse::<u32>().ok() == Some(uid))
                .then(|| fields[3].parse::<u32>().ok())
                .flatten()
        });
        (uid, Some(primary.unwrap_or(0)))
    } else {
        match passwd_entry(user) {
            Some((Some(uid), gid)) => (uid, gid),
            _ => return Err(ProcessError::UnknownUser(user.to_string())),
        }
    };
    let gid = match grp {
        None | Some("") => primary_gid.unwrap_or(0),
        Some(g) => match g.parse::<u32>() {
            Ok(gid) => gid,
            Err(_) => group
                .lines()
                .find_map(|line| {
                    let fields: Vec<&str> = line.split(':').collect();
                    (fields.len() >= 3 && fields[0] == g)
                        .then(|| fields[2].parse::<u32>().ok())
                        .flatten()
                })
                .ok_or_else(|| ProcessError::UnknownGroup(g.to_string()))?,
        },
    };
    Ok(UserIds { uid, gid })
}

/// Resolves `spec` against the files of a mounted rootfs. Symlinked or
/// missing `/etc/passwd` / `/etc/group` read as empty (never followed out
/// of the rootfs).
pub fn resolve_user_in_rootfs(spec: &str, rootfs: &Path) -> Result<UserIds, ProcessError> {
    let read = |relative: &str| -> Result<String, ProcessError> {
        let path = rootfs.join(relative);
        match fs::symlink_metadata(&path) {
            Ok(meta) if meta.is_file() => {
                fs::read_to_string(&path).map_err(|e| ProcessError::ReadImageFile {
                    path: format!("/{relative}"),
                    kind: e.kind(),
                })
            }
            _ => Ok(String::new()),
        }
    };
    resolve_user(spec, &read("etc/passwd")?, &read("etc/group")?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    fn image() -> ImageConfig {
        ImageConfig {
            user: None,
            env: Some(strings(&["PATH=/bin", "MODE=image"])),
            entrypoint: Some(strings(&["/entry"])),
            cmd: Some(strings(&["--serve"])),
            working_dir: Some("/srv".to_string()),
        }
    }

    #[test]
    fn no_overrides_keeps_entrypoint_and_cmd() {
        let merged = merge_process(&image(), &ProcessOverrides::default()).expect("merge");
        assert_eq!(merged.args, strings(&["/entry", "--serve"]));
        assert_eq!(merged.env, strings(&["PATH=/bin", "MODE=image"]));
        assert_eq!(merged.cwd, "/srv");
    }

    #[test]
    fn args_replace_cmd_only() {
        let overrides = ProcessOverrides {
            args: strings(&["--debug"]),
            ..Default::default()
        };
        let merged = merge_process(&image(), &overrides).expect("merge");
        assert_eq!(merged.args, strings(&["/entry", "--debug"]));
    }

    #[test]
    fn command_replaces_entrypoint_and_drops_cmd() {
        let overrides = ProcessOverrides {
            command: strings(&["sh", "-c"]),
            ..Default::default()
        };
        let merged = merge_process(&image(), &overrides).expect("merge");
        assert_eq!(merged.args, strings(&["sh", "-c"]));
        let overrides = ProcessOverrides {
            command: strings(&["sh", "-c"]),
            args: strings(&["echo hi"]),
            ..Default::default()
        };
        let merged = merge_process(&image(), &overrides).expect("merge");
        assert_eq!(merged.args, strings(&["sh", "-c", "echo hi"]));
    }

    #[test]
    fn env_overrides_by_name_and_appends() {
        let overrides = ProcessOverrides {
            env: BTreeMap::from([
                ("MODE".to_string(), "pod".to_string()),
                ("EXTRA".to_string(), "1".to_string()),
            ]),
            working_dir: Some("/work".to_string()),
            ..Default::default()
        };
        let merged = merge_process(&image(), &overrides).expect("merge");
        assert_eq!(merged.env, strings(&["PATH=/bin", "MODE=pod", "EXTRA=1"]));
        assert_eq!(merged.cwd, "/work");
    }

    #[test]
    fn empty_image_gets_default_path_and_root_cwd() {
        let overrides = ProcessOverrides {
            command: strings(&["true"]),
            ..Default::default()
        };
        let merged = merge_process(&ImageConfig::default(), &overrides).expect("merge");
        assert_eq!(merged.env, vec![format!("PATH={DEFAULT_PATH}")]);
        assert_eq!(merged.cwd, "/");
    }

    #[test]
    fn errors_on_nothing_to_run_and_relative_cwd() {
        assert_eq!(
            merge_process(&ImageConfig::default(), &ProcessOverrides::default()),
            Err(ProcessError::NoCommand)
        );
        let overrides = ProcessOverrides {
            working_dir: Some("srv".to_string()),
            ..Default::default()
        };
        assert_eq!(
            merge_process(&image(), &overrides),
            Err(ProcessError::RelativeWorkingDir("srv".to_string()))
        );
    }

    const PASSWD: &str =
        "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n";
    const GROUP: &str = "root:x:0:\nnogroup:x:65534:\nstaff:x:50:\n";

    #[test]
    fn resolves_user_forms() {
        let ids = |spec| resolve_user(spec, PASSWD, GROUP);
        assert_eq!(ids(""), Ok(UserIds { uid: 0, gid: 0 }));
        assert_eq!(
            ids("nobody"),
            Ok(UserIds {
                uid: 65534,
                gid: 65534
            })
        );
        assert_eq!(
            ids("65534"),
            Ok(UserIds {
                uid: 65534,
                gid: 65534
            })
        );
        assert_eq!(ids("1000"), Ok(UserIds { uid: 1000, gid: 0 }));
        assert_eq!(
            ids("1000:1000"),
            Ok(UserIds {
                uid: 1000,
                gid: 1000
            })
        );
        assert_eq!(
            ids("nobody:staff"),
            Ok(UserIds {
                uid: 65534,
                gid: 50
            })
        );
        assert_eq!(
            ids("ghost"),
            Err(ProcessError::UnknownUser("ghost".to_string()))
        );
        assert_eq!(
            ids("root:ghosts"),
            Err(ProcessError::UnknownGroup("ghosts".to_string()))
        );
    }
}

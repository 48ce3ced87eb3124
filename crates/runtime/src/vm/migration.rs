//! Live migration through QMP: the source QEMU sends its disks and memory
//! to a QEMU started with `-incoming` ([`super::VmConfig::incoming`]) while
//! the guest runs, pauses it only for the last dirty pages, and the target
//! resumes it.
//!
//! The disks travel in the migration stream (QEMU's block migration,
//! capability `block`): the target starts with empty disks of the same
//! size and no shared storage is needed. (QEMU 9.1 removed block
//! migration; there the disks go by `blockdev-mirror` to an NBD export on
//! the target instead — not done here.) Both ends speak over unix sockets;
//! moving the bytes between nodes is the caller's ([`crate`] has no
//! network of its own).
//!
//! [`progress`] reads QEMU's `query-migrate` answer into what a workflow
//! step waits for; it is pure and unit-tested.

use serde::Deserialize;
use serde_json::{Value, json};

use super::qmp::{QmpClient, QmpError};

/// Counters of one part of a migration (`ram`, `disk`) in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct Transfer {
    #[serde(default)]
    pub transferred: u64,
    #[serde(default)]
    pub remaining: u64,
    #[serde(default)]
    pub total: u64,
}

/// QEMU's `query-migrate` answer, the fields this crate reads.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct MigrationInfo {
    /// `none`, `setup`, `active`, `device`, `completed`, `failed`, …;
    /// absent before any migration.
    #[serde(default)]
    pub status: Option<String>,
    #[serde(default)]
    pub ram: Option<Transfer>,
    #[serde(default)]
    pub disk: Option<Transfer>,
    /// How long the guest was paused, in milliseconds (once completed).
    #[serde(default)]
    pub downtime: Option<u64>,
    /// How long the whole migration took, in milliseconds.
    #[serde(default)]
    pub total_time: Option<u64>,
    #[serde(default)]
    pub error_desc: Option<String>,
}

/// Where a migration stands, for the step that waits on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    /// Nothing was started (or QEMU forgot it).
    NotStarted,
    /// The disks are still being copied (bytes copied, bytes in all).
    CopyingDisk { copied: u64, total: u64 },
    /// The disks are copied; memory is being sent.
    SendingMemory { sent: u64, remaining: u64 },
    /// Done: the target runs the guest; the source is paused for good.
    Completed { downtime_ms: u64, total_ms: u64 },
    /// QEMU gave up (why, as QEMU says it).
    Failed(String),
}

/// What `info` says about a migration.
pub fn progress(info: &MigrationInfo) -> Progress {
    match info.status.as_deref() {
        None | Some("none") => Progress::NotStarted,
        Some("completed") => Progress::Completed {
            downtime_ms: info.downtime.unwrap_or(0),
            total_ms: info.total_time.unwrap_or(0),
        },
        Some("failed" | "cancelled" | "cancelling") => Progress::Failed(
            info.error_desc
                .clone()
                .unwrap_or_else(|| format!("migration {}", info.status.as_deref().unwrap_or(""))),
        ),
        Some(_) => match info.disk {
            Some(disk) if disk.total > 0 && disk.remaining > 0 => Progress::CopyingDisk {
                copied: disk.transferred,
                total: disk.total,
            },
            // `setup` has no disk counters yet: still copying.
            None if info.status.as_deref() == Some("setup") => Progress::CopyingDisk {
                copied: 0,
                total: 0,
            },
            _ => {
                let ram = info.ram.unwrap_or_default();
                Progress::SendingMemory {
                    sent: ram.transferred,
                    remaining: ram.remaining,
                }
            }
        },
    }
}

/// Starts sending the running guest, its disks included, to the QEMU
/// waiting at the unix socket `socket`.
pub fn start(client: &mut QmpClient, socket: &std::path::Path) -> Result<(), QmpError> {
    client.execute::<Value>(
        "migrate-set-capabilities",
        Some(json!({ "capabilities": [{ "capability": "block", "state": true }] })),
    )?;
    client.execute::<Value>(
        "migrate",
        Some(json!({ "uri": format!("unix:{}", socket.display()) })),
    )?;
    Ok(())
}

/// QEMU's view of its (last) migration.
pub fn query(client: &mut QmpClient) -> Result<MigrationInfo, QmpError> {
    client.execute("query-migrate", None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(value: Value) -> MigrationInfo {
        serde_json::from_value(value).expect("a query-migrate answer")
    }

    #[test]
    fn nothing_started_before_migrate() {
        assert_eq!(progress(&info(json!({}))), Progress::NotStarted);
        assert_eq!(
            progress(&info(json!({"status": "none"}))),
            Progress::NotStarted
        );
    }

    #[test]
    fn the_disk_is_copied_before_memory() {
        let copying = info(json!({
            "status": "active",
            "disk": {"transferred": 10, "remaining": 54, "total": 64},
            "ram": {"transferred": 1, "remaining": 100, "total": 101}
        }));
        assert_eq!(
            progress(&copying),
            Progress::CopyingDisk {
                copied: 10,
                total: 64
            }
        );
        let sending = info(json!({
            "status": "active",
            "disk": {"transferred": 64, "remaining": 0, "total": 64},
            "ram": {"transferred": 40, "remaining": 61, "total": 101}
        }));
        assert_eq!(
            progress(&sending),
            Progress::SendingMemory {
                sent: 40,
                remaining: 61
            }
        );
        assert_eq!(
            progress(&info(json!({"status": "setup"}))),
            Progress::CopyingDisk {
                copied: 0,
                total: 0
            }
        );
    }

    #[test]
    fn completion_carries_the_downtime_and_failure_the_reason() {
        assert_eq!(
            progress(&info(json!({
                "status": "completed", "downtime": 42, "total-time": 9000,
                "ram": {"transferred": 1, "remaining": 0, "total": 1}
            }))),
            Progress::Completed {
                downtime_ms: 42,
                total_ms: 9000
            }
        );
        assert_eq!(
            progress(&info(
                json!({"status": "failed", "error-desc": "Broken pipe"})
            )),
            Progress::Failed("Broken pipe".into())
        );
        assert_eq!(
            progress(&info(json!({"status": "cancelled"}))),
            Progress::Failed("migration cancelled".into())
        );
    }
}

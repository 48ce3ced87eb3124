//! History compaction on a schedule: the operator's keep policy
//! (`--history-keep`, default `last=10,age=30d`) applied at start and then
//! every [`COMPACTION_INTERVAL`], by the server that runs the controllers.
//!
//! Whatever the operator says, a live object keeps at least its newest
//! [`ROLLBACK_REVISIONS`] revisions: nodes keep the images of that many
//! revisions so a rollback starts without a pull, and `rollback: auto`
//! needs the previous one.

use std::time::Duration;

use corral_api::history::CompactionPolicy;
use tokio_util::sync::CancellationToken;

use crate::SharedServer;

/// The policy when the operator names none.
pub const DEFAULT_KEEP: &str = "last=10,age=30d";

/// How often history is compacted.
pub const COMPACTION_INTERVAL: Duration = Duration::from_secs(3600);

/// Revisions a live object always keeps (the images nodes keep for
/// rollbacks are those of its last three revisions).
pub const ROLLBACK_REVISIONS: u64 = 3;

/// The policy applied for `asked`: the same, but never keeping fewer than
/// [`ROLLBACK_REVISIONS`] revisions of a live object.
pub fn effective(asked: CompactionPolicy) -> CompactionPolicy {
    match asked {
        CompactionPolicy::All => CompactionPolicy::All,
        CompactionPolicy::Last { count } => CompactionPolicy::Last {
            count: count.max(ROLLBACK_REVISIONS),
        },
        CompactionPolicy::For { seconds } => CompactionPolicy::LastOrFor {
            last: ROLLBACK_REVISIONS,
            seconds,
        },
        CompactionPolicy::LastOrFor { last, seconds } => CompactionPolicy::LastOrFor {
            last: last.max(ROLLBACK_REVISIONS),
            seconds,
        },
    }
}

/// Compacts history with `policy` now and every `interval` until `stop`.
pub async fn compact_loop(
    server: SharedServer,
    policy: CompactionPolicy,
    interval: Duration,
    stop: CancellationToken,
) {
    let policy = effective(policy);
    if policy == CompactionPolicy::All {
        return;
    }
    loop {
        let started = std::time::Instant::now();
        match server
            .store
            .compact_history(policy, server.clock.now())
            .await
        {
            Ok(report) => tracing::info!(
                policy = %policy,
                removed = report.revisions_removed,
                step_log_entries_removed = report.step_log_entries_removed,
                took = ?started.elapsed(),
                "history compacted"
            ),
            Err(error) => {
                tracing::warn!(policy = %policy, %error, "history compaction failed; trying again later")
            }
        }
        tokio::select! {
            () = tokio::time::sleep(interval) => {}
            () = stop.cancelled() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_policy_drops_what_a_rollback_needs() {
        assert_eq!(
            effective("last=1".parse().expect("policy")),
            CompactionPolicy::Last { count: 3 }
        );
        assert_eq!(
            effective("age=1d".parse().expect("policy")),
            CompactionPolicy::LastOrFor {
                last: 3,
                seconds: 86_400
            }
        );
        assert_eq!(
            effective(DEFAULT_KEEP.parse().expect("policy")),
            CompactionPolicy::LastOrFor {
                last: 10,
                seconds: 30 * 86_400
            }
        );
        assert_eq!(effective(CompactionPolicy::All), CompactionPolicy::All);
    }
}

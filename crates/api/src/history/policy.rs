//! How much history the store keeps: the compaction policy, its CLI
//! spelling (`all`, `last=10`, `age=30d`, `last=10,age=30d`) and the pure
//! decision of which revisions of one object a policy drops, which every
//! store backend applies the same way.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How much history the store keeps. A live object's current revision is
/// never dropped, whatever the policy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", tag = "keep")]
pub enum CompactionPolicy {
    /// Keep every revision (the default).
    #[default]
    All,
    /// Keep the newest N revisions of each object (a deleted object's
    /// deletion record counts as its newest).
    Last { count: u64 },
    /// Keep revisions younger than this many seconds.
    For { seconds: u64 },
    /// Keep a revision of a live object if it is among its newest `last`
    /// revisions or younger than `seconds`; keep a deleted object's
    /// revisions only while they are younger than `seconds`.
    #[serde(rename_all = "camelCase")]
    LastOrFor { last: u64, seconds: u64 },
}

/// One kept revision of an object, as compaction sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeptRevision {
    pub revision: u64,
    pub time: DateTime<Utc>,
}

impl CompactionPolicy {
    /// The revisions of one object this policy drops at `now`.
    ///
    /// `revisions` are the object's kept revisions in any order; `current`
    /// is the live object's current revision, `None` once it is deleted.
    /// The current revision is never in the result.
    pub fn doomed(
        &self,
        revisions: &[KeptRevision],
        current: Option<u64>,
        now: DateTime<Utc>,
    ) -> BTreeSet<u64> {
        let newest = revisions.iter().map(|kept| kept.revision).max();
        let Some(newest) = newest else {
            return BTreeSet::new();
        };
        let among_last = |count: u64, revision: u64| revision.saturating_add(count) > newest;
        let keeps = |kept: &KeptRevision| match *self {
            CompactionPolicy::All => true,
            CompactionPolicy::Last { count } => among_last(count, kept.revision),
            CompactionPolicy::For { seconds } => is_young(kept.time, seconds, now),
            CompactionPolicy::LastOrFor { last, seconds } => {
                (current.is_some() && among_last(last, kept.revision))
                    || is_young(kept.time, seconds, now)
            }
        };
        revisions
            .iter()
            .filter(|kept| Some(kept.revision) != current && !keeps(kept))
            .map(|kept| kept.revision)
            .collect()
    }
}

/// Whether `time` is no older than `seconds` before `now`. An age too large
/// to subtract keeps everything.
fn is_young(time: DateTime<Utc>, seconds: u64, now: DateTime<Utc>) -> bool {
    let cutoff = i64::try_from(seconds)
        .ok()
        .and_then(TimeDelta::try_seconds)
        .and_then(|age| now.checked_sub_signed(age));
    cutoff.is_none_or(|cutoff| time >= cutoff)
}

/// Why a policy string does not parse; each names the part that is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyParseError {
    #[error("keep policy is empty: expected all, last=N, age=DURATION or last=N,age=DURATION")]
    Empty,
    #[error("keep policy part {part:?}: expected all, last=N or age=DURATION")]
    UnknownPart { part: String },
    #[error("keep policy part {part:?}: expected a whole number of revisions")]
    BadCount { part: String },
    #[error("keep policy part {part:?}: expected a duration like 30d, 12h or 90m")]
    BadAge { part: String },
    #[error("keep policy part {part:?}: {key} is given twice")]
    Repeated { part: String, key: String },
    #[error("keep policy part {part:?}: all cannot be combined with other parts")]
    AllWithOthers { part: String },
}

impl FromStr for CompactionPolicy {
    type Err = PolicyParseError;

    /// `all`, `last=N`, `age=DURATION` (humantime: `30d`, `12h`, `1w`) or
    /// both, comma-separated, which keeps what either keeps.
    fn from_str(text: &str) -> Result<CompactionPolicy, PolicyParseError> {
        let parts: Vec<&str> = text.split(',').map(str::trim).collect();
        if parts.iter().all(|part| part.is_empty()) {
            return Err(PolicyParseError::Empty);
        }
        let (mut last, mut age) = (None, None);
        for part in &parts {
            let owned = || part.to_string();
            if part.eq_ignore_ascii_case("all") {
                if parts.len() > 1 {
                    return Err(PolicyParseError::AllWithOthers { part: owned() });
                }
                return Ok(CompactionPolicy::All);
            }
            let Some((key, value)) = part.split_once('=') else {
                return Err(PolicyParseError::UnknownPart { part: owned() });
            };
            let (key, value) = (key.trim(), value.trim());
            let slot = match key {
                "last" => &mut last,
                "age" => &mut age,
                _ => return Err(PolicyParseError::UnknownPart { part: owned() }),
            };
            if slot.is_some() {
                return Err(PolicyParseError::Repeated {
                    part: owned(),
                    key: key.to_string(),
                });
            }
            let number = if key == "last" {
                value
                    .parse::<u64>()
                    .map_err(|_| PolicyParseError::BadCount { part: owned() })?
            } else {
                humantime::parse_duration(value)
                    .map_err(|_| PolicyParseError::BadAge { part: owned() })?
                    .as_secs()
            };
            *slot = Some(number);
        }
        Ok(match (last, age) {
            (Some(count), None) => CompactionPolicy::Last { count },
            (None, Some(seconds)) => CompactionPolicy::For { seconds },
            (Some(last), Some(seconds)) => CompactionPolicy::LastOrFor { last, seconds },
            // INVARIANT: at least one part was non-empty and every non-empty
            // part either returned or filled a slot; an empty part between
            // commas fails above as an unknown part.
            (None, None) => return Err(PolicyParseError::Empty),
        })
    }
}

impl fmt::Display for CompactionPolicy {
    /// The spelling [`FromStr`] reads back.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let age = |seconds: u64| humantime::format_duration(Duration::from_secs(seconds));
        match *self {
            CompactionPolicy::All => write!(f, "all"),
            CompactionPolicy::Last { count } => write!(f, "last={count}"),
            CompactionPolicy::For { seconds } => write!(f, "age={}", age(seconds)),
            CompactionPolicy::LastOrFor { last, seconds } => {
                write!(f, "last={last},age={}", age(seconds))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    const DAY: u64 = 24 * 60 * 60;

    #[test]
    fn policies_parse_from_their_cli_spelling() {
        let cases = [
            ("all", CompactionPolicy::All),
            ("ALL", CompactionPolicy::All),
            ("last=10", CompactionPolicy::Last { count: 10 }),
            ("age=30d", CompactionPolicy::For { seconds: 30 * DAY }),
            (
                "last=10,age=30d",
                CompactionPolicy::LastOrFor {
                    last: 10,
                    seconds: 30 * DAY,
                },
            ),
            (
                " age = 12h , last = 0 ",
                CompactionPolicy::LastOrFor {
                    last: 0,
                    seconds: 12 * 60 * 60,
                },
            ),
            ("age=1w 2d", CompactionPolicy::For { seconds: 9 * DAY }),
        ];
        for (text, expected) in cases {
            assert_eq!(text.parse::<CompactionPolicy>(), Ok(expected), "{text:?}");
        }
    }

    #[test]
    fn bad_policies_name_the_part_that_is_wrong() {
        let cases: [(&str, PolicyParseError); 8] = [
            ("", PolicyParseError::Empty),
            (" , ", PolicyParseError::Empty),
            (
                "last=ten",
                PolicyParseError::BadCount {
                    part: "last=ten".into(),
                },
            ),
            (
                "last=-1",
                PolicyParseError::BadCount {
                    part: "last=-1".into(),
                },
            ),
            (
                "last=3,age=30x",
                PolicyParseError::BadAge {
                    part: "age=30x".into(),
                },
            ),
            (
                "keep=3",
                PolicyParseError::UnknownPart {
                    part: "keep=3".into(),
                },
            ),
            (
                "last=3,last=4",
                PolicyParseError::Repeated {
                    part: "last=4".into(),
                    key: "last".into(),
                },
            ),
            (
                "all,last=3",
                PolicyParseError::AllWithOthers { part: "all".into() },
            ),
        ];
        for (text, expected) in cases {
            let error = text
                .parse::<CompactionPolicy>()
                .expect_err("a bad policy is refused");
            assert_eq!(error, expected, "{text:?}");
        }
        let message = "last=3,age=30x"
            .parse::<CompactionPolicy>()
            .expect_err("bad age")
            .to_string();
        assert!(message.contains("\"age=30x\""), "{message}");
        assert!(
            "last=3,".parse::<CompactionPolicy>().is_err(),
            "a trailing comma is an empty part"
        );
    }

    #[test]
    fn display_reads_back() {
        for policy in [
            CompactionPolicy::All,
            CompactionPolicy::Last { count: 7 },
            CompactionPolicy::For { seconds: 30 * DAY },
            CompactionPolicy::LastOrFor {
                last: 10,
                seconds: 90 * 60,
            },
        ] {
            assert_eq!(policy.to_string().parse(), Ok(policy), "{policy}");
        }
    }

    #[test]
    fn the_combined_policy_has_a_stable_wire_form() {
        let policy = CompactionPolicy::LastOrFor {
            last: 10,
            seconds: 60,
        };
        let json = serde_json::to_value(policy).expect("serialize");
        assert_eq!(
            json,
            serde_json::json!({"keep": "lastOrFor", "last": 10, "seconds": 60})
        );
        assert_eq!(
            serde_json::from_value::<CompactionPolicy>(json).expect("read back"),
            policy
        );
    }

    fn minute(minute: i64) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2030, 1, 1, 0, 0, 0)
            .single()
            .expect("valid time")
            + TimeDelta::minutes(minute)
    }

    /// Revisions 1..=n, revision r written at minute r.
    fn history(n: u64) -> Vec<KeptRevision> {
        (1..=n)
            .map(|revision| KeptRevision {
                revision,
                time: minute(i64::try_from(revision).expect("small")),
            })
            .collect()
    }

    fn doomed(
        policy: CompactionPolicy,
        revisions: &[KeptRevision],
        current: Option<u64>,
        now: i64,
    ) -> Vec<u64> {
        policy
            .doomed(revisions, current, minute(now))
            .into_iter()
            .collect()
    }

    #[test]
    fn each_policy_drops_what_it_does_not_keep_and_never_the_current_revision() {
        let ten = history(10);
        assert!(doomed(CompactionPolicy::All, &ten, Some(10), 100).is_empty());
        assert_eq!(
            doomed(CompactionPolicy::Last { count: 3 }, &ten, Some(10), 100),
            (1..=7).collect::<Vec<_>>()
        );
        assert_eq!(
            doomed(CompactionPolicy::Last { count: 0 }, &ten, Some(10), 100),
            (1..=9).collect::<Vec<_>>(),
            "last=0 keeps only the current revision"
        );
        // A deleted object: revision 10 is its deletion record.
        assert_eq!(
            doomed(CompactionPolicy::Last { count: 3 }, &ten, None, 100),
            (1..=7).collect::<Vec<_>>()
        );
        // Minute 10 minus 5 minutes: revisions before minute 5 go.
        assert_eq!(
            doomed(CompactionPolicy::For { seconds: 300 }, &ten, Some(10), 10),
            vec![1, 2, 3, 4]
        );
        assert_eq!(
            doomed(CompactionPolicy::For { seconds: 0 }, &ten, Some(10), 100),
            (1..=9).collect::<Vec<_>>()
        );
        assert!(
            doomed(
                CompactionPolicy::For { seconds: u64::MAX },
                &ten,
                Some(10),
                100
            )
            .is_empty(),
            "an age beyond the calendar keeps everything"
        );
    }

    #[test]
    fn the_combined_policy_keeps_the_union_and_ages_out_deleted_objects() {
        let ten = history(10);
        let policy = |last| CompactionPolicy::LastOrFor {
            last,
            seconds: 4 * 60,
        };
        // now = minute 10, cutoff minute 6: revisions 6..=10 are young.
        assert_eq!(doomed(policy(2), &ten, Some(10), 10), vec![1, 2, 3, 4, 5]);
        assert_eq!(
            doomed(policy(7), &ten, Some(10), 10),
            vec![1, 2, 3],
            "the newest 7 outlive the age"
        );
        assert_eq!(
            doomed(policy(2), &ten, Some(10), 1000),
            (1..=8).collect::<Vec<_>>(),
            "when everything is old, the newest 2 stay"
        );
        assert_eq!(
            doomed(policy(7), &ten, None, 1000),
            (1..=10).collect::<Vec<_>>(),
            "a deleted object keeps nothing old, not even its last revisions"
        );
        assert_eq!(
            doomed(policy(7), &ten, None, 10),
            vec![1, 2, 3, 4, 5],
            "a deleted object keeps what is young"
        );
        // A live object whose current revision is not the newest record
        // (never the case in a store, but the rule holds).
        assert_eq!(doomed(policy(0), &ten, Some(3), 1000), {
            let mut all: Vec<u64> = (1..=10).collect();
            all.retain(|revision| *revision != 3);
            all
        });
    }
}

//! Five-field cron schedules (`minute hour day-of-month month day-of-week`,
//! in UTC) as a Job's `schedule` takes them: `*`, numbers, ranges `a-b`,
//! steps `*/n` and `a-b/n`, and lists `a,b,c`. Day of week is 0–6 from
//! Sunday (7 is Sunday too). As in cron, when both day fields are
//! restricted a day matching either one fires.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Datelike, Duration, TimeZone, Timelike, Utc};

/// A parsed schedule: the set of values each field allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    minutes: u64,
    hours: u64,
    days: u64,
    months: u64,
    weekdays: u64,
    /// Whether the day-of-month field was `*` (then only the weekday counts).
    any_day: bool,
    /// Whether the day-of-week field was `*`.
    any_weekday: bool,
    text: String,
}

/// A schedule that does not parse, naming the field and the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CronError {
    #[error("expected 5 fields (minute hour day-of-month month day-of-week), found {found}")]
    FieldCount { found: usize },
    #[error("{field}: {given:?} is not a number, `*`, a range a-b, a step x/n or a list")]
    Syntax { field: &'static str, given: String },
    #[error("{field}: {value} is outside {min}–{max}")]
    Range {
        field: &'static str,
        value: u32,
        min: u32,
        max: u32,
    },
}

const FIELDS: [(&str, u32, u32); 5] = [
    ("minute", 0, 59),
    ("hour", 0, 23),
    ("day-of-month", 1, 31),
    ("month", 1, 12),
    ("day-of-week", 0, 7),
];

impl FromStr for Schedule {
    type Err = CronError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let parts: Vec<&str> = text.split_whitespace().collect();
        if parts.len() != 5 {
            return Err(CronError::FieldCount { found: parts.len() });
        }
        let mut sets = [0u64; 5];
        for ((part, (field, min, max)), set) in parts.iter().zip(FIELDS).zip(sets.iter_mut()) {
            *set = parse_field(part, field, min, max)?;
        }
        // Sunday is 0 and 7.
        let weekdays = (sets[4] | (sets[4] >> 7)) & 0x7f;
        Ok(Schedule {
            minutes: sets[0],
            hours: sets[1],
            days: sets[2],
            months: sets[3],
            weekdays,
            any_day: parts[2] == "*",
            any_weekday: parts[4] == "*",
            text: parts.join(" "),
        })
    }
}

fn parse_field(part: &str, field: &'static str, min: u32, max: u32) -> Result<u64, CronError> {
    let syntax = || CronError::Syntax {
        field,
        given: part.to_string(),
    };
    let number = |text: &str| -> Result<u32, CronError> {
        let value: u32 = text.parse().map_err(|_| syntax())?;
        if value < min || value > max {
            return Err(CronError::Range {
                field,
                value,
                min,
                max,
            });
        }
        Ok(value)
    };
    let mut set = 0u64;
    for item in part.split(',') {
        let (range, step) = match item.split_once('/') {
            Some((range, step)) => {
                let step: u32 = step.parse().map_err(|_| syntax())?;
                if step == 0 {
                    return Err(syntax());
                }
                (range, step)
            }
            None => (item, 1),
        };
        let (from, to) = match range {
            "*" => (min, max),
            _ => match range.split_once('-') {
                Some((a, b)) => (number(a)?, number(b)?),
                // `5/15` means from 5 to the end, every 15.
                None if item.contains('/') => (number(range)?, max),
                None => {
                    let value = number(range)?;
                    (value, value)
                }
            },
        };
        if from > to {
            return Err(syntax());
        }
        for value in (from..=to).step_by(step as usize) {
            set |= 1 << value;
        }
    }
    Ok(set)
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

fn has(set: u64, value: u32) -> bool {
    set & (1 << value) != 0
}

impl Schedule {
    fn day_matches(&self, time: &DateTime<Utc>) -> bool {
        let day = has(self.days, time.day());
        let weekday = has(self.weekdays, time.weekday().num_days_from_sunday());
        match (self.any_day, self.any_weekday) {
            (true, true) => true,
            (true, false) => weekday,
            (false, true) => day,
            (false, false) => day || weekday,
        }
    }

    /// The first time strictly after `after` (to the minute) the schedule
    /// fires; `None` if it never does within five years (`0 0 31 2 *`).
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let start = after.with_second(0)?.with_nanosecond(0)? + Duration::minutes(1);
        let limit = start + Duration::days(5 * 366);
        let mut time = start;
        while time < limit {
            if !has(self.months, time.month()) || !self.day_matches(&time) {
                // The next day, at midnight.
                let day = time.date_naive().succ_opt()?;
                time = Utc.from_utc_datetime(&day.and_hms_opt(0, 0, 0)?);
                continue;
            }
            if !has(self.hours, time.hour()) {
                time = time.with_minute(0)? + Duration::hours(1);
                continue;
            }
            if !has(self.minutes, time.minute()) {
                time += Duration::minutes(1);
                continue;
            }
            return Some(time);
        }
        None
    }

    /// The latest time in `(after, until]` the schedule fires, if any: the
    /// run that is due now when several were missed.
    pub fn latest_between(
        &self,
        after: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> Option<DateTime<Utc>> {
        let mut latest = None;
        let mut time = after;
        while let Some(next) = self.next_after(time).filter(|next| *next <= until) {
            latest = Some(next);
            time = next;
        }
        latest
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text).unwrap().to_utc()
    }

    fn next(schedule: &str, after: &str) -> String {
        let schedule: Schedule = schedule.parse().unwrap();
        schedule.next_after(at(after)).unwrap().to_rfc3339()
    }

    #[test]
    fn every_minute_fires_on_the_next_minute() {
        assert_eq!(
            next("* * * * *", "2026-03-01T10:15:42Z"),
            "2026-03-01T10:16:00+00:00"
        );
    }

    #[test]
    fn steps_ranges_and_lists() {
        assert_eq!(
            next("*/15 * * * *", "2026-03-01T10:15:00Z"),
            "2026-03-01T10:30:00+00:00"
        );
        assert_eq!(
            next("5,35 9-17 * * *", "2026-03-01T17:40:00Z"),
            "2026-03-02T09:05:00+00:00"
        );
        assert_eq!(
            next("0 */6 * * *", "2026-03-01T19:00:00Z"),
            "2026-03-02T00:00:00+00:00"
        );
        assert_eq!(
            next("10/20 * * * *", "2026-03-01T10:31:00Z"),
            "2026-03-01T10:50:00+00:00"
        );
    }

    #[test]
    fn days_of_month_and_week() {
        // 2026-03-01 is a Sunday.
        assert_eq!(
            next("0 0 * * 1", "2026-03-01T12:00:00Z"),
            "2026-03-02T00:00:00+00:00"
        );
        assert_eq!(
            next("0 0 * * 7", "2026-03-02T12:00:00Z"),
            "2026-03-08T00:00:00+00:00",
            "7 is Sunday"
        );
        assert_eq!(
            next("30 4 1 * *", "2026-03-01T05:00:00Z"),
            "2026-04-01T04:30:00+00:00"
        );
        assert_eq!(
            next("0 0 13 * 5", "2026-03-01T00:00:00Z"),
            "2026-03-06T00:00:00+00:00",
            "either day field matches when both are set"
        );
        assert_eq!(
            next("0 0 29 2 *", "2026-03-01T00:00:00Z"),
            "2028-02-29T00:00:00+00:00"
        );
    }

    #[test]
    fn impossible_dates_never_fire() {
        let schedule: Schedule = "0 0 31 2 *".parse().unwrap();
        assert_eq!(schedule.next_after(at("2026-01-01T00:00:00Z")), None);
    }

    #[test]
    fn the_latest_missed_run_is_the_one_due() {
        let schedule: Schedule = "*/10 * * * *".parse().unwrap();
        assert_eq!(
            schedule.latest_between(at("2026-03-01T10:00:00Z"), at("2026-03-01T10:35:00Z")),
            Some(at("2026-03-01T10:30:00Z"))
        );
        assert_eq!(
            schedule.latest_between(at("2026-03-01T10:30:00Z"), at("2026-03-01T10:35:00Z")),
            None
        );
    }

    #[test]
    fn errors_name_the_field_and_the_rule() {
        let error = |text: &str| text.parse::<Schedule>().unwrap_err().to_string();
        assert_eq!(
            error("* * * *"),
            "expected 5 fields (minute hour day-of-month month day-of-week), found 4"
        );
        assert_eq!(error("60 * * * *"), "minute: 60 is outside 0–59");
        assert_eq!(error("* * 0 * *"), "day-of-month: 0 is outside 1–31");
        assert_eq!(
            error("* x * * *"),
            "hour: \"x\" is not a number, `*`, a range a-b, a step x/n or a list"
        );
        assert_eq!(
            error("*/0 * * * *"),
            "minute: \"*/0\" is not a number, `*`, a range a-b, a step x/n or a list"
        );
        assert_eq!(
            error("5-1 * * * *"),
            "minute: \"5-1\" is not a number, `*`, a range a-b, a step x/n or a list"
        );
    }
}

//! Durations as people read them: `3ms`, `1.5s`, `5m12s`, `2h3m`, `1d4h`.

use chrono::TimeDelta;

/// Formats a duration compactly, keeping at most two units above a minute.
/// Negative durations are shown as `0ms`.
pub fn format_duration(duration: TimeDelta) -> String {
    let millis = duration.num_milliseconds().max(0);
    if millis < 1_000 {
        return format!("{millis}ms");
    }
    if millis < 60_000 {
        let tenths = millis / 100;
        return if tenths % 10 == 0 || millis >= 10_000 {
            format!("{}s", millis / 1_000)
        } else {
            format!("{}.{}s", tenths / 10, tenths % 10)
        };
    }
    let seconds = millis / 1_000;
    let units = [
        (seconds / 86_400, "d"),
        (seconds / 3_600 % 24, "h"),
        (seconds / 60 % 60, "m"),
        (seconds % 60, "s"),
    ];
    let first = units.iter().position(|(value, _)| *value > 0).unwrap_or(3);
    units[first..]
        .iter()
        .take(2)
        .filter(|(value, _)| *value > 0)
        .map(|(value, unit)| format!("{value}{unit}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_like_the_why_output() {
        let cases = [
            (3, "3ms"),
            (999, "999ms"),
            (1_000, "1s"),
            (1_500, "1.5s"),
            (12_400, "12s"),
            (312_000, "5m12s"),
            (600_000, "10m"),
            (3_780_000, "1h3m"),
            (93_600_000, "1d2h"),
            (-5, "0ms"),
        ];
        for (millis, expected) in cases {
            assert_eq!(format_duration(TimeDelta::milliseconds(millis)), expected);
        }
    }
}

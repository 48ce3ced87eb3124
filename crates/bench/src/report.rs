//! Printing results: one row per (system, client count), with ops/s, median
//! and p99 latency, and ratios against a baseline system at the same client
//! count.

use std::fmt::Write;
use std::time::Duration;

use crate::stats::Summary;

#[derive(Debug, Clone)]
pub struct Row {
    pub system: String,
    pub clients: usize,
    pub summary: Summary,
}

/// A Markdown table (readable in a terminal too). Ratios are this row's
/// ops/s and median divided by the `baseline` system's at the same client
/// count; `-` where there is no baseline row.
pub fn table(rows: &[Row], baseline: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| system | clients | ops | ops/s | p50 | p99 | max | ops/s ÷ {baseline} | p50 ÷ {baseline} |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for row in rows {
        let base = rows
            .iter()
            .find(|other| other.system == baseline && other.clients == row.clients);
        let (ops_ratio, p50_ratio) = match base {
            Some(base) => (
                ratio(row.summary.ops_per_sec, base.summary.ops_per_sec),
                ratio(
                    row.summary.median.as_secs_f64(),
                    base.summary.median.as_secs_f64(),
                ),
            ),
            None => ("-".into(), "-".into()),
        };
        let s = &row.summary;
        let _ = writeln!(
            out,
            "| {} | {} | {} | {:.0} | {} | {} | {} | {ops_ratio} | {p50_ratio} |",
            row.system,
            row.clients,
            s.count,
            s.ops_per_sec,
            millis(s.median),
            millis(s.p99),
            millis(s.max),
        );
    }
    out
}

/// A latency-only Markdown table: per row the number of operations, p50,
/// p99 and max, and for each `(system, label)` baseline the p50 and p99
/// ratios against that system's row at the same client count (`-` when
/// there is none). `clients` is shown as `1 at a time` or `N at once`.
pub fn latency_table(rows: &[Row], baselines: &[(&str, &str)]) -> String {
    let mut out = String::new();
    let mut header = "| system | concurrency | ops | p50 | p99 | max |".to_string();
    let mut rule = "|---|---|---:|---:|---:|---:|".to_string();
    for (_, label) in baselines {
        let _ = write!(header, " p50 ÷ {label} | p99 ÷ {label} |");
        rule.push_str("---:|---:|");
    }
    let _ = writeln!(out, "{header}");
    let _ = writeln!(out, "{rule}");
    for row in rows {
        let s = &row.summary;
        let concurrency = if row.clients == 1 {
            "1 at a time".to_string()
        } else {
            format!("{} at once", row.clients)
        };
        let _ = write!(
            out,
            "| {} | {concurrency} | {} | {} | {} | {} |",
            row.system,
            s.count,
            millis(s.median),
            millis(s.p99),
            millis(s.max),
        );
        for (baseline, _) in baselines {
            let base = rows
                .iter()
                .find(|other| other.system == *baseline && other.clients == row.clients);
            match base {
                Some(base) => {
                    let _ = write!(
                        out,
                        " {} | {} |",
                        ratio(s.median.as_secs_f64(), base.summary.median.as_secs_f64()),
                        ratio(s.p99.as_secs_f64(), base.summary.p99.as_secs_f64()),
                    );
                }
                None => out.push_str(" - | - |"),
            }
        }
        out.push('\n');
    }
    out
}

fn ratio(value: f64, base: f64) -> String {
    if base > 0.0 {
        format!("{:.2}×", value / base)
    } else {
        "-".into()
    }
}

/// Milliseconds with two decimals, e.g. `3.14 ms`.
pub fn millis(duration: Duration) -> String {
    format!("{:.2} ms", duration.as_secs_f64() * 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(system: &str, clients: usize, ops_per_sec: f64, median_ms: u64) -> Row {
        let median = Duration::from_millis(median_ms);
        Row {
            system: system.into(),
            clients,
            summary: Summary {
                count: 10,
                wall: Duration::from_secs(1),
                median,
                p99: median,
                max: median,
                ops_per_sec,
            },
        }
    }

    #[test]
    fn ratios_compare_rows_with_the_same_client_count() {
        let text = table(
            &[
                row("a", 1, 100.0, 4),
                row("b", 1, 400.0, 2),
                row("a", 16, 50.0, 1),
            ],
            "b",
        );
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[2].ends_with("| 0.25× | 2.00× |"), "{}", lines[2]);
        assert!(lines[3].ends_with("| 1.00× | 1.00× |"), "{}", lines[3]);
        assert!(lines[4].ends_with("| - | - |"), "{}", lines[4]);
    }

    #[test]
    fn latency_ratios_per_baseline() {
        let rows = [
            row("a", 1, 1.0, 30),
            row("b", 1, 1.0, 10),
            row("a", 5, 1.0, 40),
        ];
        let text = latency_table(&rows, &[("b", "B"), ("c", "C")]);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].contains("p50 ÷ B | p99 ÷ B | p50 ÷ C | p99 ÷ C |"));
        assert_eq!(
            lines[2],
            "| a | 1 at a time | 10 | 30.00 ms | 30.00 ms | 30.00 ms | 3.00× | 3.00× | - | - |"
        );
        assert!(lines[4].starts_with("| a | 5 at once |"), "{}", lines[4]);
        assert!(lines[4].ends_with("| - | - | - | - |"), "{}", lines[4]);
    }
}

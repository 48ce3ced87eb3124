//! The results table of `corral-bench scale`: one column per pod count,
//! one row per metric, and where issue 14 sets a goal (at 10,000 running
//! pods on 100 hollow nodes) the goal and whether the largest measured
//! size meets it.

use std::fmt::Write;
use std::time::Duration;

use crate::report::millis;
use crate::stats::Summary;

/// Everything measured at one pod count.
#[derive(Debug, Clone, Default)]
pub struct SizeResult {
    pub pods: usize,
    /// Pods started per second (new pods ÷ first create → last seen
    /// running); `None` when no pod was added.
    pub pods_per_second: Option<f64>,
    /// The bench process's CPU while the pods started, % of a core.
    pub bench_cpu_starting: Option<f64>,
    /// Server CPU with every pod running and nothing to do, % of a core.
    pub idle_cpu: f64,
    /// This process (the hollow nodes) over the same idle window.
    pub bench_idle_cpu: f64,
    /// etcd's CPU over the idle window, on etcd.
    pub etcd_idle_cpu: Option<f64>,
    pub rss: u64,
    pub peak_rss: u64,
    /// Server CPU per apply: raw, and less the idle CPU over the same time.
    pub cpu_per_apply: Duration,
    pub cpu_per_apply_corrected: Duration,
    pub apply: Option<Summary>,
    pub get_pods: Duration,
    pub store_bytes: u64,
    pub nodes_ready: usize,
}

/// One row: a label, a value per size, and the goal with its check.
struct Line {
    label: &'static str,
    values: Vec<String>,
    goal: Option<(&'static str, Option<bool>)>,
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20))
}

fn ratio(value: Duration, base: Duration) -> Option<f64> {
    (base > Duration::ZERO).then(|| value.as_secs_f64() / base.as_secs_f64())
}

/// The Markdown table (readable in a terminal too).
pub fn render(results: &[SizeResult], nodes: usize) -> String {
    let Some(last) = results.last() else {
        return "no size was measured\n".to_string();
    };
    let base = results.iter().find(|result| result.pods == 0);
    let column = |f: &dyn Fn(&SizeResult) -> String| results.iter().map(f).collect::<Vec<_>>();
    let ratio_of = |f: fn(&SizeResult) -> Duration| {
        move |result: &SizeResult| {
            base.and_then(|base| ratio(f(result), f(base)))
                .map_or_else(|| "-".to_string(), |r| format!("{r:.2}×"))
        }
    };
    let last_ratio = |f: fn(&SizeResult) -> Duration| base.and_then(|base| ratio(f(last), f(base)));
    let lines = vec![
        Line {
            label: "pods started per second (hollow nodes)",
            values: column(&|r| r.pods_per_second.map_or("-".into(), |v| format!("{v:.1}"))),
            goal: Some(("≥ 300", last.pods_per_second.map(|v| v >= 300.0))),
        },
        Line {
            label: "idle server CPU (% of a core)",
            values: column(&|r| format!("{:.1} %", r.idle_cpu)),
            goal: Some(("≤ 5 %", Some(last.idle_cpu <= 5.0))),
        },
        Line {
            label: "server RSS",
            values: column(&|r| mib(r.rss)),
            goal: Some(("≤ 250 MiB", Some(last.rss <= 250 << 20))),
        },
        Line {
            label: "server peak RSS (VmHWM)",
            values: column(&|r| mib(r.peak_rss)),
            goal: None,
        },
        Line {
            label: "server CPU per apply",
            values: column(&|r| millis(r.cpu_per_apply)),
            goal: None,
        },
        Line {
            label: "  ÷ at 0 pods",
            values: column(&ratio_of(|r| r.cpu_per_apply)),
            goal: Some(("≤ 1.3×", last_ratio(|r| r.cpu_per_apply).map(|r| r <= 1.3))),
        },
        Line {
            label: "server CPU per apply, less idle CPU",
            values: column(&|r| millis(r.cpu_per_apply_corrected)),
            goal: None,
        },
        Line {
            label: "  ÷ at 0 pods",
            values: column(&ratio_of(|r| r.cpu_per_apply_corrected)),
            goal: Some((
                "≤ 1.3×",
                last_ratio(|r| r.cpu_per_apply_corrected).map(|r| r <= 1.3),
            )),
        },
        Line {
            label: "apply p50 (one client)",
            values: column(&|r| r.apply.map_or("-".into(), |s| millis(s.median))),
            goal: None,
        },
        Line {
            label: "apply p99 (one client)",
            values: column(&|r| r.apply.map_or("-".into(), |s| millis(s.p99))),
            goal: Some((
                "≤ 50 ms",
                last.apply.map(|s| s.p99 <= Duration::from_millis(50)),
            )),
        },
        Line {
            label: "`corral get pods -o json` (median of 3)",
            values: column(&|r| millis(r.get_pods)),
            goal: Some(("≤ 1 s", Some(last.get_pods <= Duration::from_secs(1)))),
        },
        Line {
            label: "store size",
            values: column(&|r| mib(r.store_bytes)),
            goal: None,
        },
        Line {
            label: "bench process CPU while pods start (% of a core)",
            values: column(&|r| {
                r.bench_cpu_starting
                    .map_or("-".into(), |v| format!("{v:.1} %"))
            }),
            goal: None,
        },
        Line {
            label: "bench process CPU while idle (% of a core)",
            values: column(&|r| format!("{:.1} %", r.bench_idle_cpu)),
            goal: None,
        },
        Line {
            label: "hollow nodes Ready",
            values: column(&|r| format!("{} of {nodes}", r.nodes_ready)),
            goal: None,
        },
    ];
    let mut lines = lines;
    if results.iter().any(|r| r.etcd_idle_cpu.is_some()) {
        lines.push(Line {
            label: "idle etcd CPU (% of a core)",
            values: column(&|r| r.etcd_idle_cpu.map_or("-".into(), |v| format!("{v:.1} %"))),
            goal: None,
        });
    }

    let mut out = String::new();
    let _ = write!(out, "| pods running |");
    for result in results {
        let _ = write!(out, " {} |", result.pods);
    }
    let _ = writeln!(
        out,
        " goal (issue 14, at 10,000 pods) | met at {} pods |",
        last.pods
    );
    let _ = writeln!(out, "|---|{}---|---|", "---:|".repeat(results.len()));
    for line in lines {
        let _ = write!(out, "| {} |", line.label);
        for value in &line.values {
            let _ = write!(out, " {value} |");
        }
        let (goal, met) = match line.goal {
            Some((goal, Some(true))) => (goal, "yes"),
            Some((goal, Some(false))) => (goal, "**no**"),
            Some((goal, None)) => (goal, "-"),
            None => ("", ""),
        };
        let _ = writeln!(out, " {goal} | {met} |");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(pods: usize, cpu_ms: u64, idle: f64) -> SizeResult {
        SizeResult {
            pods,
            pods_per_second: (pods > 0).then_some(350.0),
            idle_cpu: idle,
            rss: 100 << 20,
            cpu_per_apply: Duration::from_millis(cpu_ms),
            cpu_per_apply_corrected: Duration::from_millis(cpu_ms),
            get_pods: Duration::from_millis(200),
            nodes_ready: 3,
            ..SizeResult::default()
        }
    }

    #[test]
    fn ratios_are_to_zero_pods_and_goals_are_checked_at_the_last_size() {
        let text = render(&[result(0, 10, 1.0), result(200, 20, 9.0)], 3);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "| pods running | 0 | 200 | goal (issue 14, at 10,000 pods) | met at 200 pods |"
        );
        let row = |label: &str| {
            *lines
                .iter()
                .find(|line| line.starts_with(&format!("| {label} |")))
                .unwrap_or_else(|| panic!("no row {label} in\n{text}"))
        };
        assert!(
            row("pods started per second (hollow nodes)").ends_with("| - | 350.0 | ≥ 300 | yes |")
        );
        assert!(row("idle server CPU (% of a core)").ends_with("| 9.0 % | ≤ 5 % | **no** |"));
        assert!(
            text.contains("| 1.00× | 2.00× | ≤ 1.3× | **no** |"),
            "{text}"
        );
        assert!(row("hollow nodes Ready").contains("| 3 of 3 |"));
        assert!(!text.contains("etcd"));
    }
}

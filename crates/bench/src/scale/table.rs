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
    /// The server's and this process's CPU while the pods started, % of a core.
    pub server_cpu_starting: Option<f64>,
    pub bench_cpu_starting: Option<f64>,
    /// Server CPU with every pod running and nothing to do, % of a core.
    pub idle_cpu: f64,
    /// This process (the hollow nodes) over the same idle window.
    pub bench_idle_cpu: f64,
    /// etcd's CPU over the idle window, on etcd.
    pub etcd_idle_cpu: Option<f64>,
    pub rss: u64,
    pub peak_rss: u64,
    /// Applies of a Policy, and of a pod's label.
    pub policy: ApplyMeasure,
    pub pod_label: ApplyMeasure,
    pub get_pods: Duration,
    pub store_bytes: u64,
    pub nodes_ready: usize,
}

/// One series of applies at one size.
#[derive(Debug, Clone, Copy, Default)]
pub struct ApplyMeasure {
    /// Server CPU per apply: raw, and less the idle CPU over the same time.
    pub cpu: Duration,
    pub cpu_less_idle: Duration,
    pub latency: Option<Summary>,
}

/// One row: a label, a value per size, and the goal with its check.
struct Line {
    label: String,
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
    let line = |label: &str, f: &dyn Fn(&SizeResult) -> String, goal| Line {
        label: label.to_string(),
        values: column(f),
        goal,
    };
    let percent = |value: f64| format!("{value:.1} %");
    let mut lines = vec![
        line(
            "pods started per second (hollow nodes)",
            &|r| r.pods_per_second.map_or("-".into(), |v| format!("{v:.1}")),
            Some(("≥ 300", last.pods_per_second.map(|v| v >= 300.0))),
        ),
        line(
            "server CPU while pods start (% of a core)",
            &|r| r.server_cpu_starting.map_or("-".into(), percent),
            None,
        ),
        line(
            "idle server CPU (% of a core)",
            &|r| percent(r.idle_cpu),
            Some(("≤ 5 %", Some(last.idle_cpu <= 5.0))),
        ),
        line(
            "server RSS",
            &|r| mib(r.rss),
            Some(("≤ 250 MiB", Some(last.rss <= 250 << 20))),
        ),
        line("server peak RSS (VmHWM)", &|r| mib(r.peak_rss), None),
    ];
    for (name, series) in [
        (
            "Policy",
            (|r: &SizeResult| r.policy) as fn(&SizeResult) -> ApplyMeasure,
        ),
        ("pod label", |r: &SizeResult| r.pod_label),
    ] {
        lines.extend(apply_lines(name, series, results, base, last));
    }
    lines.extend([
        line(
            "`corral get pods -o json` (median of 3)",
            &|r| millis(r.get_pods),
            Some(("≤ 1 s", Some(last.get_pods <= Duration::from_secs(1)))),
        ),
        line("store size", &|r| mib(r.store_bytes), None),
        line(
            "bench process CPU while pods start (% of a core)",
            &|r| r.bench_cpu_starting.map_or("-".into(), percent),
            None,
        ),
        line(
            "bench process CPU while idle (% of a core)",
            &|r| percent(r.bench_idle_cpu),
            None,
        ),
        line(
            "hollow nodes Ready",
            &|r| format!("{} of {nodes}", r.nodes_ready),
            None,
        ),
    ]);
    if results.iter().any(|r| r.etcd_idle_cpu.is_some()) {
        lines.push(line(
            "idle etcd CPU (% of a core)",
            &|r| r.etcd_idle_cpu.map_or("-".into(), percent),
            None,
        ));
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

/// The rows of one series of applies: CPU per apply raw and less idle,
/// each with its ratio to 0 pods, and the latency.
fn apply_lines(
    name: &str,
    series: fn(&SizeResult) -> ApplyMeasure,
    results: &[SizeResult],
    base: Option<&SizeResult>,
    last: &SizeResult,
) -> Vec<Line> {
    let values = |f: &dyn Fn(ApplyMeasure) -> String| {
        results.iter().map(|r| f(series(r))).collect::<Vec<_>>()
    };
    let ratio_line = |label: String, cpu: fn(ApplyMeasure) -> Duration| {
        let to_base = |r: &SizeResult| base.and_then(|b| ratio(cpu(series(r)), cpu(series(b))));
        Line {
            label,
            values: results
                .iter()
                .map(|r| to_base(r).map_or_else(|| "-".to_string(), |v| format!("{v:.2}×")))
                .collect(),
            goal: Some(("≤ 1.3×", to_base(last).map(|v| v <= 1.3))),
        }
    };
    let latency = |f: fn(&Summary) -> Duration| {
        move |m: ApplyMeasure| m.latency.map_or("-".into(), |s| millis(f(&s)))
    };
    let p99_met = series(last)
        .latency
        .map(|s| s.p99 <= Duration::from_millis(50));
    vec![
        Line {
            label: format!("server CPU per apply ({name})"),
            values: values(&|m| millis(m.cpu)),
            goal: None,
        },
        ratio_line("  ÷ at 0 pods".into(), |m| m.cpu),
        Line {
            label: format!("server CPU per apply ({name}), less idle CPU"),
            values: values(&|m| millis(m.cpu_less_idle)),
            goal: None,
        },
        ratio_line("  ÷ at 0 pods".into(), |m| m.cpu_less_idle),
        Line {
            label: format!("apply p50 ({name}, one client)"),
            values: values(&latency(|s| s.median)),
            goal: None,
        },
        Line {
            label: format!("apply p99 ({name}, one client)"),
            values: values(&latency(|s| s.p99)),
            goal: Some(("≤ 50 ms", p99_met)),
        },
    ]
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
            policy: ApplyMeasure {
                cpu: Duration::from_millis(cpu_ms),
                cpu_less_idle: Duration::from_millis(cpu_ms),
                latency: None,
            },
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

//! One line describing the machine a benchmark ran on: cores, kernel, CPU
//! model and load, as `docs/BENCHMARKS.md` records next to every result.

use std::fs;

/// e.g. `2 cores (nproc), kernel 6.1.0-18-amd64, CPU: Intel Xeon …, load 1.2 0.9 0.8`.
pub fn describe() -> String {
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    let kernel = fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|text| text.trim().to_string())
        .unwrap_or_else(|_| "unknown".into());
    let cpu = fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| cpu_model(&text))
        .unwrap_or_else(|| "unknown".into());
    format!(
        "{cores} cores (nproc), kernel {kernel}, CPU: {cpu}, load {}",
        load()
    )
}

/// The 1, 5 and 15 minute load averages.
pub fn load() -> String {
    fs::read_to_string("/proc/loadavg")
        .map(|text| {
            text.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|_| "unknown".into())
}

fn cpu_model(cpuinfo: &str) -> Option<String> {
    cpuinfo
        .lines()
        .find(|line| line.starts_with("model name"))
        .and_then(|line| line.split_once(':'))
        .map(|(_, model)| model.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_first_model_name() {
        let cpuinfo = "processor\t: 0\nmodel name\t: Example CPU @ 2.0GHz\nprocessor\t: 1\nmodel name\t: other\n";
        assert_eq!(cpu_model(cpuinfo).as_deref(), Some("Example CPU @ 2.0GHz"));
        assert_eq!(cpu_model("processor: 0\n"), None);
    }
}

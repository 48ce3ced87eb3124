//! A pod's health *now*, from its status: the word `get pods` shows and the
//! sentence `why` leads with when a pod whose workflow finished is not
//! healthy any more (a container exiting in a loop, killed by its liveness
//! probe, failed for good, not started again by the runtime).

use chrono::{DateTime, Utc};

use super::pod::{ContainerReason, ContainerStatus, PodPhase, PodStatus};

/// The word for a pod's STATUS (`get pods`, the dashboard): `Deleting`
/// while its stop workflow runs, else its status' [`PodStatus::reason`].
pub fn pod_status_word(pod: &crate::Object) -> String {
    if pod.metadata.deleting.is_some() {
        return "Deleting".to_string();
    }
    pod.typed_status::<PodStatus>().unwrap_or_default().reason()
}

impl PodStatus {
    /// The word for `get pods`' STATUS: the worst container reason when one
    /// is unhealthy, otherwise the phase.
    pub fn reason(&self) -> String {
        match self.worst_container() {
            Some((_, reason)) if !reason.is_healthy() => reason.as_str().to_string(),
            _ => format!("{:?}", self.phase),
        }
    }

    /// `n/m`: containers ready of containers.
    pub fn ready_count(&self) -> String {
        let ready = self.containers.iter().filter(|c| c.ready).count();
        format!("{ready}/{}", self.containers.len())
    }

    /// Restarts after exits, summed over the containers.
    pub fn restarts(&self) -> u32 {
        self.containers.iter().map(|c| c.restarts).sum()
    }

    /// Why the pod is not healthy now, in one sentence; `None` when every
    /// container is healthy (or the node has not reported any yet).
    pub fn unhealthy(&self, now: DateTime<Utc>) -> Option<String> {
        let sick: Vec<String> = self
            .containers
            .iter()
            .filter(|c| c.reason.is_some_and(|r| !r.is_healthy()))
            .map(|c| describe(c, now))
            .collect();
        if sick.is_empty() {
            return (self.phase == PodPhase::Failed)
                .then(|| "its containers exited and are not restarted".to_string());
        }
        Some(sick.join("; "))
    }

    fn worst_container(&self) -> Option<(&ContainerStatus, ContainerReason)> {
        self.containers
            .iter()
            .filter_map(|c| c.reason.map(|r| (c, r)))
            .max_by_key(|(_, reason)| *reason)
    }
}

/// "container app exited with code 3 (attempt 5 of …): restart in 8s".
fn describe(container: &ContainerStatus, now: DateTime<Utc>) -> String {
    let mut text = format!("container {}", container.name);
    match &container.message {
        Some(message) => {
            text.push(' ');
            text.push_str(message);
        }
        None => {
            text.push_str(" is ");
            text.push_str(container.reason.map_or("unknown", ContainerReason::as_str));
        }
    }
    if let (Some(exit), true) = (&container.last_exit, container.message.is_some()) {
        let ago = (now - exit.at).num_seconds().max(0);
        text.push_str(&format!(" {ago}s ago"));
    }
    if container.restarts > 0 {
        let times = if container.restarts == 1 {
            "time"
        } else {
            "times"
        };
        text.push_str(&format!("; restarted {} {times}", container.restarts));
    }
    if let Some(at) = container.next_restart_at {
        text.push_str(&format!(", next restart {}", relative(at, now)));
    }
    text
}

/// "in 8s", "now".
fn relative(at: DateTime<Utc>, now: DateTime<Utc>) -> String {
    let seconds = (at - now).num_milliseconds() as f64 / 1000.0;
    if seconds <= 0.0 {
        "due now".to_string()
    } else if seconds < 10.0 {
        format!("in {seconds:.1}s")
    } else {
        format!("in {}s", seconds.round() as i64)
    }
}

/// The message the node writes for a container that exited: "exited with
/// code 3", "was killed by signal 9 (exit code 137)" or the cause the node
/// knows ("was killed: its liveness probe failed: …"; no time: `why` adds
/// how long ago).
pub fn exit_message(code: Option<i32>, cause: Option<&str>) -> String {
    match (cause, code) {
        (Some(cause), _) => cause.to_string(),
        (None, Some(code)) if code > 128 && code <= 128 + 64 => {
            format!("was killed by signal {} (exit code {code})", code - 128)
        }
        (None, Some(code)) => format!("exited with code {code}"),
        (None, None) => "exited (its code could not be collected)".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::{ContainerExit, ContainerState};
    use chrono::TimeDelta;

    fn container(name: &str, reason: ContainerReason) -> ContainerStatus {
        ContainerStatus {
            name: name.into(),
            state: ContainerState::Running,
            restarts: 0,
            started_at: None,
            container_id: None,
            exit_code: None,
            ready: reason == ContainerReason::Running,
            reason: Some(reason),
            message: None,
            last_exit: None,
            next_restart_at: None,
        }
    }

    #[test]
    fn a_crash_looping_container_says_how_it_exited_and_when_it_restarts() {
        let now = Utc::now();
        let mut looping = container("app", ContainerReason::CrashLoop);
        looping.state = ContainerState::Waiting;
        looping.restarts = 4;
        looping.exit_code = Some(3);
        looping.last_exit = Some(ContainerExit {
            code: Some(3),
            at: now - TimeDelta::seconds(2),
            cause: None,
            reason: None,
        });
        looping.message = Some(exit_message(Some(3), None));
        looping.next_restart_at = Some(now + TimeDelta::seconds(14));
        let status = PodStatus {
            phase: PodPhase::Pending,
            containers: vec![container("sidecar", ContainerReason::Running), looping],
            ..PodStatus::default()
        };
        assert_eq!(status.reason(), "CrashLoop");
        assert_eq!(status.ready_count(), "1/2");
        assert_eq!(status.restarts(), 4);
        assert_eq!(
            status.unhealthy(now).as_deref(),
            Some("container app exited with code 3 2s ago; restarted 4 times, next restart in 14s")
        );
    }

    #[test]
    fn healthy_pods_have_no_complaint_and_show_their_phase() {
        let status = PodStatus {
            phase: PodPhase::Running,
            containers: vec![container("app", ContainerReason::Running)],
            ..PodStatus::default()
        };
        assert_eq!(status.reason(), "Running");
        assert_eq!(status.unhealthy(Utc::now()), None);
        let done = PodStatus {
            phase: PodPhase::Succeeded,
            containers: vec![container("job", ContainerReason::Completed)],
            ..PodStatus::default()
        };
        assert_eq!(done.reason(), "Succeeded");
        assert_eq!(done.unhealthy(Utc::now()), None);
    }

    #[test]
    fn exits_read_as_codes_signals_or_the_nodes_cause() {
        assert_eq!(exit_message(Some(1), None), "exited with code 1");
        assert_eq!(
            exit_message(Some(137), None),
            "was killed by signal 9 (exit code 137)"
        );
        assert_eq!(
            exit_message(
                Some(137),
                Some("was killed: its liveness probe failed: connection refused")
            ),
            "was killed: its liveness probe failed: connection refused"
        );
        assert_eq!(
            exit_message(None, None),
            "exited (its code could not be collected)"
        );
    }

    #[test]
    fn the_worst_reason_wins_and_final_errors_are_unhealthy() {
        let mut failed = container("app", ContainerReason::Error);
        failed.message = Some("exited with code 2".into());
        let now = Utc::now();
        failed.last_exit = Some(ContainerExit {
            code: Some(2),
            at: now - chrono::TimeDelta::seconds(1),
            cause: None,
            reason: None,
        });
        let status = PodStatus {
            phase: PodPhase::Failed,
            containers: vec![failed, container("log", ContainerReason::Completed)],
            ..PodStatus::default()
        };
        assert_eq!(status.reason(), "Error");
        assert_eq!(
            status.unhealthy(now).as_deref(),
            Some("container app exited with code 2 1s ago")
        );
    }
}

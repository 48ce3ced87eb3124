//! Pure decisions: which containers a new revision restarts, when an exited
//! container starts again, and what phase a pod is in. No I/O, no clock.

use std::collections::BTreeMap;

use chrono::{DateTime, Duration, Utc};
use corral_api::kinds::{
    Container, ContainerReason, PodPhase, PodSpec, RestartPolicy, exit_message,
};
use sha2::{Digest, Sha256};

use crate::state::ContainerRecord;

/// A hash of everything a container is started from: its own spec and the
/// pod-level settings that shape it (runtime, security, volumes). Equal
/// hashes mean an update can leave the container running.
pub fn config_hash(spec: &PodSpec, container: &Container) -> String {
    let mut hasher = Sha256::new();
    let inputs = serde_json::json!({
        "container": container,
        "runtime": spec.runtime,
        "security": spec.security,
        "volumes": spec.volumes,
    });
    hasher.update(inputs.to_string().as_bytes());
    hex::encode(&hasher.finalize()[..8])
}

/// How a new revision changes a running pod.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RevisionPlan {
    /// Same config: keep running untouched.
    pub unchanged: Vec<String>,
    /// Config changed: stop (SIGTERM, grace, SIGKILL) and start again.
    pub changed: Vec<String>,
    /// New in this revision: start.
    pub added: Vec<String>,
    /// Gone from this revision: stop.
    pub removed: Vec<String>,
}

impl RevisionPlan {
    /// Containers to stop before the new ones start.
    pub fn to_stop(&self) -> impl Iterator<Item = &String> {
        self.changed.iter().chain(&self.removed)
    }

    /// Containers to start after the stops.
    pub fn to_start(&self) -> impl Iterator<Item = &String> {
        self.changed.iter().chain(&self.added)
    }
}

/// Compares a revision's containers with what runs.
pub fn plan_revision(spec: &PodSpec, current: &BTreeMap<String, ContainerRecord>) -> RevisionPlan {
    let mut plan = RevisionPlan::default();
    for container in &spec.containers {
        match current.get(&container.name) {
            Some(record) if record.config_hash == config_hash(spec, container) => {
                plan.unchanged.push(container.name.clone());
            }
            Some(_) => plan.changed.push(container.name.clone()),
            None => plan.added.push(container.name.clone()),
        }
    }
    for name in current.keys() {
        if !spec.containers.iter().any(|c| c.name == *name) {
            plan.removed.push(name.clone());
        }
    }
    plan
}

/// The CPU (millicores) and memory (bytes) a pod spec requests.
pub fn requests(spec: &PodSpec) -> (u64, u64) {
    spec.containers.iter().fold((0, 0), |(cpu, memory), c| {
        (
            cpu + c.resources.cpu.map_or(0, |q| q.millis),
            memory + c.resources.memory.map_or(0, |q| q.bytes),
        )
    })
}

/// Whether `new` still fits a node with this capacity next to the `others`
/// on it; the error says which resource is short, in the scheduler's words.
pub fn fits<'a>(
    capacity: (u64, u64),
    others: impl IntoIterator<Item = &'a PodSpec>,
    new: &PodSpec,
) -> Result<(), String> {
    let used = others
        .into_iter()
        .map(requests)
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    let wanted = requests(new);
    let free_cpu = capacity.0.saturating_sub(used.0);
    let free_memory = capacity.1.saturating_sub(used.1);
    if wanted.0 > free_cpu {
        return Err(format!(
            "insufficient cpu: {} free, {} requested",
            corral_api::quantity::Cpu { millis: free_cpu },
            corral_api::quantity::Cpu { millis: wanted.0 }
        ));
    }
    if wanted.1 > free_memory {
        return Err(format!(
            "insufficient memory: {} free, {} requested",
            corral_api::quantity::Memory { bytes: free_memory },
            corral_api::quantity::Memory { bytes: wanted.1 }
        ));
    }
    Ok(())
}

/// The first restart waits this long; each further one twice as long.
pub const INITIAL_BACKOFF_SECONDS: i64 = 1;
/// Restarts never wait longer than this.
pub const MAX_BACKOFF_SECONDS: i64 = 60;

/// When an exited container should start again, or `None` if the policy
/// says it stays down.
pub fn restart_at(
    policy: RestartPolicy,
    exit_code: Option<i32>,
    restarts: u32,
    exited_at: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    let restart = match policy {
        RestartPolicy::Always => true,
        RestartPolicy::OnFailure => exit_code != Some(0),
        RestartPolicy::Never => false,
    };
    restart.then(|| {
        let exponent = restarts.min(16);
        let wait = (INITIAL_BACKOFF_SECONDS << exponent).min(MAX_BACKOFF_SECONDS);
        exited_at + Duration::seconds(wait)
    })
}

/// Why a container is in its state, and the sentence for `status` and
/// `why`, from its record.
pub fn container_health(record: &ContainerRecord) -> (ContainerReason, Option<String>) {
    let exit = record.last_exit.as_ref();
    let exited = || {
        exit.map(|e| exit_message(e.code, e.cause.as_deref()))
            .or_else(|| {
                record
                    .exit_code
                    .map(|code| format!("exited with code {code}"))
            })
    };
    match (record.running, record.pid) {
        (true, Some(_)) => match (&record.readiness_error, record.ready) {
            (Some(error), false) => (
                ContainerReason::NotReady,
                Some(format!("is not ready: its readiness probe fails: {error}")),
            ),
            _ => (ContainerReason::Running, record.data_restart.clone()),
        },
        (true, None) => match (&record.start_error, record.restart_after, exit) {
            (Some(error), _, _) => (
                ContainerReason::StartFailed,
                Some(format!("could not be started again: {error}")),
            ),
            (None, Some(_), Some(e)) => (e.reason.unwrap_or(ContainerReason::CrashLoop), exited()),
            (None, Some(_), None) => (ContainerReason::CrashLoop, exited()),
            (None, None, _) => (ContainerReason::Starting, None),
        },
        (false, _) if record.exit_code == Some(0) => (ContainerReason::Completed, exited()),
        (false, _) => (ContainerReason::Error, exited()),
    }
}

/// The pod's phase from its containers' records.
pub fn pod_phase(spec: &PodSpec, records: &BTreeMap<String, ContainerRecord>) -> PodPhase {
    let all: Vec<Option<&ContainerRecord>> = spec
        .containers
        .iter()
        .map(|c| records.get(&c.name))
        .collect();
    if all.iter().any(Option::is_none) {
        return PodPhase::Pending;
    }
    let records: Vec<&ContainerRecord> = all.into_iter().flatten().collect();
    if records.iter().all(|r| r.running && r.pid.is_some()) {
        return PodPhase::Running;
    }
    let finished = records.iter().all(|r| !r.running);
    if finished {
        if records.iter().all(|r| r.exit_code == Some(0)) {
            return PodPhase::Succeeded;
        }
        return PodPhase::Failed;
    }
    if records.iter().any(|r| r.pid.is_some()) {
        PodPhase::Running
    } else {
        PodPhase::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(containers: serde_json::Value) -> PodSpec {
        serde_json::from_value(json!({ "containers": containers })).unwrap()
    }

    fn record(spec: &PodSpec, name: &str) -> ContainerRecord {
        let container = spec.containers.iter().find(|c| c.name == name).unwrap();
        ContainerRecord {
            runtime_id: format!("{name}-1"),
            config_hash: config_hash(spec, container),
            generation: 1,
            started_at: None,
            restarts: 0,
            exit_code: None,
            pid: Some(1),
            running: true,
            ready: false,
            restart_after: None,
            last_exit: None,
            stop_cause: None,
            start_error: None,
            readiness_error: None,
            data_restart: None,
        }
    }

    #[test]
    fn container_health_names_the_loop_the_probe_and_the_final_exit() {
        let spec = spec(json!([{"name": "web", "image": "busybox"}]));
        let now = Utc::now();
        let mut web = record(&spec, "web");
        assert_eq!(container_health(&web), (ContainerReason::Running, None));
        web.readiness_error = Some("exit code 1".into());
        assert_eq!(
            container_health(&web),
            (
                ContainerReason::NotReady,
                Some("is not ready: its readiness probe fails: exit code 1".into())
            )
        );
        web.readiness_error = None;
        web.pid = None;
        assert_eq!(container_health(&web).0, ContainerReason::Starting);
        web.exit_code = Some(3);
        web.restart_after = Some(now + Duration::seconds(8));
        web.last_exit = Some(corral_api::kinds::ContainerExit {
            code: Some(3),
            at: now - Duration::seconds(1),
            cause: None,
            reason: None,
        });
        assert_eq!(
            container_health(&web),
            (
                ContainerReason::CrashLoop,
                Some("exited with code 3".into())
            )
        );
        let exit = web.last_exit.as_mut().unwrap();
        exit.cause = Some("was killed: its liveness probe failed: refused".into());
        exit.reason = Some(ContainerReason::Unhealthy);
        assert_eq!(
            container_health(&web),
            (
                ContainerReason::Unhealthy,
                Some("was killed: its liveness probe failed: refused".into())
            )
        );
        web.start_error = Some("runc create: no such file".into());
        assert_eq!(
            container_health(&web),
            (
                ContainerReason::StartFailed,
                Some("could not be started again: runc create: no such file".into())
            )
        );
        web.start_error = None;
        web.running = false;
        web.restart_after = None;
        web.last_exit.as_mut().unwrap().cause = None;
        web.last_exit.as_mut().unwrap().reason = None;
        assert_eq!(container_health(&web).0, ContainerReason::Error);
        web.exit_code = Some(0);
        web.last_exit.as_mut().unwrap().code = Some(0);
        assert_eq!(container_health(&web).0, ContainerReason::Completed);
    }

    #[test]
    fn only_changed_containers_restart() {
        let old = spec(json!([
            {"name": "web", "image": "busybox", "env": {"A": "1"}},
            {"name": "side", "image": "busybox"},
            {"name": "gone", "image": "busybox"}
        ]));
        let current: BTreeMap<String, ContainerRecord> = ["web", "side", "gone"]
            .iter()
            .map(|n| (n.to_string(), record(&old, n)))
            .collect();
        let new = spec(json!([
            {"name": "web", "image": "busybox", "env": {"A": "2"}},
            {"name": "side", "image": "busybox"},
            {"name": "extra", "image": "busybox"}
        ]));
        let plan = plan_revision(&new, &current);
        assert_eq!(plan.unchanged, vec!["side"]);
        assert_eq!(plan.changed, vec!["web"]);
        assert_eq!(plan.added, vec!["extra"]);
        assert_eq!(plan.removed, vec!["gone"]);
        assert_eq!(plan.to_stop().collect::<Vec<_>>(), vec!["web", "gone"]);
        assert_eq!(plan.to_start().collect::<Vec<_>>(), vec!["web", "extra"]);
    }

    #[test]
    fn pod_level_changes_restart_every_container() {
        let old = spec(json!([{"name": "web", "image": "busybox"}]));
        let current = BTreeMap::from([("web".to_string(), record(&old, "web"))]);
        let mut new = old.clone();
        new.runtime = Some(corral_api::kinds::RuntimeClass::Gvisor);
        assert_eq!(plan_revision(&new, &current).changed, vec!["web"]);
    }

    #[test]
    fn updates_that_outgrow_the_node_are_named() {
        let small = spec(
            json!([{"name": "a", "image": "i", "resources": {"cpu": "500m", "memory": "64Mi"}}]),
        );
        let big =
            spec(json!([{"name": "a", "image": "i", "resources": {"cpu": "1", "memory": "2Gi"}}]));
        let capacity = (2000, 1 << 30);
        assert_eq!(fits(capacity, [&small], &small), Ok(()));
        assert_eq!(
            fits(capacity, [&small], &big),
            Err("insufficient memory: 960Mi free, 2Gi requested".to_string())
        );
        assert_eq!(
            fits((1000, 1 << 30), [&small], &big),
            Err("insufficient cpu: 500m free, 1 requested".to_string())
        );
    }

    #[test]
    fn restart_policy_and_backoff() {
        let t = Utc::now();
        assert_eq!(
            restart_at(RestartPolicy::Always, Some(0), 0, t),
            Some(t + Duration::seconds(1))
        );
        assert_eq!(
            restart_at(RestartPolicy::Always, Some(1), 3, t),
            Some(t + Duration::seconds(8))
        );
        assert_eq!(
            restart_at(RestartPolicy::Always, None, 30, t),
            Some(t + Duration::seconds(60))
        );
        assert_eq!(restart_at(RestartPolicy::OnFailure, Some(0), 0, t), None);
        assert!(restart_at(RestartPolicy::OnFailure, Some(2), 0, t).is_some());
        assert!(restart_at(RestartPolicy::OnFailure, None, 0, t).is_some());
        assert_eq!(restart_at(RestartPolicy::Never, Some(1), 0, t), None);
    }

    #[test]
    fn phases() {
        let s = spec(json!([{"name": "a", "image": "i"}, {"name": "b", "image": "i"}]));
        let mut records = BTreeMap::from([("a".to_string(), record(&s, "a"))]);
        assert_eq!(pod_phase(&s, &records), PodPhase::Pending);
        records.insert("b".into(), record(&s, "b"));
        assert_eq!(pod_phase(&s, &records), PodPhase::Running);
        for r in records.values_mut() {
            r.running = false;
            r.pid = None;
            r.exit_code = Some(0);
        }
        assert_eq!(pod_phase(&s, &records), PodPhase::Succeeded);
        records.get_mut("b").unwrap().exit_code = Some(3);
        assert_eq!(pod_phase(&s, &records), PodPhase::Failed);
    }
}

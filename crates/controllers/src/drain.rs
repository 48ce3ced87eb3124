//! A node's deletion is a drain: the `scheduler/drain` step of its `stop`
//! workflow. While the node is being deleted the scheduler places nothing
//! there (it counts as unschedulable) and moves every pod not pinned to it
//! ([`crate::evacuate`]); the step is done once no pod or VM is bound to
//! the node any more. Pods pinned there and VMs hold it: its step log
//! names them, so `why node/x` says what to delete, re-pin or migrate (or
//! that the operator may skip the step).
//!
//! The step is claimed at once and completed when the last workload left;
//! in between, a log line each time what holds it changes.

use std::collections::BTreeMap;
use std::sync::Mutex;

use corral_api::workflow::{
    StepActionKind, StepActionRequest, StepBatchRequest, StepState, StoredWorkflows,
};
use corral_api::{Object, ObjectKey};
use corral_client::{Client, ClientError};

pub const DRAIN_STEP: &str = "scheduler/drain";

/// Where a node's drain stands: its step in the newest (running) instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DrainStep {
    /// Not claimed yet (instance id).
    Ready(String),
    /// Claimed by the scheduler, waiting for workloads to leave.
    Running(String),
}

impl DrainStep {
    /// The drain step of `node`, if it is ready or running.
    pub fn of(node: &Object) -> Option<DrainStep> {
        let status = StoredWorkflows::of(&node.status).ok()?;
        let instance = status.latest()?;
        if instance.outcome != corral_api::workflow::WorkflowOutcome::Running {
            return None;
        }
        match &instance.steps.get(DRAIN_STEP)?.state {
            StepState::Ready { .. } => Some(DrainStep::Ready(instance.id.clone())),
            StepState::Running { .. } => Some(DrainStep::Running(instance.id.clone())),
            _ => None,
        }
    }

    fn instance(&self) -> &str {
        match self {
            DrainStep::Ready(id) | DrainStep::Running(id) => id,
        }
    }
}

/// What is still bound to a node being drained, by kind of wait.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Holders {
    /// Pods on their way to another node (unbound by the scheduler).
    pub moving: Vec<String>,
    /// Pods pinned to this node (`spec.placement.node`): they never move.
    pub pinned: Vec<String>,
    /// Pods being deleted: their own stop workflows run.
    pub stopping: Vec<String>,
    /// Virtual machines: deleted or migrated by a person.
    pub vms: Vec<String>,
}

impl Holders {
    pub fn is_empty(&self) -> bool {
        self.moving.is_empty()
            && self.pinned.is_empty()
            && self.stopping.is_empty()
            && self.vms.is_empty()
    }

    /// The step log's line for what holds the drain; `None` when nothing.
    pub fn describe(&self) -> Option<String> {
        let mut parts = Vec::new();
        let mut waits_on_people = false;
        for (names, what, people) in [
            (&self.moving, "moving away", false),
            (&self.stopping, "being deleted", false),
            (&self.pinned, "pinned here", true),
            (&self.vms, "", true),
        ] {
            if names.is_empty() {
                continue;
            }
            waits_on_people |= people;
            let noun = match (what.is_empty(), names.len()) {
                (true, 1) => "1 VM".to_string(),
                (true, n) => format!("{n} VMs"),
                (false, 1) => format!("1 pod {what}"),
                (false, n) => format!("{n} pods {what}"),
            };
            parts.push(format!("{noun} ({})", list(names)));
        }
        if parts.is_empty() {
            return None;
        }
        let mut line = format!("waiting for {}", parts.join(", "));
        if waits_on_people {
            line.push_str(
                "; pinned pods and VMs do not move by themselves: delete, re-pin or migrate them, \
                 or skip this step (`corral delete node/NAME --skip scheduler/drain`)",
            );
        }
        Some(line)
    }
}

/// At most five names, then how many more.
fn list(names: &[String]) -> String {
    const SHOWN: usize = 5;
    let mut shown = names
        .iter()
        .take(SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > SHOWN {
        shown.push_str(&format!(", and {} more", names.len() - SHOWN));
    }
    shown
}

/// The requests that move the drain step of `node`, given what holds it
/// and the line last logged for it; empty when nothing changed. Pure.
pub fn actions(
    step: &DrainStep,
    holders: &Holders,
    last_logged: Option<&str>,
) -> Vec<StepActionRequest> {
    let action = |kind| {
        let mut request = StepActionRequest::new(kind, DRAIN_STEP);
        request.workflow = Some(step.instance().to_string());
        request
    };
    let mut actions = Vec::new();
    if matches!(step, DrainStep::Ready(_)) {
        actions.push(action(StepActionKind::Claim));
    }
    match holders.describe() {
        None => {
            let mut done = action(StepActionKind::Complete);
            done.note = Some("no pod or VM is bound to the node".to_string());
            actions.push(done);
        }
        Some(line) if last_logged != Some(line.as_str()) => {
            let mut log = action(StepActionKind::Log);
            log.message = Some(line);
            actions.push(log);
        }
        Some(_) => {}
    }
    actions
}

/// Moves the drain step of the node at `key` (see [`actions`]), keeping
/// the line last logged per node in `logged`.
pub async fn advance(
    client: &Client,
    key: &ObjectKey,
    step: &DrainStep,
    holders: &Holders,
    logged: &Mutex<BTreeMap<ObjectKey, String>>,
) -> Result<(), ClientError> {
    let last = logged
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .get(key)
        .cloned();
    let actions = actions(step, holders, last.as_deref());
    if actions.is_empty() {
        return Ok(());
    }
    let batch = StepBatchRequest {
        actions,
        status: BTreeMap::new(),
    };
    client.step_batch(key, &batch).await?;
    let mut logged = logged
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    match holders.describe() {
        Some(line) => {
            tracing::info!(node = %key.name, %line, "draining");
            logged.insert(key.clone(), line);
        }
        None => {
            tracing::info!(node = %key.name, "drained");
            logged.remove(key);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(names: &[&str]) -> Vec<String> {
        names.iter().map(|name| name.to_string()).collect()
    }

    #[test]
    fn an_empty_node_is_drained_in_one_request() {
        let kinds: Vec<_> = actions(
            &DrainStep::Ready("stop-3".into()),
            &Holders::default(),
            None,
        )
        .into_iter()
        .map(|action| (action.action, action.workflow))
        .collect();
        assert_eq!(
            kinds,
            vec![
                (StepActionKind::Claim, Some("stop-3".to_string())),
                (StepActionKind::Complete, Some("stop-3".to_string())),
            ]
        );
    }

    #[test]
    fn what_holds_the_drain_is_logged_once_per_change() {
        let holders = Holders {
            moving: names(&["default/a", "default/b"]),
            pinned: names(&["default/db"]),
            ..Holders::default()
        };
        let line = holders.describe().expect("something holds it");
        assert_eq!(
            line,
            "waiting for 2 pods moving away (default/a, default/b), 1 pod pinned here (default/db); \
             pinned pods and VMs do not move by themselves: delete, re-pin or migrate them, or skip \
             this step (`corral delete node/NAME --skip scheduler/drain`)"
        );
        let first = actions(&DrainStep::Ready("stop-1".into()), &holders, None);
        assert_eq!(
            first.iter().map(|a| a.action).collect::<Vec<_>>(),
            vec![StepActionKind::Claim, StepActionKind::Log]
        );
        let running = DrainStep::Running("stop-1".into());
        assert!(actions(&running, &holders, Some(&line)).is_empty());
        let fewer = Holders {
            moving: Vec::new(),
            ..holders
        };
        let next = actions(&running, &fewer, Some(&line));
        assert_eq!(next.len(), 1);
        assert_eq!(next[0].action, StepActionKind::Log);
        let done = actions(&running, &Holders::default(), Some(&line));
        assert_eq!(done[0].action, StepActionKind::Complete);
    }

    #[test]
    fn pods_merely_moving_need_no_person() {
        let holders = Holders {
            moving: names(&["default/a"]),
            vms: Vec::new(),
            ..Holders::default()
        };
        assert_eq!(
            holders.describe().as_deref(),
            Some("waiting for 1 pod moving away (default/a)")
        );
        let many = Holders {
            vms: (0..7).map(|i| format!("default/vm{i}")).collect(),
            ..Holders::default()
        };
        assert!(
            many.describe()
                .unwrap()
                .starts_with("waiting for 7 VMs (default/vm0, default/vm1, default/vm2, default/vm3, default/vm4, and 2 more)")
        );
    }
}

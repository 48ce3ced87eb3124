//! Analysis renderers, all pure: `why` (verdict and graph), `blame` (steps
//! by duration), `critical-chain` (what set the time to the goal) and `dot`
//! (Graphviz). Each takes the object's display name (`pod/web`), the
//! instance and `now`, and brings derived states up to `now` on a copy.

mod blame;
mod chain;
mod dot;
mod svg;
mod why;

pub use blame::{blame_json, blame_text};
pub use chain::{critical_chain_json, critical_chain_text};
pub use dot::dot;
pub use svg::svg;
pub use why::{verdict_line, why_json, why_text};

use chrono::{DateTime, TimeDelta, Utc};
use corral_api::workflow::{StepInstance, StepKind, StepState, WorkflowInstance};
use serde_json::{Map, Value};

use crate::engine::tick;

/// The instance brought up to `now`, and the clock durations are measured
/// against: `now`, or the finish time of a finished instance.
pub(crate) fn current(
    instance: &WorkflowInstance,
    now: DateTime<Utc>,
) -> (WorkflowInstance, DateTime<Utc>) {
    let mut instance = instance.clone();
    tick(&mut instance, now);
    let clock = instance.finished_at.unwrap_or(now);
    (instance, clock)
}

/// Everything a renderer shows about one step, computed once.
#[derive(Debug, Clone)]
pub(crate) struct StepView {
    pub name: String,
    pub owner: String,
    pub kind: StepKind,
    pub phase: &'static str,
    pub description: Option<String>,
    /// When the first attempt started.
    pub started: Option<DateTime<Utc>>,
    /// When the step settled (done, or failed / timed out for the last time).
    pub finished: Option<DateTime<Utc>>,
    /// When the current phase began (ready, running, blocked).
    pub since: Option<DateTime<Utc>>,
    /// How long a ready or running step has been so, up to the clock.
    pub for_how_long: Option<TimeDelta>,
    /// From the first attempt's start to the end, or to the clock.
    pub duration: Option<TimeDelta>,
    pub timeout: Option<TimeDelta>,
    pub time_left: Option<TimeDelta>,
    pub waiting_on: Vec<String>,
    pub error: Option<String>,
    pub blocked_by: Option<String>,
    pub cause: Option<String>,
    pub attempt: Option<u32>,
    pub max_attempts: u32,
    pub next_retry_at: Option<DateTime<Utc>>,
    pub claimed_by: Option<String>,
    pub note: Option<String>,
    /// `finished` relative to the instance's start.
    pub at: Option<TimeDelta>,
}

pub(crate) fn step_view(
    instance: &WorkflowInstance,
    step: &StepInstance,
    clock: DateTime<Utc>,
) -> StepView {
    let definition = &step.definition;
    let mut view = StepView {
        name: definition.name.clone(),
        owner: definition.owner.clone(),
        kind: definition.kind,
        phase: step.state.phase(),
        description: definition.description.clone(),
        started: step.first_started_at,
        finished: None,
        since: None,
        for_how_long: None,
        duration: None,
        timeout: definition
            .timeout_ms
            .map(|ms| TimeDelta::milliseconds(i64::try_from(ms).unwrap_or(i64::MAX))),
        time_left: None,
        waiting_on: Vec::new(),
        error: None,
        blocked_by: None,
        cause: None,
        attempt: (step.attempts > 0).then_some(step.attempts),
        max_attempts: step.max_attempts(),
        next_retry_at: None,
        claimed_by: None,
        note: None,
        at: None,
    };
    match &step.state {
        StepState::Waiting { on } => view.waiting_on = on.clone(),
        StepState::Ready { since } => {
            view.since = Some(*since);
            view.for_how_long = Some(clock - *since);
        }
        StepState::Running {
            claimed_by,
            since,
            deadline,
            ..
        } => {
            view.since = Some(*since);
            view.for_how_long = Some(clock - *since);
            view.claimed_by = Some(claimed_by.clone());
            view.time_left = deadline.map(|deadline| deadline - clock);
            view.duration = Some(clock - step.first_started_at.unwrap_or(*since));
        }
        StepState::Done {
            started,
            finished,
            note,
            ..
        } => {
            view.note = note.clone();
            view.finished = Some(*finished);
            if definition.kind == StepKind::Step {
                let first = step.first_started_at.unwrap_or(*started);
                view.started = Some(first);
                view.duration = Some(*finished - first);
            }
        }
        StepState::Failed {
            error,
            started,
            at,
            next_retry_at,
            ..
        } => {
            view.error = Some(error.clone());
            view.next_retry_at = *next_retry_at;
            settle_failure(&mut view, step, *started, *at, *next_retry_at, clock);
        }
        StepState::TimedOut {
            started,
            at,
            next_retry_at,
            ..
        } => {
            view.error = Some(format!(
                "timed out after {}",
                crate::duration::format_duration(*at - *started)
            ));
            view.next_retry_at = *next_retry_at;
            settle_failure(&mut view, step, *started, *at, *next_retry_at, clock);
        }
        StepState::Blocked {
            dependency,
            cause,
            at,
        } => {
            view.since = Some(*at);
            view.blocked_by = Some(dependency.clone());
            view.cause = Some(cause.clone());
        }
    }
    view.at = view.finished.map(|finished| finished - instance.started_at);
    view
}

fn settle_failure(
    view: &mut StepView,
    step: &StepInstance,
    started: DateTime<Utc>,
    at: DateTime<Utc>,
    next_retry_at: Option<DateTime<Utc>>,
    clock: DateTime<Utc>,
) {
    let first = step.first_started_at.unwrap_or(started);
    view.started = Some(first);
    view.since = Some(at);
    if next_retry_at.is_none() {
        view.finished = Some(at);
        view.duration = Some(at - first);
    } else {
        view.duration = Some(clock - first);
    }
}

/// Every step's view, in the instance's (topological) order.
pub(crate) fn step_views(instance: &WorkflowInstance, clock: DateTime<Utc>) -> Vec<StepView> {
    instance
        .steps
        .iter()
        .map(|step| step_view(instance, step, clock))
        .collect()
}

/// The JSON of one step: name, owner, kind, state, and the timing fields
/// that apply (`startedAt`, `finishedAt`, `since`, `durationMs`,
/// `timeoutMs`, `timeLeftMs`, `waitingOn`, `error`, `blockedBy`, …).
pub(crate) fn step_json(view: &StepView) -> Value {
    let mut map = Map::new();
    map.insert("name".into(), view.name.clone().into());
    map.insert("owner".into(), view.owner.clone().into());
    map.insert("kind".into(), view.kind.as_str().into());
    map.insert("state".into(), view.phase.into());
    let mut put = |key: &str, value: Option<Value>| {
        if let Some(value) = value {
            map.insert(key.to_string(), value);
        }
    };
    put("description", view.description.clone().map(Value::from));
    put("startedAt", view.started.map(time_json));
    put("finishedAt", view.finished.map(time_json));
    put("since", view.since.map(time_json));
    put("durationMs", view.duration.map(millis_json));
    put("atMs", view.at.map(millis_json));
    put("timeoutMs", view.timeout.map(millis_json));
    put("timeLeftMs", view.time_left.map(millis_json));
    put(
        "waitingOn",
        (!view.waiting_on.is_empty()).then(|| Value::from(view.waiting_on.clone())),
    );
    put("error", view.error.clone().map(Value::from));
    put("blockedBy", view.blocked_by.clone().map(Value::from));
    put("cause", view.cause.clone().map(Value::from));
    put("attempt", view.attempt.map(Value::from));
    put(
        "maxAttempts",
        (view.kind == StepKind::Step).then(|| Value::from(view.max_attempts)),
    );
    put("nextRetryAt", view.next_retry_at.map(time_json));
    put("claimedBy", view.claimed_by.clone().map(Value::from));
    put("note", view.note.clone().map(Value::from));
    Value::Object(map)
}

pub(crate) fn time_json(time: DateTime<Utc>) -> Value {
    Value::from(time.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
}

pub(crate) fn millis_json(duration: TimeDelta) -> Value {
    Value::from(duration.num_milliseconds())
}

/// `storage (target)` for targets, the plain name for steps.
pub(crate) fn display_name(view: &StepView) -> String {
    match view.kind {
        StepKind::Target => format!("{} (target)", view.name),
        StepKind::Step => view.name.clone(),
    }
}

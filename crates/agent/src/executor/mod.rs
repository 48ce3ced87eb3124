//! The node-step executor: the one loop every object this node runs goes
//! through — a pod, a VirtualMachine, the node's own join.
//!
//! It admits a new revision only through the revision's workflow: it claims
//! the node's ready steps, runs them, and reports each outcome with its log
//! lines, following the instance the API returns after every request so a
//! stale view (an older watch event) never runs a step twice. Then it lets
//! the object be supervised from local state and reports the status fields
//! the node owns. It works from the local record, so supervision goes on
//! with the API down.
//!
//! What differs between kinds is a [`Workload`]: how a step runs, what is
//! supervised and reported, how the object is removed. The executor owns
//! the order of things and the conversation with the API ([`StepApi`]); it
//! never touches a runtime itself.

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use corral_api::{Object, ObjectKey};
use serde_json::{Map, Value};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::pod_data::follow::DataChange;
use crate::steps::{Attempt, NodeWork, StepApi, StepApiError, StepBatch};

mod inline;
#[cfg(test)]
mod tests;
mod workload;

use inline::InlineRun;
pub use workload::{Settled, Workload};

/// How often a supervised object is looked at without being told to.
pub const TICK: Duration = Duration::from_millis(500);

/// What running a step came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepOutcome {
    /// Done, with a note for `why`.
    Done(Option<String>),
    /// Failed with this error (the engine retries it per its policy).
    Failed(String),
    /// Not finished yet (waiting for readiness, a boot marker): the step
    /// stays running and is looked at again.
    NotYet,
}

/// A step's outcome and the lines it produced for its step log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepRun {
    pub outcome: StepOutcome,
    pub log: Vec<String>,
}

impl From<StepOutcome> for StepRun {
    fn from(outcome: StepOutcome) -> Self {
        StepRun {
            outcome,
            log: Vec::new(),
        }
    }
}

impl From<Result<Option<String>, String>> for StepRun {
    fn from(result: Result<Option<String>, String>) -> Self {
        match result {
            Ok(note) => StepOutcome::Done(note).into(),
            Err(error) => StepOutcome::Failed(error).into(),
        }
    }
}

/// What a manager tells an executor.
#[derive(Debug)]
pub enum Message {
    /// The object as the API now has it (bound to this node).
    Desired(Box<Object>),
    /// The object is gone from the API, or bound elsewhere: stop everything.
    Remove,
    /// A Secret or Config the object reads has a new revision.
    Data(DataChange),
}

/// The node-owned `fields` of a status value, each present (`null` when the
/// value lacks it) so that a write clears what the node no longer reports.
pub fn owned_fields(value: &Value, fields: &[&str]) -> Map<String, Value> {
    fields
        .iter()
        .map(|field| {
            let value = value.get(*field).cloned().unwrap_or(Value::Null);
            (field.to_string(), value)
        })
        .collect()
}

/// One object's executor: its workload and what it knows of the API.
pub struct Executor<W> {
    workload: W,
    api: Arc<dyn StepApi>,
    /// The status last written, to write only on change.
    reported: Option<Map<String, Value>>,
    /// Step attempts this executor claimed: a stale view can still show
    /// the step ready, and it must not be claimed again.
    claimed: BTreeSet<Attempt>,
    /// Step attempts this executor reported: a stale view can still show
    /// one running, and it must not run twice. (A step ready for a retry
    /// shows the failed attempt's number too, but is claimed first.)
    finished: BTreeSet<Attempt>,
    /// Steps running on their own; they outlive an admission pass, so news
    /// (a step another owner finished) is acted on while they run.
    detached: JoinSet<StepEnd>,
    /// Their attempts, and runs that ended and are not reported yet.
    running_detached: BTreeSet<Attempt>,
    ended: Vec<StepEnd>,
}

/// A step that ended: its name, attempt and outcome.
type StepEnd = (String, u32, StepRun);

impl<W> std::fmt::Debug for Executor<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executor").finish_non_exhaustive()
    }
}

impl<W: Workload> Executor<W> {
    pub fn new(workload: W, api: Arc<dyn StepApi>) -> Self {
        Executor {
            workload,
            api,
            reported: None,
            claimed: BTreeSet::new(),
            finished: BTreeSet::new(),
            detached: JoinSet::new(),
            running_detached: BTreeSet::new(),
            ended: Vec::new(),
        }
    }

    pub fn workload(&self) -> &W {
        &self.workload
    }

    fn key(&self) -> ObjectKey {
        self.workload.desired().key()
    }

    /// Runs until told to remove the object (then removes it) or until the
    /// channel closes (agent shutdown, which leaves everything running).
    pub async fn run(mut self, mut messages: mpsc::Receiver<Message>) {
        self.workload.resume().await;
        loop {
            self.reconcile().await;
            let tick = self.workload.tick();
            let message = tokio::select! {
                message = messages.recv() => message,
                Some(joined) = self.detached.join_next(), if !self.detached.is_empty() => {
                    if let Ok(end) = joined {
                        self.ended.push(end);
                    }
                    continue;
                }
                () = sleep_for(tick) => continue,
            };
            let Some(first) = message else {
                return;
            };
            // Only the newest view matters; a removal wins; every data
            // change is handled, after the view.
            let mut pending = vec![first];
            while let Ok(next) = messages.try_recv() {
                pending.push(next);
            }
            let mut latest = None;
            let mut changes = Vec::new();
            for message in pending {
                match message {
                    Message::Desired(object) => latest = Some(object),
                    Message::Data(change) => changes.push(change),
                    Message::Remove => {
                        self.workload.remove().await;
                        return;
                    }
                }
            }
            if let Some(object) = latest {
                self.workload.set_desired(*object);
            }
            for change in &changes {
                self.workload.data_changed(change).await;
            }
        }
    }

    /// One look: admission, supervision (and admission again when it
    /// changed something a step waits for), status.
    pub async fn reconcile(&mut self) {
        self.admit().await;
        if self.workload.supervise().await {
            self.admit().await;
        }
        self.report().await;
    }

    /// Moves the object towards the desired revision through the node's
    /// steps of the revision's workflow, until none is left to start now:
    /// steps running on their own go on after it returns.
    pub async fn admit(&mut self) {
        let desired = self.workload.desired();
        let revision = desired.metadata.revision;
        if !NodeWork::exists_for(desired, revision) {
            self.workload.admit_without_workflow().await;
            return;
        }
        // Without its definition (the API away) there is nothing to do yet.
        let Some(mut work) = NodeWork::for_revision(self.api.as_ref(), desired, revision).await
        else {
            return;
        };
        // Steps started in this pass (each runs at most once per pass).
        let mut started: BTreeSet<String> = BTreeSet::new();
        // Claimed or resumed, waiting for the workload to itself.
        let mut queue: VecDeque<(String, u32)> = VecDeque::new();
        let mut batch = StepBatch::default();
        // Attempts reported in `batch`.
        let mut reporting: Vec<Attempt> = Vec::new();
        for (step, line) in self.workload.running_log() {
            batch.log(&work, &step, line);
        }
        self.collect_ended(&work, &mut batch, &mut reporting);
        loop {
            if work.is_running() {
                self.plan(&work, &mut started, &mut queue, &mut batch, &reporting);
            }
            let sent = !batch.is_empty();
            if sent {
                let Some(claimed) = self.send(&mut batch, &mut reporting, &mut work).await else {
                    // The API refused or is away: what runs on its own
                    // goes on, and is reported at a later pass (or, if that
                    // report is lost too, run again: steps are idempotent).
                    return;
                };
                // What the batch claimed runs now, at the attempt it started.
                for step in claimed {
                    let attempt = work.attempts(&step);
                    started.insert(step.clone());
                    queue.push_back((step, attempt));
                }
            }
            // Hand over the claimed steps that run on their own.
            let mut inline = VecDeque::new();
            for (step, attempt) in std::mem::take(&mut queue) {
                if self.workload.is_detached(&step) {
                    let task = self.workload.detach(&step, &work);
                    self.running_detached.insert(work.attempt(&step, attempt));
                    self.detached
                        .spawn(async move { (step, attempt, task.await) });
                } else {
                    inline.push_back((step, attempt));
                }
            }
            queue = inline;
            if let Some((step, attempt)) = queue.pop_front() {
                let key = self.key();
                let inline = InlineRun {
                    api: self.api.as_ref(),
                    key: &key,
                    finished: &mut self.finished,
                    running_detached: &mut self.running_detached,
                    detached: &mut self.detached,
                };
                let began = std::time::Instant::now();
                let (run, fresh, unsent) = inline.run(&mut self.workload, &step, &work).await;
                tracing::debug!(object = %key, %step, took = ?began.elapsed(), outcome = ?run.outcome, "step ran");
                if let Some(fresh) = fresh {
                    self.workload.remember(&fresh);
                    work = fresh;
                }
                if let Some((unsent, attempts)) = unsent {
                    batch.append(unsent);
                    reporting.extend(attempts);
                }
                record(&work, &step, attempt, run, &mut batch, &mut reporting);
            } else if !sent && batch.is_empty() {
                // Nothing to run here, nothing to report, and the view is
                // the one the last request returned (or the first): done
                // for now; what runs on its own is reported when it ends.
                return;
            }
            // Whatever else ended meanwhile goes in the same request.
            self.collect_ended(&work, &mut batch, &mut reporting);
        }
    }

    /// Moves the runs of detached steps that ended into `batch`.
    fn collect_ended(
        &mut self,
        work: &NodeWork,
        batch: &mut StepBatch,
        reporting: &mut Vec<Attempt>,
    ) {
        while let Some(joined) = self.detached.try_join_next() {
            if let Ok(end) = joined {
                self.ended.push(end);
            }
        }
        for (step, attempt, run) in std::mem::take(&mut self.ended) {
            self.running_detached.remove(&work.attempt(&step, attempt));
            record(work, &step, attempt, run, batch, reporting);
        }
    }

    /// Adds to `batch` the claims of the node's ready steps (counting those
    /// the batch's reports will make ready) and the inline steps with
    /// nothing to do, settled at once; and to `queue`
    /// the running ones this executor has not reported (a step claimed
    /// before the agent restarted, or one not finished yet).
    fn plan(
        &self,
        work: &NodeWork,
        started: &mut BTreeSet<String>,
        queue: &mut VecDeque<(String, u32)>,
        batch: &mut StepBatch,
        reporting: &[Attempt],
    ) {
        let ours = |step: &str| {
            work.owner_of(step)
                .is_some_and(|owner| self.workload.acts_for(owner))
        };
        for running in work.running() {
            if !ours(&running.name) {
                continue;
            }
            let attempt = work.attempt(&running.name, running.attempt);
            if started.contains(&running.name)
                || self.finished.contains(&attempt)
                || self.running_detached.contains(&attempt)
                || reporting.contains(&attempt)
            {
                continue;
            }
            started.insert(running.name.clone());
            queue.push_back((running.name, running.attempt));
        }
        // Steps that run with the workload to themselves are claimed one at
        // a time, so each is claimed when it starts (honest timings).
        let mut inline_claimed = queue.iter().any(|(s, _)| !self.workload.is_detached(s));
        // An inline step with nothing to do is claimed and completed in
        // this request, and so is the next, until one has work: each
        // saves a round trip of the pod's start.
        if !inline_claimed {
            loop {
                let next = work
                    .ready_after(&batch.completed())
                    .into_iter()
                    .find(|step| self.may_take_inline(work, started, step));
                let Some(step) = next else {
                    break;
                };
                let Some(settled) = self.workload.settled_at_once(&step, work) else {
                    break;
                };
                tracing::debug!(object = %self.key(), %step, note = ?settled.note, "step settled at once");
                started.insert(step.clone());
                batch.settle(work, &step, settled.note);
            }
        }
        // What the reports about to be sent make ready is claimed with them.
        for step in work.ready_after(&batch.completed()) {
            if !ours(&step)
                || started.contains(&step)
                || self.claimed.contains(&work.next_attempt(&step))
            {
                continue;
            }
            let detached = self.workload.is_detached(&step);
            if !detached && inline_claimed {
                continue;
            }
            inline_claimed |= !detached;
            batch.claim(work, &step);
        }
        // A request moving steps anyway takes along the claim, if ready by
        // then, of the next inline step that waits only on another owner's
        // step (the sandbox on IPAM's address, written while this node
        // claims the image): it then costs no round trip after that write.
        if !inline_claimed && batch.moves_a_step() {
            let riding = work
                .waiting_on_others_after(&batch.completed())
                .into_iter()
                .find(|step| self.may_take_inline(work, started, step));
            if let Some(step) = riding {
                batch.claim_if_ready(work, &step);
            }
        }
    }

    /// Whether `step` is an inline step of this workload's that this pass
    /// has not started and this executor has not claimed.
    fn may_take_inline(&self, work: &NodeWork, started: &BTreeSet<String>, step: &str) -> bool {
        work.owner_of(step)
            .is_some_and(|owner| self.workload.acts_for(owner))
            && !self.workload.is_detached(step)
            && !started.contains(step)
            && !self.claimed.contains(&work.next_attempt(step))
    }

    /// Sends `batch` (with the status when it changed) and returns the
    /// steps it claimed; `work` is then the fresh instance, which the
    /// workload remembers. A refused batch that also reports is sent again
    /// without its claims (they came from a stale view; the reports did
    /// not). `None`: nothing was applied (refused, or the API is away).
    async fn send(
        &mut self,
        batch: &mut StepBatch,
        reporting: &mut Vec<Attempt>,
        work: &mut NodeWork,
    ) -> Option<Vec<String>> {
        let key = self.key();
        let status = self
            .workload
            .status()
            .filter(|status| Some(status) != self.reported.as_ref());
        if let Some(status) = &status {
            batch.set_status(status);
        }
        let mut result = self.api.batch(&key, batch).await;
        if let Err(StepApiError::Refused(error)) = &result
            && batch.has_claims()
            && batch.has_reports()
        {
            tracing::debug!(object = %key, %error, "claims refused; reporting alone");
            *batch = batch.without_claims();
            result = self.api.batch(&key, batch).await;
        }
        let sent = std::mem::take(batch);
        match result {
            Ok(fresh) => {
                self.finished.extend(reporting.drain(..));
                // A claim if ready took its step when the fresh instance
                // runs the attempt it would start.
                let riding = sent.claimed_if_ready().filter(|step| {
                    let attempt = work.next_attempt(step).attempt;
                    fresh.runs_at(step, attempt)
                });
                let claimed: Vec<String> =
                    sent.claimed().chain(riding).map(str::to_string).collect();
                for step in claimed.iter().map(String::as_str).chain(sent.settled()) {
                    self.claimed.insert(work.next_attempt(step));
                }
                if sent.has_status() {
                    self.reported = status;
                }
                self.workload.remember(&fresh);
                *work = fresh;
                Some(claimed)
            }
            Err(error) => {
                tracing::debug!(object = %key, %error, "step request not applied");
                reporting.clear();
                None
            }
        }
    }

    /// Writes the node-owned status fields when they changed; on failure
    /// (API down) tries again at the next look.
    async fn report(&mut self) {
        let Some(status) = self.workload.status() else {
            return;
        };
        if self.reported.as_ref() == Some(&status) {
            return;
        }
        match self.api.put_status(&self.key(), &status).await {
            Ok(()) => self.reported = Some(status),
            Err(error) => {
                tracing::debug!(object = %self.key(), %error, "status not reported; will retry");
            }
        }
    }
}

/// Sleeps for `tick`, or forever.
async fn sleep_for(tick: Option<Duration>) {
    match tick {
        Some(tick) => tokio::time::sleep(tick).await,
        None => std::future::pending().await,
    }
}

/// Puts a step's outcome (and its log lines) in `batch`; a step not
/// finished yet stays running and reports nothing.
fn record(
    work: &NodeWork,
    step: &str,
    attempt: u32,
    run: StepRun,
    batch: &mut StepBatch,
    reporting: &mut Vec<Attempt>,
) {
    for line in run.log {
        batch.log(work, step, line);
    }
    match run.outcome {
        StepOutcome::Done(note) => batch.complete(work, step, note),
        StepOutcome::Failed(error) => batch.fail(work, step, error),
        StepOutcome::NotYet => return,
    }
    reporting.push(work.attempt(step, attempt));
}

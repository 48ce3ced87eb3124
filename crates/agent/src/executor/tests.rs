//! The executor's loop against a fake step API (the engine's own
//! transitions) and a fake workload that records what it ran.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use corral_api::Object;
use futures::future::BoxFuture;
use serde_json::{Map, Value, json};

use super::*;
use crate::steps::fake::{self, FakeApi};

const PLACE: &str = "scheduler/place";
const ADDRESS: &str = "ipam/assign-address";
const SANDBOX: &str = "node/create-sandbox";
const PULL: &str = "node/pull-image";
const VOLUMES: &str = "node/prepare-volumes";
const INIT: &str = "node/run-init-containers";
const START: &str = "node/start-containers";
const READY: &str = "node/await-readiness";

/// Runs whatever it is asked, checking the step was claimed first.
struct FakeWorkload {
    desired: Object,
    api: Arc<FakeApi>,
    /// Steps run, in order (detached ones when they start).
    runs: Arc<Mutex<Vec<String>>>,
    /// Outcomes other than `Done(None)`.
    outcomes: BTreeMap<String, StepRun>,
    detached: BTreeSet<String>,
    /// Steps that take a while (50 ms; inline ones in two halves, as a
    /// step awaiting two things in turn).
    slow: BTreeSet<String>,
    /// When each inline step's run ended.
    ended: Arc<Mutex<Vec<(String, tokio::time::Instant)>>>,
    /// Whether `await-readiness` is satisfied; supervision makes it so.
    ready: bool,
    ready_after_supervision: bool,
    status: Option<Map<String, Value>>,
    removed: Arc<Mutex<bool>>,
    /// Data changes handed to it, in order.
    data: Arc<Mutex<Vec<DataChange>>>,
    /// `None`: looks again only on news.
    tick: Option<std::time::Duration>,
    /// Lines of running steps not taken yet.
    running_log: Arc<Mutex<Vec<(String, String)>>>,
    /// Steps with nothing to do (settled at once), with their note.
    at_once: BTreeMap<String, Option<String>>,
}

impl FakeWorkload {
    fn new(api: &Arc<FakeApi>) -> Self {
        FakeWorkload {
            desired: api.object(),
            api: api.clone(),
            runs: Arc::default(),
            outcomes: BTreeMap::new(),
            detached: BTreeSet::new(),
            slow: BTreeSet::new(),
            ended: Arc::default(),
            ready: true,
            ready_after_supervision: false,
            status: None,
            removed: Arc::default(),
            data: Arc::default(),
            tick: Some(TICK),
            running_log: Arc::default(),
            at_once: BTreeMap::new(),
        }
    }

    fn outcome(&self, step: &str) -> StepRun {
        if step == READY && !self.ready {
            return StepOutcome::NotYet.into();
        }
        self.outcomes
            .get(step)
            .cloned()
            .unwrap_or_else(|| StepOutcome::Done(None).into())
    }

    fn start(&self, step: &str) {
        assert_eq!(
            self.api.step(step).0,
            "running",
            "{step} runs only once claimed"
        );
        self.runs.lock().unwrap().push(step.to_string());
    }
}

#[async_trait]
impl Workload for FakeWorkload {
    fn desired(&self) -> &Object {
        &self.desired
    }

    fn desired_mut(&mut self) -> &mut Object {
        &mut self.desired
    }

    async fn admit_without_workflow(&mut self) {
        self.runs
            .lock()
            .unwrap()
            .push("admit without workflow".into());
    }

    fn is_detached(&self, step: &str) -> bool {
        self.detached.contains(step)
    }

    fn detach(&mut self, step: &str, _work: &NodeWork) -> BoxFuture<'static, StepRun> {
        self.start(step);
        let run = self.outcome(step);
        let slow = self.slow.contains(step);
        Box::pin(async move {
            if slow {
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
            tokio::task::yield_now().await;
            run
        })
    }

    fn settled_at_once(&self, step: &str, _work: &NodeWork) -> Option<Settled> {
        let note = self.at_once.get(step)?.clone();
        Some(Settled { note })
    }

    async fn run_step(&mut self, step: &str, _work: &NodeWork) -> StepRun {
        self.start(step);
        if self.slow.contains(step) {
            tokio::time::sleep(std::time::Duration::from_millis(25)).await;
            tokio::time::sleep(std::time::Duration::from_millis(25)).await;
        }
        let ended = (step.to_string(), tokio::time::Instant::now());
        self.ended.lock().unwrap().push(ended);
        self.outcome(step)
    }

    async fn supervise(&mut self) -> bool {
        let changed = self.ready_after_supervision && !self.ready;
        self.ready |= self.ready_after_supervision;
        changed
    }

    fn status(&self) -> Option<Map<String, Value>> {
        self.status.clone()
    }

    async fn remove(&mut self) {
        *self.removed.lock().unwrap() = true;
    }

    async fn data_changed(&mut self, change: &DataChange) {
        self.data.lock().unwrap().push(change.clone());
    }

    fn tick(&self) -> Option<std::time::Duration> {
        self.tick
    }

    fn running_log(&mut self) -> Vec<(String, String)> {
        std::mem::take(&mut *self.running_log.lock().unwrap())
    }
}

fn executor(api: &Arc<FakeApi>, workload: FakeWorkload) -> Executor<FakeWorkload> {
    Executor::new(workload, api.clone() as Arc<dyn StepApi>)
}

/// Admits until nothing runs any more: what the run loop does as steps
/// running on their own end.
async fn settle(executor: &mut Executor<FakeWorkload>) {
    loop {
        executor.admit().await;
        match executor.detached.join_next().await {
            Some(Ok(end)) => executor.ended.push(end),
            Some(Err(error)) => panic!("a step task failed: {error}"),
            None => return,
        }
    }
}

fn runs(executor: &Executor<FakeWorkload>) -> Vec<String> {
    executor.workload().runs.lock().unwrap().clone()
}

fn pod_api(done: &[&str]) -> Arc<FakeApi> {
    Arc::new(FakeApi::new(fake::pod("start", done)))
}

#[tokio::test]
async fn a_pod_start_runs_every_node_step_once_after_claiming_it() {
    let api = pod_api(&[PLACE, ADDRESS]);
    let mut executor = executor(&api, FakeWorkload::new(&api));
    executor.reconcile().await;
    assert_eq!(
        runs(&executor),
        [SANDBOX, PULL, VOLUMES, INIT, START, READY],
        "graph order, one at a time"
    );
    for step in [SANDBOX, PULL, VOLUMES, INIT, START, READY] {
        assert_eq!(api.step(step), ("done", 1), "{step}");
    }
    // Looking again does nothing: everything is reported.
    let requests = api.requests().len();
    executor.reconcile().await;
    assert_eq!(api.requests().len(), requests);
    assert_eq!(runs(&executor).len(), 6);
}

#[tokio::test]
async fn steps_that_run_on_their_own_are_claimed_together_and_run_beside_one_inline_step() {
    let api = pod_api(&[PLACE, ADDRESS]);
    let mut workload = FakeWorkload::new(&api);
    workload.detached = [PULL.to_string(), VOLUMES.to_string()].into();
    let mut executor = executor(&api, workload);
    settle(&mut executor).await;
    let actions = api.actions();
    assert_eq!(
        actions[0],
        [
            format!("claim {SANDBOX}"),
            format!("claim {PULL}"),
            format!("claim {VOLUMES}")
        ],
        "one request claims the three ready steps: {actions:?}"
    );
    assert!(
        actions
            .iter()
            .flatten()
            .filter(|a| a.starts_with("claim"))
            .count()
            == 6,
        "{actions:?}"
    );
    assert_eq!(api.step(READY), ("done", 1));
}

#[tokio::test]
async fn a_completion_and_the_claim_of_the_step_it_makes_ready_share_a_request() {
    let api = pod_api(&[PLACE, ADDRESS]);
    let mut executor = executor(&api, FakeWorkload::new(&api));
    executor.admit().await;
    let expected: Vec<Vec<String>> = [
        vec![format!("claim {SANDBOX}")],
        vec![format!("complete {SANDBOX}"), format!("claim {PULL}")],
        vec![format!("complete {PULL}"), format!("claim {VOLUMES}")],
        vec![format!("complete {VOLUMES}"), format!("claim {INIT}")],
        vec![format!("complete {INIT}"), format!("claim {START}")],
        vec![format!("complete {START}"), format!("claim {READY}")],
        vec![format!("complete {READY}")],
    ]
    .into();
    assert_eq!(api.actions(), expected);
}

#[tokio::test]
async fn steps_with_nothing_to_do_are_claimed_and_completed_with_the_report_before_them() {
    let api = pod_api(&[PLACE, ADDRESS]);
    let mut workload = FakeWorkload::new(&api);
    workload.at_once = [
        (INIT.to_string(), Some("no init containers".to_string())),
        (READY.to_string(), None),
    ]
    .into();
    let mut executor = executor(&api, workload);
    executor.admit().await;
    let expected: Vec<Vec<String>> = [
        vec![format!("claim {SANDBOX}")],
        vec![format!("complete {SANDBOX}"), format!("claim {PULL}")],
        vec![format!("complete {PULL}"), format!("claim {VOLUMES}")],
        vec![
            format!("complete {VOLUMES}"),
            format!("claim {INIT}"),
            format!("complete {INIT}"),
            format!("claim {START}"),
        ],
        vec![
            format!("complete {START}"),
            format!("claim {READY}"),
            format!("complete {READY}"),
        ],
    ]
    .into();
    assert_eq!(api.actions(), expected);
    assert_eq!(runs(&executor), [SANDBOX, PULL, VOLUMES, START]);
    assert_eq!(api.step(INIT), ("done", 1));
    assert_eq!(api.step(READY), ("done", 1));
    // Nothing is settled twice: a look at a stale view (INIT still ready
    // in it) sends nothing.
    let requests = api.requests().len();
    let stale = fake::pod("start", &[PLACE, ADDRESS, SANDBOX, PULL, VOLUMES]);
    let stale_work = NodeWork::for_revision(api.as_ref(), &stale, 1).await;
    assert_eq!(stale_work.expect("an instance").ready(), [INIT]);
    executor.workload.set_desired(stale);
    executor.admit().await;
    assert_eq!(api.requests().len(), requests);
}

#[tokio::test]
async fn a_settled_step_whose_claim_is_refused_is_not_taken_for_done() {
    let api = pod_api(&[PLACE, ADDRESS]);
    api.refuse_claims_of(START);
    let mut workload = FakeWorkload::new(&api);
    workload.at_once = [(INIT.to_string(), None)].into();
    let mut executor = executor(&api, workload);
    executor.admit().await;
    // The refused request settled INIT and claimed START: the volumes'
    // report went again alone, INIT is still ready for a later look.
    assert_eq!(api.step(VOLUMES), ("done", 1));
    assert_eq!(api.step(INIT), ("ready", 0));
    assert!(!executor.claimed.iter().any(|a| a.step == INIT));
}

#[tokio::test]
async fn a_refused_claim_costs_a_request_not_a_report() {
    let api = pod_api(&[PLACE, ADDRESS]);
    api.refuse_claims_of(START);
    let mut executor = executor(&api, FakeWorkload::new(&api));
    executor.admit().await;
    assert_eq!(api.step(INIT), ("done", 1), "reported alone");
    assert_eq!(api.step(START), ("ready", 0));
    let actions = api.actions();
    let refused = actions
        .iter()
        .position(|r| r.contains(&format!("claim {START}")))
        .unwrap();
    assert_eq!(actions[refused + 1], [format!("complete {INIT}")]);
    assert!(!runs(&executor).contains(&START.to_string()));
}

#[tokio::test]
async fn a_third_partys_step_before_the_containers_is_waited_for() {
    // Ready only after the node's volumes: the executor's guess does not
    // claim the containers with the volumes' report.
    let mut definition = corral_workflow::builtin(corral_api::Kind::Pod, "start").unwrap();
    let mut sidecar = definition.steps[0].clone();
    sidecar.name = "acme/inject".into();
    sidecar.owner = "acme".into();
    sidecar.requires = vec![VOLUMES.into()];
    sidecar.wanted_by = None;
    sidecar.before = vec!["containers".into()];
    definition.steps.push(sidecar);
    let object = fake::object_with(&definition, &[PLACE, ADDRESS]);
    let api = Arc::new(FakeApi::with_definitions(object, &[definition]));
    let mut executor = executor(&api, FakeWorkload::new(&api));
    executor.admit().await;
    assert_eq!(api.step(VOLUMES), ("done", 1));
    assert_eq!(api.step(START).0, "waiting", "waits for acme/inject");
    api.finish_as_owner("acme/inject");
    executor.workload.set_desired(api.object());
    executor.admit().await;
    assert_eq!(api.step(READY), ("done", 1));
}

#[tokio::test]
async fn steps_that_end_beside_a_slow_one_are_reported_when_they_end() {
    let api = pod_api(&[PLACE, ADDRESS]);
    let mut workload = FakeWorkload::new(&api);
    workload.detached = [PULL.to_string(), VOLUMES.to_string()].into();
    workload.slow = [SANDBOX.to_string()].into();
    let mut executor = executor(&api, workload);
    settle(&mut executor).await;
    let actions = api.actions();
    let position = |action: String| {
        actions
            .iter()
            .position(|request| request.contains(&action))
            .unwrap_or_else(|| panic!("{action} in {actions:?}"))
    };
    assert!(
        position(format!("complete {PULL}")) < position(format!("complete {SANDBOX}")),
        "{actions:?}"
    );
    assert!(
        position(format!("complete {VOLUMES}")) < position(format!("complete {SANDBOX}")),
        "{actions:?}"
    );
    assert_eq!(api.step(READY), ("done", 1));
}

#[tokio::test(start_paused = true)]
async fn an_inline_step_goes_on_while_the_report_of_one_beside_it_is_sent() {
    let api = pod_api(&[PLACE, ADDRESS]);
    api.delay_batches(std::time::Duration::from_millis(100));
    let mut workload = FakeWorkload::new(&api);
    workload.detached = [PULL.to_string(), VOLUMES.to_string()].into();
    workload.slow = [SANDBOX.to_string()].into();
    let ended = workload.ended.clone();
    let mut executor = executor(&api, workload);
    let began = tokio::time::Instant::now();
    settle(&mut executor).await;
    // The claim is answered at 100 ms; the image and volumes end at once
    // and their report is answered at 200 ms. The sandbox (two 25 ms
    // waits from 100 ms) is not held up by that report.
    let sandbox = ended
        .lock()
        .unwrap()
        .iter()
        .find(|(step, _)| step == SANDBOX)
        .map(|(_, at)| *at - began)
        .expect("the sandbox ran");
    assert_eq!(sandbox, std::time::Duration::from_millis(150));
    let actions = api.actions();
    let mut beside = actions[1].clone();
    beside.sort();
    assert_eq!(
        beside,
        [format!("complete {VOLUMES}"), format!("complete {PULL}")],
        "reported beside the sandbox: {actions:?}"
    );
    assert!(
        actions[2].contains(&format!("complete {SANDBOX}")),
        "{actions:?}"
    );
    assert_eq!(api.step(READY), ("done", 1));
}

#[tokio::test]
async fn news_is_acted_on_while_a_step_runs_on_its_own() {
    let api = pod_api(&[PLACE]);
    let mut workload = FakeWorkload::new(&api);
    workload.detached = [PULL.to_string(), VOLUMES.to_string()].into();
    workload.slow = [PULL.to_string()].into();
    let mut executor = executor(&api, workload);
    executor.admit().await;
    assert_eq!(api.step(PULL), ("running", 1));
    // The address arrives while the image is still being pulled.
    api.finish_as_owner(ADDRESS);
    executor.workload.set_desired(api.object());
    executor.admit().await;
    assert_eq!(api.step(SANDBOX), ("done", 1), "not held up by the pull");
    assert_eq!(api.step(PULL), ("running", 1));
    settle(&mut executor).await;
    assert_eq!(api.step(READY), ("done", 1));
    let pulls = runs(&executor).iter().filter(|s| *s == PULL).count();
    assert_eq!(pulls, 1);
}

#[tokio::test]
async fn lines_of_a_running_step_are_sent_before_it_ends() {
    let api = pod_api(&[PLACE]);
    let mut workload = FakeWorkload::new(&api);
    workload.detached = [PULL.to_string(), VOLUMES.to_string()].into();
    workload.slow = [PULL.to_string()].into();
    let lines = workload.running_log.clone();
    let mut executor = executor(&api, workload);
    executor.admit().await;
    assert_eq!(api.step(PULL), ("running", 1));
    lines.lock().unwrap().push((
        PULL.to_string(),
        "layer sha256:0123… 1.0/2.0 MiB".to_string(),
    ));
    executor.admit().await;
    let actions = api.actions();
    let last = actions.last().expect("a request");
    assert_eq!(last, &[format!("log {PULL}")], "{actions:?}");
    let sent = api.requests().last().expect("a request").actions[0].clone();
    assert_eq!(
        sent.message.as_deref(),
        Some("layer sha256:0123… 1.0/2.0 MiB")
    );
    assert_eq!(api.step(PULL), ("running", 1), "the log came first");
    // Nothing new: no request.
    let requests = api.requests().len();
    executor.admit().await;
    assert_eq!(api.requests().len(), requests);
    settle(&mut executor).await;
    assert_eq!(api.step(PULL), ("done", 1));
}

#[tokio::test]
async fn inline_steps_ready_together_are_claimed_one_at_a_time() {
    let api = pod_api(&[PLACE, ADDRESS]);
    let mut executor = executor(&api, FakeWorkload::new(&api));
    executor.admit().await;
    let actions = api.actions();
    assert_eq!(actions[0], [format!("claim {SANDBOX}")], "{actions:?}");
    for request in &actions {
        let claims = request.iter().filter(|a| a.starts_with("claim")).count();
        assert!(claims <= 1, "{actions:?}");
    }
}

#[tokio::test]
async fn log_lines_and_the_outcome_go_in_one_request() {
    let api = pod_api(&[PLACE, ADDRESS]);
    let mut workload = FakeWorkload::new(&api);
    workload.outcomes.insert(
        SANDBOX.into(),
        StepRun {
            outcome: StepOutcome::Failed("no room".into()),
            log: vec!["tried".into(), "gave up".into()],
        },
    );
    let mut executor = executor(&api, workload);
    executor.admit().await;
    let actions = api.actions();
    assert!(
        actions.iter().any(|request| request.starts_with(&[
            format!("log {SANDBOX}"),
            format!("log {SANDBOX}"),
            format!("fail {SANDBOX}")
        ])),
        "{actions:?}"
    );
    assert_eq!(api.step(SANDBOX).0, "failed");
    let request = api
        .requests()
        .into_iter()
        .find(|r| r.actions.iter().any(|a| a.error.is_some()))
        .expect("the failure was reported");
    assert_eq!(request.actions[2].error.as_deref(), Some("no room"));
}

#[tokio::test]
async fn a_stale_view_never_runs_a_finished_step_again() {
    let api = pod_api(&[PLACE, ADDRESS]);
    let before = api.object();
    let with_sandbox_claimed = view_with_claimed(&api, SANDBOX);
    let mut executor = executor(&api, FakeWorkload::new(&api));
    executor.admit().await;
    assert_eq!(runs(&executor).len(), 6);
    let requests = api.requests().len();
    // Older watch events arrive after the fresh instances the API returned:
    // every node step ready or waiting again, or the sandbox still running
    // with the others ready.
    for stale in [before, with_sandbox_claimed] {
        executor.workload.set_desired(stale);
        executor.reconcile().await;
        assert_eq!(runs(&executor).len(), 6, "nothing ran twice");
        assert_eq!(api.requests().len(), requests, "nothing was claimed again");
    }
}

/// `api`'s object as it would look with `step` claimed by the node.
fn view_with_claimed(api: &Arc<FakeApi>, step: &str) -> Object {
    let other = FakeApi::new(api.object());
    let work = futures::executor::block_on(NodeWork::for_revision(&other, &other.object(), 1))
        .expect("an instance");
    let mut batch = crate::steps::StepBatch::default();
    batch.claim(&work, step);
    let key = other.object().key();
    futures::executor::block_on(other.batch(&key, &batch)).expect("claimable");
    other.object()
}

#[tokio::test]
async fn with_the_api_away_a_step_is_run_again_and_reported_once_it_is_back() {
    let api = pod_api(&[PLACE, ADDRESS]);
    api.go_away_after(1);
    let mut executor = executor(&api, FakeWorkload::new(&api));
    executor.reconcile().await;
    assert_eq!(api.step(SANDBOX), ("running", 1), "claimed, not reported");
    api.set_unavailable(false);
    executor.reconcile().await;
    assert_eq!(api.step(SANDBOX), ("done", 1), "resumed and reported");
    assert_eq!(api.step(READY), ("done", 1));
    let sandbox_runs = runs(&executor).iter().filter(|s| *s == SANDBOX).count();
    assert_eq!(
        sandbox_runs, 2,
        "run again (steps are idempotent), claimed once"
    );
}

#[tokio::test]
async fn a_step_waiting_on_supervision_finishes_in_the_same_look() {
    let api = pod_api(&[PLACE, ADDRESS]);
    let mut workload = FakeWorkload::new(&api);
    workload.ready = false;
    let mut executor = executor(&api, workload);
    executor.reconcile().await;
    assert_eq!(api.step(READY), ("running", 1), "not ready yet");
    executor.workload.ready_after_supervision = true;
    executor.reconcile().await;
    assert_eq!(api.step(READY), ("done", 1), "admitted after supervision");
    let ready_runs = runs(&executor).iter().filter(|s| *s == READY).count();
    assert_eq!(ready_runs, 3, "looked at once per admission pass");
}

#[tokio::test]
async fn status_is_written_on_change_only_and_rides_along_with_steps() {
    let api = pod_api(&[PLACE, ADDRESS]);
    let mut workload = FakeWorkload::new(&api);
    workload.status = Some(json!({"phase": "Pending"}).as_object().cloned().unwrap());
    let mut executor = executor(&api, workload);
    executor.reconcile().await;
    assert!(
        api.requests()[0].status.contains_key("phase"),
        "the first request carries the status"
    );
    assert!(api.status_writes().is_empty(), "no write of its own");
    executor.workload.status = Some(json!({"phase": "Running"}).as_object().cloned().unwrap());
    executor.reconcile().await;
    executor.reconcile().await;
    assert_eq!(api.status_writes().len(), 1, "one write for one change");
    assert_eq!(api.object().status["phase"], "Running");
}

#[tokio::test]
async fn a_revision_without_a_workflow_is_admitted_directly() {
    let api = pod_api(&[PLACE, ADDRESS]);
    let mut workload = FakeWorkload::new(&api);
    workload.desired.status = json!({});
    let mut executor = executor(&api, workload);
    executor.reconcile().await;
    assert_eq!(runs(&executor), ["admit without workflow"]);
    assert!(api.requests().is_empty());
}

#[tokio::test]
async fn steps_of_another_owner_wait_and_run_once_the_view_shows_them_ready() {
    let api = pod_api(&[PLACE]);
    let mut executor = executor(&api, FakeWorkload::new(&api));
    executor.admit().await;
    assert!(!runs(&executor).contains(&SANDBOX.to_string()));
    api.finish_as_owner(ADDRESS);
    executor.workload.set_desired(api.object());
    executor.admit().await;
    assert_eq!(api.step(READY), ("done", 1));
}

#[tokio::test]
async fn a_step_waiting_on_another_owner_is_claimed_if_ready_with_the_next_request() {
    let api = pod_api(&[PLACE]);
    let mut workload = FakeWorkload::new(&api);
    workload.detached = [PULL.to_string(), VOLUMES.to_string()].into();
    // IPAM writes the address after this view was taken, before the
    // node's request lands.
    api.finish_as_owner(ADDRESS);
    let mut executor = executor(&api, workload);
    settle(&mut executor).await;
    let actions = api.actions();
    assert_eq!(
        actions[0],
        [
            format!("claim {PULL}"),
            format!("claim {VOLUMES}"),
            format!("claim-if-ready {SANDBOX}")
        ],
        "{actions:?}"
    );
    assert_eq!(api.step(SANDBOX), ("done", 1), "taken by the riding claim");
    assert!(
        !actions[1..]
            .iter()
            .flatten()
            .any(|a| a.contains(SANDBOX) && a.starts_with("claim")),
        "claimed once: {actions:?}"
    );
    assert_eq!(api.step(READY), ("done", 1));
}

#[tokio::test]
async fn a_claim_if_ready_of_a_step_still_waiting_takes_nothing() {
    let api = pod_api(&[PLACE]);
    let mut workload = FakeWorkload::new(&api);
    workload.detached = [PULL.to_string(), VOLUMES.to_string()].into();
    let mut executor = executor(&api, workload);
    settle(&mut executor).await;
    let actions = api.actions();
    assert_eq!(
        actions[0].last(),
        Some(&format!("claim-if-ready {SANDBOX}"))
    );
    assert_eq!(api.step(SANDBOX), ("waiting", 0));
    assert!(!runs(&executor).contains(&SANDBOX.to_string()));
    // Nothing to report, nothing to send: no request of a lone riding claim.
    let requests = api.requests().len();
    executor.admit().await;
    assert_eq!(api.requests().len(), requests, "{:?}", api.actions());
    api.finish_as_owner(ADDRESS);
    executor.workload.set_desired(api.object());
    settle(&mut executor).await;
    assert_eq!(api.step(SANDBOX), ("done", 1));
    assert_eq!(api.step(READY), ("done", 1));
}

#[tokio::test]
async fn the_loop_wakes_when_a_step_running_on_its_own_ends() {
    let api = pod_api(&[PLACE, ADDRESS]);
    let mut workload = FakeWorkload::new(&api);
    workload.detached = [PULL.to_string(), VOLUMES.to_string()].into();
    workload.slow = [PULL.to_string()].into();
    workload.tick = None;
    let (sender, receiver) = mpsc::channel(4);
    let task = tokio::spawn(executor(&api, workload).run(receiver));
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    while api.step(READY).0 != "done" {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no progress without news: {:?}",
            api.actions()
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    drop(sender);
    task.await.unwrap();
}

#[tokio::test]
async fn removal_and_shutdown_end_the_loop() {
    let api = pod_api(&[PLACE, ADDRESS]);
    let workload = FakeWorkload::new(&api);
    let removed = workload.removed.clone();
    let (sender, receiver) = mpsc::channel(4);
    let task = tokio::spawn(executor(&api, workload).run(receiver));
    sender
        .send(Message::Desired(Box::new(api.object())))
        .await
        .unwrap();
    sender.send(Message::Remove).await.unwrap();
    task.await.unwrap();
    assert!(*removed.lock().unwrap());

    let workload = FakeWorkload::new(&api);
    let removed = workload.removed.clone();
    let (sender, receiver) = mpsc::channel(4);
    let task = tokio::spawn(executor(&api, workload).run(receiver));
    drop(sender);
    task.await.unwrap();
    assert!(
        !*removed.lock().unwrap(),
        "shutdown leaves everything running"
    );
}

#[tokio::test]
async fn data_changes_are_never_dropped_for_a_newer_view() {
    let api = pod_api(&[PLACE, ADDRESS]);
    let mut workload = FakeWorkload::new(&api);
    workload.tick = None;
    let data = workload.data.clone();
    let change = |name: &str, revision| DataChange {
        namespace: "default".into(),
        source: corral_api::kinds::DataRef::secret(name),
        revision,
    };
    let (sender, receiver) = mpsc::channel(8);
    // Queued before the loop looks: drained together with the views.
    sender.send(Message::Data(change("db", 2))).await.unwrap();
    sender
        .send(Message::Desired(Box::new(api.object())))
        .await
        .unwrap();
    sender.send(Message::Data(change("tls", 5))).await.unwrap();
    sender
        .send(Message::Desired(Box::new(api.object())))
        .await
        .unwrap();
    let task = tokio::spawn(executor(&api, workload).run(receiver));
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    while data.lock().unwrap().len() < 2 {
        assert!(tokio::time::Instant::now() < deadline, "changes lost");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    drop(sender);
    task.await.unwrap();
    assert_eq!(*data.lock().unwrap(), [change("db", 2), change("tls", 5)]);
}

//! `apply --wait` and `delete --wait`: follows an object's newest workflow
//! instance through watch until it succeeds (for a deletion: until the
//! object is gone), fails or the deadline passes. In a terminal the
//! `why` view is redrawn in place every second; otherwise one line is
//! printed per step transition.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::time::Duration;

use anyhow::{Context, bail};
use chrono::{TimeDelta, Utc};
use corral_api::watch::EventType;
use corral_api::workflow::{StepKind, StepLogEntry, StepState, WorkflowInstance, WorkflowOutcome};
use corral_api::{Object, ObjectKey};
use corral_client::Client;
use futures::StreamExt;
use tokio::time::Instant;

use super::{Hydrator, display_name};

/// How often the view is refreshed (and the object re-read when the watch
/// is gone).
const REFRESH: Duration = Duration::from_secs(1);

/// Follows the newest instance of `stored` (as the apply returned it) until
/// it finishes or `deadline`. Errors (so the command exits non-zero) when
/// it fails, is cancelled, or the deadline passes, with the `why` verdict.
pub async fn follow(
    client: &Client,
    stored: &Object,
    deadline: Instant,
    live: bool,
) -> anyhow::Result<()> {
    follow_until(client, stored, deadline, live, Until::Finished).await
}

/// When following ends well.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Until {
    /// The instance succeeded.
    Finished,
    /// The object is gone (its stop instance succeeded and the server
    /// removed it).
    Gone,
}

/// [`follow`], ending as `until` says.
pub async fn follow_until(
    client: &Client,
    stored: &Object,
    deadline: Instant,
    live: bool,
    until: Until,
) -> anyhow::Result<()> {
    let key = stored.key();
    let name = display_name(&key);
    let mut hydrator = Hydrator::new(client);
    let Some(mut instance) = hydrator.instance(stored, None).await? else {
        return Ok(()); // a kind without a lifecycle: nothing to wait for
    };
    let mut view = View::new(&name, live);
    view.header(&instance);
    let mut watch = Some(open_watch(client, &key, stored.metadata.resource_version).await?);
    let mut refresh = tokio::time::interval(REFRESH);
    loop {
        let now = Utc::now();
        let mut current = instance.clone();
        corral_workflow::tick(&mut current, now);
        let lines = super::running_lines(client, &key, &current).await;
        view.show(&current, &lines)?;
        let gone_next = until == Until::Gone && current.outcome == WorkflowOutcome::Succeeded;
        if current.outcome != WorkflowOutcome::Running && !gone_next {
            return view.finish(&current);
        }
        tokio::select! {
            () = tokio::time::sleep_until(deadline) => {
                let verdict = verdict_line(&name, &current);
                view.close(&current)?;
                bail!("gave up waiting: {verdict}");
            }
            _ = refresh.tick() => {
                if watch.is_none() {
                    let object = match client.get(&key).await {
                        Err(error) if until == Until::Gone && error.status() == Some(404) => {
                            println!("{name} deleted: its {} workflow {} finished", instance.workflow, instance.id);
                            return Ok(());
                        }
                        other => other?,
                    };
                    instance = find(&mut hydrator, &object, &instance.id, &name).await?;
                }
            }
            event = next_event(&mut watch) => {
                match event {
                    Some(Ok(event)) if event.event_type == EventType::Deleted => {
                        if until == Until::Gone {
                            instance.outcome = WorkflowOutcome::Succeeded;
                            view.close(&instance)?;
                            println!("{name} deleted: its {} workflow {} finished", instance.workflow, instance.id);
                            return Ok(());
                        }
                        bail!("{name} was deleted while waiting for it");
                    }
                    Some(Ok(event)) => {
                        match find(&mut hydrator, &event.object, &instance.id, &name).await {
                            Ok(found) => instance = found,
                            // A finished stop instance is replayed from
                            // the object, which may be gone already.
                            Err(error) if until == Until::Gone && is_not_found(&error) => {
                                println!("{name} deleted: its {} workflow {} finished", instance.workflow, instance.id);
                                return Ok(());
                            }
                            Err(error) => return Err(error),
                        }
                    }
                    // The watch ended: poll on the refresh tick instead.
                    Some(Err(_)) | None => watch = None,
                }
            }
        }
    }
}

type Events = std::pin::Pin<
    Box<
        dyn futures::Stream<
                Item = Result<corral_api::watch::WatchEvent, corral_client::ClientError>,
            > + Send,
    >,
>;

async fn open_watch(client: &Client, key: &ObjectKey, after: u64) -> anyhow::Result<Events> {
    let namespace = (!key.namespace.is_empty()).then_some(key.namespace.as_str());
    let stream = client
        .watch(key.kind, namespace, Some(&key.name), after)
        .await
        .with_context(|| format!("cannot watch {key}"))?;
    Ok(Box::pin(stream))
}

/// The next watch event, or never when there is no watch.
async fn next_event(
    watch: &mut Option<Events>,
) -> Option<Result<corral_api::watch::WatchEvent, corral_client::ClientError>> {
    match watch {
        Some(stream) => stream.next().await,
        None => std::future::pending().await,
    }
}

/// Whether `error` is the API's 404.
fn is_not_found(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause
            .downcast_ref::<corral_client::ClientError>()
            .is_some_and(|error| error.status() == Some(404))
    })
}

/// The followed instance in a newer copy of the object.
async fn find(
    hydrator: &mut Hydrator<'_>,
    object: &Object,
    id: &str,
    name: &str,
) -> anyhow::Result<WorkflowInstance> {
    hydrator.instance(object, Some(id)).await?.with_context(|| {
        format!("{name}: workflow instance {id} is gone (a newer operation replaced it)")
    })
}

fn verdict_line(name: &str, instance: &WorkflowInstance) -> String {
    let stuck = TimeDelta::seconds(corral_workflow::DEFAULT_STUCK_AFTER_SECS);
    let verdict = corral_workflow::verdict(instance, Utc::now(), stuck);
    corral_workflow::verdict_line(name, instance, &verdict)
}

/// What has been printed so far.
struct View<'a> {
    name: &'a str,
    live: bool,
    /// Lines of the last live frame, to move back over.
    drawn: usize,
    /// Each step's last printed phase and detail (plain mode).
    seen: HashMap<String, String>,
}

impl<'a> View<'a> {
    fn new(name: &'a str, live: bool) -> Self {
        View {
            name,
            live,
            drawn: 0,
            seen: HashMap::new(),
        }
    }

    fn header(&self, instance: &WorkflowInstance) {
        if !self.live {
            println!(
                "{}: following {} workflow {} (revision {})",
                self.name, instance.workflow, instance.id, instance.revision
            );
        }
    }

    /// Draws the instance; `lines` are the newest lines of running steps
    /// (a pull's progress), shown under the frame, or printed once each.
    fn show(
        &mut self,
        instance: &WorkflowInstance,
        lines: &BTreeMap<String, StepLogEntry>,
    ) -> anyhow::Result<()> {
        if self.live {
            let mut frame = corral_workflow::why_text(self.name, instance, Utc::now());
            frame.push_str(&super::running_lines_text(lines));
            let mut out = std::io::stdout().lock();
            if self.drawn > 0 {
                // Back to the first line of the last frame, and clear below.
                write!(out, "\x1b[{}F\x1b[J", self.drawn)?;
            }
            write!(out, "{frame}")?;
            out.flush()?;
            self.drawn = frame.lines().count();
            return Ok(());
        }
        for step in &instance.steps {
            let line = transition(step);
            let name = &step.definition.name;
            if self.seen.get(name) == Some(&line) {
                continue;
            }
            let first_sight = !self.seen.contains_key(name);
            self.seen.insert(name.clone(), line.clone());
            if first_sight && matches!(step.state, StepState::Waiting { .. }) {
                continue;
            }
            println!("{} {}: {name} {line}", self.name, instance.id);
        }
        for (name, entry) in lines {
            let key = format!("{name}\u{0}line");
            if self.seen.get(&key) == Some(&entry.message) {
                continue;
            }
            self.seen.insert(key, entry.message.clone());
            println!("{} {}: {name}: {}", self.name, instance.id, entry.message);
        }
        Ok(())
    }

    /// Leaves the final frame on screen; in plain mode prints `why` for a
    /// failure.
    fn close(&self, instance: &WorkflowInstance) -> anyhow::Result<()> {
        if !self.live && instance.outcome != WorkflowOutcome::Succeeded {
            print!(
                "{}",
                corral_workflow::why_text(self.name, instance, Utc::now())
            );
        }
        std::io::stdout().flush()?;
        Ok(())
    }

    fn finish(&self, instance: &WorkflowInstance) -> anyhow::Result<()> {
        self.close(instance)?;
        let verdict = verdict_line(self.name, instance);
        if instance.outcome == WorkflowOutcome::Succeeded {
            println!("{verdict}");
            Ok(())
        } else {
            bail!("{verdict}")
        }
    }
}

/// One step's state as a plain line: `running, claimed by acme-storage`.
fn transition(step: &corral_api::workflow::StepInstance) -> String {
    let owner = &step.definition.owner;
    match &step.state {
        StepState::Waiting { on } if on.is_empty() => "waiting".into(),
        StepState::Waiting { on } => format!("waiting on {}", on.join(", ")),
        StepState::Ready { .. } => format!("ready, for {owner} to claim"),
        StepState::Running {
            claimed_by,
            attempt,
            ..
        } => format!("running (attempt {attempt}, claimed by {claimed_by})"),
        StepState::Done { .. } if step.definition.kind == StepKind::Target => "reached".into(),
        StepState::Done {
            started,
            finished,
            note,
            ..
        } => {
            let took = corral_workflow::format_duration(*finished - *started);
            match note {
                Some(note) => format!("done in {took}: {note}"),
                None => format!("done in {took}"),
            }
        }
        StepState::Failed {
            error,
            next_retry_at,
            ..
        } => match next_retry_at {
            Some(_) => format!("failed, will retry: {error}"),
            None => format!("failed: {error}"),
        },
        StepState::TimedOut { next_retry_at, .. } => match next_retry_at {
            Some(_) => "timed out, will retry".into(),
            None => "timed out".into(),
        },
        StepState::Blocked {
            dependency, cause, ..
        } if dependency == cause => format!("blocked: required {dependency} failed"),
        StepState::Blocked {
            dependency, cause, ..
        } => format!("blocked: {dependency} is blocked by failed {cause}"),
    }
}

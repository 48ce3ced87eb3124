//! Workflow commands: `why`, `analyze blame|critical-chain|dot`,
//! `logs --steps`, `retry`, and the follower behind `apply --wait`. They fetch the
//! object and render with `corral_workflow`'s pure renderers, with `now` the
//! client's clock.

mod logs;
mod retry;
mod wait;
mod why;
mod why_fence;
mod why_job;
mod why_pd;
mod why_pnd;

pub use logs::{LogsArgs, logs};
pub use retry::{RetryArgs, retry};
pub use wait::{Until, follow, follow_until};
pub(crate) use why::unhealthy_now;
pub use why::{AnalyzeArgs, WhyArgs, analyze, why};

use std::collections::{BTreeMap, HashMap};

use anyhow::{Context, bail};
use corral_api::workflow::{
    StepLogEntry, StepState, StoredWorkflows, WorkflowInstance, WorkflowOutcome,
};
use corral_api::{Kind, Object, ObjectKey};
use corral_client::{Client, StepLogQuery};
use corral_workflow::WorkflowDefinition;

/// How `why` and friends name an object: `pod/web`, `vm/builder`.
pub fn display_name(key: &ObjectKey) -> String {
    format!("{}/{}", key.kind.short(), key.name)
}

/// Joins the instances objects store with their definitions, fetching
/// each definition once.
pub struct Hydrator<'a> {
    client: &'a Client,
    definitions: HashMap<String, WorkflowDefinition>,
}

impl<'a> Hydrator<'a> {
    pub fn new(client: &'a Client) -> Self {
        Hydrator {
            client,
            definitions: HashMap::new(),
        }
    }

    /// The instance `id` of `object` (the newest without one), whole. A
    /// finished instance, whose steps the object no longer keeps, comes from
    /// the server, which replays its step log.
    pub async fn instance(
        &mut self,
        object: &Object,
        id: Option<&str>,
    ) -> anyhow::Result<Option<WorkflowInstance>> {
        let stored = StoredWorkflows::of(&object.status)
            .with_context(|| format!("{}: status.workflow is unreadable", object.key()))?;
        let found = match id {
            Some(id) => stored.instances.iter().find(|i| i.id == id),
            None => stored.latest(),
        };
        let Some(found) = found else {
            return Ok(None);
        };
        if found.steps.is_empty() && found.outcome != WorkflowOutcome::Running {
            let whole = self.client.workflows(&object.key()).await?;
            return Ok(whole.find(&found.id).cloned());
        }
        if !self.definitions.contains_key(&found.definition) {
            let key = ObjectKey::new(Kind::WorkflowDefinition, None, &found.definition);
            let spec =
                self.client.get(&key).await?.typed_spec().with_context(|| {
                    format!("{}: the definition is unreadable", found.definition)
                })?;
            self.definitions.insert(
                found.definition.clone(),
                corral_workflow::definition_from_spec(spec),
            );
        }
        let definition = &self.definitions[&found.definition];
        Ok(Some(corral_workflow::hydrate(
            definition,
            found,
            &object.metadata.uid,
            &[],
        )))
    }
}

/// The object and the instance to explain: the one named, else the newest.
pub async fn load_instance(
    client: &Client,
    key: &ObjectKey,
    id: Option<&str>,
) -> anyhow::Result<(Object, WorkflowInstance)> {
    let object = client.get(key).await?;
    if let Some(instance) = Hydrator::new(client).instance(&object, id).await? {
        return Ok((object, instance));
    }
    let stored = StoredWorkflows::of(&object.status).unwrap_or_default();
    match id {
        Some(id) => {
            let kept: Vec<&str> = stored.instances.iter().map(|i| i.id.as_str()).collect();
            bail!(
                "{} has no workflow instance {id} (kept: {}); what an instance no longer kept \
                 did is in its step log: corral logs {}{} --steps --workflow {id}",
                display_name(key),
                if kept.is_empty() {
                    "none".to_string()
                } else {
                    kept.join(", ")
                },
                display_name(key),
                match key.namespace.as_str() {
                    "" | "default" => String::new(),
                    namespace => format!(" -n {namespace}"),
                }
            )
        }
        None if !matches!(key.kind, Kind::Pod | Kind::VirtualMachine | Kind::Node) => bail!(
            "{} has no workflow: only pods, VMs and nodes have lifecycles to explain",
            display_name(key)
        ),
        None => bail!(
            "{} has no workflow instance yet (it was created before workflows were recorded)",
            display_name(key)
        ),
    }
}

/// The newest line each running step's owner wrote during its current
/// attempt (a pull's progress, say), by step: what `why` and `apply --wait`
/// show beside a step that is still at work. Lines only change the step
/// log, not the object, so they are read from it.
pub async fn running_lines(
    client: &Client,
    key: &ObjectKey,
    instance: &WorkflowInstance,
) -> BTreeMap<String, StepLogEntry> {
    let mut lines = BTreeMap::new();
    for step in &instance.steps {
        let StepState::Running { since, .. } = &step.state else {
            continue;
        };
        let query = StepLogQuery {
            step: Some(step.definition.name.clone()),
            workflow: Some(instance.id.clone()),
            owner: None,
        };
        let Ok(entries) = client.step_logs(key, &query).await else {
            continue;
        };
        // The claim is logged at the attempt's start; what follows it
        // until the step ends is the owner's own.
        if let Some(line) = entries
            .into_iter()
            .rfind(|entry| entry.time >= *since && !entry.message.starts_with("claimed by "))
        {
            lines.insert(step.definition.name.clone(), line);
        }
    }
    lines
}

/// `  node/pull-image: local/web:1: layer sha256:0123… 12.3/45.6 MiB`, one
/// per running step with a line.
pub fn running_lines_text(lines: &BTreeMap<String, StepLogEntry>) -> String {
    lines
        .iter()
        .map(|(step, line)| format!("  {step}: {}\n", line.message))
        .collect()
}

//! Workflow definitions as the server keeps them: each version stored once
//! as a `WorkflowDefinition` object named by its content, remembered by
//! name (they never change), and the current one of each (kind, workflow)
//! — the built-in steps merged with those registered `Controller`s add —
//! kept until a registration changes.

use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock};

use corral_api::kinds::ControllerSpec;
use corral_api::{AuthorClass, Kind, Object, ObjectKey};
use corral_store::{ChangeMeta, StoreError};
use corral_workflow::{Fresh, RegisteredController, WorkflowDefinition};

use crate::Server;

/// The definitions this server has seen.
#[derive(Debug, Default)]
pub struct Definitions {
    /// Stored definitions by name.
    named: RwLock<HashMap<String, Arc<WorkflowDefinition>>>,
    /// (kind, workflow) → the current definition's name, and the watch
    /// cache's count of `Controller` changes it was made at.
    current: RwLock<HashMap<(Kind, String), (u64, String)>>,
    /// Stored definitions' new instances, by name, worked out once.
    fresh: RwLock<HashMap<String, Arc<Fresh>>>,
}

impl Definitions {
    /// Forgets the current definitions: a registration changed.
    pub fn invalidate(&self) {
        self.current
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    /// The new instance of the definition stored as `name`, worked out
    /// the first time it is asked for.
    pub(super) fn fresh(&self, name: &str, definition: &WorkflowDefinition) -> Arc<Fresh> {
        let known = self
            .fresh
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
            .cloned();
        known.unwrap_or_else(|| {
            let fresh = Arc::new(Fresh::new(definition, name));
            self.fresh
                .write()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(name.to_string(), fresh.clone());
            fresh
        })
    }

    fn remembered(&self, name: &str) -> Option<Arc<WorkflowDefinition>> {
        self.named
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
            .cloned()
    }

    fn remember(&self, name: &str, definition: Arc<WorkflowDefinition>) {
        self.named
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(name.to_string(), definition);
    }
}

/// The stored definition called `name`.
pub async fn named(server: &Server, name: &str) -> Result<Arc<WorkflowDefinition>, StoreError> {
    if let Some(definition) = server.definitions.remembered(name) {
        return Ok(definition);
    }
    let key = ObjectKey::new(Kind::WorkflowDefinition, None, name);
    let object = server
        .store
        .get(&key)
        .await?
        .ok_or_else(|| StoreError::NotFound { key: key.clone() })?;
    let spec = object
        .typed_spec()
        .map_err(|error| StoreError::Corrupt(format!("{key}: {error}")))?;
    let definition = Arc::new(corral_workflow::definition_from_spec(spec));
    server.definitions.remember(name, definition.clone());
    Ok(definition)
}

/// The definition new instances of `kind`'s `workflow` run, stored (once)
/// before its name is handed out; `None` if the kind has no such workflow.
pub async fn current(
    server: &Server,
    kind: Kind,
    workflow: &str,
) -> Result<Option<(String, Arc<WorkflowDefinition>)>, StoreError> {
    let generation = server.cache.changes_of(Kind::Controller);
    let slot = (kind, workflow.to_string());
    let known = server
        .definitions
        .current
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&slot)
        .cloned();
    if let Some((seen, name)) = known
        && seen == generation
        && let Some(definition) = server.definitions.remembered(&name)
    {
        return Ok(Some((name, definition)));
    }
    // Known above means the kind has the workflow: the built-in one is
    // built only when it is not.
    if corral_workflow::builtin(kind, workflow).is_none() {
        return Ok(None);
    }
    let Some(definition) = merge(server, kind, workflow).await? else {
        return Ok(None);
    };
    let name = corral_workflow::definition_name(&definition);
    let definition = Arc::new(definition);
    store(server, &name, &definition).await?;
    server.definitions.remember(&name, definition.clone());
    server
        .definitions
        .current
        .write()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(slot, (generation, name.clone()));
    Ok(Some((name, definition)))
}

/// Writes the definition's object unless it exists.
async fn store(
    server: &Server,
    name: &str,
    definition: &WorkflowDefinition,
) -> Result<(), StoreError> {
    let key = ObjectKey::new(Kind::WorkflowDefinition, None, name);
    if server.store.get(&key).await?.is_some() {
        return Ok(());
    }
    let spec = corral_workflow::definition_spec(definition);
    // INVARIANT: the spec is plain data, which always serializes.
    let spec = serde_json::to_value(spec).expect("a definition spec serializes");
    let mut object = Object::new(Kind::WorkflowDefinition, None, name, spec);
    object.metadata.uid = server.ids.uid();
    object.metadata.created_at = Some(server.clock.now());
    let change = ChangeMeta {
        author: corral_workflow::ENGINE_OWNER.to_string(),
        class: AuthorClass::System,
        message: format!(
            "the {} workflow of {} as registered now",
            definition.workflow, definition.kind
        ),
        time: server.clock.now(),
        always_record: false,
    };
    match server.store.create(object, &change).await {
        Ok(_) | Err(StoreError::AlreadyExists { .. }) => Ok(()),
        Err(error) => Err(error),
    }
}

/// The built-in steps of `kind`'s `workflow` with those of every
/// `Controller` in the store. A controller whose steps do not fit (it
/// slipped past admission, or two were registered at once) is left out
/// with a warning, never the object.
async fn merge(
    server: &Server,
    kind: Kind,
    workflow: &str,
) -> Result<Option<WorkflowDefinition>, StoreError> {
    let controllers = registered_controllers(server, None).await?;
    let mut accepted: Vec<RegisteredController<'_>> = Vec::new();
    for (name, spec) in &controllers {
        accepted.push(RegisteredController { name, spec });
        if let Err(error) = corral_workflow::definition_for(kind, workflow, &accepted) {
            accepted.pop();
            tracing::warn!(controller = %name, %kind, workflow, %error,
                "registered steps left out of new workflow instances");
        }
    }
    Ok(corral_workflow::definition_for(kind, workflow, &accepted)
        .ok()
        .flatten())
}

/// Every registered controller's name and spec except `except`, by name.
pub(super) async fn registered_controllers(
    server: &Server,
    except: Option<&str>,
) -> Result<Vec<(String, ControllerSpec)>, StoreError> {
    let listed = server.store.list(Kind::Controller, None).await?;
    Ok(listed
        .objects
        .into_iter()
        .filter(|object| Some(object.metadata.name.as_str()) != except)
        .filter_map(|object| match object.typed_spec::<ControllerSpec>() {
            Ok(spec) => Some((object.metadata.name, spec)),
            Err(error) => {
                tracing::warn!(controller = %object.metadata.name, %error, "unreadable controller spec ignored");
                None
            }
        })
        .collect())
}

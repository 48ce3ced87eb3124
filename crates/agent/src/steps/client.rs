//! The step API over HTTPS: what [`StepApi`] is for a node agent.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use corral_api::{Kind, ObjectKey};
use corral_client::Client;
use corral_workflow::WorkflowDefinition;
use serde_json::{Map, Value};

use super::{NodeWork, StepApi, StepApiError, StepBatch, merge_fields};

/// The step API of a client, remembering the definitions it fetched (they
/// never change).
#[derive(Debug)]
pub struct ClientSteps {
    client: Client,
    definitions: Mutex<HashMap<String, Arc<WorkflowDefinition>>>,
}

impl ClientSteps {
    pub fn new(client: Client) -> Self {
        ClientSteps {
            client,
            definitions: Mutex::new(HashMap::new()),
        }
    }
}

#[async_trait]
impl StepApi for ClientSteps {
    async fn definition(&self, name: &str) -> Result<Arc<WorkflowDefinition>, StepApiError> {
        let known = self
            .definitions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
            .cloned();
        if let Some(definition) = known {
            return Ok(definition);
        }
        let key = ObjectKey::new(Kind::WorkflowDefinition, None, name);
        let object = self.client.get(&key).await?;
        let spec = object.typed_spec().map_err(|error| {
            StepApiError::Refused(format!("{key}: unreadable definition: {error}"))
        })?;
        let definition = Arc::new(corral_workflow::definition_from_spec(spec));
        self.definitions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(name.to_string(), definition.clone());
        Ok(definition)
    }

    async fn batch(&self, key: &ObjectKey, batch: &StepBatch) -> Result<NodeWork, StepApiError> {
        let instance = self.client.step_batch(key, &batch.request()).await?;
        Ok(NodeWork { instance })
    }

    async fn put_status(
        &self,
        key: &ObjectKey,
        fields: &Map<String, Value>,
    ) -> Result<(), StepApiError> {
        // A write that lost a race with a step moving (409) is read and
        // made again at once.
        let mut attempt = 1;
        loop {
            let mut current = self.client.get(key).await?;
            let mut merged = current.status.as_object().cloned().unwrap_or_default();
            merge_fields(&mut merged, fields);
            current.status = Value::Object(merged);
            match self.client.put_status(&current).await {
                Ok(_) => return Ok(()),
                Err(error)
                    if error.status() == Some(409)
                        && attempt < crate::node::STATUS_WRITE_ATTEMPTS =>
                {
                    attempt += 1;
                }
                Err(error) => return Err(error.into()),
            }
        }
    }
}

//! The driver: a background loop that brings every running workflow
//! instance up to the clock — timeouts, retries that are due, and the
//! waiting / ready / blocked states and targets that follow — and writes an
//! object back only when one of its instances changed.

use std::time::Duration;

use chrono::{DateTime, Utc};
use corral_api::workflow::WorkflowOutcome;
use corral_api::{AuthorClass, Kind, Object};
use corral_store::{ChangeMeta, StoreError};
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use super::{read_status, store_logs, write_status};
use crate::{Server, SharedServer};

/// How often the driver ticks.
pub const TICK_INTERVAL: Duration = Duration::from_secs(1);

/// The kinds whose objects carry workflow instances.
const KINDS: [Kind; 3] = [Kind::Pod, Kind::VirtualMachine, Kind::Node];

/// Ticks every [`TICK_INTERVAL`] until `shutdown` is cancelled. A failed
/// round is logged and the next one tries again.
pub async fn drive(server: SharedServer, shutdown: CancellationToken) {
    let mut interval = tokio::time::interval(TICK_INTERVAL);
    interval.set_missed_tick_behavior(MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            _ = interval.tick() => {}
        }
        if let Err(error) = tick_all(&server).await {
            tracing::warn!(%error, "workflow tick failed; retrying next round");
        }
    }
    tracing::debug!("workflow driver stopped");
}

/// One round: ticks every running instance of every object at the server
/// clock's `now`. Returns how many objects were written. An object changed
/// by someone else meanwhile is skipped (compare-and-swap) and ticked again
/// next round.
pub async fn tick_all(server: &Server) -> Result<usize, StoreError> {
    let now = server.clock.now();
    let mut written = 0;
    for kind in KINDS {
        let listed = server.store.list(kind, None).await?;
        for object in listed.objects {
            if kind == Kind::Pod && super::rollback::maybe_roll_back(server, &object).await? {
                written += 1;
                continue;
            }
            if tick_object(server, object, now).await? {
                written += 1;
            }
        }
    }
    Ok(written)
}

async fn tick_object(
    server: &Server,
    mut object: Object,
    now: DateTime<Utc>,
) -> Result<bool, StoreError> {
    let mut status = match read_status(&object) {
        Ok(status) => status,
        Err(error) => {
            tracing::warn!(object = %object.key(), %error, "unreadable status.workflow not ticked");
            return Ok(false);
        }
    };
    let mut logs = Vec::new();
    let mut changed = false;
    for instance in &mut status.instances {
        if instance.outcome != WorkflowOutcome::Running {
            continue;
        }
        let before = instance.clone();
        logs.extend(corral_workflow::tick(instance, now));
        changed |= *instance != before;
    }
    if !changed {
        return Ok(false);
    }
    let key = object.key();
    write_status(&mut object, &status);
    let expected = object.metadata.resource_version;
    let change = ChangeMeta {
        author: corral_workflow::ENGINE_OWNER.to_string(),
        class: AuthorClass::System,
        message: String::new(),
        time: now,
        always_record: false,
    };
    match server.store.update(object, expected, &change).await {
        Ok(_) => {}
        Err(StoreError::Conflict { .. } | StoreError::NotFound { .. }) => {
            tracing::debug!(object = %key, "changed meanwhile; ticked again next round");
            return Ok(false);
        }
        Err(error) => return Err(error),
    }
    store_logs(server, &logs).await;
    Ok(true)
}

//! The scheduler's part of a VM's live migration (`scheduler/rebind`, the
//! first step of its `migrate` workflow): whether the target can take the
//! VM, and the binding that moves it there. Pure, tested without a cluster;
//! [`crate::scheduler`] makes the request.
//!
//! The VM is bound to the target before anything moves, so its room there
//! is reserved while the guest travels; `status.migration` names the node
//! it leaves, whose agent sends the guest and then cleans up. Its disks
//! (its own pseudo `local` volume and any `local` volume holding a disk)
//! move with it: the migration copies them.

use std::collections::BTreeMap;

use corral_api::Object;
use corral_scheduler::{BoundWorkload, Request, Scheduler};
use serde_json::{Value, json};

/// What a VM's spec asks of a migration.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Ask {
    /// `spec.migration.to`.
    pub to: Option<String>,
    /// `spec.disk.clone.vm`: a clone's disk is an overlay over another
    /// VM's disk on this node.
    pub clone_of: Option<String>,
    /// `spec.template`: a template does not run.
    pub template: bool,
    /// `spec.running: false`: the VM is stopped (the API server refuses
    /// the request already; this is the scheduler's own word on it).
    pub stopped: bool,
}

impl Ask {
    pub fn of(object: &Object) -> Ask {
        let text = |value: Option<&Value>| value.and_then(Value::as_str).map(str::to_string);
        Ask {
            to: text(object.spec.pointer("/migration/to")),
            clone_of: text(object.spec.pointer("/disk/clone/vm")),
            template: object.spec.get("template").and_then(Value::as_bool) == Some(true),
            stopped: object.spec.get("running").and_then(Value::as_bool) == Some(false),
        }
    }
}

/// A VM's migration as the scheduler sees it: the node it is bound to and
/// what its spec asks.
#[derive(Debug, Clone, Copy)]
pub struct Migration<'a> {
    pub from: Option<&'a str>,
    pub ask: &'a Ask,
}

/// A migration the scheduler agreed to.
#[derive(Debug, Clone, PartialEq)]
pub struct Moved {
    pub from: String,
    pub to: String,
    /// The VM's reservation on the target, its disks' volumes with it.
    pub reservation: BoundWorkload,
}

/// Whether the VM of `request` may move as `migration` asks: it runs
/// somewhere else than the target, is no clone or template, is not
/// stopped, and the
/// target has room for it and matches its placement. The reason when not.
pub fn decide(
    scheduler: &mut Scheduler,
    request: &Request,
    migration: &Migration<'_>,
) -> Result<Moved, String> {
    let Some(to) = migration.ask.to.as_deref() else {
        return Err("spec.migration names no node".into());
    };
    let Some(from) = migration.from else {
        return Err("the VM is not bound to a node: there is nothing running to migrate".into());
    };
    if from == to {
        return Err(format!("the VM already runs on {to}"));
    }
    if migration.ask.template {
        return Err("a template does not run: there is nothing running to migrate".into());
    }
    if migration.ask.stopped {
        return Err(
            "the VM is stopped (spec.running: false): there is nothing running to migrate; start it first (corral vm start)"
                .into(),
        );
    }
    if let Some(source) = &migration.ask.clone_of {
        return Err(format!(
            "the VM's disk is an overlay over {source}'s disk on {from}: a clone does not migrate"
        ));
    }
    // Its disks go with it: the volumes holding them do not pin it here.
    let movable = Request {
        local_volumes: Vec::new(),
        ..request.clone()
    };
    scheduler
        .fits(&movable, to)
        .map_err(|reason| format!("{to} cannot take the VM: {reason}"))?;
    Ok(Moved {
        from: from.to_string(),
        to: to.to_string(),
        reservation: BoundWorkload::new(request, to),
    })
}

/// The status fields the request completing `scheduler/rebind` writes.
pub fn status(moved: &Moved) -> BTreeMap<String, Value> {
    BTreeMap::from([
        ("node".to_string(), Value::from(moved.to.clone())),
        (
            "migration".to_string(),
            json!({ "from": moved.from, "to": moved.to }),
        ),
    ])
}

#[cfg(test)]
mod tests;

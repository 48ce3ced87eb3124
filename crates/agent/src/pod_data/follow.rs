//! Following Secrets and Configs: one informer per kind over every
//! namespace, keeping only each object's revision (the objects carry no
//! values: a Secret's are revealed to the node per pod, when a pod that
//! uses it needs them). Each new revision — and, after the first list,
//! every object once, in case it changed while the agent was away — is
//! handed to the manager, which tells only the pods that read it.

use corral_api::kinds::DataRef;
use corral_api::{Kind, Object};
use corral_client::Client;
use corral_client::runtime::{Change, Informer, Scope};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// A Secret or Config at a new revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataChange {
    pub namespace: String,
    pub source: DataRef,
    pub revision: u64,
}

fn revision(object: &Object) -> u64 {
    object.metadata.revision
}

fn change(kind: Kind, key: &corral_api::ObjectKey, revision: u64) -> DataChange {
    DataChange {
        namespace: key.namespace.clone(),
        source: DataRef {
            kind,
            name: key.name.clone(),
        },
        revision,
    }
}

/// Follows every Secret and Config until `shutdown`.
pub fn follow(client: Client, shutdown: CancellationToken) -> mpsc::UnboundedReceiver<DataChange> {
    let (sender, receiver) = mpsc::unbounded_channel();
    for kind in [Kind::Secret, Kind::Config] {
        let informer = Informer::start_projected(
            client.clone(),
            Scope::all(kind),
            revision,
            Vec::new(),
            shutdown.clone(),
        );
        let sender = sender.clone();
        tokio::spawn(async move {
            informer.synced().await;
            let existing = sender.clone();
            informer.on_change(
                |key, revision| {
                    let _ = existing.send(change(kind, key, *revision));
                },
                move |update| {
                    if let Change::Applied { key, old, new, .. } = update
                        && old.copied() != Some(**new)
                    {
                        // A closed channel means the manager stopped.
                        let _ = sender.send(change(kind, key, **new));
                    }
                },
            );
        });
    }
    receiver
}

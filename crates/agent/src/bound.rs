//! Following the objects bound to this node: a node-scoped informer (the
//! server sends only this node's pods or VMs, and a deletion when one is
//! taken away) whose changes are handed to a manager as messages it routes
//! to its workers.

use corral_api::{Kind, Object, ObjectKey};
use corral_client::Client;
use corral_client::runtime::{Change, Informer, Scope};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// What a manager does with a change of an object bound here.
#[derive(Debug)]
pub enum Bound {
    /// Run (or keep running) the object as it is now.
    Desired(Box<Object>),
    /// The object is gone from this node: stop and remove it.
    Gone(ObjectKey),
    /// The first list is in, and every object of it was sent as
    /// `Desired`: an object the manager runs (restored from local state)
    /// that it was not sent since it started is gone (deleted or moved
    /// while the agent was away).
    Synced,
}

/// Follows the objects of `kind` bound to `node` until `shutdown`.
pub fn follow(
    client: Client,
    kind: Kind,
    node: &str,
    shutdown: CancellationToken,
) -> mpsc::UnboundedReceiver<Bound> {
    let informer = Informer::start(client, Scope::on_node(kind, node), Vec::new(), shutdown);
    let (sender, receiver) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        informer.synced().await;
        let existing = sender.clone();
        informer.on_change(
            |_, object| {
                let _ = existing.send(Bound::Desired(Box::new(object.clone())));
            },
            {
                let sender = sender.clone();
                move |change| {
                    let message = match change {
                        Change::Applied { object, .. } => {
                            Bound::Desired(Box::new((*object).clone()))
                        }
                        Change::Deleted { key, .. } => Bound::Gone((*key).clone()),
                    };
                    // A closed channel means the manager stopped.
                    let _ = sender.send(message);
                }
            },
        );
        let _ = sender.send(Bound::Synced);
    });
    receiver
}

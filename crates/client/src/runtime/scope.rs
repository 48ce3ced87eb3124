//! Which objects a list or watch covers.

use corral_api::Kind;

/// The objects of one kind a list or watch covers: in one namespace or
/// all, optionally only those bound to one node, optionally by label,
/// optionally only those one controller manages.
///
/// A node-scoped watch (`node`) is filtered by the server, which also
/// tells the watcher when an object leaves the scope (its `status.node`
/// changed): it arrives as a deletion, so a node's agent hears only about
/// its own pods and still learns when one is taken away. A scope by
/// manager (`managed_by`) works the same way on the object's
/// `corral.dev/managed-by` annotation: a Job's controller hears only about
/// the pods it made, not every pod's every change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    pub kind: Kind,
    pub namespace: Option<String>,
    /// Only pods and VirtualMachines whose `status.node` is this node.
    pub node: Option<String>,
    /// A label selector (`app=web,tier!=db`).
    pub selector: Option<String>,
    /// Only objects whose `corral.dev/managed-by` annotation names this
    /// controller: one that stops naming it arrives as a deletion.
    pub managed_by: Option<String>,
}

impl Scope {
    /// Every object of `kind`, cluster-wide.
    pub fn all(kind: Kind) -> Self {
        Scope {
            kind,
            namespace: None,
            node: None,
            selector: None,
            managed_by: None,
        }
    }

    /// The objects of `kind` bound to `node`.
    pub fn on_node(kind: Kind, node: &str) -> Self {
        Scope {
            node: Some(node.to_string()),
            ..Scope::all(kind)
        }
    }

    /// The objects of `kind` that `controller` manages (its pods, say),
    /// cluster-wide.
    pub fn managed_by(kind: Kind, controller: &str) -> Self {
        Scope {
            managed_by: Some(controller.to_string()),
            ..Scope::all(kind)
        }
    }

    /// The query parameters that select this scope (the namespace is in
    /// the path).
    pub(crate) fn query(&self) -> Vec<(&'static str, String)> {
        let mut query = Vec::new();
        if let Some(node) = &self.node {
            query.push(("node", node.clone()));
        }
        if let Some(selector) = &self.selector {
            query.push(("selector", selector.clone()));
        }
        if let Some(controller) = &self.managed_by {
            query.push(("managedBy", controller.clone()));
        }
        query
    }
}

//! What a caller is served: people and nodes see whole objects; a
//! controller sees `kind`, `metadata` and the fields it declared it reads
//! (plus those it owns, and all of its own registration). A controller with
//! no registration sees metadata only.

use std::collections::HashMap;
use std::sync::Arc;

use corral_api::{Identity, Kind, Object, Role};
use corral_ownership::{Registry, strip_owned};

use crate::Server;
use crate::error::ApiError;

/// The field patterns a controller is served, per kind.
type Masks = Arc<HashMap<Kind, Vec<String>>>;

/// The mask of one caller, cheap to clone into a watch stream.
#[derive(Debug, Clone)]
pub struct ReadView {
    /// For a controller: its name and the field patterns it sees per kind.
    controller: Option<(String, Masks)>,
}

impl ReadView {
    pub fn new(caller: &Identity, registry: Arc<Registry>) -> Self {
        let controller = (caller.role == Role::Controller).then(|| {
            let paths = Kind::ALL
                .into_iter()
                .map(|kind| {
                    let paths = registry
                        .visible_paths(&caller.name, kind, "")
                        .unwrap_or_default();
                    (kind, paths)
                })
                .collect();
            (caller.name.clone(), Arc::new(paths))
        });
        ReadView { controller }
    }

    /// Whether this caller is served whole objects (people and nodes).
    pub fn sees_everything(&self) -> bool {
        self.controller.is_none()
    }

    /// `object` as this caller may see it.
    pub fn serve(&self, object: Object) -> Object {
        let Some((name, paths)) = &self.controller else {
            return object;
        };
        if object.kind == Kind::Controller && object.metadata.name == *name {
            return object;
        }
        let paths = paths
            .get(&object.kind)
            .map(Vec::as_slice)
            .unwrap_or_default();
        strip_owned(object, paths)
    }
}

/// The mask for `caller`, with the registry in effect now.
pub async fn reader(server: &Server, caller: &Identity) -> Result<ReadView, ApiError> {
    if caller.role != Role::Controller {
        return Ok(ReadView { controller: None });
    }
    Ok(ReadView::new(caller, super::registry(server).await?))
}

//! What a caller is served: people and nodes see whole objects; a
//! controller sees `kind`, `metadata` and the fields it declared it reads
//! (plus those it owns, and all of its own registration). A controller with
//! no registration sees metadata only.

use std::collections::HashMap;
use std::sync::Arc;

use corral_api::{Identity, Kind, Object, Role};
use corral_ownership::{Mask, Registry, strip_owned};

use crate::Server;
use crate::error::ApiError;

/// The field patterns a controller is served, per kind, and the same
/// compiled for serving shared objects.
type Masks = Arc<HashMap<Kind, (Vec<String>, Mask)>>;

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
                    let mask = Mask::new(&paths);
                    (kind, (paths, mask))
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
        match self.mask(&object) {
            Masked::Whole => object,
            Masked::Through(paths, _) => strip_owned(object, paths),
            Masked::Nothing => strip_owned(object, &[]),
        }
    }

    /// [`ReadView::serve`] of an object others share: only what this
    /// caller sees is copied.
    pub fn serve_shared(&self, object: &Object) -> Object {
        match self.mask(object) {
            Masked::Whole => object.clone(),
            Masked::Through(_, mask) => mask.strip(object),
            Masked::Nothing => Mask::default().strip(object),
        }
    }

    fn mask(&self, object: &Object) -> Masked<'_> {
        let Some((name, masks)) = &self.controller else {
            return Masked::Whole;
        };
        if object.kind == Kind::Controller && object.metadata.name == *name {
            return Masked::Whole;
        }
        match masks.get(&object.kind) {
            Some((paths, mask)) => Masked::Through(paths, mask),
            None => Masked::Nothing,
        }
    }
}

/// How a caller is served an object.
enum Masked<'a> {
    Whole,
    /// Through these patterns (and their compiled mask).
    Through(&'a [String], &'a Mask),
    /// No registration for its kind: metadata only.
    Nothing,
}

/// The mask for `caller`, with the registry in effect now.
pub async fn reader(server: &Server, caller: &Identity) -> Result<ReadView, ApiError> {
    if caller.role != Role::Controller {
        return Ok(ReadView { controller: None });
    }
    Ok(ReadView::new(caller, super::registry(server).await?))
}

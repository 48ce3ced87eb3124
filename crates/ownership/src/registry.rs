//! The controller registry: the built-in owner table merged with every
//! registered `Controller`'s `owns`, who owns a path, who reads it, and the
//! rules for registering and handing over fields.

use std::collections::BTreeSet;

use corral_api::fieldpath::{PathPattern, path_matches, split};
use corral_api::kinds::ControllerSpec;
use corral_api::{Kind, Object};
use serde::{Deserialize, Serialize};

use crate::mask::segment_count;
use crate::owner::{FieldRef, Owner, carvable, default_owners, ownable};

/// One registered controller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    pub name: String,
    pub spec: ControllerSpec,
}

/// Where an ownership rule comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// The built-in owner table.
    Default,
    /// A `Controller` object's `owns`.
    Registered,
}

/// One ownership rule: a field pattern, its owner and where the rule comes
/// from. A pattern covers its subtree; the most specific rule wins, and a
/// registration beats a default of the same specificity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rule {
    pub field: FieldRef,
    pub owner: Owner,
    pub source: Source,
}

/// Why a registration is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistrationError {
    /// Another owner has the field (409).
    #[error("{field} is already owned by {owner}; controller {candidate} may not register it")]
    AlreadyOwned {
        field: FieldRef,
        owner: Owner,
        candidate: String,
    },
    /// The field can never be owned (400).
    #[error(
        "{field} cannot be owned: only spec, status and sub-keys of metadata.labels or metadata.annotations can"
    )]
    NotOwnable { field: FieldRef },
    /// A path in `owns` or `reads` is not `Kind:path`.
    #[error("{0}")]
    BadField(#[from] crate::owner::BadFieldRef),
}

/// Why a transfer is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransferError {
    #[error("{field} is owned by {owner}, not controller {from}: nothing to transfer")]
    NotOwner {
        field: FieldRef,
        owner: Owner,
        from: String,
    },
    #[error("{field} is already owned by controller {to}")]
    SameOwner { field: FieldRef, to: String },
    #[error("{0}")]
    NotOwnable(RegistrationError),
}

/// The specs a transfer writes: `from` without the field (absent when
/// `from` owned it only by default and has no registration) and `to` with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransferPlan {
    pub from: Option<ControllerSpec>,
    pub to: ControllerSpec,
}

/// Every ownership rule in effect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registry {
    controllers: Vec<Registration>,
    /// The default table and every registration, parsed once: every write
    /// asks `owner_of` for each changed path.
    all_rules: Vec<Rule>,
    /// Each of `all_rules`' paths split once, with its specificity (the
    /// deeper pattern decides): `owner_of` matches a path against them
    /// without splitting a pattern.
    patterns: Vec<(PathPattern, usize)>,
    /// [`Registry::effective_rules`], computed once: every read served to a
    /// controller asks which fields it owns.
    effective: Vec<Rule>,
}

impl Default for Registry {
    fn default() -> Self {
        Registry::new([])
    }
}

impl Registry {
    /// A registry of these controllers (sorted by name).
    pub fn new(controllers: impl IntoIterator<Item = Registration>) -> Self {
        let mut controllers: Vec<Registration> = controllers.into_iter().collect();
        controllers.sort_by(|a, b| a.name.cmp(&b.name));
        let mut registry = Registry {
            controllers,
            all_rules: Vec::new(),
            patterns: Vec::new(),
            effective: Vec::new(),
        };
        registry.all_rules = registry.build_rules();
        registry.patterns = registry
            .all_rules
            .iter()
            .map(|rule| {
                let path = &rule.field.path;
                (PathPattern::new(path), segment_count(path))
            })
            .collect();
        registry.effective = registry.build_effective_rules();
        registry
    }

    /// A registry of stored `Controller` objects; objects of other kinds and
    /// undecodable specs are skipped (admission never stores those).
    pub fn from_objects(objects: &[Object]) -> Self {
        Registry::new(
            objects
                .iter()
                .filter(|object| object.kind == Kind::Controller)
                .filter_map(|object| {
                    Some(Registration {
                        name: object.metadata.name.clone(),
                        spec: object.typed_spec().ok()?,
                    })
                }),
        )
    }

    pub fn controllers(&self) -> &[Registration] {
        &self.controllers
    }

    pub fn controller(&self, name: &str) -> Option<&Registration> {
        self.controllers.iter().find(|c| c.name == name)
    }

    /// Every rule: the defaults of every kind, then every registration.
    pub fn rules(&self) -> Vec<Rule> {
        self.all_rules.clone()
    }

    fn build_rules(&self) -> Vec<Rule> {
        let mut rules: Vec<Rule> = Kind::ALL
            .into_iter()
            .flat_map(|kind| {
                default_owners(kind).into_iter().map(move |row| Rule {
                    field: FieldRef::new(kind, row.path),
                    owner: row.owner,
                    source: Source::Default,
                })
            })
            .collect();
        rules.extend(self.registered_rules(None));
        rules
    }

    /// The registered rules, all or all but one controller's.
    fn registered_rules(&self, except: Option<&str>) -> Vec<Rule> {
        self.controllers
            .iter()
            .filter(|c| Some(c.name.as_str()) != except)
            .flat_map(|c| {
                c.spec.owns.iter().filter_map(|field| {
                    Some(Rule {
                        field: field.parse().ok()?,
                        owner: Owner::Controller(c.name.clone()),
                        source: Source::Registered,
                    })
                })
            })
            .collect()
    }

    /// Who owns a concrete path (`spec.containers[0].image`) of `kind`.
    pub fn owner_of(&self, kind: Kind, path: &str) -> Owner {
        let path = split(path);
        self.all_rules
            .iter()
            .zip(&self.patterns)
            .filter(|(rule, (pattern, _))| rule.field.kind == kind && pattern.matches(&path))
            .max_by_key(|(rule, (_, specificity))| {
                (*specificity, rule.source == Source::Registered)
            })
            .map_or(Owner::Unowned, |(rule, _)| rule.owner.clone())
    }

    /// The rules in effect: every rule that still decides some path (a
    /// default handed over to a registered controller is dropped), once per
    /// field and owner (a registration repeating a default is kept as the
    /// registration).
    pub fn effective_rules(&self) -> Vec<Rule> {
        self.effective.clone()
    }

    fn build_effective_rules(&self) -> Vec<Rule> {
        let mut rules: Vec<Rule> = Vec::new();
        for rule in self.rules() {
            if self.owner_of(rule.field.kind, &rule.field.path) != rule.owner {
                continue;
            }
            match rules
                .iter_mut()
                .find(|kept| kept.field == rule.field && kept.owner == rule.owner)
            {
                Some(kept) => kept.source = Source::Registered,
                None => rules.push(rule),
            }
        }
        rules
    }

    /// The registered controllers that declare reading a field overlapping
    /// `path` of `kind`, by name.
    pub fn readers_of(&self, kind: Kind, path: &str) -> Vec<String> {
        self.controllers
            .iter()
            .filter(|c| {
                c.spec.reads.iter().any(|read| {
                    read.parse::<FieldRef>()
                        .is_ok_and(|read| read.kind == kind && overlaps(&read.path, path))
                })
            })
            .map(|c| c.name.clone())
            .collect()
    }

    /// The field patterns of `kind` a controller is served: what it
    /// declared it reads plus what it owns. `None` means everything (its own
    /// `Controller` object); metadata is always served besides.
    pub fn visible_paths(&self, controller: &str, kind: Kind, name: &str) -> Option<Vec<String>> {
        if kind == Kind::Controller && name == controller {
            return None;
        }
        let mut paths: BTreeSet<String> = BTreeSet::new();
        if let Some(registration) = self.controller(controller) {
            paths.extend(
                registration
                    .spec
                    .reads
                    .iter()
                    .filter_map(|read| read.parse::<FieldRef>().ok())
                    .filter(|read| read.kind == kind)
                    .map(|read| read.path),
            );
        }
        let owner = Owner::Controller(controller.to_string());
        paths.extend(
            self.effective
                .iter()
                .filter(|rule| rule.field.kind == kind && rule.owner == owner)
                .map(|rule| rule.field.path.clone()),
        );
        Some(paths.into_iter().collect())
    }

    /// Checks that controller `name` may register `spec`: every field it
    /// owns must be ownable and owned by nobody else — not by another
    /// registration, not by a default owner (unless a registration already
    /// took that default over), and not by people (except sub-keys of labels
    /// and annotations).
    pub fn check_registration(
        &self,
        name: &str,
        spec: &ControllerSpec,
    ) -> Result<(), RegistrationError> {
        for read in &spec.reads {
            read.parse::<FieldRef>()?;
        }
        let others = self.registered_rules(Some(name));
        let all_registered = self.registered_rules(None);
        let candidate = Owner::Controller(name.to_string());
        for owned in &spec.owns {
            let field: FieldRef = owned.parse()?;
            if !ownable(&field.path) {
                return Err(RegistrationError::NotOwnable { field });
            }
            let conflict = |rule: &Rule| RegistrationError::AlreadyOwned {
                field: narrower(&field, &rule.field),
                owner: rule.owner.clone(),
                candidate: name.to_string(),
            };
            for rule in others.iter().filter(|rule| same_area(rule, &field)) {
                if rule.owner != candidate {
                    return Err(conflict(rule));
                }
            }
            for rule in deciding_defaults(&field) {
                if rule.owner == candidate {
                    continue;
                }
                let taken_over = all_registered.iter().any(|r| {
                    r.field.kind == field.kind && path_matches(&r.field.path, &rule.field.path)
                });
                let allowed = match &rule.owner {
                    Owner::People => carvable(&rule.field.path, &field.path),
                    _ => taken_over,
                };
                if !allowed {
                    return Err(conflict(&rule));
                }
            }
        }
        Ok(())
    }

    /// Plans handing `field` over from controller `from` to controller `to`
    /// (whose current spec is `to_spec`, empty when it has none yet).
    pub fn plan_transfer(
        &self,
        field: &FieldRef,
        from: &str,
        to: &str,
    ) -> Result<TransferPlan, TransferError> {
        if !ownable(&field.path) {
            return Err(TransferError::NotOwnable(RegistrationError::NotOwnable {
                field: field.clone(),
            }));
        }
        let owner = self.owner_of(field.kind, &field.path);
        if owner.controller() == Some(to) {
            return Err(TransferError::SameOwner {
                field: field.clone(),
                to: to.to_string(),
            });
        }
        if owner.controller() != Some(from) {
            return Err(TransferError::NotOwner {
                field: field.clone(),
                owner,
                from: from.to_string(),
            });
        }
        let text = field.to_string();
        let from_spec = self.controller(from).map(|registration| {
            let mut spec = registration.spec.clone();
            spec.owns.retain(|owned| *owned != text);
            spec
        });
        let mut to_spec = self
            .controller(to)
            .map(|registration| registration.spec.clone())
            .unwrap_or_default();
        if !to_spec.owns.contains(&text) {
            to_spec.owns.push(text);
        }
        Ok(TransferPlan {
            from: from_spec.filter(|spec| Some(spec) != self.controller(from).map(|c| &c.spec)),
            to: to_spec,
        })
    }
}

/// The default rules that decide some part of `field`: the most specific
/// row covering it, and every row strictly inside it.
fn deciding_defaults(field: &FieldRef) -> Vec<Rule> {
    let rows = default_owners(field.kind);
    let covering = rows
        .iter()
        .filter(|row| path_matches(row.path, &field.path))
        .max_by_key(|row| segment_count(row.path));
    let inside = rows.iter().filter(|row| {
        path_matches(&field.path, row.path) && segment_count(row.path) > segment_count(&field.path)
    });
    covering
        .into_iter()
        .chain(inside)
        .map(|row| Rule {
            field: FieldRef::new(field.kind, row.path),
            owner: row.owner.clone(),
            source: Source::Default,
        })
        .collect()
}

/// Whether two patterns cover a common path (one contains the other).
pub fn overlaps(a: &str, b: &str) -> bool {
    path_matches(a, b) || path_matches(b, a)
}

fn same_area(rule: &Rule, field: &FieldRef) -> bool {
    rule.field.kind == field.kind && overlaps(&rule.field.path, &field.path)
}

/// The narrower of two overlapping fields: the one a conflict is about.
fn narrower(a: &FieldRef, b: &FieldRef) -> FieldRef {
    if segment_count(&b.path) > segment_count(&a.path) {
        b.clone()
    } else {
        a.clone()
    }
}

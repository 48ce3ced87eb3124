//! Masks over objects: serving a controller only the fields it declared
//! ([`strip`]) and, when it writes back what it was served, keeping the
//! fields it never saw ([`overlay`]).
//!
//! `kind` and `metadata` are always served whole; the mask applies to
//! `spec` and `status`. Patterns are field paths (`spec.containers`,
//! `spec.containers[*].image`, `status.node`); a pattern covers its subtree.

use std::collections::HashMap;

use corral_api::Object;
use serde_json::{Map, Value};

/// One step of a path: a key, an index, or `[*]`.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Key(String),
    Index(usize),
    AnyIndex,
}

/// Splits `a.b[0].c[*]` into its segments; a final `.*` is dropped (a
/// pattern covers its subtree anyway).
fn segments(path: &str) -> Vec<Segment> {
    let path = path.strip_suffix(".*").unwrap_or(path);
    let mut out = Vec::new();
    for part in path.split('.').filter(|p| !p.is_empty()) {
        let mut rest = part;
        while let Some(open) = rest.find('[') {
            if open > 0 {
                out.push(Segment::Key(rest[..open].to_string()));
            }
            let close = rest[open..].find(']').map_or(rest.len(), |c| open + c + 1);
            let inner = rest[open..close]
                .trim_start_matches('[')
                .trim_end_matches(']');
            out.push(match inner.parse() {
                Ok(index) => Segment::Index(index),
                Err(_) => Segment::AnyIndex,
            });
            rest = &rest[close..];
        }
        if !rest.is_empty() {
            out.push(Segment::Key(rest.to_string()));
        }
    }
    out
}

/// How many segments a path has: how specific it is.
pub fn segment_count(path: &str) -> usize {
    segments(path).len()
}

/// The patterns under `root` (`spec` or `status`), relative to it.
fn under(root: &str, patterns: &[String]) -> Vec<Vec<Segment>> {
    patterns
        .iter()
        .map(|pattern| segments(pattern))
        .filter(|segments| segments.first() == Some(&Segment::Key(root.to_string())))
        .map(|mut segments| {
            segments.remove(0);
            segments
        })
        .collect()
}

/// The patterns that continue into the child at `key` or `index`.
fn descend(patterns: &[Vec<Segment>], step: &Segment) -> Vec<Vec<Segment>> {
    patterns
        .iter()
        .filter(|pattern| match (pattern.first(), step) {
            (Some(Segment::Key(want)), Segment::Key(have)) => want == have,
            (Some(Segment::AnyIndex), Segment::Index(_)) => true,
            (Some(Segment::Index(want)), Segment::Index(have)) => want == have,
            _ => false,
        })
        .map(|pattern| pattern[1..].to_vec())
        .collect()
}

/// `object` with `spec` and `status` cut down to `patterns` (full paths,
/// `spec.…` or `status.…`). A part nothing reaches becomes `null`.
/// Only what is kept is copied: an object shared by several readers is
/// served to each without a copy of the fields it may not see.
pub fn strip(object: &Object, patterns: &[String]) -> Object {
    Object {
        kind: object.kind,
        metadata: object.metadata.clone(),
        spec: strip_value(&object.spec, &under("spec", patterns)).unwrap_or(Value::Null),
        status: strip_value(&object.status, &under("status", patterns)).unwrap_or(Value::Null),
    }
}

/// [`strip`] of an object the caller gives away: what is kept is moved,
/// not copied.
pub fn strip_owned(mut object: Object, patterns: &[String]) -> Object {
    let spec = std::mem::take(&mut object.spec);
    object.spec = strip_owned_value(spec, &under("spec", patterns)).unwrap_or(Value::Null);
    let status = std::mem::take(&mut object.status);
    object.status = strip_owned_value(status, &under("status", patterns)).unwrap_or(Value::Null);
    object
}

fn strip_owned_value(value: Value, patterns: &[Vec<Segment>]) -> Option<Value> {
    if patterns.is_empty() {
        return None;
    }
    if patterns.iter().any(Vec::is_empty) {
        return Some(value);
    }
    match value {
        Value::Object(map) => Some(Value::Object(
            map.into_iter()
                .filter_map(|(key, child)| {
                    let deeper = descend(patterns, &Segment::Key(key.clone()));
                    strip_owned_value(child, &deeper).map(|kept| (key, kept))
                })
                .collect(),
        )),
        Value::Array(items) => Some(Value::Array(
            items
                .into_iter()
                .enumerate()
                .map(|(index, child)| {
                    strip_owned_value(child, &descend(patterns, &Segment::Index(index)))
                        .unwrap_or(Value::Null)
                })
                .collect(),
        )),
        _ => None,
    }
}

fn strip_value(value: &Value, patterns: &[Vec<Segment>]) -> Option<Value> {
    if patterns.is_empty() {
        return None;
    }
    if patterns.iter().any(Vec::is_empty) {
        return Some(value.clone());
    }
    match value {
        Value::Object(map) => {
            let kept: Map<String, Value> = map
                .iter()
                .filter_map(|(key, child)| {
                    let deeper = descend(patterns, &Segment::Key(key.clone()));
                    strip_value(child, &deeper).map(|kept| (key.clone(), kept))
                })
                .collect();
            Some(Value::Object(kept))
        }
        Value::Array(items) => Some(Value::Array(
            items
                .iter()
                .enumerate()
                .map(|(index, child)| {
                    strip_value(child, &descend(patterns, &Segment::Index(index)))
                        .unwrap_or(Value::Null)
                })
                .collect(),
        )),
        _ => None,
    }
}

/// Field patterns compiled once for serving many objects through them:
/// [`Mask::strip`] serves what [`strip`] serves, walking a tree of the
/// patterns instead of matching every pattern at every field.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Mask {
    /// A pattern ends here: the whole subtree is served.
    whole: bool,
    keys: HashMap<String, Mask>,
    /// `[*]`: what every item of an array is served through.
    items: Option<Box<Mask>>,
    /// `[n]`, each with the `[*]` patterns merged in.
    indexes: HashMap<usize, Mask>,
}

impl Mask {
    /// The mask of `patterns` (full paths, `spec.…` or `status.…`).
    pub fn new(patterns: &[String]) -> Mask {
        let mut root = Mask::default();
        for pattern in patterns {
            root.insert(&segments(pattern));
        }
        root.spread_items();
        root
    }

    fn insert(&mut self, path: &[Segment]) {
        let Some((first, rest)) = path.split_first() else {
            self.whole = true;
            return;
        };
        let child = match first {
            Segment::Key(key) => self.keys.entry(key.clone()).or_default(),
            Segment::Index(index) => self.indexes.entry(*index).or_default(),
            Segment::AnyIndex => self.items.get_or_insert_with(Box::default),
        };
        child.insert(rest);
    }

    fn merge(&mut self, other: &Mask) {
        self.whole |= other.whole;
        for (key, child) in &other.keys {
            self.keys.entry(key.clone()).or_default().merge(child);
        }
        if let Some(items) = &other.items {
            self.items.get_or_insert_with(Box::default).merge(items);
        }
        for (index, child) in &other.indexes {
            self.indexes.entry(*index).or_default().merge(child);
        }
    }

    /// Item `n` is served through both `[n]` and `[*]` patterns.
    fn spread_items(&mut self) {
        if let Some(items) = &mut self.items {
            items.spread_items();
        }
        for child in self.keys.values_mut() {
            child.spread_items();
        }
        if let Some(items) = self.items.as_deref() {
            for child in self.indexes.values_mut() {
                child.merge(items);
            }
        }
        for child in self.indexes.values_mut() {
            child.spread_items();
        }
    }

    /// `object` with `spec` and `status` cut down to the mask, copying
    /// only what is kept.
    pub fn strip(&self, object: &Object) -> Object {
        let part = |root: &str, value: &Value| {
            self.keys
                .get(root)
                .and_then(|mask| mask.keep(value))
                .unwrap_or(Value::Null)
        };
        Object {
            kind: object.kind,
            metadata: object.metadata.clone(),
            spec: part("spec", &object.spec),
            status: part("status", &object.status),
        }
    }

    fn keep(&self, value: &Value) -> Option<Value> {
        if self.whole {
            return Some(value.clone());
        }
        match value {
            Value::Object(map) => Some(Value::Object(
                map.iter()
                    .filter_map(|(key, child)| {
                        let kept = self.keys.get(key)?.keep(child)?;
                        Some((key.clone(), kept))
                    })
                    .collect(),
            )),
            Value::Array(items) => Some(Value::Array(
                items
                    .iter()
                    .enumerate()
                    .map(|(index, child)| {
                        self.indexes
                            .get(&index)
                            .or(self.items.as_deref())
                            .and_then(|mask| mask.keep(child))
                            .unwrap_or(Value::Null)
                    })
                    .collect(),
            )),
            _ => None,
        }
    }
}

/// What a writer who sees only `patterns` means by writing `incoming`
/// over `stored`: its `spec` and `status` inside the patterns; outside
/// them, where it was served nothing, the stored values — unless it set a
/// value there anyway, which is then a write like any other (and the
/// ownership check decides). Metadata comes from `incoming`.
pub fn overlay(stored: &Object, incoming: &Object, patterns: &[String]) -> Object {
    let mut merged = incoming.clone();
    merged.spec = overlay_value(&stored.spec, &incoming.spec, &under("spec", patterns));
    merged.status = overlay_value(&stored.status, &incoming.status, &under("status", patterns));
    merged
}

fn overlay_value(stored: &Value, incoming: &Value, patterns: &[Vec<Segment>]) -> Value {
    if patterns.is_empty() {
        // Hidden: absent in what the writer was served. Left absent it
        // means "unchanged"; a value there is a write to be checked.
        return if incoming.is_null() {
            stored.clone()
        } else {
            incoming.clone()
        };
    }
    if patterns.iter().any(Vec::is_empty) {
        return incoming.clone();
    }
    let empty = Map::new();
    match (stored, incoming) {
        (Value::Object(_) | Value::Null, Value::Object(_) | Value::Null) => {
            let old = stored.as_object().unwrap_or(&empty);
            let new = incoming.as_object().unwrap_or(&empty);
            let mut merged = Map::new();
            for key in old
                .keys()
                .chain(new.keys().filter(|k| !old.contains_key(*k)))
            {
                let deeper = descend(patterns, &Segment::Key(key.clone()));
                let value = overlay_value(
                    old.get(key).unwrap_or(&Value::Null),
                    new.get(key).unwrap_or(&Value::Null),
                    &deeper,
                );
                if !value.is_null() || old.contains_key(key) {
                    merged.insert(key.clone(), value);
                }
            }
            if merged.is_empty() && stored.is_null() {
                Value::Null
            } else {
                Value::Object(merged)
            }
        }
        (Value::Array(_) | Value::Null, Value::Array(new)) => {
            let old = stored.as_array().map(Vec::as_slice).unwrap_or_default();
            Value::Array(
                new.iter()
                    .enumerate()
                    .map(|(index, item)| {
                        overlay_value(
                            old.get(index).unwrap_or(&Value::Null),
                            item,
                            &descend(patterns, &Segment::Index(index)),
                        )
                    })
                    .collect(),
            )
        }
        _ => stored.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use corral_api::Kind;
    use serde_json::json;

    fn pod(spec: Value, status: Value) -> Object {
        let mut object = Object::new(Kind::Pod, Some("default"), "web", spec);
        object.status = status;
        object.metadata.labels.insert("app".into(), "web".into());
        object
    }

    fn paths(list: &[&str]) -> Vec<String> {
        list.iter().map(|p| p.to_string()).collect()
    }

    #[test]
    fn a_compiled_mask_serves_what_strip_serves() {
        let object = pod(
            json!({
                "containers": [
                    {"name": "web", "image": "a", "env": {"A": "1"}, "ports": [80, 443]},
                    {"name": "log", "image": "b", "ports": [9090]}
                ],
                "runtime": "runc",
                "volumes": [{"name": "data", "size": "1Gi"}]
            }),
            json!({
                "node": "n1",
                "workflow": {"instances": [{"id": "start-1", "steps": {"a": {"phase": "done"}}}]},
                "containers": [{"name": "web", "ready": true}]
            }),
        );
        let cases: &[&[&str]] = &[
            &[],
            &["spec", "status"],
            &["spec.*"],
            &["spec.containers"],
            &["spec.containers[*].image", "status.node"],
            &["spec.containers[1].name", "spec.containers[*].image"],
            &["spec.containers[0]", "spec.containers[*].ports[1]"],
            &["spec.containers[*].ports[*]", "spec.volumes[0].size"],
            &["spec.runtime.deeper", "status.workflow.instances[*].steps"],
            &[
                "status.workflow",
                "status.workflow.instances[*].id",
                "metadata.labels",
            ],
            &["spec.missing", "status.containers[3]"],
        ];
        for case in cases {
            let patterns = paths(case);
            assert_eq!(
                Mask::new(&patterns).strip(&object),
                strip(&object, &patterns),
                "patterns {case:?}"
            );
        }
    }

    #[test]
    fn strip_keeps_metadata_and_declared_fields_only() {
        let object = pod(
            json!({"containers": [{"name": "web", "image": "a"}], "runtime": "runc", "availability": "ha"}),
            json!({"node": "n1", "phase": "Running"}),
        );
        let stripped = strip(&object, &paths(&["spec.containers"]));
        assert_eq!(
            stripped.spec,
            json!({"containers": [{"name": "web", "image": "a"}]})
        );
        assert_eq!(stripped.status, Value::Null);
        assert_eq!(stripped.metadata, object.metadata);
        assert_eq!(stripped.kind, Kind::Pod);
    }

    #[test]
    fn strip_supports_any_index_and_leaves() {
        let object = pod(
            json!({"containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "y"}]}),
            json!({"node": "n1", "phase": "Running"}),
        );
        let stripped = strip(
            &object,
            &paths(&["spec.containers[*].image", "status.node"]),
        );
        assert_eq!(
            stripped.spec,
            json!({"containers": [{"image": "x"}, {"image": "y"}]})
        );
        assert_eq!(stripped.status, json!({"node": "n1"}));
        let nothing = strip(&object, &[]);
        assert_eq!((nothing.spec, nothing.status), (Value::Null, Value::Null));
        let whole = strip(&object, &paths(&["spec", "status"]));
        assert_eq!(whole, object);
    }

    #[test]
    fn overlay_restores_what_the_writer_never_saw() {
        let stored = pod(
            json!({"containers": [{"name": "web", "image": "a"}], "runtime": "runc"}),
            json!({"node": "n1", "phase": "Running", "address": "fd00::1"}),
        );
        let served = strip(&stored, &paths(&["status.node"]));
        let mut written = served.clone();
        written.status = json!({"node": "n2"});
        let merged = overlay(&stored, &written, &paths(&["status.node"]));
        assert_eq!(merged.spec, stored.spec);
        assert_eq!(
            merged.status,
            json!({"node": "n2", "phase": "Running", "address": "fd00::1"})
        );
        // Writing back exactly what was served changes nothing.
        assert_eq!(overlay(&stored, &served, &paths(&["status.node"])), stored);
    }

    #[test]
    fn overlay_into_an_empty_status_and_through_arrays() {
        let stored = pod(
            json!({"containers": [{"name": "a", "image": "x"}]}),
            Value::Null,
        );
        let mut written = stored.clone();
        written.status = json!({"node": "n1", "phase": "Failed"});
        written.spec = json!({"containers": [{"image": "z"}]});
        let merged = overlay(
            &stored,
            &written,
            &paths(&["status.node", "spec.containers[*].image"]),
        );
        // A value set where nothing was served stays, for the check to refuse.
        assert_eq!(merged.status, json!({"node": "n1", "phase": "Failed"}));
        assert_eq!(
            merged.spec,
            json!({"containers": [{"name": "a", "image": "z"}]})
        );
    }

    #[test]
    fn segments_count_indices_and_ignore_a_final_star() {
        assert_eq!(segment_count("spec.containers[*].image"), 4);
        assert_eq!(segment_count("spec.*"), 1);
        assert_eq!(segment_count("status.node"), 2);
    }
}

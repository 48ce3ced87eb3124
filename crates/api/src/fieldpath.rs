//! Field paths (`spec.containers[0].image`) and the changes between two
//! JSON documents, path by path. History diffs and field ownership both
//! reason in these paths.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One leaf that differs between two documents. `old` is `None` when the
/// field was added, `new` is `None` when it was removed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct FieldChange {
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub old: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new: Option<Value>,
}

/// Every leaf path that differs between `old` and `new`, in key order,
/// each prefixed with `root` (`spec`, say; empty for none). Arrays compare by
/// index; objects by key; a value whose type changed is one change.
pub fn changed_paths(root: &str, old: &Value, new: &Value) -> Vec<FieldChange> {
    let mut changes = Vec::new();
    walk(root, Some(old), Some(new), &mut changes);
    changes
}

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_string()
    } else {
        format!("{prefix}.{key}")
    }
}

fn walk(path: &str, old: Option<&Value>, new: Option<&Value>, out: &mut Vec<FieldChange>) {
    match (old, new) {
        (Some(Value::Object(a)), Some(Value::Object(b))) => {
            for (key, value) in a {
                let other = b.get(key);
                // An unchanged subtree is skipped before its path is built.
                if other != Some(value) {
                    walk(&join(path, key), Some(value), other, out);
                }
            }
            for (key, value) in b.iter().filter(|(key, _)| !a.contains_key(*key)) {
                walk(&join(path, key), None, Some(value), out);
            }
        }
        (Some(Value::Array(a)), Some(Value::Array(b))) => {
            for index in 0..a.len().max(b.len()) {
                if a.get(index) != b.get(index) {
                    walk(&format!("{path}[{index}]"), a.get(index), b.get(index), out);
                }
            }
        }
        (Some(a), Some(b)) if a == b => {}
        (None, None) => {}
        (Some(Value::Null), None) | (None, Some(Value::Null)) => {}
        (old, new) => out.push(FieldChange {
            path: path.to_string(),
            old: old.cloned(),
            new: new.cloned(),
        }),
    }
}

/// Whether a concrete path (`spec.containers[0].image`) falls under a
/// pattern (`spec.containers[*].image`, `spec.*`, `status.workflow`). A
/// pattern covers its own subtree; `[*]` matches any index and a final
/// `.*` any child.
pub fn path_matches(pattern: &str, path: &str) -> bool {
    let pattern = pattern.strip_suffix(".*").unwrap_or(pattern);
    covers(&segments(pattern), &segments(path))
}

/// A pattern split once, for matching it against many paths: what
/// [`path_matches`] does, without splitting the pattern at every call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathPattern {
    segments: Vec<String>,
}

impl PathPattern {
    pub fn new(pattern: &str) -> Self {
        let pattern = pattern.strip_suffix(".*").unwrap_or(pattern);
        PathPattern {
            segments: segments(pattern).into_iter().map(str::to_string).collect(),
        }
    }

    /// Whether the concrete path split by [`split`] falls under it.
    pub fn matches(&self, path: &[&str]) -> bool {
        covers(&self.segments, path)
    }
}

/// A concrete path's segments, for [`PathPattern::matches`].
pub fn split(path: &str) -> Vec<&str> {
    segments(path)
}

/// Whether the pattern's segments cover the path's: each equal, or `[*]`
/// against any index, the pattern no longer than the path.
fn covers(pattern: &[impl AsRef<str>], path: &[&str]) -> bool {
    pattern.len() <= path.len()
        && pattern.iter().zip(path).all(|(want, have)| {
            let want = want.as_ref();
            want == *have || (want == "[*]" && have.starts_with('['))
        })
}

/// Splits `a.b[0].c` into `a`, `b`, `[0]`, `c`.
fn segments(path: &str) -> Vec<&str> {
    let mut out = Vec::new();
    for part in path.split('.').filter(|p| !p.is_empty()) {
        let mut rest = part;
        while let Some(open) = rest.find('[') {
            if open > 0 {
                out.push(&rest[..open]);
            }
            let close = rest[open..].find(']').map_or(rest.len(), |c| open + c + 1);
            out.push(&rest[open..close]);
            rest = &rest[close..];
        }
        if !rest.is_empty() {
            out.push(rest);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn changes_are_named_by_leaf_path() {
        let old =
            json!({"containers": [{"name": "web", "image": "a", "env": {"X": "1"}}], "gone": 1});
        let new = json!({"containers": [{"name": "web", "image": "b", "env": {"X": "1", "Y": "2"}}, {"name": "side"}]});
        let paths: Vec<String> = changed_paths("spec", &old, &new)
            .into_iter()
            .map(|c| c.path)
            .collect();
        assert_eq!(
            paths,
            vec![
                "spec.containers[0].env.Y",
                "spec.containers[0].image",
                "spec.containers[1]",
                "spec.gone"
            ]
        );
    }

    #[test]
    fn identical_documents_have_no_changes() {
        let doc = json!({"a": [1, {"b": null}]});
        assert!(changed_paths("", &doc, &doc).is_empty());
        assert!(changed_paths("", &json!({"a": null}), &json!({})).is_empty());
    }

    #[test]
    fn patterns_cover_subtrees_and_indices() {
        assert!(path_matches(
            "spec.containers[*].image",
            "spec.containers[3].image"
        ));
        assert!(path_matches("spec", "spec.containers[3].image"));
        assert!(path_matches("spec.*", "spec.containers"));
        assert!(path_matches(
            "status.workflow",
            "status.workflow[0].steps[2].state"
        ));
        assert!(!path_matches("status.node", "status.nodeName"));
        assert!(!path_matches(
            "spec.containers[*].image",
            "spec.containers[0].name"
        ));
        assert!(!path_matches("status.node.x", "status.node"));
    }

    #[test]
    fn a_pattern_split_once_matches_as_the_pattern_does() {
        let patterns = [
            "spec.containers[*].image",
            "spec",
            "spec.*",
            "status.workflow",
            "status.node",
            "status.node.x",
            "metadata.labels.app",
        ];
        let paths = [
            "spec.containers[3].image",
            "spec.containers[0].name",
            "spec.containers",
            "status.workflow[0].steps[2].state",
            "status.nodeName",
            "status.node",
            "metadata.labels.app",
            "metadata.labels",
        ];
        let mut matched = 0;
        for pattern in patterns {
            let split_once = PathPattern::new(pattern);
            for path in paths {
                let expected = path_matches(pattern, path);
                assert_eq!(
                    split_once.matches(&split(path)),
                    expected,
                    "{pattern} against {path}"
                );
                matched += usize::from(expected);
            }
        }
        // Both answers occur: the comparison is not of two constants.
        assert!(matched > 3 && matched < patterns.len() * paths.len());
    }
}

//! Human renderings shared by the API and the CLI: a spec as YAML and the
//! unified diff between two specs.

use serde_json::Value;

use corral_api::fieldpath::changed_paths;
pub use corral_api::history::RevisionDiff;

/// Renders a JSON value as YAML for people.
pub fn to_yaml(value: &Value) -> String {
    serde_yaml_ng::to_string(value).unwrap_or_else(|_| value.to_string())
}

/// The diff from spec `old` (revision `from`) to spec `new` (revision `to`).
pub fn diff_specs(from: u64, old: &Value, to: u64, new: &Value) -> RevisionDiff {
    let old_text = to_yaml(old);
    let new_text = to_yaml(new);
    let unified = similar::TextDiff::from_lines(&old_text, &new_text)
        .unified_diff()
        .context_radius(3)
        .header(&format!("revision {from}"), &format!("revision {to}"))
        .to_string();
    RevisionDiff {
        from,
        to,
        changes: changed_paths("spec", old, new),
        unified,
    }
}

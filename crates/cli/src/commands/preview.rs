//! What applying a manifest would do, without doing it: `apply --dry-run`
//! and `diff -f FILE`. Each object is compared with the live one: created,
//! unchanged, or changed — with the spec's unified diff and, for a pod,
//! which containers its node would restart (the agent's own rule: a
//! container restarts when what it was started from changes).

use std::collections::BTreeMap;
use std::io::IsTerminal;

use corral_agent::plan::config_hash;
use corral_api::kinds::{PodSpec, SecretSpec};
use corral_api::{Kind, Object, canonical_spec};
use corral_client::Client;

/// Prints what applying `objects` would do; returns whether anything would
/// change. Nothing is written.
pub async fn preview(client: &Client, objects: &[Object]) -> anyhow::Result<bool> {
    let mut any = false;
    for object in objects {
        let key = object.key();
        let new_spec = canonical_spec(object.kind, &object.spec);
        let live = match client.get(&key).await {
            Ok(live) => live,
            Err(error) if error.status() == Some(404) => {
                println!("{key} would be created");
                any = true;
                continue;
            }
            Err(error) => return Err(error.into()),
        };
        if object.kind == Kind::Secret {
            any |= secret_preview(client, object, &live).await?;
            continue;
        }
        if live.spec == new_spec {
            println!("{key} unchanged (revision {})", live.metadata.revision);
            continue;
        }
        any = true;
        let next = live.metadata.revision + 1;
        println!(
            "{key} would change (revision {} → {next}):",
            live.metadata.revision
        );
        let diff =
            corral_server::render::diff_specs(live.metadata.revision, &live.spec, next, &new_spec);
        print_unified(&diff.unified);
        if object.kind == Kind::Pod
            && let (Ok(old), Ok(new)) = (
                serde_json::from_value::<PodSpec>(live.spec.clone()),
                serde_json::from_value::<PodSpec>(new_spec),
            )
        {
            println!("  {}", restarts(&old, &new));
        }
    }
    Ok(any)
}

/// A Secret's preview names keys, never values: compared exactly when the
/// caller may read the live values, by key and size otherwise. Returns
/// whether it would (or may) change.
async fn secret_preview(client: &Client, object: &Object, live: &Object) -> anyhow::Result<bool> {
    use base64::Engine;
    use base64::engine::general_purpose::STANDARD;
    let key = object.key();
    let revision = live.metadata.revision;
    let new: SecretSpec = serde_json::from_value(object.spec.clone())?;
    let old: SecretSpec = serde_json::from_value(live.spec.clone())?;
    if !new.has_values() {
        let same = new.keys == old.keys && new.secret_type == old.secret_type;
        let verb = if same { "unchanged" } else { "would change" };
        println!("{key} {verb} (revision {revision})");
        return Ok(!same);
    }
    let mut values: BTreeMap<&str, Vec<u8>> = BTreeMap::new();
    for (name, text) in &new.data {
        values.insert(name, STANDARD.decode(text).unwrap_or_default());
    }
    for (name, text) in &new.string_data {
        values.insert(name, text.as_bytes().to_vec());
    }
    let live_values = client.reveal(&key, None).await.ok().map(|revealed| {
        revealed
            .data
            .into_iter()
            .map(|(name, text)| (name, STANDARD.decode(text).unwrap_or_default()))
            .collect::<BTreeMap<String, Vec<u8>>>()
    });
    let mut changes = Vec::new();
    for (name, value) in &values {
        let change = match (old.keys.get(*name), &live_values) {
            (None, _) => Some("added"),
            (Some(_), Some(live)) if live.get(*name) != Some(value) => Some("changes"),
            (Some(info), None) if info.size != value.len() as u64 => Some("changes"),
            (Some(_), None) => Some("may change"),
            _ => None,
        };
        if let Some(change) = change {
            changes.push(format!("{name} {change}"));
        }
    }
    for name in old.keys.keys() {
        if !values.contains_key(name.as_str()) {
            changes.push(format!("{name} is removed"));
        }
    }
    if new.secret_type != old.secret_type {
        changes.push("type changes".into());
    }
    if changes.is_empty() {
        println!("{key} unchanged (revision {revision})");
        return Ok(false);
    }
    println!(
        "{key} would change (revision {revision} → {}): {}",
        revision + 1,
        changes.join("; ")
    );
    if live_values.is_none() && changes.iter().any(|c| c.ends_with("may change")) {
        println!("  (values are compared only by size: this token may not read the live ones)");
    }
    Ok(true)
}

/// "containers: web restarts; side keeps running; log is added".
pub fn restarts(old: &PodSpec, new: &PodSpec) -> String {
    let before: BTreeMap<&str, String> = old
        .containers
        .iter()
        .map(|c| (c.name.as_str(), config_hash(old, c)))
        .collect();
    let mut parts = Vec::new();
    for container in &new.containers {
        let name = container.name.as_str();
        parts.push(match before.get(name) {
            Some(hash) if *hash == config_hash(new, container) => format!("{name} keeps running"),
            Some(_) => format!("{name} restarts"),
            None => format!("{name} is added"),
        });
    }
    for name in before.keys() {
        if !new.containers.iter().any(|c| c.name == *name) {
            parts.push(format!("{name} stops"));
        }
    }
    format!("containers: {}", parts.join("; "))
}

/// A unified diff, coloured on a terminal.
pub fn print_unified(unified: &str) {
    let color = std::io::stdout().is_terminal();
    for line in unified.lines() {
        match (color, line.chars().next()) {
            (true, Some('+')) if !line.starts_with("+++") => println!("\x1b[32m{line}\x1b[0m"),
            (true, Some('-')) if !line.starts_with("---") => println!("\x1b[31m{line}\x1b[0m"),
            (true, Some('@')) => println!("\x1b[36m{line}\x1b[0m"),
            _ => println!("{line}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(value: serde_json::Value) -> PodSpec {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn only_containers_whose_inputs_change_restart() {
        let old = spec(serde_json::json!({"containers": [
            {"name": "web", "image": "busybox", "env": {"A": "1"}},
            {"name": "side", "image": "busybox"},
            {"name": "old", "image": "busybox"},
        ]}));
        let new = spec(serde_json::json!({"containers": [
            {"name": "web", "image": "busybox", "env": {"A": "2"}},
            {"name": "side", "image": "busybox"},
            {"name": "log", "image": "busybox"},
        ]}));
        assert_eq!(
            restarts(&old, &new),
            "containers: web restarts; side keeps running; log is added; old stops"
        );
    }
}

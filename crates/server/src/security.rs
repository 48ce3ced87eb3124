//! Admission of sandbox relaxations: a pod (or a `PinnedDeployment`'s pod
//! templates) asking for a relaxation is written only when a `Policy`
//! applying to its namespace grants it. The rule is
//! [`corral_api::security::admit_pod`]; this module loads the Policies and
//! maps a refusal to 403. Writing Policies is an operator's right, checked
//! by field ownership (`corral_ownership` owns `Policy` fields to
//! operators).

use corral_api::kinds::{
    JobSpec, PerNodeDeploymentSpec, PinnedDeploymentSpec, PodSpec, PolicySpec, RuntimeClass,
};
use corral_api::security::{admit_pod, namespace_runtime};
use corral_api::{Kind, Object};
use serde::Deserialize;
use serde_json::Value;

use crate::Server;
use crate::error::ApiError;

/// Refuses `new` when it asks for a relaxation no Policy grants. Only
/// pods and pinned deployments whose spec changed (or that are new) and
/// that ask for something are checked; the rest pass without a store read.
///
/// A new pod that names no runtime gets its namespace's default written
/// into its spec when a Policy makes that gVisor (and [`keep_runtime`]
/// keeps it on later writes). The spec then says what the pod runs with, and a
/// later change of the Policy restarts nothing.
pub async fn admit(
    server: &Server,
    old: Option<&Object>,
    new: &mut Object,
) -> Result<(), ApiError> {
    default_runtime(server, old, new).await?;
    if old.is_some_and(|old| old.spec == new.spec) {
        return Ok(());
    }
    // Most writes ask for nothing: seen in the JSON, without decoding.
    if !pod_spec_values(new).into_iter().any(asks) {
        return Ok(());
    }
    let specs = pod_specs(new);
    let asking = |spec: &PodSpec| spec.runtime.is_some() || !spec.security.relax.is_empty();
    if !specs.iter().any(asking) {
        return Ok(());
    }
    let namespace = new.key().namespace;
    let policies = policies(server).await?;
    for spec in specs.iter().filter(|spec| asking(spec)) {
        admit_pod(&namespace, spec, &policies)
            .map_err(|refusal| ApiError::Forbidden(refusal.to_string()))?;
    }
    Ok(())
}

/// A pod that names no runtime keeps the one it has: an apply that leaves
/// `runtime` out changes nothing.
pub fn keep_runtime(old: &Object, new: &mut Object) {
    if new.kind != Kind::Pod {
        return;
    }
    let kept = old
        .spec
        .get("runtime")
        .and_then(|runtime| RuntimeClass::deserialize(runtime).ok());
    set_runtime_if_unset(new, kept);
}

async fn default_runtime(
    server: &Server,
    old: Option<&Object>,
    new: &mut Object,
) -> Result<(), ApiError> {
    if new.kind != Kind::Pod || old.is_some() {
        return Ok(());
    }
    let unset = new
        .typed_spec::<PodSpec>()
        .is_ok_and(|spec| spec.runtime.is_none());
    if !unset {
        return Ok(());
    }
    let namespace = new.key().namespace;
    if let (RuntimeClass::Gvisor, _) = namespace_runtime(&namespace, &policies(server).await?) {
        set_runtime_if_unset(new, Some(RuntimeClass::Gvisor));
    }
    Ok(())
}

fn set_runtime_if_unset(object: &mut Object, runtime: Option<RuntimeClass>) {
    let Some(runtime) = runtime else { return };
    if let Some(spec) = object.spec.as_object_mut()
        && spec.get("runtime").is_none_or(serde_json::Value::is_null)
        && let Ok(value) = serde_json::to_value(runtime)
    {
        spec.insert("runtime".to_string(), value);
    }
}

/// The pod specs `object` carries: its own for a pod, both templates' for
/// a pinned deployment, its template's for a Job. A spec that does not decode is validation's to
/// refuse, so it yields none here.
fn pod_specs(object: &Object) -> Vec<PodSpec> {
    match object.kind {
        Kind::Pod => object.typed_spec::<PodSpec>().into_iter().collect(),
        Kind::PinnedDeployment => object
            .typed_spec::<PinnedDeploymentSpec>()
            .map(|spec| vec![spec.templates.previous.spec, spec.templates.next.spec])
            .unwrap_or_default(),
        Kind::PerNodeDeployment => object
            .typed_spec::<PerNodeDeploymentSpec>()
            .map(|spec| vec![spec.template.spec])
            .unwrap_or_default(),
        Kind::Job => object
            .typed_spec::<JobSpec>()
            .map(|spec| vec![spec.template.spec])
            .unwrap_or_default(),
        _ => Vec::new(),
    }
}

/// The pod specs of [`pod_specs`], as the object's JSON holds them.
fn pod_spec_values(object: &Object) -> Vec<&Value> {
    let at = |path: &[&str]| {
        path.iter()
            .try_fold(&object.spec, |value, key| value.get(key))
    };
    match object.kind {
        Kind::Pod => vec![&object.spec],
        Kind::PinnedDeployment => [
            at(&["templates", "previous", "spec"]),
            at(&["templates", "next", "spec"]),
        ]
        .into_iter()
        .flatten()
        .collect(),
        Kind::PerNodeDeployment | Kind::Job => at(&["template", "spec"]).into_iter().collect(),
        _ => Vec::new(),
    }
}

/// Whether a pod spec names a runtime or a relaxation (what the typed
/// check asks: `runtime` set, `security.relax` not empty).
fn asks(spec: &Value) -> bool {
    spec.get("runtime")
        .is_some_and(|runtime| !runtime.is_null())
        || spec
            .get("security")
            .and_then(|security| security.get("relax"))
            .and_then(Value::as_array)
            .is_some_and(|relax| !relax.is_empty())
}

async fn policies(server: &Server) -> Result<Vec<(String, PolicySpec)>, ApiError> {
    let listed = server.store.list(Kind::Policy, None).await?;
    Ok(listed
        .objects
        .iter()
        .filter_map(|policy| {
            let spec = policy.typed_spec::<PolicySpec>().ok()?;
            Some((policy.metadata.name.clone(), spec))
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn typed_asks(object: &Object) -> bool {
        pod_specs(object)
            .iter()
            .any(|spec| spec.runtime.is_some() || !spec.security.relax.is_empty())
    }

    #[test]
    fn the_json_look_asks_what_the_typed_check_asks() {
        let plain = json!({"containers": [{"name": "c", "image": "i"}]});
        let with = |extra: serde_json::Value| {
            let mut spec = plain.clone();
            for (key, value) in extra.as_object().unwrap() {
                spec[key] = value.clone();
            }
            spec
        };
        let pod_specs = [
            (plain.clone(), false),
            (with(json!({"runtime": null})), false),
            (with(json!({"security": {"relax": []}})), false),
            (with(json!({"runtime": "gvisor"})), true),
            (with(json!({"security": {"relax": ["run-as-root"]}})), true),
        ];
        for (spec, expected) in pod_specs {
            let template = json!({"spec": spec});
            let objects = [
                Object::new(Kind::Pod, Some("default"), "p", spec.clone()),
                Object::new(
                    Kind::Job,
                    Some("default"),
                    "j",
                    json!({"template": template}),
                ),
                Object::new(
                    Kind::PerNodeDeployment,
                    Some("default"),
                    "n",
                    json!({"template": template}),
                ),
                Object::new(
                    Kind::PinnedDeployment,
                    Some("default"),
                    "d",
                    json!({"replicas": 1, "selector": {},
                           "templates": {"previous": {"spec": plain}, "next": template}}),
                ),
            ];
            for object in objects {
                let looked = pod_spec_values(&object).into_iter().any(asks);
                assert_eq!(looked, expected, "{} {spec}", object.kind);
                assert_eq!(typed_asks(&object), expected, "{} {spec}", object.kind);
            }
        }
        let policy = Object::new(Kind::Policy, None, "p", json!({"namespaces": ["*"]}));
        assert!(pod_spec_values(&policy).is_empty());
    }

    #[test]
    fn keep_runtime_keeps_the_stored_runtime_when_the_new_spec_names_none() {
        let old = Object::new(
            Kind::Pod,
            Some("default"),
            "p",
            json!({"containers": [], "runtime": "gvisor"}),
        );
        let mut new = Object::new(Kind::Pod, Some("default"), "p", json!({"containers": []}));
        keep_runtime(&old, &mut new);
        assert_eq!(new.spec["runtime"], "gvisor");
        let mut named = Object::new(
            Kind::Pod,
            Some("default"),
            "p",
            json!({"containers": [], "runtime": "runc"}),
        );
        keep_runtime(&old, &mut named);
        assert_eq!(named.spec["runtime"], "runc");
    }
}

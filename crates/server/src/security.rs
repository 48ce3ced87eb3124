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
    let kept = old.typed_spec::<PodSpec>().ok().and_then(|old| old.runtime);
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

//! Admission of sandbox relaxations: a pod (or a `PinnedDeployment`'s pod
//! templates) asking for a relaxation is written only when a `Policy`
//! applying to its namespace grants it. The rule is
//! [`corral_api::security::admit_pod`]; this module loads the Policies and
//! maps a refusal to 403. Writing Policies is an operator's right, checked
//! by field ownership (`corral_ownership` owns `Policy` fields to
//! operators).

use corral_api::kinds::{PinnedDeploymentSpec, PodSpec, PolicySpec};
use corral_api::security::admit_pod;
use corral_api::{Kind, Object};

use crate::Server;
use crate::error::ApiError;

/// Refuses `new` when it asks for a relaxation no Policy grants. Only
/// pods and pinned deployments whose spec changed (or that are new) and
/// that ask for something are checked; the rest pass without a store read.
pub async fn admit(server: &Server, old: Option<&Object>, new: &Object) -> Result<(), ApiError> {
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

/// The pod specs `object` carries: its own for a pod, both templates' for
/// a pinned deployment. A spec that does not decode is validation's to
/// refuse, so it yields none here.
fn pod_specs(object: &Object) -> Vec<PodSpec> {
    match object.kind {
        Kind::Pod => object.typed_spec::<PodSpec>().into_iter().collect(),
        Kind::PinnedDeployment => object
            .typed_spec::<PinnedDeploymentSpec>()
            .map(|spec| vec![spec.templates.previous.spec, spec.templates.next.spec])
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

//! Request handlers, one module per area. Handlers parse the request into
//! domain values, call the store, and map failures through [`ApiError`].

pub mod history;
pub mod image_import;
pub mod lease;
pub mod node_certificate;
pub mod node_images;
pub mod objects;
pub mod pods_io;
pub mod secrets;
pub mod steps;
pub mod system;
pub mod tokens;
pub mod watch;

use std::collections::HashMap;

use bytes::Bytes;
use corral_api::manifest::decode_object;
use corral_api::{Identity, Kind, Object, ObjectKey, validated};
use corral_store::ChangeMeta;

use crate::Server;
use crate::error::ApiError;

/// The kind, namespace and name a request's path names.
#[derive(Debug, Clone)]
pub struct Target {
    pub kind: Kind,
    /// `Some` on `/v1/namespaces/{namespace}/…` routes.
    pub namespace: Option<String>,
    pub name: Option<String>,
}

impl Target {
    /// Reads `plural`, `namespace` and `name` from the route's parameters and
    /// checks the route shape fits the kind.
    pub fn from_params(params: &HashMap<String, String>) -> Result<Self, ApiError> {
        let plural = params.get("plural").map(String::as_str).unwrap_or_default();
        let kind: Kind = plural
            .parse()
            .map_err(|e: corral_api::UnknownKind| ApiError::NotFound(e.to_string()))?;
        let namespace = params.get("namespace").cloned();
        let name = params.get("name").cloned();
        match (&namespace, kind.is_namespaced(), &name) {
            (Some(_), false, _) => Err(ApiError::NotFound(format!(
                "{kind} objects are cluster-wide: use /v1/{}/NAME",
                kind.plural()
            ))),
            (None, true, Some(name)) => Err(ApiError::NotFound(format!(
                "{kind} objects live in namespaces: use /v1/namespaces/default/{}/{name}",
                kind.plural()
            ))),
            _ => Ok(Target {
                kind,
                namespace,
                name,
            }),
        }
    }

    /// The key of the named object.
    pub fn key(&self) -> Result<ObjectKey, ApiError> {
        let name = self
            .name
            .as_deref()
            .ok_or_else(|| ApiError::BadRequest("the route names no object".into()))?;
        Ok(ObjectKey::new(self.kind, self.namespace.as_deref(), name))
    }
}

/// Who is changing what, now.
pub fn change(server: &Server, caller: &Identity, message: Option<&str>) -> ChangeMeta {
    ChangeMeta {
        author: caller.name.clone(),
        class: caller.class(),
        message: message.unwrap_or_default().to_string(),
        time: server.clock.now(),
        always_record: false,
    }
}

/// Decodes and validates a request body as an object of the target's kind,
/// at the target's key when the route names one.
pub fn parse_object(target: &Target, body: &Bytes) -> Result<Object, ApiError> {
    // The body as it usually comes (canonical kind, every field known)
    // decodes straight into an object; anything else takes the way that
    // accepts a kind's other names and says where the body is wrong.
    let object = match serde_json::from_slice::<Object>(body) {
        Ok(object) => object,
        Err(_) => decode_body(body)?,
    };
    if object.kind != target.kind {
        return Err(ApiError::BadRequest(format!(
            "kind: the body is a {} but the route is for {}",
            object.kind,
            target.kind.plural()
        )));
    }
    let key = object.key();
    let object = validated(object).map_err(|fields| ApiError::invalid(&key.to_string(), fields))?;
    if let Some(name) = &target.name
        && *name != key.name
    {
        return Err(ApiError::BadRequest(format!(
            "metadata.name: the body names {:?} but the route names {name:?}",
            key.name
        )));
    }
    if let Some(namespace) = &target.namespace
        && *namespace != key.namespace
    {
        return Err(ApiError::BadRequest(format!(
            "metadata.namespace: the body says {:?} but the route says {namespace:?}",
            key.namespace
        )));
    }
    Ok(object)
}

/// The body as JSON, its kind by any of its names made canonical, decoded
/// with the path of what does not fit.
fn decode_body(body: &Bytes) -> Result<Object, ApiError> {
    let mut value: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::BadRequest(format!("request body is not valid JSON: {e}")))?;
    // Any name the CLI accepts (`pod`, `PD`), stored canonical.
    if let Some(kind) = value
        .get("kind")
        .and_then(serde_json::Value::as_str)
        .and_then(|kind| kind.parse::<Kind>().ok())
    {
        value["kind"] = kind.as_str().into();
    }
    decode_object(value).map_err(|e| ApiError::invalid("object", vec![e]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pods() -> Target {
        Target {
            kind: Kind::Pod,
            namespace: Some("default".into()),
            name: Some("web".into()),
        }
    }

    fn parse(body: &str) -> Result<Object, ApiError> {
        parse_object(&pods(), &Bytes::from(body.to_string()))
    }

    fn refusal(body: &str) -> String {
        parse(body).unwrap_err().to_string()
    }

    const SPEC: &str = r#""spec": {"containers": [{"name": "c", "image": "i"}]}"#;

    #[test]
    fn a_kind_by_another_name_parses_as_the_canonical_body_does() {
        let canonical = parse(&format!(
            r#"{{"kind": "Pod", "metadata": {{"name": "web"}}, {SPEC}}}"#
        ))
        .unwrap();
        for kind in ["pod", "PO", "pods"] {
            let other = parse(&format!(
                r#"{{"kind": "{kind}", "metadata": {{"name": "web"}}, {SPEC}}}"#
            ))
            .unwrap();
            assert_eq!(other, canonical, "{kind}");
        }
        // Validated and canonical: the defaults are spelled out.
        assert_eq!(canonical.spec["restartPolicy"], "Always");
        assert_eq!(canonical.key().namespace, "default");
    }

    #[test]
    fn a_body_that_does_not_fit_is_refused_with_the_path() {
        assert!(refusal("{").starts_with("request body is not valid JSON"));
        let unknown = refusal(&format!(
            r#"{{"kind": "Pod", "metadata": {{"name": "web", "colour": 1}}, {SPEC}}}"#
        ));
        assert!(unknown.contains("metadata"), "{unknown}");
        assert!(unknown.contains("colour"), "{unknown}");
        let typo = refusal(
            r#"{"kind": "Pod", "metadata": {"name": "web"}, "spec": {"containers": [{"name": "c", "imag": "i"}]}}"#,
        );
        assert!(typo.contains("spec.containers[0]"), "{typo}");
        let kind = refusal(&format!(
            r#"{{"kind": "Node", "metadata": {{"name": "web"}}, {SPEC}}}"#
        ));
        assert!(kind.starts_with("kind: the body is a Node"), "{kind}");
    }
}

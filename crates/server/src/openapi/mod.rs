//! The OpenAPI 3 document of the API, generated so it cannot drift: the
//! schemas from the Rust types, the paths from the route table the router
//! is built from ([`crate::routes`]), each route with its operations.
//! `docs/openapi.json` is a checked-in copy that a test keeps equal
//! (regenerate with `corral openapi > docs/openapi.json`).

pub(crate) mod objects;
pub(crate) mod system;

use corral_api::{Kind, Object, RevisionRecord};
use schemars::generate::SchemaSettings;
use serde_json::{Value, json};

use crate::error::ErrorBody;
use crate::render::RevisionDiff;

pub(crate) fn error_responses() -> Value {
    let error = json!({"content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}});
    let mut responses = serde_json::Map::new();
    for (status, what) in [
        ("400", "malformed request"),
        ("401", "no or unknown token"),
        ("403", "the caller may not do this"),
        ("404", "no such object or revision"),
        ("409", "already exists, or stale resourceVersion"),
        (
            "422",
            "the object breaks a validation rule; `fields` names each path",
        ),
    ] {
        let mut response = error.clone();
        response["description"] = json!(what);
        responses.insert(status.to_string(), response);
    }
    Value::Object(responses)
}

pub(crate) fn ok(schema: Value, description: &str) -> Value {
    let mut responses = error_responses();
    responses["200"] = json!({
        "description": description,
        "content": {"application/json": {"schema": schema}}
    });
    responses
}

pub(crate) fn schema_ref(name: &str) -> Value {
    json!({"$ref": format!("#/components/schemas/{name}")})
}

/// The whole OpenAPI document.
pub fn document() -> Value {
    let mut generator = SchemaSettings::openapi3().into_generator();
    generator.subschema_for::<Object>();
    generator.subschema_for::<RevisionRecord>();
    generator.subschema_for::<ErrorBody>();
    generator.subschema_for::<RevisionDiff>();
    generator.subschema_for::<corral_api::Identity>();
    generator.subschema_for::<corral_api::workflow::StepActionRequest>();
    generator.subschema_for::<corral_api::workflow::StepBatchRequest>();
    generator.subschema_for::<corral_api::workflow::RecoveryReport>();
    generator.subschema_for::<corral_api::workflow::WorkflowStatus>();
    generator.subschema_for::<corral_api::workflow::WorkflowInstance>();
    generator.subschema_for::<corral_api::workflow::StepLogEntry>();
    generator.subschema_for::<crate::handlers::lease::Lease>();
    generator.subschema_for::<corral_api::kinds::ImagePruneReport>();
    generator.subschema_for::<corral_api::kinds::NodeCertificateRequest>();
    generator.subschema_for::<corral_api::kinds::NodeCertificate>();
    generator.subschema_for::<corral_api::kinds::RevealedSecret>();
    generator.subschema_for::<crate::secrets::RotationReport>();
    generator.subschema_for::<corral_api::identity::TokenInfo>();
    generator.subschema_for::<corral_api::identity::Revoked>();
    generator.subschema_for::<corral_api::kinds::NodeImagesReport>();
    for kind in Kind::ALL {
        corral_api::kinds::spec_schema(kind, &mut generator);
    }
    let schemas = generator.take_definitions(true);

    let mut paths = serde_json::Map::new();
    for route in crate::routes::table() {
        let operations: serde_json::Map<String, Value> = route
            .operations()
            .map(|(method, doc)| (method.as_str().to_ascii_lowercase(), doc.clone()))
            .collect();
        paths.insert(route.path().to_string(), Value::Object(operations));
    }
    json!({
        "openapi": "3.0.3",
        "info": {"title": "corral API", "version": "v1",
            "description": "Objects, revisions, history and watch of a corral cluster. Every request but /healthz and /metrics needs `Authorization: Bearer TOKEN`."},
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}
        },
        "security": [{"bearer": []}],
        "paths": paths,
    })
}

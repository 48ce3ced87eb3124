//! The OpenAPI 3 document of the API, generated from the Rust types so it
//! cannot drift; `docs/openapi.json` is a checked-in copy that a test keeps
//! equal (regenerate with `corral openapi > docs/openapi.json`).

use corral_api::{Kind, Object, RevisionRecord};
use schemars::generate::SchemaSettings;
use serde_json::{Value, json};

use crate::error::ErrorBody;
use crate::render::RevisionDiff;

fn error_responses() -> Value {
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

fn ok(schema: Value, description: &str) -> Value {
    let mut responses = error_responses();
    responses["200"] = json!({
        "description": description,
        "content": {"application/json": {"schema": schema}}
    });
    responses
}

fn schema_ref(name: &str) -> Value {
    json!({"$ref": format!("#/components/schemas/{name}")})
}

fn object_paths(prefix: &str, kind_names: &str, namespaced: bool) -> Vec<(String, Value)> {
    let mut params = vec![json!({"name": "plural", "in": "path", "required": true,
        "schema": {"type": "string"}, "description": kind_names})];
    if namespaced {
        params.push(json!({"name": "namespace", "in": "path", "required": true, "schema": {"type": "string"}}));
    }
    let mut named = params.clone();
    named.push(
        json!({"name": "name", "in": "path", "required": true, "schema": {"type": "string"}}),
    );
    let message = json!({"name": "message", "in": "query", "schema": {"type": "string"},
        "description": "recorded in history with the new revision"});
    let object = schema_ref("Object");
    let body = json!({"required": true, "content": {"application/json": {"schema": object}}});
    let history = json!({"type": "array", "items": schema_ref("RevisionRecord")});
    let mut revision_params = named.clone();
    revision_params.push(
        json!({"name": "revision", "in": "path", "required": true, "schema": {"type": "integer"}}),
    );
    vec![
        (
            format!("{prefix}/{{plural}}"),
            json!({
                "get": {"summary": "list objects, or watch them with watch=true (newline-delimited JSON events)",
                    "parameters": ([params.clone(), vec![
                        json!({"name": "selector", "in": "query", "schema": {"type": "string"}, "description": "label selector: a=b,c!=d,e,!f"}),
                        json!({"name": "node", "in": "query", "schema": {"type": "string"}, "description": "pods and virtualmachines bound to this node; a watch hears one that leaves the node as a deletion"}),
                        json!({"name": "limit", "in": "query", "schema": {"type": "integer"}, "description": "at most this many objects; the answer's continue token gets the next page"}),
                        json!({"name": "continue", "in": "query", "schema": {"type": "string"}, "description": "the continue token of the previous page"}),
                        json!({"name": "watch", "in": "query", "schema": {"type": "boolean"}}),
                        json!({"name": "resourceVersion", "in": "query", "schema": {"type": "integer"}, "description": "watch changes after this store revision (410 Gone: list again)"}),
                    ]].concat()),
                    "responses": ok(json!({"type": "object", "properties": {"items": {"type": "array", "items": object}, "resourceVersion": {"type": "integer"}, "continue": {"type": "string"}}}), "the objects")},
                "post": {"summary": "create an object", "parameters": ([params.clone(), vec![message.clone()]].concat()),
                    "requestBody": body, "responses": ok(object.clone(), "the created object")}
            }),
        ),
        (
            format!("{prefix}/{{plural}}/{{name}}"),
            json!({
                "get": {"summary": "read an object", "parameters": named, "responses": ok(object.clone(), "the object")},
                "put": {"summary": "apply: create, or replace spec, labels and annotations (compare-and-swap when metadata.resourceVersion is set)",
                    "parameters": ([named.clone(), vec![message.clone()]].concat()), "requestBody": body, "responses": ok(object.clone(), "the stored object")},
                "delete": {"summary": "delete an object", "parameters": ([named.clone(), vec![message.clone(),
                    json!({"name": "resourceVersion", "in": "query", "schema": {"type": "integer"}})]].concat()),
                    "responses": ok(object.clone(), "the deleted object")}
            }),
        ),
        (
            format!("{prefix}/{{plural}}/{{name}}/status"),
            json!({
                "put": {"summary": "replace the status; never creates a revision", "parameters": named,
                    "requestBody": body, "responses": ok(object.clone(), "the stored object")}
            }),
        ),
        (
            format!("{prefix}/{{plural}}/{{name}}/history"),
            json!({
                "get": {"summary": "the object's revisions, oldest first", "parameters": named, "responses": ok(history, "revisions")}
            }),
        ),
        (
            format!("{prefix}/{{plural}}/{{name}}/history/{{revision}}"),
            json!({
                "get": {"summary": "one revision with its spec", "parameters": revision_params, "responses": ok(schema_ref("RevisionRecord"), "the revision")}
            }),
        ),
        (
            format!("{prefix}/{{plural}}/{{name}}/diff"),
            json!({
                "get": {"summary": "changes between two revisions", "parameters": ([named.clone(), vec![
                    json!({"name": "from", "in": "query", "required": true, "schema": {"type": "integer"}}),
                    json!({"name": "to", "in": "query", "schema": {"type": "integer"}, "description": "default: the current revision"})]].concat()),
                    "responses": ok(schema_ref("RevisionDiff"), "the diff")}
            }),
        ),
        (
            format!("{prefix}/{{plural}}/{{name}}/rollback"),
            json!({
                "post": {"summary": "create a new revision whose spec is revision `to`'s", "parameters": named,
                    "requestBody": {"required": true, "content": {"application/json": {"schema": {"type": "object", "required": ["to"],
                        "properties": {"to": {"type": "integer"}, "message": {"type": "string"}}}}}},
                    "responses": ok(object, "the rolled-back object")}
            }),
        ),
        (
            format!("{prefix}/{{plural}}/{{name}}/steps"),
            json!({
                "post": {"summary": "a step owner claims, completes, fails or logs for a step of the object's workflow (403: not the owner; 409: the step's state does not allow it); a batch of actions and owned status fields is applied in one write, all or none",
                    "parameters": named.clone(),
                    "requestBody": {"required": true, "content": {"application/json": {"schema": {"oneOf": [schema_ref("StepActionRequest"), schema_ref("StepBatchRequest")]}}}},
                    "responses": ok(schema_ref("WorkflowInstance"), "the workflow instance afterwards")}
            }),
        ),
        (
            format!("{prefix}/{{plural}}/{{name}}/workflows"),
            json!({
                "get": {"summary": "the object's kept workflow instances, each joined with its WorkflowDefinition; finished ones replayed from the step log (what why and analyze render)",
                    "parameters": named.clone(),
                    "responses": ok(schema_ref("WorkflowStatus"), "the instances, oldest first")}
            }),
        ),
        (
            format!("{prefix}/{{plural}}/{{name}}/steplogs"),
            json!({
                "get": {"summary": "the object's workflow step log: every transition and every line step owners appended, in time order",
                    "parameters": ([named.clone(), vec![
                        json!({"name": "step", "in": "query", "schema": {"type": "string"}, "description": "only this step"}),
                        json!({"name": "owner", "in": "query", "schema": {"type": "string"}, "description": "only steps of this owner"}),
                        json!({"name": "workflow", "in": "query", "schema": {"type": "string"}, "description": "only this workflow instance (start-1)"})]].concat()),
                    "responses": ok(json!({"type": "array", "items": schema_ref("StepLogEntry")}), "log entries")}
            }),
        ),
        (
            format!("{prefix}/{{plural}}/{{name}}/logs"),
            json!({
                "get": {"summary": "pods and VMs, people only: a pod container's log or a VM's console log, streamed from the agent of its node (text/plain)",
                    "parameters": ([named.clone(), vec![
                        json!({"name": "container", "in": "query", "schema": {"type": "string"}, "description": "pods: default the pod's only container"}),
                        json!({"name": "follow", "in": "query", "schema": {"type": "boolean"}, "description": "keep streaming appended output"}),
                        json!({"name": "tail", "in": "query", "schema": {"type": "integer"}, "description": "start at the last N lines"})]].concat()),
                    "responses": {"200": {"description": "the log bytes", "content": {"text/plain": {"schema": {"type": "string"}}}}}}
            }),
        ),
        (
            format!("{prefix}/{{plural}}/{{name}}/exec"),
            json!({
                "post": {"summary": "pods only, people only: run a command in a container. Send Connection: Upgrade and Upgrade: corral-exec; after 101 the connection carries framed stdin, stdout, stderr and the exit code (see corral_client::exec_protocol)",
                    "parameters": ([named.clone(), vec![
                        json!({"name": "container", "in": "query", "schema": {"type": "string"}, "description": "default: the pod's only container"}),
                        json!({"name": "tty", "in": "query", "schema": {"type": "boolean"}}),
                        json!({"name": "cmd", "in": "query", "required": true, "schema": {"type": "array", "items": {"type": "string"}}, "style": "form", "explode": true, "description": "the command and its arguments, repeated"})]].concat()),
                    "responses": {"101": {"description": "switched to the corral-exec protocol"}}}
            }),
        ),
        (
            format!("{prefix}/{{plural}}/{{name}}/console"),
            json!({
                "post": {"summary": "VMs only, people only: attach to the serial console. Send Connection: Upgrade and Upgrade: corral-exec; after 101 stdin frames are typed on the console and stdout frames carry what it prints; stdin end of file detaches once the console is quiet (exit code 0)",
                    "parameters": named,
                    "responses": {"101": {"description": "switched to the corral-exec protocol"}}}
            }),
        ),
    ]
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
    generator.subschema_for::<corral_api::workflow::WorkflowStatus>();
    generator.subschema_for::<corral_api::workflow::WorkflowInstance>();
    generator.subschema_for::<corral_api::workflow::StepLogEntry>();
    generator.subschema_for::<crate::handlers::lease::Lease>();
    for kind in Kind::ALL {
        corral_api::kinds::spec_schema(kind, &mut generator);
    }
    let schemas = generator.take_definitions(true);

    let namespaced: Vec<&str> = Kind::ALL
        .iter()
        .filter(|k| k.is_namespaced())
        .map(|k| k.plural())
        .collect();
    let cluster: Vec<&str> = Kind::ALL.iter().map(|k| k.plural()).collect();
    let mut paths = serde_json::Map::new();
    paths.insert(
        "/healthz".into(),
        json!({"get": {"summary": "liveness of the server and its store", "security": [],
        "responses": {"200": {"description": "ok"}}}}),
    );
    paths.insert(
        "/metrics".into(),
        json!({"get": {"summary": "Prometheus metrics", "security": [],
        "responses": {"200": {"description": "text exposition format"}}}}),
    );
    paths.insert("/v1/whoami".into(), json!({"get": {"summary": "the caller's identity", "responses": ok(schema_ref("Identity"), "identity")}}));
    paths.insert("/v1/tokens".into(), json!({"post": {"summary": "mint a token (operators only)",
        "requestBody": {"required": true, "content": {"application/json": {"schema": {"type": "object", "required": ["name", "role"],
            "properties": {"name": {"type": "string"}, "role": {"type": "string", "enum": ["operator", "user", "controller", "node"]}}}}}},
        "responses": ok(json!({"type": "object", "properties": {"token": {"type": "string"}, "identity": schema_ref("Identity")}}), "the token, shown once")}}));
    paths.insert("/v1/nodes/{name}/lease".into(), json!({
        "get": {"summary": "when the node last renewed its lease (404: not since the store started)",
            "parameters": [{"name": "name", "in": "path", "required": true, "schema": {"type": "string"}}],
            "responses": ok(schema_ref("Lease"), "the lease")},
        "put": {"summary": "the node's heartbeat: renews its lease without writing the Node (the node itself, or an operator)",
            "parameters": [{"name": "name", "in": "path", "required": true, "schema": {"type": "string"}}],
            "responses": ok(schema_ref("Lease"), "the lease")}}));
    paths.insert("/v1/history".into(), json!({"get": {"summary": "cluster-wide history, oldest first",
        "parameters": [
            {"name": "since", "in": "query", "schema": {"type": "string"}, "description": "a duration like 1h, or an RFC 3339 time"},
            {"name": "author", "in": "query", "schema": {"type": "string"}, "description": "repeatable; only these authors"},
            {"name": "excludeAuthor", "in": "query", "schema": {"type": "string"}, "description": "repeatable; never these authors"},
            {"name": "class", "in": "query", "schema": {"type": "string", "enum": ["external", "system"]}},
            {"name": "kind", "in": "query", "schema": {"type": "string"}},
            {"name": "limit", "in": "query", "schema": {"type": "integer"}}
        ],
        "responses": ok(json!({"type": "array", "items": schema_ref("RevisionRecord")}), "revisions")}}));
    for (path, item) in object_paths("/v1/namespaces/{namespace}", &namespaced.join(", "), true)
        .into_iter()
        .chain(object_paths("/v1", &cluster.join(", "), false))
    {
        paths.insert(path, item);
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

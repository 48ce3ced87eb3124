//! The OpenAPI operations of the routes that are not object routes.

use serde_json::{Value, json};

use super::{ok, schema_ref};

fn name_param(description: &str) -> Value {
    json!({"name": "name", "in": "path", "required": true, "schema": {"type": "string"}, "description": description})
}

fn json_body(schema: Value) -> Value {
    json!({"required": true, "content": {"application/json": {"schema": schema}}})
}

pub(crate) fn healthz() -> Value {
    json!({"summary": "liveness of the server and its store", "security": [],
        "responses": {"200": {"description": "ok"}}})
}

pub(crate) fn metrics() -> Value {
    json!({"summary": "Prometheus metrics", "security": [],
        "responses": {"200": {"description": "text exposition format"}}})
}

pub(crate) fn openapi() -> Value {
    json!({"summary": "this document",
        "responses": ok(json!({"type": "object"}), "the OpenAPI 3 document")})
}

pub(crate) fn whoami() -> Value {
    json!({"summary": "the caller's identity", "responses": ok(schema_ref("Identity"), "identity")})
}

fn token_response() -> Value {
    json!({"type": "object", "properties": {"token": {"type": "string"}, "identity": schema_ref("Identity")}})
}

pub(crate) fn list_tokens() -> Value {
    json!({"summary": "operators only: every token's id (the first 12 hex digits of its SHA-256), identity, creation and last use — never a token",
        "responses": ok(json!({"type": "array", "items": schema_ref("TokenInfo")}), "the tokens, oldest first")})
}

pub(crate) fn revoke_token() -> Value {
    json!({"summary": "operators only: revoke the token with this id (8 or more leading hex digits) or every token of this name; effective on every server within 5 s. Built-in controllers' tokens are refused",
        "parameters": [{"name": "token", "in": "path", "required": true, "schema": {"type": "string"}}],
        "responses": ok(schema_ref("Revoked"), "the tokens revoked")})
}

pub(crate) fn create_token() -> Value {
    json!({"summary": "mint a token (operators only)",
        "requestBody": json_body(json!({"type": "object", "required": ["name", "role"],
            "properties": {"name": {"type": "string"},
                "role": {"type": "string", "enum": ["operator", "user", "controller", "node", "joiner"]},
                "namespaces": {"type": "array", "items": {"type": "string"}, "description": "users: the namespaces they may act in (* for every one)"},
                "ttlSeconds": {"type": "integer", "description": "the token stops working after this many seconds (join tokens: a day by default)"},
                "readSecrets": {"type": "boolean", "description": "users: may also read Secrets' values in their namespaces"}}})),
        "responses": ok(token_response(), "the token, shown once")})
}

pub(crate) fn join() -> Value {
    json!({"summary": "with a join token: claim a node name and mint the node's own token (409: a node of that name is alive)",
        "requestBody": json_body(json!({"type": "object", "required": ["node"], "properties": {"node": {"type": "string"}}})),
        "responses": ok(token_response(), "the node's token, shown once")})
}

pub(crate) fn rotate_key() -> Value {
    json!({"summary": "operators only: make a new secrets data key current, encrypt every Secret's values again with it, and forget the old keys",
        "responses": ok(schema_ref("RotationReport"), "the new key, how many values were sealed again, the keys retired")})
}

pub(crate) fn cluster_history() -> Value {
    json!({"summary": "cluster-wide history, oldest first",
        "parameters": [
            {"name": "since", "in": "query", "schema": {"type": "string"}, "description": "a duration like 1h, or an RFC 3339 time"},
            {"name": "author", "in": "query", "schema": {"type": "string"}, "description": "repeatable; only these authors"},
            {"name": "excludeAuthor", "in": "query", "schema": {"type": "string"}, "description": "repeatable; never these authors"},
            {"name": "class", "in": "query", "schema": {"type": "string", "enum": ["external", "system"]}},
            {"name": "kind", "in": "query", "schema": {"type": "string"}},
            {"name": "limit", "in": "query", "schema": {"type": "integer"}}
        ],
        "responses": ok(json!({"type": "array", "items": schema_ref("RevisionRecord")}), "revisions")})
}

pub(crate) fn transfer() -> Value {
    json!({"summary": "operators only: hand a field from controller `name` to another (both Controller objects are rewritten in one step)",
        "parameters": [name_param("the controller that owns the field now")],
        "requestBody": json_body(json!({"type": "object", "required": ["path", "to"],
            "properties": {"path": {"type": "string", "description": "Kind:path, e.g. Pod:status.node"},
                "to": {"type": "string", "description": "the controller that owns the field afterwards"}}})),
        "responses": ok(json!({"type": "object", "required": ["to"],
            "properties": {"from": schema_ref("Object"), "to": schema_ref("Object")}}), "the Controller objects as written")})
}

pub(crate) fn read_lease() -> Value {
    json!({"summary": "when the node last renewed its lease (404: not since the store started)",
        "parameters": [name_param("the node")],
        "responses": ok(schema_ref("Lease"), "the lease")})
}

pub(crate) fn renew_lease() -> Value {
    json!({"summary": "the node's heartbeat: renews its lease without writing the Node (the node itself, or an operator)",
        "parameters": [name_param("the node")],
        "responses": ok(schema_ref("Lease"), "the lease")})
}

pub(crate) fn node_certificate() -> Value {
    json!({"summary": "the node itself, with its node token: the cluster CA signs the node agent's serving certificate (for NAME.node.corral, server authentication only) for the key of the certificate signing request; the key stays on the node",
        "parameters": [name_param("the node")],
        "requestBody": json_body(schema_ref("NodeCertificateRequest")),
        "responses": ok(schema_ref("NodeCertificate"), "the certificate, the CA, and its validity")})
}

pub(crate) fn prune_images() -> Value {
    json!({"summary": "operators only: the node's agent deletes the pulled images no pod on the node uses or used in its last revisions (it also does so every 10 minutes), and says what it removed",
        "parameters": [name_param("the node")],
        "responses": ok(schema_ref("ImagePruneReport"), "what was removed")})
}

fn nodes_param() -> Value {
    json!({"name": "node", "in": "query", "schema": {"type": "string"},
        "description": "repeatable: ask these nodes (each is asked, whatever its phase); default: every Ready node, the others listed as skipped"})
}

pub(crate) fn list_images() -> Value {
    json!({"summary": "operators and users: each node's images (reference, digest, size, the pods using it), asked of its agent; a node that cannot answer has an error",
        "parameters": [nodes_param()],
        "responses": ok(schema_ref("NodeImagesReport"), "one entry per node")})
}

pub(crate) fn import_images() -> Value {
    json!({"summary": "operators only: import the image archive in the body (an OCI layout or docker-archive tar, any size, streamed) on each node, by its agent; each node answers what it imported, or its error (then it imported nothing)",
        "parameters": [nodes_param(),
            {"name": "name", "in": "query", "schema": {"type": "string"}, "description": "store the archive's only image under this NAME:TAG"}],
        "requestBody": {"required": true, "content": {"application/x-tar": {"schema": {"type": "string", "format": "binary"}}}},
        "responses": ok(schema_ref("NodeImagesReport"), "one entry per node")})
}

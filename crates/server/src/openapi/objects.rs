//! The OpenAPI operations of the object routes, the same under
//! `/v1/namespaces/{namespace}/{plural}` and `/v1/{plural}`.

use serde_json::{Value, json};

use super::{ok, schema_ref};

/// The path parameters of one shape of object routes.
#[derive(Debug, Clone)]
pub(crate) struct ObjectDocs {
    /// `plural` (and `namespace` for namespaced routes).
    params: Vec<Value>,
    /// `params` and `name`.
    named: Vec<Value>,
}

fn message() -> Value {
    json!({"name": "message", "in": "query", "schema": {"type": "string"},
        "description": "recorded in history with the new revision"})
}

fn body() -> Value {
    json!({"required": true, "content": {"application/json": {"schema": schema_ref("Object")}}})
}

fn query(name: &str, schema: Value, description: &str) -> Value {
    json!({"name": name, "in": "query", "schema": schema, "description": description})
}

impl ObjectDocs {
    /// `kind_names` lists the plurals these routes serve.
    pub(crate) fn new(kind_names: &str, namespaced: bool) -> ObjectDocs {
        let mut params = vec![json!({"name": "plural", "in": "path", "required": true,
            "schema": {"type": "string"}, "description": kind_names})];
        if namespaced {
            params.push(json!({"name": "namespace", "in": "path", "required": true, "schema": {"type": "string"}}));
        }
        let mut named = params.clone();
        named.push(
            json!({"name": "name", "in": "path", "required": true, "schema": {"type": "string"}}),
        );
        ObjectDocs { params, named }
    }

    fn named_and(&self, more: Vec<Value>) -> Value {
        Value::Array([self.named.clone(), more].concat())
    }

    pub(crate) fn list(&self) -> Value {
        let parameters = [self.params.clone(), vec![
            json!({"name": "selector", "in": "query", "schema": {"type": "string"}, "description": "label selector: a=b,c!=d,e,!f"}),
            json!({"name": "node", "in": "query", "schema": {"type": "string"}, "description": "pods and virtualmachines bound to this node; a watch hears one that leaves the node as a deletion"}),
            json!({"name": "managedBy", "in": "query", "schema": {"type": "string"}, "description": "objects whose corral.dev/managed-by annotation names this controller; a watch hears one that stops naming it as a deletion"}),
            json!({"name": "limit", "in": "query", "schema": {"type": "integer"}, "description": "at most this many objects; the answer's continue token gets the next page"}),
            json!({"name": "continue", "in": "query", "schema": {"type": "string"}, "description": "the continue token of the previous page"}),
            json!({"name": "watch", "in": "query", "schema": {"type": "boolean"}}),
            json!({"name": "resourceVersion", "in": "query", "schema": {"type": "integer"}, "description": "watch changes after this store revision (410 Gone: list again)"}),
        ]].concat();
        json!({"summary": "list objects, or watch them with watch=true (newline-delimited JSON events)",
            "parameters": parameters,
            "responses": ok(json!({"type": "object", "properties": {"items": {"type": "array", "items": schema_ref("Object")}, "resourceVersion": {"type": "integer"}, "continue": {"type": "string"}}}), "the objects")})
    }

    pub(crate) fn create(&self) -> Value {
        json!({"summary": "create an object", "parameters": ([self.params.clone(), vec![message()]].concat()),
            "requestBody": body(), "responses": ok(schema_ref("Object"), "the created object")})
    }

    pub(crate) fn get(&self) -> Value {
        json!({"summary": "read an object", "parameters": self.named, "responses": ok(schema_ref("Object"), "the object")})
    }

    pub(crate) fn apply(&self) -> Value {
        json!({"summary": "apply: create, or replace spec, labels and annotations (compare-and-swap when metadata.resourceVersion is set); an unchanged apply by a person of an object whose newest workflow failed retries it",
            "parameters": self.named_and(vec![message()]), "requestBody": body(), "responses": ok(schema_ref("Object"), "the stored object")})
    }

    pub(crate) fn delete(&self) -> Value {
        let cascade = query(
            "cascade",
            json!({"type": "string", "enum": ["delete", "orphan"]}),
            "what happens to the objects whose metadata.owner names this one: delete (default) deletes them too; orphan keeps them and clears their owner",
        );
        let force = query(
            "force",
            json!({"type": "boolean"}),
            "skip every step of the object's stop workflow not done yet and remove it now (recorded in its step log and history)",
        );
        let skip = query(
            "skip",
            json!({"type": "string"}),
            "a step of the stop workflow to skip (repeatable, or comma-separated); an unknown step is a 404 that changes nothing",
        );
        let mut responses = ok(schema_ref("Object"), "removed: the object's last state");
        responses["202"] = json!({
            "description": "a Pod a node runs: its stop workflow runs (metadata.deleting set) and it is removed when that finishes",
            "content": {"application/json": {"schema": schema_ref("Object")}}
        });
        json!({"summary": "delete an object, and its dependents unless cascade=orphan; a Pod a node runs is stopped through its stop workflow first",
            "parameters": self.named_and(vec![message(), json!({"name": "resourceVersion", "in": "query", "schema": {"type": "integer"}}), cascade, force, skip]),
            "responses": responses})
    }

    pub(crate) fn put_status(&self) -> Value {
        json!({"summary": "replace the status; never creates a revision", "parameters": self.named,
            "requestBody": body(), "responses": ok(schema_ref("Object"), "the stored object")})
    }

    pub(crate) fn history(&self) -> Value {
        let limit = query(
            "limit",
            json!({"type": "integer", "minimum": 1}),
            "only the newest N revisions (default: every one kept)",
        );
        json!({"summary": "the object's revisions, oldest first", "parameters": self.named_and(vec![limit]),
            "responses": ok(json!({"type": "array", "items": schema_ref("RevisionRecord")}), "revisions")})
    }

    pub(crate) fn revision(&self) -> Value {
        let revision = json!({"name": "revision", "in": "path", "required": true, "schema": {"type": "integer"}});
        json!({"summary": "one revision with its spec", "parameters": self.named_and(vec![revision]),
            "responses": ok(schema_ref("RevisionRecord"), "the revision")})
    }

    pub(crate) fn diff(&self) -> Value {
        json!({"summary": "changes between two revisions", "parameters": self.named_and(vec![
                json!({"name": "from", "in": "query", "required": true, "schema": {"type": "integer"}}),
                query("to", json!({"type": "integer"}), "default: the current revision")]),
            "responses": ok(schema_ref("RevisionDiff"), "the diff")})
    }

    pub(crate) fn rollback(&self) -> Value {
        json!({"summary": "create a new revision whose spec is revision `to`'s", "parameters": self.named,
            "requestBody": {"required": true, "content": {"application/json": {"schema": {"type": "object", "required": ["to"],
                "properties": {"to": {"type": "integer"}, "message": {"type": "string"}}}}}},
            "responses": ok(schema_ref("Object"), "the rolled-back object")})
    }

    pub(crate) fn steps(&self) -> Value {
        json!({"summary": "a step owner claims, completes, fails or logs for a step of the object's workflow (403: not the owner; 409: the step's state does not allow it); a batch of actions and owned status fields is applied in one write, all or none",
            "parameters": self.named,
            "requestBody": {"required": true, "content": {"application/json": {"schema": {"oneOf": [schema_ref("StepActionRequest"), schema_ref("StepBatchRequest")]}}}},
            "responses": ok(schema_ref("WorkflowInstance"), "the workflow instance afterwards")})
    }

    pub(crate) fn reveal(&self) -> Value {
        json!({"summary": "Secrets only: the values (base64) of the current revision or of `revision`; operators, users with the read-secrets right in their namespaces, controllers that declare they read Secret spec.data, nodes for a pod bound to them that uses the Secret (403 otherwise, naming the rule)",
            "parameters": self.named_and(vec![
                query("revision", json!({"type": "integer"}), "default: the current revision"),
                query("pod", json!({"type": "string"}), "nodes: the pod (same namespace) bound to the node that uses the Secret")]),
            "responses": ok(schema_ref("RevealedSecret"), "the values")})
    }

    pub(crate) fn recoveries(&self) -> Value {
        json!({"summary": "Pods only, the pod's node only: a recovery the node ran from local state after it found the pod's sandbox stale (a reboot), recorded as a finished `recover` workflow instance with the node's timings (403: not the pod's node; 404: not a pod; 409: the pod is being deleted); sending the same report again returns the recorded instance",
            "parameters": self.named,
            "requestBody": {"required": true, "content": {"application/json": {"schema": schema_ref("RecoveryReport")}}},
            "responses": ok(schema_ref("WorkflowInstance"), "the recorded instance")})
    }

    pub(crate) fn retry(&self) -> Value {
        json!({"summary": "people only: run the failed steps of the object's newest workflow instance again, each with a fresh retry budget (done steps stay done), or bring forward the retry of steps waiting out their backoff (409: nothing failed)",
            "parameters": self.named,
            "responses": ok(schema_ref("WorkflowInstance"), "the workflow instance afterwards")})
    }

    pub(crate) fn workflows(&self) -> Value {
        json!({"summary": "the object's kept workflow instances, each joined with its WorkflowDefinition; finished ones replayed from the step log (what why and analyze render)",
            "parameters": self.named,
            "responses": ok(schema_ref("WorkflowStatus"), "the instances, oldest first")})
    }

    pub(crate) fn steplogs(&self) -> Value {
        json!({"summary": "the object's workflow step log: every transition and every line step owners appended, in time order",
            "parameters": self.named_and(vec![
                query("step", json!({"type": "string"}), "only this step"),
                query("owner", json!({"type": "string"}), "only steps of this owner"),
                query("workflow", json!({"type": "string"}), "only this workflow instance (start-1)")]),
            "responses": ok(json!({"type": "array", "items": schema_ref("StepLogEntry")}), "log entries")})
    }

    pub(crate) fn logs(&self) -> Value {
        json!({"summary": "pods and VMs, people only: a pod container's log or a VM's console log, streamed from the agent of its node (text/plain)",
            "parameters": self.named_and(vec![
                query("container", json!({"type": "string"}), "pods: default the pod's only container"),
                query("follow", json!({"type": "boolean"}), "keep streaming appended output"),
                query("tail", json!({"type": "integer"}), "start at the last N lines")]),
            "responses": {"200": {"description": "the log bytes", "content": {"text/plain": {"schema": {"type": "string"}}}}}})
    }

    pub(crate) fn exec(&self) -> Value {
        json!({"summary": "pods only, people only: run a command in a container. Send Connection: Upgrade and Upgrade: corral-exec; after 101 the connection carries framed stdin, stdout, stderr and the exit code (see corral_client::exec_protocol)",
            "parameters": self.named_and(vec![
                query("container", json!({"type": "string"}), "default: the pod's only container"),
                json!({"name": "tty", "in": "query", "schema": {"type": "boolean"}}),
                json!({"name": "cmd", "in": "query", "required": true, "schema": {"type": "array", "items": {"type": "string"}}, "style": "form", "explode": true, "description": "the command and its arguments, repeated"})]),
            "responses": {"101": {"description": "switched to the corral-exec protocol"}}})
    }

    pub(crate) fn port_forward(&self) -> Value {
        json!({"summary": "pods only, people only: a TCP connection to a port on the pod's loopback, relayed by its node. Send Connection: Upgrade and Upgrade: corral-exec; after 101 the connection carries the TCP stream's bytes unframed",
            "parameters": self.named_and(vec![
                json!({"name": "port", "in": "query", "required": true, "schema": {"type": "integer", "minimum": 1, "maximum": 65535}})]),
            "responses": {"101": {"description": "switched; the bytes are the TCP connection's"}}})
    }

    pub(crate) fn console(&self) -> Value {
        json!({"summary": "VMs only, people only: attach to the serial console. Send Connection: Upgrade and Upgrade: corral-exec; after 101 stdin frames are typed on the console and stdout frames carry what it prints; stdin end of file detaches once the console is quiet (exit code 0)",
            "parameters": self.named,
            "responses": {"101": {"description": "switched to the corral-exec protocol"}}})
    }
}

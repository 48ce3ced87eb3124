//! Validation of objects: the typed spec of the kind must decode (so unknown
//! fields and wrong types are refused with their path) and every semantic
//! rule must hold. Errors name the field path and what was expected.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::kinds::{
    ConfigSpec, ControllerSpec, JobSpec, LoadBalancerSpec, NodeSpec, PerNodeDeploymentSpec,
    PinnedDeploymentSpec, PodSpec, PolicySpec, SecretSpec, VirtualMachineSpec,
};
use crate::meta::Kind;
use crate::object::Object;

/// One broken rule: where, and what was expected.
#[derive(
    Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema, thiserror::Error,
)]
pub struct FieldError {
    pub path: String,
    pub message: String,
}

impl FieldError {
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        FieldError {
            path: path.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

/// Collects errors under a path prefix.
#[derive(Debug, Default)]
struct Checker {
    errors: Vec<FieldError>,
}

impl Checker {
    fn fail(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.errors.push(FieldError::new(path, message));
    }

    fn dns_label(&mut self, path: &str, value: &str) {
        if value.is_empty() {
            self.fail(path, "is required");
        } else if !is_dns_label(value) {
            self.fail(
                path,
                format!(
                    "{value:?} is not a valid name: expected at most 63 lowercase letters, digits or '-', starting and ending with a letter or digit"
                ),
            );
        }
    }

    fn non_empty(&mut self, path: &str, value: &str) {
        if value.trim().is_empty() {
            self.fail(path, "must not be empty");
        }
    }

    fn relaxation(&mut self, path: &str, name: &str) {
        if let Err(error) = name.parse::<crate::security::Relaxation>() {
            self.fail(path, error.to_string());
        }
    }

    fn labels(&mut self, path: &str, labels: &BTreeMap<String, String>) {
        for key in labels.keys() {
            if !is_label_key(key) {
                self.fail(
                    format!("{path}.{key}"),
                    "invalid label key: expected letters, digits, '-', '_', '.' and at most one '/'",
                );
            }
        }
    }
}

/// Whether `value` is a DNS-1123 label.
pub fn is_dns_label(value: &str) -> bool {
    let bytes = value.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes[0] != b'-'
        && bytes[bytes.len() - 1] != b'-'
}

fn is_label_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 253
        && key.matches('/').count() <= 1
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

/// Validates an object of any kind; all broken rules are reported together.
/// An owner reference names an object by name and uid, and a cluster-wide
/// object cannot belong to a namespaced one (it would have no namespace to
/// find it in).
fn check_owner(checker: &mut Checker, kind: Kind, owner: &crate::OwnerReference) {
    checker.dns_label("metadata.owner.name", &owner.name);
    if owner.uid.is_empty() {
        checker.fail("metadata.owner.uid", "must name the owner's uid");
    }
    if !kind.is_namespaced() && owner.kind.is_namespaced() {
        checker.fail(
            "metadata.owner.kind",
            format!(
                "{kind} objects are cluster-wide and cannot belong to a namespaced {}",
                owner.kind
            ),
        );
    }
}

pub fn validate_object(object: &Object) -> Result<(), Vec<FieldError>> {
    check_object(object, false).map(drop)
}

/// [`validate_object`], then the spec in canonical form
/// ([`canonical_spec`]) from the same decode: what the API stores of a
/// valid object it was given.
pub fn validated(mut object: Object) -> Result<Object, Vec<FieldError>> {
    if let Some(canonical) = check_object(&object, true)? {
        object.spec = canonical;
    }
    Ok(object)
}

/// Every rule of `object`; with `canonical`, its typed spec encoded again.
fn check_object(object: &Object, canonical: bool) -> Result<Option<Value>, Vec<FieldError>> {
    let mut checker = Checker::default();
    checker.dns_label("metadata.name", &object.metadata.name);
    match (&object.metadata.namespace, object.kind.is_namespaced()) {
        (Some(namespace), true) => checker.dns_label("metadata.namespace", namespace),
        (Some(namespace), false) if !namespace.is_empty() => checker.fail(
            "metadata.namespace",
            format!(
                "{} objects are cluster-wide and take no namespace",
                object.kind
            ),
        ),
        _ => {}
    }
    checker.labels("metadata.labels", &object.metadata.labels);
    checker.labels("metadata.annotations", &object.metadata.annotations);
    if let Some(owner) = &object.metadata.owner {
        check_owner(&mut checker, object.kind, owner);
    }
    let spec = Spec {
        value: &object.spec,
        canonical,
    };
    let checker = &mut checker;
    let encoded = match object.kind {
        Kind::Pod => spec.check::<PodSpec>(checker, |c, s| check_pod(c, "spec", s)),
        Kind::Node => spec.check::<NodeSpec>(checker, |_, _| {}),
        Kind::PinnedDeployment => spec.check::<PinnedDeploymentSpec>(checker, check_pinned),
        Kind::Policy => spec.check::<PolicySpec>(checker, check_policy),
        Kind::Controller => spec.check::<ControllerSpec>(checker, check_controller),
        Kind::VirtualMachine => spec.check::<VirtualMachineSpec>(checker, check_vm),
        Kind::LoadBalancer => spec.check::<LoadBalancerSpec>(checker, check_load_balancer),
        Kind::WorkflowDefinition => {
            spec.check::<crate::workflow::WorkflowDefinitionSpec>(checker, |_, _| {})
        }
        Kind::Secret => spec.encode(decode_secret(checker, spec.value).inspect(|s| {
            check_secret(checker, s);
        })),
        Kind::Config => spec.check::<ConfigSpec>(checker, |c, spec| {
            check_data_keys(c, "spec.data", spec.data.keys());
            let size: usize = spec.data.values().map(String::len).sum();
            check_data_size(c, size);
        }),
        Kind::Job => spec.check::<JobSpec>(checker, workloads::check_job),
        Kind::PerNodeDeployment => {
            spec.check::<PerNodeDeploymentSpec>(checker, workloads::check_per_node)
        }
    };
    if checker.errors.is_empty() {
        Ok(encoded)
    } else {
        Err(std::mem::take(&mut checker.errors))
    }
}

/// An object's spec being checked, and whether its canonical form is
/// wanted.
#[derive(Clone, Copy)]
struct Spec<'a> {
    value: &'a Value,
    canonical: bool,
}

impl Spec<'_> {
    /// Decodes the spec as `T` and checks it with `rules`; its canonical
    /// form if it decoded and that is wanted.
    fn check<T: serde::de::DeserializeOwned + Serialize>(
        self,
        checker: &mut Checker,
        rules: impl FnOnce(&mut Checker, &T),
    ) -> Option<Value> {
        let typed = decode_spec::<T>(checker, self.value);
        if let Some(typed) = &typed {
            rules(checker, typed);
        }
        self.encode(typed)
    }

    fn encode<T: Serialize>(self, typed: Option<T>) -> Option<Value> {
        if !self.canonical {
            return None;
        }
        serde_json::to_value(typed?).ok()
    }
}

/// The rules of a change to an object, beyond those of the new object
/// itself (checked by [`validate_object`]): today, that a VM's disk only
/// grows. A stored spec that no longer decodes imposes nothing.
pub fn validate_update(old: &Object, new: &Object) -> Result<(), Vec<FieldError>> {
    let mut checker = Checker::default();
    if old.kind == Kind::VirtualMachine && new.kind == Kind::VirtualMachine {
        let old = serde_json::from_value::<VirtualMachineSpec>(old.spec.clone());
        let new = serde_json::from_value::<VirtualMachineSpec>(new.spec.clone());
        if let (Ok(old), Ok(new)) = (old, new) {
            vm::check_vm_update(&mut checker, &old, &new);
        }
    }
    if checker.errors.is_empty() {
        Ok(())
    } else {
        Err(checker.errors)
    }
}

/// The spec in canonical form: decoded into the kind's typed spec and
/// encoded again, so defaults are explicit and equal specs are equal bytes.
/// Call it on a validated object; an undecodable spec is returned unchanged.
pub fn canonical_spec(kind: Kind, spec: &Value) -> Value {
    fn round_trip<T: serde::de::DeserializeOwned + Serialize>(spec: &Value) -> Option<Value> {
        let typed = T::deserialize(spec).ok()?;
        serde_json::to_value(typed).ok()
    }
    let empty = Value::Object(Default::default());
    let spec = if spec.is_null() { &empty } else { spec };
    let canonical = match kind {
        Kind::Pod => round_trip::<PodSpec>(spec),
        Kind::Node => round_trip::<NodeSpec>(spec),
        Kind::PinnedDeployment => round_trip::<PinnedDeploymentSpec>(spec),
        Kind::Policy => round_trip::<PolicySpec>(spec),
        Kind::Controller => round_trip::<ControllerSpec>(spec),
        Kind::VirtualMachine => round_trip::<VirtualMachineSpec>(spec),
        Kind::LoadBalancer => round_trip::<LoadBalancerSpec>(spec),
        Kind::WorkflowDefinition => round_trip::<crate::workflow::WorkflowDefinitionSpec>(spec),
        Kind::Secret => round_trip::<SecretSpec>(spec),
        Kind::Config => round_trip::<ConfigSpec>(spec),
        Kind::Job => round_trip::<JobSpec>(spec),
        Kind::PerNodeDeployment => round_trip::<PerNodeDeploymentSpec>(spec),
    };
    canonical.unwrap_or_else(|| spec.clone())
}

fn decode_spec<T: serde::de::DeserializeOwned>(checker: &mut Checker, spec: &Value) -> Option<T> {
    decode_with(checker, spec, |error| error.to_string())
}

/// A Secret's spec, decoded without ever quoting a value: serde's messages
/// may (`invalid type: integer 1234`), so only the path is kept.
fn decode_secret(checker: &mut Checker, spec: &Value) -> Option<SecretSpec> {
    decode_with(checker, spec, |_| {
        "is not part of a Secret (type, data: {KEY: base64}, stringData: {KEY: text}), or a value that is not a string; values are not shown".to_string()
    })
}

/// The typed spec, or a failure at the path serde stopped at with
/// `message`'s words for serde's error.
fn decode_with<T: serde::de::DeserializeOwned>(
    checker: &mut Checker,
    spec: &Value,
    message: impl FnOnce(&serde_json::Error) -> String,
) -> Option<T> {
    let empty = Value::Object(Default::default());
    let spec = if spec.is_null() { &empty } else { spec };
    // Tracking the path costs as much again: only a spec that fails is
    // decoded a second time, to say where.
    if let Ok(typed) = T::deserialize(spec) {
        return Some(typed);
    }
    match serde_path_to_error::deserialize::<_, T>(spec) {
        Ok(typed) => Some(typed),
        Err(error) => {
            let inner = error.path().to_string();
            let path = if inner == "." {
                "spec".to_string()
            } else {
                format!("spec.{inner}")
            };
            checker.fail(path, message(error.inner()));
            None
        }
    }
}

fn check_pinned(checker: &mut Checker, spec: &PinnedDeploymentSpec) {
    if spec.replicas_percent_next > 100 {
        checker.fail("spec.replicasPercentNext", "must be between 0 and 100");
    }
    if let Some(max) = &spec.max_unavailable
        && max.resolve(spec.replicas).is_none()
    {
        checker.fail(
            "spec.maxUnavailable",
            "must be a count or a percent from 0% to 100%",
        );
    }
    if spec.progress_deadline_seconds == Some(0) {
        checker.fail("spec.progressDeadlineSeconds", "must be at least 1");
    }
    if spec.selector.is_empty() {
        checker.fail("spec.selector", "must hold at least one label");
    }
    checker.labels("spec.selector", &spec.selector);
    for (name, template) in [
        ("previous", &spec.templates.previous),
        ("next", &spec.templates.next),
    ] {
        let prefix = format!("spec.templates.{name}");
        for (key, value) in &spec.selector {
            if template.metadata.labels.get(key) != Some(value) {
                checker.fail(
                    format!("{prefix}.metadata.labels"),
                    format!("must include the selector's label {key}={value}"),
                );
            }
        }
        check_pod(checker, &format!("{prefix}.spec"), &template.spec);
    }
}

fn check_load_balancer(checker: &mut Checker, spec: &LoadBalancerSpec) {
    if spec.selector.is_empty() {
        checker.fail("spec.selector", "must hold at least one label");
    }
    checker.labels("spec.selector", &spec.selector);
    if spec.ports.is_empty() {
        checker.fail("spec.ports", "must list at least one port");
    }
    let mut ports = BTreeSet::new();
    let mut names = BTreeSet::new();
    for (index, port) in spec.ports.iter().enumerate() {
        let path = format!("spec.ports[{index}]");
        if port.port == 0 {
            checker.fail(format!("{path}.port"), "must be between 1 and 65535");
        } else if !ports.insert(port.port) {
            checker.fail(
                format!("{path}.port"),
                format!("duplicate port {}", port.port),
            );
        }
        if port.target_port == 0 {
            checker.fail(format!("{path}.targetPort"), "must be between 1 and 65535");
        }
        if let Some(name) = &port.name {
            checker.dns_label(&format!("{path}.name"), name);
            if !names.insert(name.as_str()) {
                checker.fail(
                    format!("{path}.name"),
                    format!("duplicate port name {name:?}"),
                );
            }
        }
    }
    if let Some(class) = &spec.class {
        checker.dns_label("spec.class", class);
    }
}

fn check_policy(checker: &mut Checker, spec: &PolicySpec) {
    if spec.namespaces.is_empty() {
        checker.fail("spec.namespaces", "must name at least one namespace");
    }
    for (index, namespace) in spec.namespaces.iter().enumerate() {
        if namespace != "*" {
            checker.dns_label(&format!("spec.namespaces[{index}]"), namespace);
        }
    }
    for (index, grant) in spec.grant.iter().enumerate() {
        checker.relaxation(&format!("spec.grant[{index}]"), grant);
    }
}

fn check_controller(checker: &mut Checker, spec: &ControllerSpec) {
    for (field, paths) in [("owns", &spec.owns), ("reads", &spec.reads)] {
        for (index, path) in paths.iter().enumerate() {
            let valid = path
                .split_once(':')
                .is_some_and(|(kind, field)| kind.parse::<Kind>().is_ok() && !field.is_empty());
            if !valid {
                checker.fail(
                    format!("spec.{field}[{index}]"),
                    format!(
                        "{path:?} is not a field path: expected Kind:path like Pod:status.node"
                    ),
                );
            }
        }
    }
    for (index, step) in spec.steps.iter().enumerate() {
        let path = format!("spec.steps[{index}]");
        if !step
            .name
            .split_once('/')
            .is_some_and(|(o, v)| !o.is_empty() && !v.is_empty())
        {
            checker.fail(
                format!("{path}.name"),
                "expected owner/verb, like acme/inject-sidecar",
            );
        }
        if step.kind.parse::<Kind>().is_err() {
            checker.fail(
                format!("{path}.kind"),
                format!("unknown kind {:?}", step.kind),
            );
        }
        if let Some(timeout) = &step.timeout
            && humantime::parse_duration(timeout).is_err()
        {
            checker.fail(
                format!("{path}.timeout"),
                "expected a duration like 30s or 10m",
            );
        }
    }
}

#[path = "validate_data.rs"]
mod data;
use data::{check_data_keys, check_data_size, check_secret};

#[path = "validate_pod.rs"]
mod pod;
use pod::check_pod;

#[path = "validate_workloads.rs"]
mod workloads;

#[path = "validate_vm.rs"]
mod vm;
use vm::check_vm;
pub use vm::keep_grown_disks;

#[cfg(test)]
#[path = "validate_tests.rs"]
mod tests;

use super::*;
use serde_json::json;

fn pod(spec: Value) -> Object {
    Object::new(Kind::Pod, None, "web", spec)
}

fn messages(object: &Object) -> Vec<String> {
    validate_object(object)
        .err()
        .unwrap_or_default()
        .iter()
        .map(ToString::to_string)
        .collect()
}

#[test]
fn canonical_specs_spell_out_defaults() {
    let spec = canonical_spec(
        Kind::Pod,
        &json!({"containers": [{"name": "c", "image": "i", "resources": {"memory": "65536Ki"}}]}),
    );
    assert_eq!(spec["availability"], "best-effort");
    assert_eq!(spec["restartPolicy"], "Always");
    assert_eq!(spec["containers"][0]["resources"]["memory"], "64Mi");
}

#[test]
fn valid_pod_passes() {
    let object = pod(json!({
        "containers": [{"name": "web", "image": "busybox", "mounts": [{"volume": "data", "path": "/data"}],
                        "readiness": {"http": {"port": 8080}}}],
        "volumes": [{"name": "data", "emptyDir": {}}]
    }));
    assert_eq!(messages(&object), Vec::<String>::new());
}

#[test]
fn pod_rules_name_their_paths() {
    let object = pod(json!({
        "containers": [
            {"name": "Web", "image": "busybox", "mounts": [{"volume": "nope", "path": "data"}]},
            {"name": "Web", "image": " ", "readiness": {}, "preStop": {"exec": {"command": []}}}
        ],
        "volumes": [{"name": "data"}],
        "initContainers": [{"name": "Web", "image": "busybox"}, {"name": "migrate", "image": "", "readiness": {"tcp": {"port": 1}}}]
    }));
    let errors = messages(&object);
    for expected in [
        "spec.containers[0].name: \"Web\" is not a valid name",
        "spec.containers[1].name: duplicate container name",
        "spec.containers[0].name: duplicate container name \"Web\"",
        "spec.initContainers[1].image: must not be empty",
        "spec.initContainers[1].readiness: an init container runs to completion",
        "spec.containers[1].image: must not be empty",
        "spec.containers[1].readiness: must set exactly one of exec, http or tcp",
        "spec.containers[1].preStop.exec.command: must not be empty",
        "spec.containers[0].mounts[0].volume: no volume named \"nope\"",
        "spec.containers[0].mounts[0].path: must be an absolute path",
        "spec.volumes[0]: must set exactly one of emptyDir, local, plugin, secret or config",
    ] {
        assert!(
            errors.iter().any(|e| e.starts_with(expected)),
            "missing {expected:?} in {errors:#?}"
        );
    }
}

#[test]
fn secret_and_config_references_are_checked_with_their_paths() {
    let valid = pod(json!({
        "containers": [{"name": "web", "image": "busybox",
            "env": {"PLAIN": "x", "PASS": {"secret": "db", "key": "password"}, "MODE": {"config": "app", "key": "mode.txt"}},
            "mounts": [{"volume": "db", "path": "/etc/db"}]}],
        "volumes": [{"name": "db", "secret": {"name": "db"}}, {"name": "app", "config": {"name": "app"}}]
    }));
    assert_eq!(messages(&valid), Vec::<String>::new());
    let object = pod(json!({
        "containers": [{"name": "web", "image": "busybox",
            "env": {"BOTH": {"secret": "db", "config": "app", "key": "k"},
                    "NONE": {"key": "k"},
                    "BADKEY": {"secret": "db", "key": "../etc"},
                    "BADNAME": {"config": "App", "key": "k"},
                    "A=B": "x"}}],
        "volumes": [
            {"name": "two", "secret": {"name": "db"}, "config": {"name": "app"}},
            {"name": "bad", "secret": {"name": "Db"}}
        ]
    }));
    let errors = messages(&object);
    for expected in [
        "spec.containers[0].env.BOTH: must set exactly one of secret or config",
        "spec.containers[0].env.NONE: must set exactly one of secret or config",
        "spec.containers[0].env.BADKEY.key: is not a valid key",
        "spec.containers[0].env.BADNAME.config: \"App\" is not a valid name",
        "spec.containers[0].env.A=B: is not a valid variable name",
        "spec.volumes[0]: must set exactly one of emptyDir, local, plugin, secret or config",
        "spec.volumes[1].secret.name: \"Db\" is not a valid name",
    ] {
        assert!(
            errors.iter().any(|e| e.starts_with(expected)),
            "missing {expected:?} in {errors:#?}"
        );
    }
}

#[test]
fn relaxation_names_are_checked_with_their_paths() {
    let object = pod(json!({
        "security": {"relax": ["run-as-root", "run-as-rot"]},
        "containers": [{"name": "c", "image": "i"}]
    }));
    let errors = messages(&object);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].starts_with(
            "spec.security.relax[1]: unknown relaxation \"run-as-rot\": expected one of run-as-root, "
        ),
        "{errors:?}"
    );
    let policy = Object::new(
        Kind::Policy,
        None,
        "p",
        json!({"namespaces": ["*"], "grant": ["capability:CAP_CHOWN", "host-path:etc"]}),
    );
    let errors = messages(&policy);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].starts_with("spec.grant[1]: host path"),
        "{errors:?}"
    );
}

#[test]
fn load_balancers_need_a_selector_and_distinct_ports() {
    let object = Object::new(
        Kind::LoadBalancer,
        None,
        "front",
        json!({
            "selector": {},
            "ports": [
                {"name": "http", "port": 80, "targetPort": 8080},
                {"name": "http", "port": 80, "targetPort": 0}
            ],
            "class": "Bad_Class"
        }),
    );
    let errors = messages(&object);
    assert_eq!(errors.len(), 5, "{errors:?}");
    assert_eq!(errors[0], "spec.selector: must hold at least one label");
    assert_eq!(errors[1], "spec.ports[1].port: duplicate port 80");
    assert_eq!(
        errors[2],
        "spec.ports[1].targetPort: must be between 1 and 65535"
    );
    assert_eq!(
        errors[3],
        "spec.ports[1].name: duplicate port name \"http\""
    );
    assert!(errors[4].starts_with("spec.class: "), "{errors:?}");
    let good = Object::new(
        Kind::LoadBalancer,
        None,
        "front",
        json!({"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}),
    );
    assert!(validate_object(&good).is_ok());
    let unknown = Object::new(
        Kind::LoadBalancer,
        None,
        "front",
        json!({"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080, "protocol": "sctp"}]}),
    );
    assert!(
        messages(&unknown)[0].starts_with("spec.ports[0].protocol"),
        "{:?}",
        messages(&unknown)
    );
}

#[test]
fn cluster_wide_kinds_refuse_namespaces() {
    let mut node = Object::new(Kind::Node, None, "node-1", json!({}));
    node.metadata.namespace = Some("default".into());
    assert!(messages(&node)[0].starts_with("metadata.namespace: Node objects are cluster-wide"));
}

#[test]
fn pinned_templates_must_carry_the_selector() {
    let object = Object::new(
        Kind::PinnedDeployment,
        None,
        "web",
        json!({
            "replicas": 4, "replicasPercentNext": 101, "selector": {"app": "web"},
            "templates": {
                "previous": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}},
                "next": {"metadata": {"labels": {}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}
            }
        }),
    );
    let errors = messages(&object);
    assert!(
        errors
            .iter()
            .any(|e| e.starts_with("spec.replicasPercentNext")),
        "{errors:?}"
    );
    assert!(
        errors.iter().any(|e| e.starts_with(
            "spec.templates.next.metadata.labels: must include the selector's label app=web"
        )),
        "{errors:?}"
    );
}

#[test]
fn controller_paths_and_steps_are_checked() {
    let object = Object::new(
        Kind::Controller,
        None,
        "acme",
        json!({"owns": ["status.node"], "steps": [{"name": "inject", "kind": "Pod", "workflow": "start", "timeout": "soon"}]}),
    );
    let errors = messages(&object);
    assert!(
        errors.iter().any(|e| e.starts_with("spec.owns[0]")),
        "{errors:?}"
    );
    assert!(
        errors.iter().any(|e| e.starts_with("spec.steps[0].name")),
        "{errors:?}"
    );
    assert!(
        errors
            .iter()
            .any(|e| e.starts_with("spec.steps[0].timeout")),
        "{errors:?}"
    );
}

#[test]
fn owner_references_name_a_uid_and_fit_the_dependent() {
    let mut object = pod(json!({"containers": [{"name": "c", "image": "i"}]}));
    object.metadata.owner = Some(crate::OwnerReference {
        kind: Kind::PinnedDeployment,
        name: "web".into(),
        uid: "u-1".into(),
    });
    assert_eq!(messages(&object), Vec::<String>::new());
    if let Some(owner) = object.metadata.owner.as_mut() {
        owner.uid.clear();
        owner.name = "Web_1".into();
    }
    let found = messages(&object);
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(
        found.iter().any(|m| m.starts_with("metadata.owner.uid")),
        "{found:?}"
    );
    assert!(
        found.iter().any(|m| m.starts_with("metadata.owner.name")),
        "{found:?}"
    );

    let mut node = Object::new(Kind::Node, None, "node-1", json!({}));
    node.metadata.owner = Some(crate::OwnerReference {
        kind: Kind::PinnedDeployment,
        name: "web".into(),
        uid: "u-1".into(),
    });
    let found = messages(&node);
    assert!(
        found
            .iter()
            .any(|m| m.contains("metadata.owner.kind") && m.contains("cluster-wide")),
        "{found:?}"
    );
}

#[test]
fn vm_snapshots_restores_and_power_actions_name_their_paths() {
    let vm = |extra: Value| {
        let mut spec = json!({"cpus": 1, "memory": "256Mi", "disk": {"volume": "d"},
                              "boot": {"kernel": "k"}});
        for (key, value) in extra.as_object().unwrap() {
            spec[key] = value.clone();
        }
        Object::new(Kind::VirtualMachine, None, "vm", spec)
    };
    let fine = vm(json!({
        "snapshots": [{"name": "before-upgrade"}, {"name": "s2"}],
        "restore": {"snapshot": "s2", "at": "2026-12-01T10:00:00Z"},
        "power": {"action": "reset", "at": "2026-12-01T10:00:01Z"},
        "stopGraceSeconds": 30
    }));
    assert_eq!(messages(&fine), Vec::<String>::new());
    let wrong = messages(&vm(json!({
        "snapshots": [{"name": "a b"}, {"name": "s"}, {"name": "s"}],
        "restore": {"snapshot": "gone", "at": "yesterday"},
        "power": {"action": "restart", "at": "2026-12-01"}
    })));
    let joined = wrong.join("\n");
    for path in [
        "spec.snapshots[0].name",
        "spec.snapshots[2].name",
        "spec.restore.snapshot",
        "spec.restore.at",
        "spec.power.at",
    ] {
        assert!(joined.contains(path), "{path} not in {joined}");
    }
    assert!(!joined.contains("spec.snapshots[1]"), "{joined}");
    let disks = messages(&vm(json!({
        "dataDisks": [{"name": "scratch", "size": "32Mi"}, {"name": "scratch", "volume": "v"}]
    })));
    assert!(
        disks
            .join("\n")
            .contains("spec.dataDisks[1].name: names a disk listed before"),
        "{disks:?}"
    );
    let mut diskless = vm(json!({"snapshots": [{"name": "s"}]}));
    diskless.spec.as_object_mut().unwrap().remove("disk");
    assert!(
        messages(&diskless)
            .join("\n")
            .contains("spec.snapshots: needs a disk")
    );
}

#[test]
fn a_vm_machine_ignores_what_is_applied_in_place() {
    let spec: crate::kinds::VirtualMachineSpec = serde_json::from_value(json!({
        "cpus": 1, "memory": "256Mi", "boot": {"kernel": "k"}, "disk": {"volume": "d"},
        "snapshots": [{"name": "s"}], "restore": {"snapshot": "s", "at": "2026-12-01T10:00:00Z"},
        "stopGraceSeconds": 3
    }))
    .unwrap();
    let mut edited = spec.clone();
    edited.snapshots.clear();
    edited.stop_grace_seconds = None;
    assert_eq!(spec.machine(), edited.machine());
    edited.cpus = 2;
    assert_ne!(spec.machine(), edited.machine());
    assert_eq!(spec.stop_grace(), 3);
    assert_eq!(
        edited.stop_grace(),
        crate::kinds::DEFAULT_STOP_GRACE_SECONDS
    );
}

#[test]
fn a_vm_disk_only_grows_and_a_rollback_keeps_its_size() {
    let vm = |disk: Value, data: Value| {
        Object::new(
            Kind::VirtualMachine,
            Some("default"),
            "vm",
            json!({"cpus": 1, "memory": "256Mi", "boot": {"kernel": "k"},
                   "disk": disk, "dataDisks": data}),
        )
    };
    let before = vm(
        json!({"volume": "d", "size": "2Gi"}),
        json!([{"name": "a", "size": "64Mi"}, {"name": "b"}]),
    );
    // Growing, or adding a disk, is fine; so is another source.
    let grown = vm(
        json!({"volume": "d", "size": "3Gi"}),
        json!([{"name": "a", "size": "96Mi"}, {"name": "b", "size": "2Gi"}, {"name": "c", "size": "1Mi"}]),
    );
    assert_eq!(crate::validate_update(&before, &grown), Ok(()));
    let other = vm(
        json!({"volume": "e", "size": "1Gi"}),
        json!([{"name": "z"}]),
    );
    assert_eq!(crate::validate_update(&before, &other), Ok(()));
    // Smaller is refused, naming each field; an absent size is 1Gi.
    let shrunk = vm(
        json!({"volume": "d"}),
        json!([{"name": "b", "size": "512Mi"}, {"name": "a", "size": "64Mi"}]),
    );
    let errors = crate::validate_update(&before, &shrunk).unwrap_err();
    let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert_eq!(
        text,
        [
            "spec.disk.size: 1Gi is smaller than 2Gi, the disk's size now: a disk only grows (keep at least 2Gi)",
            "spec.dataDisks[0].size: 512Mi is smaller than 1Gi, the disk's size now: a disk only grows (keep at least 1Gi)",
        ]
    );
    // A rollback to `shrunk` keeps the sizes the disks have.
    let current: crate::kinds::VirtualMachineSpec =
        serde_json::from_value(before.spec.clone()).unwrap();
    let mut rolled: crate::kinds::VirtualMachineSpec =
        serde_json::from_value(shrunk.spec.clone()).unwrap();
    let raised = crate::keep_grown_disks(&current, &mut rolled);
    assert_eq!(raised, ["spec.disk.size", "spec.dataDisks[0].size"]);
    let mut after = shrunk.clone();
    after.spec = serde_json::to_value(&rolled).unwrap();
    assert_eq!(crate::validate_update(&before, &after), Ok(()));
    assert_eq!(rolled.data_disks[1].size_bytes(), 64 << 20);
}

#[test]
fn vm_interfaces_are_named_once_and_fixed_at_creation() {
    let vm = |interfaces: Value| {
        Object::new(
            Kind::VirtualMachine,
            Some("default"),
            "vm",
            json!({"cpus": 1, "memory": "256Mi", "boot": {"kernel": "k"},
                   "interfaces": interfaces}),
        )
    };
    let two = vm(json!([{"name": "backend"}, {"name": "storage"}]));
    assert_eq!(messages(&two), Vec::<String>::new());
    let wrong = messages(&vm(json!([{"name": "a"}, {"name": "a"}, {"name": "B_"}]))).join("\n");
    assert!(
        wrong.contains("spec.interfaces[1].name: names an interface listed before"),
        "{wrong}"
    );
    assert!(wrong.contains("spec.interfaces[2].name"), "{wrong}");
    let many: Vec<Value> = (0..8).map(|i| json!({"name": format!("n{i}")})).collect();
    assert!(
        messages(&vm(Value::Array(many)))
            .join("\n")
            .contains("spec.interfaces: at most 7")
    );
    let one = vm(json!([{"name": "backend"}]));
    let errors = crate::validate_update(&one, &two).unwrap_err();
    assert_eq!(errors[0].path, "spec.interfaces", "{errors:?}");
    assert_eq!(crate::validate_update(&two, &two), Ok(()));
}

#[test]
fn a_vm_runs_by_default_and_running_is_left_out_until_it_is_stopped() {
    let written = json!({"cpus": 1, "memory": "256Mi", "boot": {"kernel": "k"}});
    let spec: crate::kinds::VirtualMachineSpec = serde_json::from_value(written.clone()).unwrap();
    assert!(spec.running && spec.runs());
    // An existing VM's spec (and so its hash and history) is unchanged.
    assert_eq!(serde_json::to_value(&spec).unwrap().get("running"), None);
    assert_eq!(
        canonical_spec(Kind::VirtualMachine, &written).get("running"),
        None
    );
    let mut stopped = spec.clone();
    stopped.running = false;
    let value = serde_json::to_value(&stopped).unwrap();
    assert_eq!(value["running"], false);
    let again: crate::kinds::VirtualMachineSpec = serde_json::from_value(value).unwrap();
    assert!(!again.running && !again.runs());
    // Stopping or starting is done in place: the same QEMU configuration.
    assert_eq!(spec.machine(), stopped.machine());
    let mut template = spec.clone();
    template.template = true;
    assert!(!template.runs());
}

#[test]
fn a_stopped_template_is_refused_naming_the_field() {
    let vm = Object::new(
        Kind::VirtualMachine,
        None,
        "vm",
        json!({"cpus": 1, "memory": "256Mi", "boot": {"kernel": "k"}, "disk": {"volume": "d"},
               "template": true, "running": false}),
    );
    let text = messages(&vm).join("\n");
    assert!(
        text.contains("spec.running: a template never runs"),
        "{text}"
    );
}

#[test]
fn a_stopped_vm_is_not_migrated_restarted_or_reset_but_may_start_and_keep_old_requests() {
    let vm = |extra: Value| {
        let mut spec = json!({"cpus": 1, "memory": "256Mi", "boot": {"kernel": "k"},
                              "disk": {"volume": "d"},
                              "migration": {"to": "n1", "at": "2026-12-01T10:00:00Z"},
                              "power": {"action": "reset", "at": "2026-12-01T10:00:00Z"}});
        for (key, value) in extra.as_object().unwrap() {
            spec[key] = value.clone();
        }
        Object::new(Kind::VirtualMachine, Some("default"), "vm", spec)
    };
    let running = vm(json!({}));
    let stopped = vm(json!({"running": false}));
    // Stopping keeps the old one-off requests: nothing newer, no refusal.
    assert_eq!(crate::validate_update(&running, &stopped), Ok(()));
    let migrated = vm(json!({"running": false,
                             "migration": {"to": "n2", "at": "2026-12-02T10:00:00Z"}}));
    let errors = crate::validate_update(&stopped, &migrated).unwrap_err();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].path, "spec.migration");
    let text = errors[0].to_string();
    assert!(
        text.contains("the VM is stopped (spec.running: false)"),
        "{text}"
    );
    assert!(text.contains("corral vm start"), "{text}");
    // Stopping and migrating in one revision is refused the same way.
    assert_eq!(
        crate::validate_update(&running, &migrated).unwrap_err()[0].path,
        "spec.migration"
    );
    for action in ["restart", "reset"] {
        let powered = vm(json!({"running": false,
                                "power": {"action": action, "at": "2026-12-02T10:00:00Z"}}));
        let errors = crate::validate_update(&stopped, &powered).unwrap_err();
        assert_eq!(errors[0].path, "spec.power", "{errors:?}");
        assert!(errors[0].to_string().contains("the VM is stopped"));
    }
    // Starting again is fine, and so is a migration of the running VM.
    assert_eq!(crate::validate_update(&stopped, &running), Ok(()));
    let moving = vm(json!({"migration": {"to": "n2", "at": "2026-12-02T10:00:00Z"}}));
    assert_eq!(crate::validate_update(&running, &moving), Ok(()));
    // A rollback to an older request (stopped) is no new request.
    assert_eq!(crate::validate_update(&migrated, &stopped), Ok(()));
}

/// One valid object of every kind, as a user might write it (defaults left
/// out).
fn one_of_each_kind() -> Vec<Object> {
    let container = json!({"name": "c", "image": "i", "resources": {"memory": "65536Ki"}});
    let template =
        json!({"metadata": {"labels": {"app": "x"}}, "spec": {"containers": [container]}});
    let specs = [
        (Kind::Pod, json!({"containers": [container]})),
        (Kind::Node, Value::Null),
        (
            Kind::PinnedDeployment,
            json!({"replicas": 2, "selector": {"app": "x"},
                   "templates": {"previous": template, "next": template}}),
        ),
        (
            Kind::Policy,
            json!({"namespaces": ["*"], "grant": ["capability:CAP_CHOWN"]}),
        ),
        (Kind::Controller, json!({"owns": ["Pod:status.node"]})),
        (
            Kind::VirtualMachine,
            json!({"cpus": 1, "memory": "256Mi", "boot": {"kernel": "k"}}),
        ),
        (
            Kind::LoadBalancer,
            json!({"selector": {"app": "x"}, "ports": [{"port": 80, "targetPort": 8080}]}),
        ),
        (Kind::Secret, json!({"stringData": {"k": "v"}})),
        (Kind::Config, json!({"data": {"k": "v"}})),
        (
            Kind::Job,
            json!({"template": {"spec": {"containers": [container], "restartPolicy": "Never"}}}),
        ),
        (Kind::PerNodeDeployment, json!({"template": template})),
    ];
    specs
        .into_iter()
        .map(|(kind, spec)| {
            let namespace = kind.is_namespaced().then_some("default");
            Object::new(kind, namespace, "x", spec)
        })
        .collect()
}

#[test]
fn validated_is_validation_then_the_canonical_spec() {
    for object in one_of_each_kind() {
        let kind = object.kind;
        let separate = validate_object(&object).map(|()| canonical_spec(kind, &object.spec));
        assert!(separate.is_ok(), "{kind}: {separate:?}");
        let together = validated(object).map(|object| object.spec);
        assert_eq!(together, separate, "{kind}");
    }
    // Defaults are spelled out, as canonical_spec does.
    let pod = validated(one_of_each_kind().remove(0)).unwrap();
    assert_eq!(pod.spec["restartPolicy"], "Always");
    assert_eq!(pod.spec["containers"][0]["resources"]["memory"], "64Mi");
}

#[test]
fn validated_refuses_what_validate_object_refuses_with_the_same_paths() {
    let wrong = [
        pod(json!({"containers": [{"name": "c", "image": "i", "bogus": 1}]})),
        pod(json!({"containers": [{"name": "Bad_Name", "image": "i"}]})),
        Object::new(Kind::Secret, None, "s", json!({"data": {"k": 1234}})),
        Object::new(Kind::Config, None, "c", json!({"data": {"bad key": "v"}})),
    ];
    for object in wrong {
        let expected = validate_object(&object).unwrap_err();
        assert!(!expected.is_empty());
        assert_eq!(validated(object).unwrap_err(), expected);
    }
}

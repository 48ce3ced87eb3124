//! The rules of a pod's spec (alone, or as a workload's template): its
//! containers and their names, images, commands, env, ports, probes,
//! mounts and volumes.

use std::collections::BTreeSet;

use super::Checker;
use crate::kinds::{EnvValue, PodSpec, Probe, is_data_key};

pub(super) fn check_pod(checker: &mut Checker, prefix: &str, spec: &PodSpec) {
    if spec.containers.is_empty() {
        checker.fail(
            format!("{prefix}.containers"),
            "must hold at least one container",
        );
    }
    if let Some(secret) = &spec.image_pull_secret {
        checker.dns_label(&format!("{prefix}.imagePullSecret"), secret);
    }
    let mut volume_names = BTreeSet::new();
    for (index, volume) in spec.volumes.iter().enumerate() {
        let path = format!("{prefix}.volumes[{index}]");
        checker.dns_label(&format!("{path}.name"), &volume.name);
        if !volume_names.insert(volume.name.as_str()) {
            checker.fail(
                format!("{path}.name"),
                format!("duplicate volume name {:?}", volume.name),
            );
        }
        let sources = [
            volume.empty_dir.is_some(),
            volume.local.is_some(),
            volume.plugin.is_some(),
            volume.secret.is_some(),
            volume.config.is_some(),
        ];
        if sources.iter().filter(|set| **set).count() != 1 {
            checker.fail(
                &path,
                "must set exactly one of emptyDir, local, plugin, secret or config",
            );
        }
        for (source, data) in [("secret", &volume.secret), ("config", &volume.config)] {
            if let Some(data) = data {
                checker.dns_label(&format!("{path}.{source}.name"), &data.name);
            }
        }
    }
    for (index, name) in spec.security.relax.iter().enumerate() {
        checker.relaxation(&format!("{prefix}.security.relax[{index}]"), name);
    }
    let mut container_names = BTreeSet::new();
    let init = spec
        .init_containers
        .iter()
        .enumerate()
        .map(|(index, container)| (format!("{prefix}.initContainers[{index}]"), container));
    let regular = spec
        .containers
        .iter()
        .enumerate()
        .map(|(index, container)| (format!("{prefix}.containers[{index}]"), container));
    for (path, container) in init.chain(regular) {
        if path.contains(".initContainers[") {
            for (field, set) in [
                ("readiness", container.readiness.is_some()),
                ("liveness", container.liveness.is_some()),
                ("preStop", container.pre_stop.is_some()),
            ] {
                if set {
                    checker.fail(
                        format!("{path}.{field}"),
                        "an init container runs to completion: it has no readiness, liveness or preStop",
                    );
                }
            }
        }
        checker.dns_label(&format!("{path}.name"), &container.name);
        if !container_names.insert(container.name.as_str()) {
            checker.fail(
                format!("{path}.name"),
                format!("duplicate container name {:?}", container.name),
            );
        }
        checker.non_empty(&format!("{path}.image"), &container.image);
        for (name, value) in &container.env {
            check_env(checker, &format!("{path}.env.{name}"), name, value);
        }
        for (port_index, port) in container.ports.iter().enumerate() {
            if *port == 0 {
                checker.fail(
                    format!("{path}.ports[{port_index}]"),
                    "must be between 1 and 65535",
                );
            }
        }
        for (name, probe) in [
            ("readiness", &container.readiness),
            ("liveness", &container.liveness),
        ] {
            if let Some(probe) = probe {
                check_probe(checker, &format!("{path}.{name}"), probe);
            }
        }
        if let Some(hook) = &container.pre_stop
            && hook.exec.command.is_empty()
        {
            checker.fail(format!("{path}.preStop.exec.command"), "must not be empty");
        }
        for (mount_index, mount) in container.mounts.iter().enumerate() {
            let mount_path = format!("{path}.mounts[{mount_index}]");
            if !volume_names.contains(mount.volume.as_str()) {
                checker.fail(
                    format!("{mount_path}.volume"),
                    format!("no volume named {:?} in {prefix}.volumes", mount.volume),
                );
            }
            if !mount.path.starts_with('/') {
                checker.fail(format!("{mount_path}.path"), "must be an absolute path");
            }
        }
    }
}

/// An env variable: a name a process can be given, and a value that is
/// text or names exactly one Secret or Config and one of its keys.
fn check_env(checker: &mut Checker, path: &str, name: &str, value: &EnvValue) {
    if name.is_empty() || name.contains('=') || name.contains('\0') {
        checker.fail(
            path,
            "is not a valid variable name: not empty, no '=' or NUL",
        );
    }
    let EnvValue::From(from) = value else {
        return;
    };
    match (&from.secret, &from.config) {
        (Some(source), None) => checker.dns_label(&format!("{path}.secret"), source),
        (None, Some(source)) => checker.dns_label(&format!("{path}.config"), source),
        _ => checker.fail(path, "must set exactly one of secret or config"),
    }
    if !is_data_key(&from.key) {
        checker.fail(
            format!("{path}.key"),
            "is not a valid key: letters, digits, '-', '_' and '.' only, at most 253, not '.' or '..'",
        );
    }
}

fn check_probe(checker: &mut Checker, path: &str, probe: &Probe) {
    let kinds = [
        probe.exec.is_some(),
        probe.http.is_some(),
        probe.tcp.is_some(),
    ];
    if kinds.iter().filter(|set| **set).count() != 1 {
        checker.fail(path, "must set exactly one of exec, http or tcp");
    }
    if let Some(exec) = &probe.exec
        && exec.command.is_empty()
    {
        checker.fail(format!("{path}.exec.command"), "must not be empty");
    }
}

use super::*;
use crate::kinds::{PodSpec, PolicySpec, RuntimeClass};

fn policy(name: &str, namespaces: &[&str], grant: &[&str]) -> (String, PolicySpec) {
    (
        name.to_string(),
        PolicySpec {
            namespaces: namespaces.iter().map(ToString::to_string).collect(),
            grant: grant.iter().map(ToString::to_string).collect(),
            default_runtime: None,
        },
    )
}

fn asks(names: &[&str]) -> Vec<String> {
    names.iter().map(ToString::to_string).collect()
}

fn parse(name: &str) -> Result<Relaxation, RelaxationError> {
    name.parse()
}

#[test]
fn every_plain_name_round_trips() {
    for name in [
        "run-as-root",
        "host-network",
        "host-network-stack",
        "writable-rootfs",
        "unconfined-seccomp",
        "32-bit-syscalls",
        "no-user-namespace",
        "runtime:runc",
        "capability:NET_BIND_SERVICE",
        "host-path:/data",
        "device:/dev/fuse",
    ] {
        assert_eq!(parse(name).expect(name).to_string(), name);
    }
}

#[test]
fn capabilities_normalise_the_cap_prefix_and_refuse_unknown_names() {
    assert_eq!(
        parse("capability:CAP_NET_ADMIN"),
        Ok(Relaxation::Capability("NET_ADMIN".into()))
    );
    for bad in [
        "capability:net_admin",
        "capability:FLY",
        "capability:",
        "capability:CAP_",
    ] {
        assert!(
            matches!(parse(bad), Err(RelaxationError::Capability { .. })),
            "{bad}"
        );
    }
    assert_eq!(CAPABILITIES.len(), 41);
}

#[test]
fn host_paths_must_be_clean_and_absolute() {
    assert_eq!(
        parse("host-path:/data/"),
        Ok(Relaxation::HostPath("/data".into()))
    );
    assert_eq!(parse("host-path:/"), Ok(Relaxation::HostPath("/".into())));
    for bad in [
        "host-path:data",
        "host-path:",
        "host-path:/a/../b",
        "host-path:/a//b",
        "host-path:/./a",
    ] {
        assert!(
            matches!(parse(bad), Err(RelaxationError::HostPath { .. })),
            "{bad}"
        );
    }
}

#[test]
fn devices_must_live_under_dev() {
    assert_eq!(
        parse("device:/dev/net/tun"),
        Ok(Relaxation::Device("/dev/net/tun".into()))
    );
    for bad in [
        "device:/dev/",
        "device:/dev",
        "device:/etc/passwd",
        "device:fuse",
        "device:/dev/../etc",
    ] {
        assert!(
            matches!(parse(bad), Err(RelaxationError::Device { .. })),
            "{bad}"
        );
    }
}

#[test]
fn unknown_names_list_the_shapes() {
    let error = parse("run-as-rot").expect_err("typo");
    assert_eq!(
        error.to_string(),
        format!("unknown relaxation \"run-as-rot\": expected one of {SHAPES}")
    );
    assert!(matches!(
        parse("privileged:yes"),
        Err(RelaxationError::Unknown { .. })
    ));
    assert!(matches!(parse(""), Err(RelaxationError::Unknown { .. })));
    assert!(matches!(
        parse("runtime:gvisor"),
        Err(RelaxationError::Runtime { .. })
    ));
}

#[test]
fn host_path_grants_cover_paths_beneath_them_only() {
    let grant = Relaxation::HostPath("/data".into());
    assert!(grant.covers(&Relaxation::HostPath("/data".into())));
    assert!(grant.covers(&Relaxation::HostPath("/data/logs".into())));
    assert!(!grant.covers(&Relaxation::HostPath("/database".into())));
    assert!(!grant.covers(&Relaxation::HostPath("/".into())));
    assert!(Relaxation::HostPath("/".into()).covers(&Relaxation::HostPath("/etc".into())));
    assert!(!grant.covers(&Relaxation::RunAsRoot));
}

#[test]
fn no_ask_no_policy_is_the_default_sandbox() {
    let sandbox = admit("team-a", &[], &[]).expect("nothing asked");
    assert!(sandbox.knobs.iter().all(|knob| knob.relaxed_by.is_empty()));
    let names: Vec<&str> = sandbox.knobs.iter().map(|k| k.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "user namespace",
            "uid",
            "capabilities",
            "no_new_privs",
            "seccomp",
            "32-bit system calls",
            "read-only rootfs",
            "masked /proc",
            "devices",
            "host network",
            "network stack",
            "host paths",
            "runtime"
        ]
    );
    assert_eq!(
        sandbox.knob("uid").map(|k| k.value.as_str()),
        Some("non-root")
    );
    assert_eq!(
        sandbox.knob("uid").map(Knob::source).as_deref(),
        Some("default")
    );
}

#[test]
fn an_ask_without_a_policy_names_the_missing_half() {
    let error = admit("team-a", &asks(&["run-as-root", "host-network"]), &[]).expect_err("refused");
    assert_eq!(
        error.to_string(),
        "pod asks for run-as-root but no Policy grants it to namespace team-a; pod asks for host-network but no Policy grants it to namespace team-a"
    );
}

#[test]
fn a_policy_for_another_namespace_does_not_count() {
    let policies = [policy("root-b", &["team-b"], &["run-as-root"])];
    let error = admit("team-a", &asks(&["run-as-root"]), &policies).expect_err("other namespace");
    assert_eq!(
        error,
        Refusal::NotGranted {
            namespace: "team-a".into(),
            missing: vec!["run-as-root".into()]
        }
    );
}

#[test]
fn a_grant_without_an_ask_changes_nothing_and_is_reported() {
    let policies = [policy("root-a", &["team-a"], &["run-as-root"])];
    let sandbox = admit("team-a", &[], &policies).expect("admitted");
    assert_eq!(
        sandbox.knob("uid").map(|k| k.value.as_str()),
        Some("non-root")
    );
    assert_eq!(
        sandbox.unused_grants[0].to_string(),
        "Policy root-a grants run-as-root to namespace team-a but the pod does not ask for it"
    );
}

#[test]
fn both_halves_grant_and_name_the_policy() {
    let policies = [
        policy(
            "zz-wide",
            &["*"],
            &["capability:CAP_NET_BIND_SERVICE", "device:/dev/fuse"],
        ),
        policy("root-a", &["team-a"], &["run-as-root", "host-path:/srv"]),
    ];
    let relax = asks(&[
        "run-as-root",
        "capability:NET_BIND_SERVICE",
        "host-path:/srv/www",
        "device:/dev/fuse",
        "run-as-root",
    ]);
    let sandbox = admit("team-a", &relax, &policies).expect("granted");
    let uid = sandbox.knob("uid").expect("uid");
    assert_eq!(uid.value, "root (0)");
    assert_eq!(uid.source(), "relaxed by Policy root-a (run-as-root)");
    let caps = sandbox.knob("capabilities").expect("caps");
    assert_eq!(caps.value, "NET_BIND_SERVICE");
    assert_eq!(caps.relaxed_by[0].policy, "zz-wide");
    assert_eq!(
        sandbox.knob("host paths").map(|k| k.value.as_str()),
        Some("/srv/www")
    );
    assert_eq!(
        sandbox.knob("devices").map(|k| k.value.as_str()),
        Some("default set + /dev/fuse")
    );
    assert_eq!(
        sandbox.knob("seccomp").map(Knob::source).as_deref(),
        Some("default")
    );
    assert!(sandbox.unused_grants.is_empty());
}

#[test]
fn every_toggle_flips_when_granted() {
    let all = [
        "no-user-namespace",
        "unconfined-seccomp",
        "32-bit-syscalls",
        "writable-rootfs",
        "host-network",
    ];
    let policies = [policy("all", &["*"], &all)];
    let sandbox = admit("x", &asks(&all), &policies).expect("granted");
    for (knob, value) in [
        ("user namespace", "off (container uids are host uids)"),
        ("seccomp", "unconfined"),
        ("32-bit system calls", "allowed (i386, x32)"),
        ("read-only rootfs", "off"),
        ("host network", "on"),
        ("no_new_privs", "on"),
        ("masked /proc", "on"),
    ] {
        assert_eq!(
            sandbox.knob(knob).map(|k| k.value.as_str()),
            Some(value),
            "{knob}"
        );
    }
}

#[test]
fn an_invalid_ask_is_refused_with_its_index() {
    let error = admit("x", &asks(&["host-network", "run-as-rot"]), &[]).expect_err("typo");
    assert!(matches!(error, Refusal::Invalid { index: 1, .. }));
    assert!(
        error
            .to_string()
            .starts_with("spec.security.relax[1]: unknown relaxation")
    );
}

#[test]
fn a_host_path_outside_the_granted_prefix_is_refused() {
    let policies = [policy("srv", &["x"], &["host-path:/srv"])];
    let error = admit("x", &asks(&["host-path:/etc"]), &policies).expect_err("outside");
    assert_eq!(
        error.to_string(),
        "pod asks for host-path:/etc but no Policy grants it to namespace x"
    );
}

fn gvisor_namespace(grant: &[&str]) -> Vec<(String, PolicySpec)> {
    let mut sandboxed = policy("sandboxed", &["x"], grant);
    sandboxed.1.default_runtime = Some(RuntimeClass::Gvisor);
    vec![sandboxed]
}

fn pod_spec(runtime: Option<RuntimeClass>, relax: &[&str]) -> PodSpec {
    let mut spec: PodSpec = serde_json::from_value(serde_json::json!({
        "containers": [{"name": "c", "image": "i"}]
    }))
    .expect("spec");
    spec.runtime = runtime;
    spec.security.relax = asks(relax);
    spec
}

#[test]
fn runtime_follows_the_namespace_default() {
    assert_eq!(namespace_runtime("x", &[]), (RuntimeClass::Runc, None));
    let policies = gvisor_namespace(&[]);
    assert_eq!(
        namespace_runtime("x", &policies),
        (RuntimeClass::Gvisor, Some("sandboxed".into()))
    );
    let sandbox = admit_pod("x", &pod_spec(None, &[]), &policies).expect("default");
    assert_eq!(
        sandbox.knob("runtime").map(|k| k.value.as_str()),
        Some("gvisor")
    );
}

#[test]
fn explicit_runc_under_a_gvisor_default_needs_the_grant() {
    let error = admit_pod(
        "x",
        &pod_spec(Some(RuntimeClass::Runc), &[]),
        &gvisor_namespace(&[]),
    )
    .expect_err("runc");
    assert_eq!(
        error.to_string(),
        "pod asks for runtime:runc but no Policy grants it to namespace x"
    );
    let sandbox = admit_pod(
        "x",
        &pod_spec(Some(RuntimeClass::Runc), &[]),
        &gvisor_namespace(&["runtime:runc"]),
    )
    .expect("granted");
    let runtime = sandbox.knob("runtime").expect("runtime");
    assert_eq!(runtime.value, "runc");
    assert_eq!(
        runtime.source(),
        "relaxed by Policy sandboxed (runtime:runc)"
    );
}

#[test]
fn explicit_runtimes_without_a_gvisor_default_need_nothing() {
    let sandbox = admit_pod("x", &pod_spec(Some(RuntimeClass::Gvisor), &[]), &[]).expect("tighter");
    assert_eq!(
        sandbox.knob("runtime").map(|k| k.value.as_str()),
        Some("gvisor")
    );
    let sandbox = admit_pod("x", &pod_spec(Some(RuntimeClass::Runc), &[]), &[]).expect("default");
    assert_eq!(
        sandbox.knob("runtime").map(Knob::source).as_deref(),
        Some("default")
    );
}

#[test]
fn gvisor_pods_use_gvisors_network_stack_by_default() {
    let sandbox = admit_pod("x", &pod_spec(Some(RuntimeClass::Gvisor), &[]), &[]).expect("gvisor");
    let stack = sandbox.knob("network stack").expect("knob");
    assert_eq!(stack.value, "gVisor netstack (in the sandbox)");
    assert_eq!(stack.source(), "default");
    let sandbox = admit_pod("x", &pod_spec(None, &[]), &[]).expect("runc");
    assert_eq!(
        sandbox.knob("network stack").map(|k| k.value.as_str()),
        Some("host kernel (runc)")
    );
    let host = [Relaxation::HostNetworkStack];
    assert_eq!(
        network_stack(RuntimeClass::Gvisor, &[]),
        NetworkStack::Gvisor
    );
    assert_eq!(
        network_stack(RuntimeClass::Gvisor, &host),
        NetworkStack::HostKernel
    );
    assert_eq!(
        network_stack(RuntimeClass::Gvisor, &[Relaxation::HostNetwork]),
        NetworkStack::HostKernel,
        "a pod in the node's namespace never gets netstack (runsc would take the node's addresses)"
    );
    assert_eq!(
        network_stack(RuntimeClass::Runc, &[]),
        NetworkStack::HostKernel
    );
}

#[test]
fn the_host_network_stack_needs_both_halves_and_gvisor() {
    let asking = pod_spec(Some(RuntimeClass::Gvisor), &["host-network-stack"]);
    let error = admit_pod("x", &asking, &[]).expect_err("no policy");
    assert_eq!(
        error.to_string(),
        "pod asks for host-network-stack but no Policy grants it to namespace x"
    );
    let granted = [policy("stack", &["x"], &["host-network-stack"])];
    let sandbox = admit_pod("x", &asking, &granted).expect("granted");
    let stack = sandbox.knob("network stack").expect("knob");
    assert_eq!(stack.value, "host kernel (through the pod's namespace)");
    assert_eq!(
        stack.source(),
        "relaxed by Policy stack (host-network-stack)"
    );
    let runc = pod_spec(Some(RuntimeClass::Runc), &["host-network-stack"]);
    let error = admit_pod("x", &runc, &granted).expect_err("runc");
    assert!(
        matches!(
            error,
            Refusal::HostNetworkStackWithoutGvisor { runtime: "runc" }
        ),
        "{error}"
    );
}

#[test]
fn gvisors_network_stack_serves_one_container() {
    let mut two = pod_spec(Some(RuntimeClass::Gvisor), &[]);
    two.containers.push(two.containers[0].clone());
    two.containers[1].name = "d".into();
    let error = admit_pod("x", &two, &[]).expect_err("two containers");
    assert!(matches!(
        error,
        Refusal::NetstackContainers { containers: 2 }
    ));
    assert!(error.to_string().contains("host-network-stack"), "{error}");
    two.security.relax = asks(&["host-network-stack"]);
    let granted = [policy("stack", &["x"], &["host-network-stack"])];
    admit_pod("x", &two, &granted).expect("on the host stack");
}

use serde_json::{Value, json};

use super::*;
use crate::bundle::{
    BindMount, Capability, ContainerConfig, IdMapping, NetworkNamespace, SysfsMount, TmpfsMount,
    UserIds, UserNamespace,
};

fn base() -> ContainerConfig {
    ContainerConfig::new(
        "pod-web.app",
        "/var/lib/corral/c/rootfs",
        vec!["/bin/sh".into(), "-c".into(), "echo hi".into()],
    )
}

fn to_json(config: &ContainerConfig) -> Value {
    serde_json::to_value(generate_spec(config).expect("spec")).expect("json")
}

fn find_mount<'a>(spec: &'a Value, destination: &str) -> Option<&'a Value> {
    spec["mounts"]
        .as_array()
        .expect("mounts")
        .iter()
        .find(|m| m["destination"] == destination)
}

fn namespace_types(spec: &Value) -> Vec<String> {
    spec["linux"]["namespaces"]
        .as_array()
        .expect("namespaces")
        .iter()
        .map(|n| n["type"].as_str().expect("type").to_string())
        .collect()
}

#[test]
fn defaults_are_secure_leaning() {
    let spec = to_json(&base());
    assert_eq!(spec["ociVersion"], "1.0.2");
    assert_eq!(
        spec["root"],
        json!({"path": "/var/lib/corral/c/rootfs", "readonly": false})
    );
    assert!(spec.get("hostname").is_none());
    let process = &spec["process"];
    assert_eq!(process["terminal"], false);
    assert_eq!(process["noNewPrivileges"], true);
    assert_eq!(process["user"], json!({"uid": 0, "gid": 0}));
    assert_eq!(process["args"], json!(["/bin/sh", "-c", "echo hi"]));
    assert_eq!(process["cwd"], "/");
    assert_eq!(
        process["rlimits"],
        json!([{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}])
    );
    let bounding = process["capabilities"]["bounding"]
        .as_array()
        .expect("caps");
    assert_eq!(bounding.len(), 9);
    for forbidden in [
        "CAP_NET_RAW",
        "CAP_SYS_ADMIN",
        "CAP_MKNOD",
        "CAP_SYS_CHROOT",
    ] {
        assert!(!bounding.contains(&json!(forbidden)), "{forbidden}");
    }
    assert_eq!(process["capabilities"]["inheritable"], json!([]));
    assert_eq!(process["capabilities"]["ambient"], json!([]));

    let linux = &spec["linux"];
    assert_eq!(
        namespace_types(&spec),
        ["pid", "ipc", "uts", "mount", "network"]
    );
    assert!(
        linux["maskedPaths"]
            .as_array()
            .expect("masked")
            .contains(&json!("/proc/kcore"))
    );
    assert!(
        linux["readonlyPaths"]
            .as_array()
            .expect("ro")
            .contains(&json!("/proc/sys"))
    );
    assert_eq!(
        linux["resources"]["devices"],
        json!([{"allow": false, "access": "rwm"}])
    );
    assert_eq!(linux["resources"]["pids"], json!({"limit": 1024}));
    assert!(linux["resources"].get("memory").is_none());
    assert!(linux["resources"].get("cpu").is_none());
    assert!(linux.get("seccomp").is_none());
    assert!(linux.get("cgroupsPath").is_none());
    assert!(linux.get("uidMappings").is_none());

    let tmp = find_mount(&spec, "/tmp").expect("/tmp tmpfs");
    assert_eq!(tmp["type"], "tmpfs");
    assert_eq!(
        tmp["options"],
        json!(["nosuid", "nodev", "size=67108864", "mode=1777"])
    );
    let sys = find_mount(&spec, "/sys").expect("/sys");
    assert_eq!(sys["type"], "sysfs");
    assert!(
        sys["options"]
            .as_array()
            .expect("opts")
            .contains(&json!("ro"))
    );
    assert!(find_mount(&spec, "/proc").is_some());
    assert!(find_mount(&spec, "/dev").is_some());
}

#[test]
fn resources_become_cgroup_limits() {
    let mut config = base();
    config.cgroup_path = Some("/corral/pod-1/web".into());
    config.memory_limit_bytes = Some(64 << 20);
    config.memory_swap_limit_bytes = Some(64 << 20);
    config.cpu_limit_millicores = Some(250);
    config.cpu_shares_millicores = Some(500);
    config.pids_limit = None;
    let spec = to_json(&config);
    let resources = &spec["linux"]["resources"];
    assert_eq!(spec["linux"]["cgroupsPath"], "/corral/pod-1/web");
    assert_eq!(
        resources["memory"],
        json!({"limit": 67108864, "swap": 67108864})
    );
    assert_eq!(
        resources["cpu"],
        json!({"quota": 25000, "period": 100000, "shares": 512})
    );
    assert!(resources.get("pids").is_none());
}

#[test]
fn tiny_cpu_limit_is_clamped_to_kernel_minimum() {
    let mut config = base();
    config.cpu_limit_millicores = Some(1);
    config.cpu_shares_millicores = Some(1);
    let spec = to_json(&config);
    assert_eq!(spec["linux"]["resources"]["cpu"]["quota"], 1000);
    assert_eq!(spec["linux"]["resources"]["cpu"]["shares"], 2);
}

#[test]
fn process_user_network_and_mounts() {
    let mut config = base();
    config.user = UserIds {
        uid: 65534,
        gid: 65534,
    };
    config.additional_gids = vec![10];
    config.hostname = Some("web-0".into());
    config.readonly_rootfs = true;
    config.network = NetworkNamespace::Join("/run/corral/netns/pod-1".into());
    config.mounts = vec![BindMount {
        source: "/var/lib/corral/volumes/data".into(),
        destination: "/data".into(),
        read_only: true,
    }];
    config.tmpfs = vec![TmpfsMount {
        destination: "/run".into(),
        size_bytes: 1 << 20,
        mode: 0o755,
    }];
    config.capabilities = vec![Capability::NetBindService];
    config.no_new_privileges = false;
    config.env = vec!["A=1".into()];
    config.cwd = "/srv".into();
    let spec = to_json(&config);
    assert_eq!(spec["hostname"], "web-0");
    assert_eq!(spec["root"]["readonly"], true);
    assert_eq!(
        spec["process"]["user"],
        json!({"uid": 65534, "gid": 65534, "additionalGids": [10]})
    );
    assert_eq!(spec["process"]["env"], json!(["A=1"]));
    assert_eq!(spec["process"]["cwd"], "/srv");
    assert_eq!(spec["process"]["noNewPrivileges"], false);
    assert_eq!(
        spec["process"]["capabilities"]["bounding"],
        json!(["CAP_NET_BIND_SERVICE"])
    );
    let network = spec["linux"]["namespaces"]
        .as_array()
        .expect("ns")
        .iter()
        .find(|n| n["type"] == "network")
        .expect("network ns")
        .clone();
    assert_eq!(network["path"], "/run/corral/netns/pod-1");
    let data = find_mount(&spec, "/data").expect("bind");
    assert_eq!(data["type"], "bind");
    assert_eq!(data["source"], "/var/lib/corral/volumes/data");
    assert_eq!(data["options"], json!(["rbind", "nosuid", "nodev", "ro"]));
    assert!(find_mount(&spec, "/tmp").is_none());
    assert_eq!(
        find_mount(&spec, "/run").expect("run")["options"],
        json!(["nosuid", "nodev", "size=1048576", "mode=755"])
    );
}

#[test]
fn host_network_has_no_namespace_entry() {
    let mut config = base();
    config.network = NetworkNamespace::Host;
    config.sysfs = SysfsMount::None;
    let spec = to_json(&config);
    assert_eq!(namespace_types(&spec), ["pid", "ipc", "uts", "mount"]);
    assert!(find_mount(&spec, "/sys").is_none());
}

#[test]
fn user_namespace_needs_bound_sysfs_when_joining_a_network() {
    let mut config = base();
    config.network = NetworkNamespace::Join("/run/netns/p".into());
    config.user_namespace = Some(UserNamespace {
        path: None,
        uid_mappings: vec![IdMapping {
            container_id: 0,
            host_id: 100_000,
            size: 65536,
        }],
        gid_mappings: vec![IdMapping {
            container_id: 0,
            host_id: 100_000,
            size: 65536,
        }],
    });
    assert!(matches!(
        generate_spec(&config),
        Err(BundleError::SysfsInUserNamespace)
    ));
    config.sysfs = SysfsMount::HostBindReadOnly;
    let spec = to_json(&config);
    assert!(namespace_types(&spec).contains(&"user".to_string()));
    assert_eq!(
        spec["linux"]["uidMappings"],
        json!([{"containerID": 0, "hostID": 100000, "size": 65536}])
    );
    let sys = find_mount(&spec, "/sys").expect("/sys");
    assert_eq!(sys["type"], "bind");
    assert_eq!(sys["source"], "/sys");
    assert!(
        sys["options"]
            .as_array()
            .expect("opts")
            .contains(&json!("ro"))
    );
}

#[test]
fn invalid_configs_are_refused() {
    let mut config = base();
    config.id = "../escape".into();
    assert!(matches!(
        generate_spec(&config),
        Err(BundleError::InvalidId(_))
    ));
    let mut config = base();
    config.args.clear();
    assert!(matches!(generate_spec(&config), Err(BundleError::NoArgs)));
    let mut config = base();
    config.cwd = "relative".into();
    assert!(matches!(
        generate_spec(&config),
        Err(BundleError::RelativePath { field: "cwd", .. })
    ));
    let mut config = base();
    config.mounts.push(BindMount {
        source: "/x".into(),
        destination: "data".into(),
        read_only: false,
    });
    assert!(matches!(
        generate_spec(&config),
        Err(BundleError::RelativePath {
            field: "mount destination",
            ..
        })
    ));
}

#[test]
fn write_bundle_writes_config_json() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write_bundle(dir.path(), &base()).expect("write");
    assert_eq!(path, dir.path().join("config.json"));
    // Capabilities are sets (their JSON order varies): compare parsed specs.
    let written: Spec = serde_json::from_slice(&std::fs::read(&path).expect("read")).expect("json");
    assert_eq!(written, generate_spec(&base()).expect("spec"));
}

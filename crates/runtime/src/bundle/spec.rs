//! `ContainerConfig` → OCI runtime `Spec` → `config.json`.

use std::collections::HashSet;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use oci_spec::OciSpecError;
use oci_spec::runtime::{
    Linux, LinuxCapabilitiesBuilder, LinuxCpuBuilder, LinuxDeviceCgroupBuilder,
    LinuxIdMappingBuilder, LinuxMemoryBuilder, LinuxNamespaceBuilder, LinuxNamespaceType,
    LinuxPidsBuilder, LinuxResourcesBuilder, Mount, MountBuilder, PosixRlimitBuilder,
    PosixRlimitType, Process, RootBuilder, Spec, UserBuilder,
};

use super::{CPU_PERIOD_US, ContainerConfig, IdMapping, NetworkNamespace, SysfsMount};

/// Why a bundle could not be generated or written.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error("container id {0:?} must be 1-128 characters of [A-Za-z0-9_.+-]")]
    InvalidId(String),
    #[error("container has no args")]
    NoArgs,
    #[error("{field} {value:?} must be an absolute path")]
    RelativePath { field: &'static str, value: String },
    #[error(
        "a fresh sysfs cannot be mounted in a user namespace that joins another network namespace: use SysfsMount::HostBindReadOnly"
    )]
    SysfsInUserNamespace,
    #[error("failed to build the OCI spec")]
    Spec(#[from] OciSpecError),
    #[error("failed to serialise the OCI spec")]
    Json(#[source] serde_json::Error),
    #[error("failed to write {path:?}")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'+' | b'-'))
}

fn absolute(field: &'static str, value: &str) -> Result<(), BundleError> {
    if value.starts_with('/') {
        Ok(())
    } else {
        Err(BundleError::RelativePath {
            field,
            value: value.to_string(),
        })
    }
}

fn validate(config: &ContainerConfig) -> Result<(), BundleError> {
    if !valid_id(&config.id) {
        return Err(BundleError::InvalidId(config.id.clone()));
    }
    if config.args.is_empty() {
        return Err(BundleError::NoArgs);
    }
    absolute("cwd", &config.cwd)?;
    absolute("rootfs", &config.rootfs.to_string_lossy())?;
    for bind in &config.mounts {
        absolute("mount destination", &bind.destination)?;
        absolute("mount source", &bind.source.to_string_lossy())?;
    }
    for tmpfs in &config.tmpfs {
        absolute("tmpfs destination", &tmpfs.destination)?;
    }
    if let NetworkNamespace::Join(path) = &config.network {
        absolute("network namespace", &path.to_string_lossy())?;
    }
    let joins_network = matches!(config.network, NetworkNamespace::Join(_));
    if config.user_namespace.is_some() && joins_network && config.sysfs == SysfsMount::FreshReadOnly
    {
        return Err(BundleError::SysfsInUserNamespace);
    }
    Ok(())
}

fn mount(
    destination: &str,
    kind: &str,
    source: &str,
    options: &[&str],
) -> Result<Mount, BundleError> {
    Ok(MountBuilder::default()
        .destination(destination)
        .typ(kind)
        .source(source)
        .options(options.iter().map(|o| o.to_string()).collect::<Vec<_>>())
        .build()?)
}

fn mounts(config: &ContainerConfig) -> Result<Vec<Mount>, BundleError> {
    let mut mounts = vec![
        mount("/proc", "proc", "proc", &["nosuid", "noexec", "nodev"])?,
        mount(
            "/dev",
            "tmpfs",
            "tmpfs",
            &["nosuid", "strictatime", "mode=755", "size=65536k"],
        )?,
        mount(
            "/dev/pts",
            "devpts",
            "devpts",
            &[
                "nosuid",
                "noexec",
                "newinstance",
                "ptmxmode=0666",
                "mode=0620",
            ],
        )?,
        mount(
            "/dev/shm",
            "tmpfs",
            "shm",
            &["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"],
        )?,
        mount(
            "/dev/mqueue",
            "mqueue",
            "mqueue",
            &["nosuid", "noexec", "nodev"],
        )?,
    ];
    match config.sysfs {
        SysfsMount::FreshReadOnly => mounts.push(mount(
            "/sys",
            "sysfs",
            "sysfs",
            &["nosuid", "noexec", "nodev", "ro"],
        )?),
        SysfsMount::HostBindReadOnly => mounts.push(mount(
            "/sys",
            "bind",
            "/sys",
            &["rbind", "nosuid", "noexec", "nodev", "ro"],
        )?),
        SysfsMount::None => {}
    }
    for tmpfs in &config.tmpfs {
        let size = format!("size={}", tmpfs.size_bytes);
        let mode = format!("mode={:o}", tmpfs.mode);
        mounts.push(mount(
            &tmpfs.destination,
            "tmpfs",
            "tmpfs",
            &["nosuid", "nodev", &size, &mode],
        )?);
    }
    for bind in &config.mounts {
        let access = if bind.read_only { "ro" } else { "rw" };
        mounts.push(mount(
            &bind.destination,
            "bind",
            &bind.source.to_string_lossy(),
            &["rbind", "nosuid", "nodev", access],
        )?);
    }
    Ok(mounts)
}

fn process(config: &ContainerConfig) -> Result<Process, BundleError> {
    let caps: HashSet<_> = config.capabilities.iter().copied().collect();
    let capabilities = LinuxCapabilitiesBuilder::default()
        .bounding(caps.clone())
        .effective(caps.clone())
        .permitted(caps)
        .inheritable(HashSet::new())
        .ambient(HashSet::new())
        .build()?;
    let mut user = UserBuilder::default()
        .uid(config.user.uid)
        .gid(config.user.gid)
        .build()?;
    if !config.additional_gids.is_empty() {
        user.set_additional_gids(Some(config.additional_gids.clone()));
    }
    let rlimits = config
        .nofile_limit
        .map(|n| {
            PosixRlimitBuilder::default()
                .typ(PosixRlimitType::RlimitNofile)
                .soft(n)
                .hard(n)
                .build()
        })
        .transpose()?;
    let mut process = Process::default();
    process
        .set_terminal(Some(false))
        .set_user(user)
        .set_args(Some(config.args.clone()))
        .set_env(Some(config.env.clone()))
        .set_cwd(PathBuf::from(&config.cwd))
        .set_capabilities(Some(capabilities))
        .set_rlimits(rlimits.map(|r| vec![r]))
        .set_no_new_privileges(Some(config.no_new_privileges));
    Ok(process)
}

fn id_mappings(
    mappings: &[IdMapping],
) -> Result<Vec<oci_spec::runtime::LinuxIdMapping>, BundleError> {
    mappings
        .iter()
        .map(|m| {
            Ok(LinuxIdMappingBuilder::default()
                .container_id(m.container_id)
                .host_id(m.host_id)
                .size(m.size)
                .build()?)
        })
        .collect()
}

fn linux(config: &ContainerConfig) -> Result<Linux, BundleError> {
    let mut namespaces = Vec::new();
    for kind in [
        LinuxNamespaceType::Pid,
        LinuxNamespaceType::Ipc,
        LinuxNamespaceType::Uts,
        LinuxNamespaceType::Mount,
    ] {
        namespaces.push(LinuxNamespaceBuilder::default().typ(kind).build()?);
    }
    match &config.network {
        NetworkNamespace::New => namespaces.push(
            LinuxNamespaceBuilder::default()
                .typ(LinuxNamespaceType::Network)
                .build()?,
        ),
        NetworkNamespace::Join(path) => namespaces.push(
            LinuxNamespaceBuilder::default()
                .typ(LinuxNamespaceType::Network)
                .path(path.clone())
                .build()?,
        ),
        NetworkNamespace::Host => {}
    }
    let mut linux = Linux::default();
    if let Some(userns) = &config.user_namespace {
        let mut ns = LinuxNamespaceBuilder::default().typ(LinuxNamespaceType::User);
        if let Some(path) = &userns.path {
            ns = ns.path(path.clone());
        }
        namespaces.push(ns.build()?);
        // runc wants the mappings even when it joins a user namespace by
        // path (it checks them and chowns what it creates with them).
        if !userns.uid_mappings.is_empty() {
            linux.set_uid_mappings(Some(id_mappings(&userns.uid_mappings)?));
        }
        if !userns.gid_mappings.is_empty() {
            linux.set_gid_mappings(Some(id_mappings(&userns.gid_mappings)?));
        }
    }

    let mut resources = LinuxResourcesBuilder::default()
        // Deny every device; runc still allows its standard set
        // (null, zero, full, random, urandom, tty, ptmx, pts).
        .devices(vec![
            LinuxDeviceCgroupBuilder::default()
                .allow(false)
                .access("rwm")
                .build()?,
        ]);
    let mut memory = LinuxMemoryBuilder::default();
    if let Some(limit) = config.memory_limit_bytes {
        memory = memory.limit(limit);
    }
    if let Some(swap) = config.memory_swap_limit_bytes {
        memory = memory.swap(swap);
    }
    let mut cpu = LinuxCpuBuilder::default();
    if let Some(millicores) = config.cpu_limit_millicores {
        let quota = (millicores * CPU_PERIOD_US / 1000).max(1000);
        cpu = cpu.quota(quota as i64).period(CPU_PERIOD_US);
    }
    if let Some(millicores) = config.cpu_shares_millicores {
        cpu = cpu.shares((millicores * 1024 / 1000).max(2));
    }
    if config.memory_limit_bytes.is_some() || config.memory_swap_limit_bytes.is_some() {
        resources = resources.memory(memory.build()?);
    }
    if config.cpu_limit_millicores.is_some() || config.cpu_shares_millicores.is_some() {
        resources = resources.cpu(cpu.build()?);
    }
    if let Some(limit) = config.pids_limit {
        resources = resources.pids(LinuxPidsBuilder::default().limit(limit).build()?);
    }

    linux
        .set_namespaces(Some(namespaces))
        .set_resources(Some(resources.build()?))
        .set_cgroups_path(config.cgroup_path.as_ref().map(PathBuf::from))
        .set_masked_paths(Some(config.masked_paths.clone()))
        .set_readonly_paths(Some(config.readonly_paths.clone()))
        .set_seccomp(config.seccomp.clone())
        .set_devices(None)
        .set_sysctl(None);
    Ok(linux)
}

/// Builds the OCI runtime spec for `config`.
pub fn generate_spec(config: &ContainerConfig) -> Result<Spec, BundleError> {
    validate(config)?;
    let root = RootBuilder::default()
        .path(config.rootfs.clone())
        .readonly(config.readonly_rootfs)
        .build()?;
    let mut spec = Spec::default();
    spec.set_version("1.0.2".to_string())
        .set_root(Some(root))
        .set_hostname(config.hostname.clone())
        .set_mounts(Some(mounts(config)?))
        .set_process(Some(process(config)?))
        .set_annotations(None)
        .set_linux(Some(linux(config)?));
    Ok(spec)
}

/// Writes `bundle_dir/config.json` (atomically) and returns its path.
///
/// Not synced: the runtime reads it at once, from the page cache, and
/// nothing needs it across a crash of the machine (the container is gone
/// then, and its next start writes the bundle again).
pub fn write_bundle(bundle_dir: &Path, config: &ContainerConfig) -> Result<PathBuf, BundleError> {
    let spec = generate_spec(config)?;
    let bytes = serde_json::to_vec_pretty(&spec).map_err(BundleError::Json)?;
    let path = bundle_dir.join("config.json");
    let tmp = bundle_dir.join(".config.json.tmp");
    let write_err = |source| BundleError::Write {
        path: path.clone(),
        source,
    };
    fs::create_dir_all(bundle_dir).map_err(write_err)?;
    let mut file = fs::File::create(&tmp).map_err(write_err)?;
    file.write_all(&bytes).map_err(write_err)?;
    fs::rename(&tmp, &path).map_err(write_err)?;
    Ok(path)
}

#[cfg(test)]
#[path = "spec_tests.rs"]
mod tests;

//! `explain-security`: the effective sandbox of a pod and where each
//! relaxation came from, computed by the same rule the server admits with;
//! for a VM, how its node confines its QEMU (the VM's `status.sandbox`).

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Args;
use corral_api::Kind;
use corral_api::kinds::{PodSpec, PolicySpec, VmSandboxStatus};
use corral_api::security::{EffectiveSandbox, admit_pod};
use corral_api::{Object, ObjectKey};

use super::connect;
use crate::output::{Format, Table, print_structured};
use crate::target::Target;

#[derive(Debug, Args)]
#[command(after_help = "Examples:
  corral explain-security pod/web                 every sandbox knob and the Policy that relaxed it
  corral explain-security web -n team-a -o json   a pod NAME alone works too
  corral explain-security vm/builder              the uid, seccomp filter, mounts and cgroup of a VM's QEMU")]
pub struct ExplainSecurityArgs {
    /// The pod (pod/NAME or NAME) or VM (vm/NAME).
    target: String,
    #[arg(short = 'n', long, value_name = "NS", default_value = "default")]
    namespace: String,
    #[arg(short = 'o', long, value_enum, default_value_t)]
    output: Format,
}

pub async fn explain_security(
    config: Option<PathBuf>,
    args: ExplainSecurityArgs,
) -> anyhow::Result<()> {
    let target = if args.target.contains('/') {
        Target::parse(&args.target, None)?
    } else {
        Target::parse("pod", Some(&args.target))?
    };
    if target.kind != Kind::Pod && target.kind != Kind::VirtualMachine {
        bail!(
            "explain-security explains pods and VMs; {} is a {}",
            args.target,
            target.kind
        );
    }
    let client = connect(config)?;
    let key = target.key(Some(&args.namespace))?;
    if target.kind == Kind::VirtualMachine {
        let vm = client.get(&key).await?;
        let sandbox = vm_sandbox(&key, &vm)?;
        if !print_structured(args.output, &sandbox)? {
            print!("{}", render_vm(&sandbox));
        }
        return Ok(());
    }
    let pod = client.get(&key).await?;
    let spec: PodSpec = pod
        .typed_spec()
        .with_context(|| format!("{key} has a spec that is not a pod spec"))?;
    let policies: Vec<(String, PolicySpec)> = client
        .list(Kind::Policy, None, None)
        .await?
        .items
        .iter()
        .filter_map(|policy| Some((policy.metadata.name.clone(), policy.typed_spec().ok()?)))
        .collect();
    let sandbox = admit_pod(&key.namespace, &spec, &policies)
        .map_err(|refusal| anyhow::anyhow!("{key} would not be admitted now: {refusal}"))?;
    if !print_structured(args.output, &sandbox)? {
        print!("{}", render(&sandbox));
    }
    Ok(())
}

/// The confinement the VM's node reported for its running QEMU.
fn vm_sandbox(key: &ObjectKey, vm: &Object) -> anyhow::Result<VmSandboxStatus> {
    let Some(value) = vm.status.get("sandbox").filter(|v| !v.is_null()) else {
        bail!(
            "{key} reports no sandbox: its QEMU is not running (phase {})",
            vm.status
                .get("phase")
                .and_then(|p| p.as_str())
                .unwrap_or("unknown")
        );
    };
    serde_json::from_value(value.clone())
        .with_context(|| format!("{key} has a status.sandbox this CLI cannot read"))
}

/// A VM's QEMU confinement as a table of knobs; the node applies them all
/// to every VM, so each one's source is the node.
fn render_vm(sandbox: &VmSandboxStatus) -> String {
    let mut table = Table::new(&["KNOB", "VALUE", "SOURCE"]);
    let node = "node (every VM)".to_string();
    let rows = [
        ("uid", format!("{} (its own, unprivileged)", sandbox.uid)),
        ("gid", sandbox.gid.to_string()),
        ("capabilities", sandbox.capabilities.clone()),
        ("seccomp", sandbox.seccomp.clone()),
        ("mount namespace", sandbox.mount_namespace.clone()),
        ("writable", sandbox.writable.join(", ")),
        ("cgroup", sandbox.cgroup.clone()),
    ];
    for (name, value) in rows {
        table.row(vec![name.to_string(), value, node.clone()]);
    }
    table.row(vec![
        "memory limit".into(),
        format!(
            "{} bytes (guest RAM + QEMU overhead)",
            sandbox.memory_limit_bytes
        ),
        "spec.memory".into(),
    ]);
    table.row(vec![
        "cpu limit".into(),
        sandbox.cpu_limit.clone(),
        "spec.cpus".into(),
    ]);
    table.render()
}

/// The sandbox as a table of knobs, then the grants nobody asked for.
fn render(sandbox: &EffectiveSandbox) -> String {
    let mut table = Table::new(&["KNOB", "VALUE", "SOURCE"]);
    for knob in &sandbox.knobs {
        table.row(vec![knob.name.clone(), knob.value.clone(), knob.source()]);
    }
    let mut out = table.render();
    for unused in &sandbox.unused_grants {
        out.push_str(&format!("note: {unused}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use corral_api::security::admit;

    #[test]
    fn a_vm_shows_its_uid_seccomp_mounts_and_limits() {
        let mut vm = Object::new(
            Kind::VirtualMachine,
            Some("default"),
            "builder",
            serde_json::json!({}),
        );
        let key = vm.key();
        let missing = vm_sandbox(&key, &vm).unwrap_err().to_string();
        assert!(missing.contains("reports no sandbox"), "{missing}");
        vm.status["sandbox"] = serde_json::json!({
                "uid": 1048576, "gid": 1048576, "capabilities": "none",
                "seccomp": "QEMU -sandbox on,spawn=deny",
                "mountNamespace": "private, over a read-only tmpfs root",
                "writable": ["/d/vms/u"], "cgroup": "/corral/vm-u",
                "memoryLimitBytes": 1024, "cpuLimit": "1 CPU",
        });
        let text = render_vm(&vm_sandbox(&key, &vm).unwrap());
        for wanted in [
            "1048576 (its own",
            "-sandbox on,spawn=deny",
            "private, over a read-only tmpfs root",
            "/corral/vm-u",
            "1024 bytes",
            "1 CPU",
        ] {
            assert!(text.contains(wanted), "{wanted} missing from {text}");
        }
    }

    #[test]
    fn renders_each_knob_with_its_source() {
        let policies = vec![(
            "root".to_string(),
            PolicySpec {
                namespaces: vec!["team-a".into()],
                grant: vec!["run-as-root".into(), "host-network".into()],
                default_runtime: None,
            },
        )];
        let sandbox = admit("team-a", &["run-as-root".to_string()], &policies).expect("granted");
        let text = render(&sandbox);
        let uid = text
            .lines()
            .find(|l| l.starts_with("uid"))
            .expect("uid row");
        assert!(
            uid.contains("root (0)") && uid.ends_with("relaxed by Policy root (run-as-root)"),
            "{text}"
        );
        let seccomp = text
            .lines()
            .find(|l| l.starts_with("seccomp"))
            .expect("seccomp row");
        assert!(seccomp.ends_with("default"), "{text}");
        assert!(text.contains("note: Policy root grants host-network to namespace team-a but the pod does not ask for it"), "{text}");
    }
}

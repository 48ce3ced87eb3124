//! Clones and templates. A VM marked `template: true` is not run: its disk
//! stays as it is and becomes the read-only base of its clones. A VM with
//! `disk.clone: {vm: T}` gets, once, a qcow2 overlay in its own directory
//! whose backing file is T's disk (copy on write: it boots with T's files
//! and its own writes stay in the overlay); with `disk.clone: {vm: V,
//! snapshot: S}` it gets a whole copy of V's snapshot S instead (V may be
//! any VM, running or not: a snapshot does not change). The source must be
//! on this node, in the same namespace.

use std::path::{Path, PathBuf};

use corral_api::kinds::{VirtualMachineSpec, VmClone};
use corral_api::{Kind, Object, ObjectKey};
use corral_runtime::vm::process;

use super::workload::{VmWorkload, typed_spec};

/// The host path of the disk of `source`, a VM bound to `node`, checked
/// to be a base `clone` may use.
pub fn source_disk(
    source: &Object,
    clone: &VmClone,
    node: &str,
    vms_dir: &Path,
    volumes_dir: &Path,
) -> Result<PathBuf, String> {
    let name = &clone.vm;
    let spec: VirtualMachineSpec = source
        .typed_spec()
        .map_err(|e| format!("VM {name} has an unreadable spec: {e}"))?;
    let bound = source.status.get("node").and_then(|n| n.as_str());
    if bound != Some(node) {
        return Err(format!(
            "VM {name}'s disk is on node {}, not on {node}: a clone runs where its source's disk is (set placement)",
            bound.unwrap_or("(none yet)")
        ));
    }
    if clone.snapshot.is_none() && !spec.template {
        return Err(format!(
            "VM {name} is not a template: its disk changes while it runs; mark it `template: true`, or clone one of its snapshots (disk.clone.snapshot)"
        ));
    }
    let disk = spec
        .disk
        .as_ref()
        .ok_or_else(|| format!("VM {name} has no disk"))?;
    Ok(match &disk.volume {
        Some(volume) => volumes_dir.join(volume).join("disk.qcow2"),
        None => vms_dir.join(&source.metadata.uid).join("disk.qcow2"),
    })
}

impl VmWorkload {
    /// Whether the admitted (else desired) revision is a template.
    pub(super) fn is_template(&self) -> bool {
        typed_spec(&self.record.vm)
            .or_else(|| typed_spec(&self.desired))
            .is_some_and(|spec| spec.template)
    }

    /// Makes the clone's disk at `path` from its source; returns a note.
    pub(super) async fn make_clone(
        &self,
        clone: &VmClone,
        path: &Path,
        size: u64,
    ) -> Result<String, String> {
        let client = self
            .ctx
            .agent
            .client
            .clone()
            .ok_or("a clone needs the API to find its source VM")?;
        let key = self.record.vm.key();
        let source_key = ObjectKey::new(
            Kind::VirtualMachine,
            Some(key.namespace.as_str()),
            &clone.vm,
        );
        let source = client
            .get(&source_key)
            .await
            .map_err(|e| format!("cannot read the clone's source: {}", crate::chain(&e)))?;
        let base = source_disk(
            &source,
            clone,
            &self.ctx.agent.node,
            &self.ctx.vms_dir,
            &self.ctx.volumes_dir,
        )?;
        if !base.exists() {
            return Err(format!(
                "VM {}'s disk {} does not exist yet",
                clone.vm,
                base.display()
            ));
        }
        let (made, shown) = (path.to_path_buf(), path.display().to_string());
        let snapshot = clone.snapshot.clone();
        let note = tokio::task::spawn_blocking(move || match snapshot {
            Some(snapshot) => process::copy_snapshot(&base, &snapshot, &made).map(|()| {
                format!(
                    "copied snapshot {snapshot} of {} to {shown}",
                    base.display()
                )
            }),
            None => process::create_disk(&made, size, Some(&base))
                .map(|_| format!("created {shown} over the template's {}", base.display())),
        })
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| crate::chain(&e))?;
        Ok(note)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn vm(name: &str, node: Option<&str>, extra: serde_json::Value) -> Object {
        let mut spec = json!({"cpus": 1, "memory": "256Mi", "boot": {"kernel": "k"}});
        for (key, value) in extra.as_object().unwrap() {
            spec[key] = value.clone();
        }
        let mut object = Object::new(Kind::VirtualMachine, Some("default"), name, spec);
        object.metadata.uid = format!("uid-{name}");
        if let Some(node) = node {
            object.status = json!({"node": node});
        }
        object
    }

    fn clone_of(vm: &str, snapshot: Option<&str>) -> VmClone {
        VmClone {
            vm: vm.into(),
            snapshot: snapshot.map(str::to_string),
        }
    }

    #[test]
    fn a_clone_needs_a_template_or_a_snapshot_on_this_node() {
        let (vms, volumes) = (Path::new("/d/vms"), Path::new("/d/volumes"));
        let template = vm(
            "base",
            Some("n1"),
            json!({"template": true, "disk": {"volume": "base-disk"}}),
        );
        assert_eq!(
            source_disk(&template, &clone_of("base", None), "n1", vms, volumes),
            Ok(PathBuf::from("/d/volumes/base-disk/disk.qcow2"))
        );
        let running = vm("web", Some("n1"), json!({"disk": {"image": "img"}}));
        let error = source_disk(&running, &clone_of("web", None), "n1", vms, volumes).unwrap_err();
        assert!(error.contains("not a template"), "{error}");
        assert_eq!(
            source_disk(&running, &clone_of("web", Some("s1")), "n1", vms, volumes),
            Ok(PathBuf::from("/d/vms/uid-web/disk.qcow2"))
        );
        let error =
            source_disk(&template, &clone_of("base", None), "n2", vms, volumes).unwrap_err();
        assert!(error.contains("is on node n1, not on n2"), "{error}");
        let unbound = vm(
            "new",
            None,
            json!({"template": true, "disk": {"volume": "x"}}),
        );
        let error = source_disk(&unbound, &clone_of("new", None), "n1", vms, volumes).unwrap_err();
        assert!(error.contains("(none yet)"), "{error}");
    }
}

//! What a workload asks of a node: the scheduler's view of a Pod or a
//! VirtualMachine.

use std::collections::BTreeMap;

use corral_api::kinds::{
    Placement, PodPhase, PodSpec, PodStatus, RuntimeClass, VirtualMachineSpec,
};
use corral_api::quantity::{Cpu, Memory};
use corral_api::{Kind, Object, ObjectKey};

/// The relaxation that puts a pod in the host's network namespace, making
/// its container ports host ports.
pub const HOST_NETWORK: &str = "host-network";

/// The prefix of a relaxation reserving one host port (`host-port:8080`).
pub const HOST_PORT_PREFIX: &str = "host-port:";

/// An object the scheduler cannot read.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("{key} cannot be scheduled: only pods and virtual machines can")]
    NotAWorkload { key: ObjectKey },
    #[error("{key} is not a node")]
    NotANode { key: ObjectKey },
    #[error("{key} has an invalid spec")]
    Spec {
        key: ObjectKey,
        #[source]
        source: serde_json::Error,
    },
    #[error("{key} has an invalid status")]
    Status {
        key: ObjectKey,
        #[source]
        source: serde_json::Error,
    },
}

/// One workload to place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// `pod/web`, `vm/builder`; names the workload in reasons and bindings.
    pub workload: ObjectKey,
    /// Summed over the pod's containers; a VM's `cpus` in cores.
    pub cpu: Cpu,
    pub memory: Memory,
    /// The OCI runtime a pod needs; `None` means the default, `runc`.
    /// Ignored for virtual machines, which run under QEMU.
    pub runtime: Option<RuntimeClass>,
    /// `spec.placement.node`: the workload is pinned to this node.
    pub node: Option<String>,
    /// `spec.placement.selector`: every label must match the node's.
    pub selector: BTreeMap<String, String>,
    /// Names of the `local` volumes it uses; one that already lives on a node
    /// pins the workload there.
    pub local_volumes: Vec<String>,
    /// Ports it binds on the host (container ports under `host-network`, and
    /// `host-port:N` relaxations). Admission has already checked the grants.
    pub host_ports: Vec<u16>,
    /// A VM prefers nodes where KVM is usable; it still runs under TCG
    /// elsewhere, so this orders nodes and never excludes one.
    pub wants_kvm: bool,
}

impl Request {
    /// A request with nothing asked: no resources, no constraints.
    pub fn new(workload: ObjectKey) -> Self {
        Request {
            workload,
            cpu: Cpu::default(),
            memory: Memory::default(),
            runtime: None,
            node: None,
            selector: BTreeMap::new(),
            local_volumes: Vec::new(),
            host_ports: Vec::new(),
            wants_kvm: false,
        }
    }

    /// Reads a Pod or a VirtualMachine.
    pub fn from_object(object: &Object) -> Result<Self, DecodeError> {
        match object.kind {
            Kind::Pod => Self::from_pod(object),
            Kind::VirtualMachine => Self::from_vm(object),
            _ => Err(DecodeError::NotAWorkload { key: object.key() }),
        }
    }

    /// Reads a Pod's typed spec: resources summed over containers, runtime,
    /// placement, `local` volumes and host ports.
    pub fn from_pod(object: &Object) -> Result<Self, DecodeError> {
        let key = object.key();
        if object.kind != Kind::Pod {
            return Err(DecodeError::NotAWorkload { key });
        }
        let spec: PodSpec = object.typed_spec().map_err(|source| DecodeError::Spec {
            key: key.clone(),
            source,
        })?;
        Ok(Self::from_pod_spec(key, &spec))
    }

    /// What the pod `key` with `spec` asks of a node (for a caller that has
    /// decoded the spec already).
    pub fn from_pod_spec(key: ObjectKey, spec: &PodSpec) -> Self {
        let mut request = Request::new(key);
        for container in &spec.containers {
            if let Some(cpu) = container.resources.cpu {
                request.cpu.millis = request.cpu.millis.saturating_add(cpu.millis);
            }
            if let Some(memory) = container.resources.memory {
                request.memory.bytes = request.memory.bytes.saturating_add(memory.bytes);
            }
        }
        request.runtime = spec.runtime;
        apply_placement(&mut request, spec.placement.as_ref());
        request.local_volumes = spec
            .volumes
            .iter()
            .filter_map(|volume| volume.local.as_ref().map(|local| local.name.clone()))
            .collect();
        let relax = &spec.security.relax;
        if relax.iter().any(|r| r == HOST_NETWORK) {
            request.host_ports.extend(
                spec.containers
                    .iter()
                    .flat_map(|container| container.ports.iter().copied()),
            );
        }
        request.host_ports.extend(
            relax
                .iter()
                .filter_map(|r| r.strip_prefix(HOST_PORT_PREFIX))
                .filter_map(|port| port.trim().parse::<u16>().ok()),
        );
        request.host_ports.sort_unstable();
        request.host_ports.dedup();
        request
    }

    /// Reads a VirtualMachine's typed spec: `cpus`, `memory`, placement and
    /// the `local` volume holding its disk. VMs prefer KVM nodes.
    pub fn from_vm(object: &Object) -> Result<Self, DecodeError> {
        let key = object.key();
        if object.kind != Kind::VirtualMachine {
            return Err(DecodeError::NotAWorkload { key });
        }
        let spec: VirtualMachineSpec = object.typed_spec().map_err(|source| DecodeError::Spec {
            key: key.clone(),
            source,
        })?;
        let mut request = Request::new(key);
        // A template is not run: it holds its disk on the node, no CPU or
        // memory.
        if !spec.template {
            request.cpu = Cpu {
                millis: u64::from(spec.cpus).saturating_mul(1000),
            };
            request.memory = spec.memory;
        }
        apply_placement(&mut request, spec.placement.as_ref());
        // Its disk is node-local, and so is the disk of a VM it clones:
        // every VM holds a volume named after itself (`vm/NS/NAME`, never
        // a real volume's name), which its clones ask for.
        request.local_volumes.push(vm_disk_volume(
            &request.workload.namespace,
            &request.workload.name,
        ));
        request.local_volumes.extend(
            spec.data_disks
                .iter()
                .filter_map(|disk| disk.volume.clone()),
        );
        if let Some(disk) = spec.disk {
            if let Some(volume) = disk.volume {
                request.local_volumes.push(volume);
            }
            if let Some(clone) = disk.clone {
                request
                    .local_volumes
                    .push(vm_disk_volume(&request.workload.namespace, &clone.vm));
            }
        }
        request.wants_kvm = true;
        Ok(request)
    }

    /// The runtime a pod needs, the default filled in.
    pub(crate) fn runtime_or_default(&self) -> RuntimeClass {
        self.runtime.unwrap_or(RuntimeClass::Runc)
    }
}

/// The pseudo local volume standing for the disk of VM `NAME` in
/// `namespace`, so clones are placed beside their source.
pub fn vm_disk_volume(namespace: &str, name: &str) -> String {
    format!("vm/{namespace}/{name}")
}

fn apply_placement(request: &mut Request, placement: Option<&Placement>) {
    if let Some(placement) = placement {
        request.node = placement.node.clone();
        request.selector = placement.selector.clone();
    }
}

/// A workload already using a node: its reservation counts against the
/// node, its host ports are taken, its `local` volumes live there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoundWorkload {
    pub workload: ObjectKey,
    pub node: String,
    pub cpu: Cpu,
    pub memory: Memory,
    pub host_ports: Vec<u16>,
    pub local_volumes: Vec<String>,
}

impl BoundWorkload {
    /// The binding a request gets on `node`.
    pub fn new(request: &Request, node: &str) -> Self {
        BoundWorkload {
            workload: request.workload.clone(),
            node: node.to_string(),
            cpu: request.cpu,
            memory: request.memory,
            host_ports: request.host_ports.clone(),
            local_volumes: request.local_volumes.clone(),
        }
    }

    /// Reads a Pod or VirtualMachine with `status.node` set. `None` when it
    /// is not bound, or is a pod that has finished (`Succeeded`/`Failed`) and
    /// so holds nothing.
    pub fn from_object(object: &Object) -> Result<Option<Self>, DecodeError> {
        Self::of_request(object, &Request::from_object(object)?)
    }

    /// [`BoundWorkload::from_object`] for a caller that has read the
    /// object's request already.
    pub fn of_request(object: &Object, request: &Request) -> Result<Option<Self>, DecodeError> {
        let status_error = |source| DecodeError::Status {
            key: object.key(),
            source,
        };
        let node = match object.kind {
            Kind::Pod => {
                let status: PodStatus = object.typed_status().map_err(status_error)?;
                if matches!(status.phase, PodPhase::Succeeded | PodPhase::Failed) {
                    return Ok(None);
                }
                status.node
            }
            // VMs have no typed status yet; `status.node` has the pod's shape.
            _ => object
                .status
                .get("node")
                .and_then(|node| node.as_str())
                .map(str::to_string),
        };
        Ok(node.map(|node| BoundWorkload::new(request, &node)))
    }
}

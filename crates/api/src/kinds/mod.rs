//! Typed specs and statuses of every kind.
//!
//! Specs reject unknown fields so that a typo is an error, not a silently
//! ignored setting. Statuses are written by controllers and agents and are
//! read leniently.

mod columns;
mod controller;
mod job;
mod loadbalancer;
mod node;
mod node_images;
mod per_node;
mod pinned;
mod pod;
mod pod_data;
mod pod_health;
mod policy;
mod secret;
mod vm;

pub use columns::{VM_HEADERS, job_columns, load_balancer_columns, per_node_columns, vm_columns};
pub use controller::{ControllerSpec, StepRegistration};
pub use job::{ConcurrencyPolicy, JobPhase, JobSpec, JobStatus};
pub use loadbalancer::{
    DEFAULT_LB_CLASS, LoadBalancerPort, LoadBalancerProtocol, LoadBalancerSpec, LoadBalancerStatus,
};
pub use node::{
    ImagePruneReport, NodeCapacity, NodeCertificate, NodeCertificateRequest, NodePhase, NodeSpec,
    NodeStatus, NodeWireguard, SERVER_TLS_NAME, node_tls_name,
};
pub use node_images::{NodeImage, NodeImages, NodeImagesReport, SkippedNode};
pub use per_node::{PerNodeDeploymentSpec, PerNodeDeploymentStatus};
pub use pinned::{
    DEFAULT_PROGRESS_DEADLINE_SECONDS, IntOrPercent, PinnedDeploymentSpec, PinnedDeploymentStatus,
    PodTemplate, RolloutHalt, RoundingStrategy, TemplateMeta, Templates, VersionStatus,
};
pub use pod::{
    Availability, Container, ContainerExit, ContainerReason, ContainerState, ContainerStatus,
    EmptyDir, ExecProbe, Hook, HttpProbe, LocalVolume, Mount, Placement, PluginVolume, PodPhase,
    PodSpec, PodStatus, Probe, Resources, RestartPolicy, RollbackPolicy, RuntimeClass,
    SecurityRequest, TcpProbe, Volume,
};
pub use pod_data::{DataRef, DataVolume, EnvFrom, EnvValue};
pub use pod_health::{exit_message, pod_status_word};
pub use policy::PolicySpec;
pub use secret::{ConfigSpec, MAX_DATA_BYTES, RevealedSecret, SecretKey, SecretSpec, is_data_key};
pub use vm::{
    BootSource, DEFAULT_DISK_BYTES, DEFAULT_STOP_GRACE_SECONDS, MAX_VM_INTERFACES, PowerAction,
    VirtualMachineSpec, VmClone, VmDataDisk, VmDisk, VmInterface, VmMigration, VmPower, VmRestore,
    VmSandboxStatus, VmSnapshot, is_snapshot_name,
};

use crate::meta::Kind;

/// The JSON schema of a kind's spec, for the OpenAPI document.
pub fn spec_schema(kind: Kind, generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    match kind {
        Kind::Pod => generator.subschema_for::<PodSpec>(),
        Kind::Node => generator.subschema_for::<NodeSpec>(),
        Kind::PinnedDeployment => generator.subschema_for::<PinnedDeploymentSpec>(),
        Kind::Policy => generator.subschema_for::<PolicySpec>(),
        Kind::Controller => generator.subschema_for::<ControllerSpec>(),
        Kind::VirtualMachine => generator.subschema_for::<VirtualMachineSpec>(),
        Kind::LoadBalancer => generator.subschema_for::<LoadBalancerSpec>(),
        Kind::WorkflowDefinition => {
            generator.subschema_for::<crate::workflow::WorkflowDefinitionSpec>()
        }
        Kind::Secret => generator.subschema_for::<SecretSpec>(),
        Kind::Config => generator.subschema_for::<ConfigSpec>(),
        Kind::Job => generator.subschema_for::<JobSpec>(),
        Kind::PerNodeDeployment => generator.subschema_for::<PerNodeDeploymentSpec>(),
    }
}

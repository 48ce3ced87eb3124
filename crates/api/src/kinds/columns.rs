//! The columns a kind shows in a table, beyond NAME and REVISION: shared by
//! `corral get` and the dashboard's overview, so both say the same.

use super::{JobSpec, JobStatus, LoadBalancerSpec, LoadBalancerStatus, PerNodeDeploymentStatus};
use crate::Object;

/// STATUS, COMPLETIONS (`succeeded/completions`; a scheduled Job's
/// schedule), ACTIVE and FAILED of a Job.
pub fn job_columns(object: &Object) -> [String; 4] {
    let status: JobStatus = object.typed_status().unwrap_or_default();
    let completions = match object.typed_spec::<JobSpec>() {
        Ok(JobSpec {
            schedule: Some(schedule),
            ..
        }) => schedule,
        Ok(spec) => format!("{}/{}", status.succeeded, spec.completions),
        Err(_) => "-".into(),
    };
    [
        format!("{:?}", status.phase),
        completions,
        status.active.to_string(),
        status.failed.to_string(),
    ]
}

/// ADDRESSES, PORTS (`port→targetPort`) and READY of a LoadBalancer.
pub fn load_balancer_columns(object: &Object) -> [String; 3] {
    let status: LoadBalancerStatus = object.typed_status().unwrap_or_default();
    let ports = object
        .typed_spec::<LoadBalancerSpec>()
        .map(|spec| {
            spec.ports
                .iter()
                .map(|p| format!("{}→{}", p.port, p.target_port))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default();
    let addresses = if status.addresses.is_empty() {
        "-".to_string()
    } else {
        status.addresses.join(",")
    };
    [addresses, ports, status.ready.to_string()]
}

/// The headers of [`vm_columns`].
pub const VM_HEADERS: [&str; 3] = ["PHASE", "NODE", "MESSAGE"];

/// PHASE (`Running`, `Pending`, `Stopped` when its spec keeps it stopped,
/// `Template`), NODE and MESSAGE of a VirtualMachine, as its node reported
/// them.
pub fn vm_columns(object: &Object) -> [String; 3] {
    let text = |field: &str| {
        object
            .status
            .get(field)
            .and_then(serde_json::Value::as_str)
            .unwrap_or("-")
            .to_string()
    };
    [text("phase"), text("node"), text("message")]
}

/// DESIRED, CURRENT and READY of a PerNodeDeployment.
pub fn per_node_columns(object: &Object) -> [String; 3] {
    let status: PerNodeDeploymentStatus = object.typed_status().unwrap_or_default();
    [status.desired, status.current, status.ready].map(|n| n.to_string())
}

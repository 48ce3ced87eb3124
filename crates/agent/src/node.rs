//! The node's own object: what it offers (capacity, runtimes, kernel
//! features) and its heartbeat.

use std::collections::BTreeMap;
use std::path::Path;

use chrono::Utc;
pub use corral_api::kinds::NodeStatus;
use corral_api::kinds::{NodeCapacity, NodePhase, RuntimeClass};
use corral_api::workflow::StepActionKind;

use crate::steps::{instance_for, is_running, node_steps, request};
use corral_api::quantity::{Cpu, Memory};
use corral_api::{Kind, Object, ObjectKey};
use corral_client::{Client, ClientError};

/// Pods a node accepts at most, whatever its memory says.
pub const MAX_PODS: u32 = 110;

/// The KVM probe's verdict, once the agent has probed (see
/// [`crate::vms::probe_accel`]).
static KVM_FEATURE: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Records the KVM probe's verdict for [`detect_status`].
pub fn set_kvm_feature(value: String) {
    let _ = KVM_FEATURE.set(value);
}

/// What this machine offers, read from the host.
pub fn detect_status(address: Option<String>) -> NodeStatus {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
    let memory = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024);
    let mut runtimes = Vec::new();
    if find_binary("runc").is_some() {
        runtimes.push(RuntimeClass::Runc);
    }
    if find_binary("runsc").is_some() {
        runtimes.push(RuntimeClass::Gvisor);
    }
    let mut features = BTreeMap::new();
    features.insert(
        "kvm".to_string(),
        if let Some(probed) = KVM_FEATURE.get() {
            probed.clone()
        } else if Path::new("/dev/kvm").exists() {
            "present (unprobed)".to_string()
        } else {
            "absent".to_string()
        },
    );
    features.insert(
        "apparmor".to_string(),
        if Path::new("/sys/module/apparmor").exists() {
            "available".to_string()
        } else {
            "unavailable: the kernel has no AppArmor".to_string()
        },
    );
    NodeStatus {
        phase: NodePhase::Ready,
        address,
        capacity: NodeCapacity {
            cpu: Cpu {
                millis: cpus * 1000,
            },
            memory: Memory { bytes: memory },
            pods: MAX_PODS,
        },
        runtimes,
        features,
        heartbeat: Some(Utc::now()),
        ..NodeStatus::default()
    }
}

pub use corral_runtime::find_binary;

/// Creates the Node object if needed and writes its status.
pub async fn register(
    client: &Client,
    name: &str,
    status: &NodeStatus,
) -> Result<Object, ClientError> {
    let key = ObjectKey::new(Kind::Node, None, name);
    let mut node = match client.get(&key).await {
        Ok(node) => node,
        Err(error) if error.status() == Some(404) => {
            let node = Object::new(Kind::Node, None, name, serde_json::json!({}));
            client.create(&node, Some("node registered")).await?
        }
        Err(error) => return Err(error),
    };
    heartbeat(client, &mut node, status).await?;
    Ok(node)
}

/// Writes the node's status with a fresh heartbeat time. Only the fields
/// the node owns are touched; the rest of the stored status (the prefix
/// IPAM chose, the phase node-lifecycle decides, the workflow) is kept as
/// stored.
pub async fn heartbeat(
    client: &Client,
    node: &mut Object,
    status: &NodeStatus,
) -> Result<(), ClientError> {
    let mut current = client.get(&node.key()).await?;
    let ours = serde_json::to_value(status).unwrap_or_default();
    let mut merged = current.status.as_object().cloned().unwrap_or_default();
    for field in [
        "address",
        "capacity",
        "runtimes",
        "features",
        "agentEndpoint",
        "wireguard",
    ] {
        match ours.get(field) {
            Some(value) if !value.is_null() => merged.insert(field.to_string(), value.clone()),
            _ => merged.remove(field),
        };
    }
    merged.insert(
        "heartbeat".to_string(),
        serde_json::to_value(Utc::now()).unwrap_or_default(),
    );
    current.status = serde_json::Value::Object(merged);
    *node = client.put_status(&current).await?;
    Ok(())
}

/// Executes the node-owned steps of the node's join workflow that are ready.
pub async fn run_join_steps(
    client: &Client,
    steps: &dyn crate::steps::StepApi,
    node: &Object,
    network: Option<&crate::network::PodNetwork>,
) {
    let Some(instance) = instance_for(steps, node, node.metadata.revision).await else {
        return;
    };
    if !is_running(&instance) {
        return;
    }
    let key = node.key();
    for step in node_steps(&instance, "ready") {
        if client
            .step_action(&key, &request(StepActionKind::Claim, &step, &instance.id))
            .await
            .is_err()
        {
            continue;
        }
        let outcome = join_step(&step, node, client, network).await;
        let mut report = match &outcome {
            Ok(_) => request(StepActionKind::Complete, &step, &instance.id),
            Err(_) => request(StepActionKind::Fail, &step, &instance.id),
        };
        match outcome {
            Ok(note) => report.note = Some(note),
            Err(error) => report.error = Some(error),
        }
        if let Err(error) = client.step_action(&key, &report).await {
            tracing::warn!(%step, error = %crate::chain(&error), "cannot report a join step");
        }
    }
}

async fn join_step(
    step: &str,
    node: &Object,
    client: &Client,
    network: Option<&crate::network::PodNetwork>,
) -> Result<String, String> {
    let status: NodeStatus = node.typed_status().unwrap_or_default();
    match step {
        "node/register" => Ok(format!(
            "{} cpu, {} memory, runtimes {:?}",
            status.capacity.cpu, status.capacity.memory, status.runtimes
        )),
        "node/configure-routes" => {
            // The stored object may predate the prefix IPAM just wrote.
            let fresh = client
                .get(&node.key())
                .await
                .map_err(|error| crate::chain(&error))?;
            let prefix = fresh
                .typed_status::<NodeStatus>()
                .ok()
                .and_then(|s| s.prefix)
                .unwrap_or_else(|| "?".to_string());
            let Some(network) = network else {
                return Ok(format!(
                    "node prefix {prefix}; no pod network on this node (pods have loopback only)"
                ));
            };
            let nodes = client
                .list(Kind::Node, None, None)
                .await
                .map_err(|error| crate::chain(&error))?;
            let (routes, _) = network
                .reconcile_routes(&node.metadata.name, &nodes.items)
                .await
                .map_err(|error| crate::chain(&error))?;
            Ok(format!(
                "node prefix {prefix}; routes: {}",
                crate::network::describe(&routes)
            ))
        }
        "node/configure-tunnel" => {
            let Some(tunnel) = network.and_then(crate::network::PodNetwork::tunnel) else {
                return Ok("no tunnel (no --wireguard): plain routing to other nodes".to_string());
            };
            let nodes = client
                .list(Kind::Node, None, None)
                .await
                .map_err(|error| crate::chain(&error))?;
            let peers = tunnel
                .reconcile(&node.metadata.name, &nodes.items)
                .await
                .map_err(|error| crate::chain(&error))?;
            Ok(tunnel.describe(&peers.0))
        }
        "node/configure-egress" => match network {
            Some(network) => network
                .configure_node()
                .await
                .map_err(|error| crate::chain(&error)),
            None => Ok("no pod network on this node (pods have loopback only)".to_string()),
        },
        "node/check-runtime" => {
            // The agent reaps orphans; hold the lock so our own child is not taken.
            let _spawning = corral_runtime::oci::reap::spawn_lock();
            let output = std::process::Command::new("runc")
                .arg("--version")
                .output()
                .map_err(|error| format!("cannot run runc: {error}"))?;
            let version = String::from_utf8_lossy(&output.stdout);
            let first = version.lines().next().unwrap_or("runc").to_string();
            if output.status.success() {
                Ok(first)
            } else {
                Err(format!(
                    "runc --version failed: {}",
                    String::from_utf8_lossy(&output.stderr).trim()
                ))
            }
        }
        other => Err(format!("this node does not know step {other}")),
    }
}

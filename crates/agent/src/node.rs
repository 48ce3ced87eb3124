//! The node's own object: what it offers (capacity, runtimes, kernel
//! features) and its heartbeat. Its join steps are [`crate::join`].

use std::collections::BTreeMap;
use std::path::Path;

use chrono::Utc;
pub use corral_api::kinds::NodeStatus;
use corral_api::kinds::{NodeCapacity, NodePhase, RuntimeClass};
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

/// How often a status write that lost a race with another write of the
/// object (a join step moving) is tried again at once.
pub const STATUS_WRITE_ATTEMPTS: usize = 5;

/// Writes the node's status with a fresh heartbeat time. Only the fields
/// the node owns are touched; the rest of the stored status (the prefix
/// IPAM chose, the phase node-lifecycle decides, the workflow) is kept as
/// stored. A write that lost a race with another (409) is read and made
/// again at once: the node's own join steps move the same object.
pub async fn heartbeat(
    client: &Client,
    node: &mut Object,
    status: &NodeStatus,
) -> Result<(), ClientError> {
    let ours = serde_json::to_value(status).unwrap_or_default();
    let mut attempt = 1;
    loop {
        let mut current = client.get(&node.key()).await?;
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
        match client.put_status(&current).await {
            Ok(written) => {
                *node = written;
                return Ok(());
            }
            Err(error) if error.status() == Some(409) && attempt < STATUS_WRITE_ATTEMPTS => {
                attempt += 1;
            }
            Err(error) => return Err(error),
        }
    }
}

/// Writes the node's last self-fence to `status.lastFence`, with its
/// summary as the message: the server records the write as a revision of
/// the node's history.
pub async fn report_fence(
    client: &Client,
    name: &str,
    fence: &corral_api::fencing::SelfFence,
) -> Result<(), ClientError> {
    let key = ObjectKey::new(Kind::Node, None, name);
    let value = serde_json::to_value(fence).unwrap_or_default();
    let mut attempt = 1;
    loop {
        let mut current = client.get(&key).await?;
        if current.status.get("lastFence") == Some(&value) {
            return Ok(());
        }
        if !current.status.is_object() {
            current.status = serde_json::json!({});
        }
        current.status["lastFence"] = value.clone();
        match client
            .put_status_with_message(&current, Some(&fence.summary()))
            .await
        {
            Ok(_) => return Ok(()),
            Err(error) if error.status() == Some(409) && attempt < STATUS_WRITE_ATTEMPTS => {
                attempt += 1;
            }
            Err(error) => return Err(error),
        }
    }
}

//! Pods on a real corral node: `corral up` (API server, controllers and node
//! agent in one process) with the busybox image imported, and the timed
//! operations of `corral-bench pod-start` against it. Every latency runs
//! from the API request to the watch event showing the pod running.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use corral_api::{Kind, Object, ObjectKey};
use corral_client::Client;
use serde_json::json;

use crate::pod_watch::PodWatch;
use crate::processes::CorralProcess;

pub const NAMESPACE: &str = "default";

/// How long one pod may take to run (or to be updated, or to go away).
pub const POD_TIMEOUT: Duration = Duration::from_secs(120);

/// A corral node with the busybox image imported and a pod watch running.
#[derive(Debug)]
pub struct CorralNode {
    // The watch stops before the process is killed and cleaned up.
    watch: PodWatch,
    pub client: Client,
    pub process: CorralProcess,
}

/// A one-container pod: busybox `sleep 3600`, env `BENCH=<value>`. The
/// grace period is 0 because `sleep` as PID 1 of its namespace ignores
/// SIGTERM: with the default 10 s every stop (update, delete) would wait it
/// out, measuring the timer instead of corral. `runc delete --force` and
/// `podman rm -f` kill at once too.
pub fn pod(name: &str, value: usize) -> Object {
    let spec = json!({
        "terminationGraceSeconds": 0,
        "containers": [{
            "name": "c",
            "image": corral_testkit::BUSYBOX_IMAGE,
            "command": ["sleep", "3600"],
            "env": {"BENCH": value.to_string()},
        }],
    });
    Object::new(Kind::Pod, Some(NAMESPACE), name, spec)
}

fn key(name: &str) -> ObjectKey {
    ObjectKey::new(Kind::Pod, Some(NAMESPACE), name)
}

impl CorralNode {
    /// Starts `corral up`, imports the image tar with `corral image import`
    /// and starts watching pods.
    pub async fn start(binary: &Path, image_tar: &Path) -> anyhow::Result<Self> {
        let process = CorralProcess::start(binary).await?;
        let output = tokio::process::Command::new(binary)
            .args(["image", "import"])
            .arg(image_tar)
            .arg("--data-dir")
            .arg(process.data_dir())
            .kill_on_drop(true)
            .output()
            .await
            .context("cannot run corral image import")?;
        if !output.status.success() {
            bail!(
                "corral image import failed ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        let client = Client::new(&process.config)?;
        let watch = PodWatch::start(&client, NAMESPACE).await?;
        Ok(CorralNode {
            watch,
            client,
            process,
        })
    }

    /// Applies a new pod and returns the time until it is seen running.
    pub async fn start_pod(&self, name: String) -> anyhow::Result<Duration> {
        self.start_pod_under(name, None).await
    }

    /// [`start_pod`](Self::start_pod) with `spec.runtime` set (`gvisor`).
    pub async fn start_pod_under(
        &self,
        name: String,
        runtime: Option<&str>,
    ) -> anyhow::Result<Duration> {
        let mut object = pod(&name, 0);
        if let (Some(runtime), Some(spec)) = (runtime, object.spec.as_object_mut()) {
            spec.insert("runtime".into(), json!(runtime));
        }
        let started = Instant::now();
        let created = self
            .client
            .apply(&object, Some("bench: create"))
            .await
            .with_context(|| format!("cannot create pod {name}"))?;
        self.running_since(&created, started).await
    }

    /// Applies `object` (a new pod) and returns the time until it is seen
    /// running.
    pub async fn start_object(&self, object: &Object) -> anyhow::Result<Duration> {
        let started = Instant::now();
        let created = self
            .client
            .apply(object, Some("bench: create"))
            .await
            .with_context(|| format!("cannot create pod {}", object.metadata.name))?;
        self.running_since(&created, started).await
    }

    /// Changes the env of running pod `name` to `value` and returns the time
    /// until the node reports the new revision running.
    pub async fn update_pod(&self, name: &str, value: usize) -> anyhow::Result<Duration> {
        let started = Instant::now();
        let updated = self
            .client
            .apply(&pod(name, value), Some("bench: update"))
            .await
            .with_context(|| format!("cannot update pod {name}"))?;
        self.running_since(&updated, started).await
    }

    /// Deletes pod `name` and creates it again; returns the time from the
    /// delete request until the new pod is seen running.
    pub async fn recreate_pod(&self, name: &str, value: usize) -> anyhow::Result<Duration> {
        let started = Instant::now();
        self.client
            .delete(&key(name), Some("bench: delete"))
            .await
            .with_context(|| format!("cannot delete pod {name}"))?;
        let created = self
            .client
            .apply(&pod(name, value), Some("bench: create again"))
            .await
            .with_context(|| format!("cannot create pod {name} again"))?;
        self.running_since(&created, started).await
    }

    async fn running_since(&self, pod: &Object, started: Instant) -> anyhow::Result<Duration> {
        self.process.remember_pod(&pod.metadata.uid);
        let at = self
            .watch
            .running_at(
                &pod.metadata.name,
                &pod.metadata.uid,
                pod.metadata.revision,
                POD_TIMEOUT,
            )
            .await?;
        Ok(at.saturating_duration_since(started))
    }

    /// Deletes every pod in the namespace through the API, then waits until
    /// the node has removed their containers.
    pub async fn delete_all_pods(&self) -> anyhow::Result<()> {
        let pods = self.client.list(Kind::Pod, Some(NAMESPACE), None).await?;
        for pod in &pods.items {
            self.client
                .delete(&pod.key(), Some("bench: clean up"))
                .await
                .with_context(|| format!("cannot delete pod {}", pod.metadata.name))?;
        }
        let deadline = Instant::now() + POD_TIMEOUT;
        loop {
            let left = self.containers().await?;
            if left == 0 {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("{left} containers still exist {POD_TIMEOUT:?} after deleting every pod");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// How many containers runc knows on this node.
    async fn containers(&self) -> anyhow::Result<usize> {
        let output = tokio::process::Command::new("runc")
            .arg(format!(
                "--root={}",
                self.process.data_dir().join("runc").display()
            ))
            .args(["list", "-q"])
            .kill_on_drop(true)
            .output()
            .await
            .context("cannot run runc list")?;
        Ok(String::from_utf8_lossy(&output.stdout).lines().count())
    }

    /// `VmRSS` and `VmHWM` (peak) of the `corral up` process, in KiB.
    pub fn rss_kib(&mut self) -> anyhow::Result<(u64, u64)> {
        self.process.ensure_running()?;
        let pid = self.process.pid();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .with_context(|| format!("cannot read /proc/{pid}/status"))?;
        let field = |name: &str| {
            status
                .lines()
                .find_map(|line| line.strip_prefix(name))
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|kib| kib.parse::<u64>().ok())
                .with_context(|| format!("no {name} in /proc/{pid}/status"))
        };
        Ok((field("VmRSS:")?, field("VmHWM:")?))
    }
}

//! A pod leaving this node: its containers stopped (within their grace
//! period), its veth, namespaces, volumes (plugin teardown first), cgroups
//! and id range freed, and its local record forgotten. A directory with
//! something still mounted in it is kept, so no mounted data is deleted.

use std::time::Duration;

use corral_api::kinds::PodSpec;

use super::{PodWorkload, short, typed_spec};

impl PodWorkload {
    /// Stops every container, removes the sandbox and forgets the pod.
    pub(super) async fn remove_pod(&mut self) {
        let spec = typed_spec(&self.record.pod);
        let grace = Duration::from_secs(u64::from(
            spec.as_ref()
                .and_then(|s| s.termination_grace_seconds)
                .unwrap_or(10),
        ));
        // An undecodable spec still names no other runtime than runc.
        let spec: PodSpec = spec.unwrap_or_else(|| {
            serde_json::from_value(serde_json::json!({"containers": []}))
                .expect("INVARIANT: an empty container list is a valid pod spec")
        });
        for record in std::mem::take(&mut self.record.containers).into_values() {
            let runner = self.ctx.runner.clone();
            let (uid, spec) = (self.uid(), spec.clone());
            let _ = tokio::task::spawn_blocking(move || {
                if let Err(error) = runner.stop(&uid, &spec, &record, grace) {
                    tracing::warn!(container = %record.runtime_id, error = %crate::chain(&error), "stop failed; removing its files anyway");
                    let _ = runner.cleanup(&uid, &record);
                }
            })
            .await;
        }
        self.finish_cleanups().await;
        let (runner, uid) = (self.ctx.runner.clone(), self.uid());
        let _ = tokio::task::spawn_blocking(move || runner.cleanup_all(&uid)).await;
        if let Some(network) = self.ctx.network.clone()
            && let Err(error) = network.unwire_pod(&self.network_owner()).await
        {
            tracing::warn!(pod = %self.key(), error = %crate::chain(&error), "cannot remove the pod's veth");
        }
        let netns = self.ctx.netns.clone();
        let name = format!("pod-{}", short(&self.uid()));
        let _ = tokio::task::spawn_blocking(move || netns.remove(&name)).await;
        let (plugins, pods_dir, pod) = (
            self.ctx.plugins.clone(),
            self.ctx.runner.pods_dir.clone(),
            self.record.pod.clone(),
        );
        let host_uid = self.ctx.id_ranges.get(&self.uid());
        let teardown_spec = spec.clone();
        if let Ok(problems) = tokio::task::spawn_blocking(move || {
            crate::plugin_volumes::teardown(&plugins, &pods_dir, &pod, &teardown_spec, host_uid)
        })
        .await
        {
            for problem in problems {
                tracing::warn!(pod = %self.key(), %problem, "volume plugin teardown failed; removing the pod's directory anyway");
            }
        }
        if crate::volumes::release(&self.ctx.runner.pods_dir, &self.uid(), &spec) {
            let _ = std::fs::remove_dir_all(crate::containers::pod_dir(
                &self.ctx.runner.pods_dir,
                &self.uid(),
            ));
        } else {
            tracing::error!(pod = %self.key(), "something stays mounted in the pod's directory; it is kept so no mounted data is deleted");
        }
        let uid = self.uid();
        let ranges = self.ctx.id_ranges.clone();
        let released = tokio::task::spawn_blocking(move || {
            crate::containers::remove_pod_cgroups(&uid);
            ranges.release(&uid)
        })
        .await;
        if let Ok(Err(error)) = released {
            tracing::error!(pod = %self.key(), error = %crate::chain(&error), "cannot free the pod's id range");
        }
        if let Err(error) = self.ctx.state.remove_if_uid(&self.key(), &self.uid()) {
            tracing::error!(pod = %self.key(), error = %crate::chain(&error), "cannot forget the pod");
        }
        tracing::info!(pod = %self.key(), "pod removed from this node");
    }
}

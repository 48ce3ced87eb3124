//! Image retention: history is the GC root. An image stays on the node
//! while any pod here runs it, is about to run it, or ran it in one of its
//! last revisions (so a rollback starts without a registry). Images that
//! were imported by hand (no registry host in their name) cannot be pulled
//! again and are never collected.
//!
//! Collection runs only in the agent, which owns the image store and the
//! pod records it reads: every 10 minutes, and when asked through its
//! endpoint (`POST /v1/images/prune`, what `corral image prune` reaches
//! through the API server).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, PoisonError};

use axum::Json;
use axum::extract::State;
use corral_api::kinds::{ImagePruneReport, PodSpec};
use corral_runtime::image::{GcReport, ImageError, ImageStore, Reference};

use crate::serve::{EndpointError, Shared};
use crate::state::PodRecord;

/// The images each pod pulls for a revision it has not admitted yet, kept
/// from collection until the pod runs that revision or leaves the node.
/// In memory only: collection runs in this process, and after a restart
/// nothing is being pulled (a pod pulls again when it resumes), so a pod
/// start writes no record for it.
#[derive(Debug, Default)]
pub struct Pulls {
    by_pod: Mutex<BTreeMap<String, Vec<String>>>,
}

impl Pulls {
    /// Pod `uid` needs `images` from now until [`Pulls::end`].
    pub fn begin(&self, uid: &str, images: Vec<String>) {
        self.lock().insert(uid.to_string(), images);
    }

    /// Pod `uid` runs what it pulled, or left the node.
    pub fn end(&self, uid: &str) {
        self.lock().remove(uid);
    }

    /// Every image being pulled.
    pub fn images(&self) -> Vec<String> {
        self.lock().values().flatten().cloned().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Vec<String>>> {
        self.by_pod.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The images to keep: every pod's current spec, images being pulled for a
/// revision not yet admitted (`pulling`), the recent revisions' images, and
/// every image with no registry to pull it from again.
pub fn roots(records: &[PodRecord], pulling: &[String], stored: &[String]) -> BTreeSet<String> {
    let mut keep: BTreeSet<String> = pulling.iter().cloned().collect();
    for record in records {
        if let Ok(spec) = record.pod.typed_spec::<PodSpec>() {
            keep.extend(spec.containers.iter().map(|c| c.image.clone()));
        }
        keep.extend(record.recent_images.iter().flatten().cloned());
        // Written by agents before the in-memory [`Pulls`].
        keep.extend(record.pulling.iter().cloned());
    }
    // A name with no registry host was pulled (and is stored) under its
    // Docker Hub name.
    let pulled_as: Vec<String> = keep
        .iter()
        .filter_map(|name| name.parse::<Reference>().ok()?.pull_name())
        .map(|name| name.to_string())
        .collect();
    keep.extend(pulled_as);
    keep.extend(
        stored
            .iter()
            .filter(|name| {
                name.parse::<Reference>()
                    .is_ok_and(|r| r.registry.is_none())
            })
            .cloned(),
    );
    keep
}

/// Deletes every image outside [`roots`]. Blocking.
pub fn collect(
    images: &ImageStore,
    records: &[PodRecord],
    pulls: &Pulls,
) -> Result<GcReport, ImageError> {
    let stored: Vec<String> = images.list()?.into_iter().map(|i| i.reference).collect();
    let keep = roots(records, &pulls.images(), &stored);
    let keep: Vec<&str> = keep.iter().map(String::as_str).collect();
    images.retain(&keep)
}

/// `POST /v1/images/prune` on the agent's endpoint: collects now, in this
/// process (under the image store's lock, like the periodic collection).
pub(crate) async fn prune(
    State(endpoint): State<Shared>,
) -> Result<Json<ImagePruneReport>, EndpointError> {
    let ctx = endpoint.ctx.clone();
    let collected = tokio::task::spawn_blocking(move || {
        let records = ctx
            .state
            .load_all()
            .map_err(|error| EndpointError::Internal(crate::chain(&error)))?;
        collect(&ctx.runner.images, &records, &ctx.pulls)
            .map_err(|error| EndpointError::Internal(crate::chain(&error)))
    })
    .await
    .map_err(|error| EndpointError::Internal(error.to_string()))??;
    tracing::info!(removed = ?collected.removed_images, "images collected on request");
    Ok(Json(ImagePruneReport {
        removed_images: collected.removed_images,
        removed_blobs: collected.removed_blobs,
        removed_layers: collected.removed_layers,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use corral_api::{Kind, Object};

    fn record(image: &str, recent: &[&[&str]], pulling: &[&str]) -> PodRecord {
        PodRecord {
            admitted_revision: 1,
            recent_images: recent
                .iter()
                .map(|r| r.iter().map(|s| s.to_string()).collect())
                .collect(),
            pulling: pulling.iter().map(|s| s.to_string()).collect(),
            ..PodRecord::new(Object::new(
                Kind::Pod,
                None,
                "web",
                serde_json::json!({"containers": [{"name": "c", "image": image}]}),
            ))
        }
    }

    #[test]
    fn history_and_hand_imports_are_roots() {
        let records = [record(
            "reg:5000/app:3",
            &[&["reg:5000/app:2"], &["reg:5000/app:3"]],
            &["reg:5000/app:4"],
        )];
        let stored = [
            "reg:5000/app:1".to_string(),
            "reg:5000/app:2".to_string(),
            "local/busybox:1".to_string(),
        ];
        let pulls = Pulls::default();
        pulls.begin("uid-other", vec!["reg:5000/app:5".into()]);
        let keep = roots(&records, &pulls.images(), &stored);
        assert!(keep.contains("reg:5000/app:2"), "a recent revision's image");
        assert!(keep.contains("reg:5000/app:3"), "the current image");
        assert!(
            keep.contains("reg:5000/app:4"),
            "an image an older agent recorded as being pulled"
        );
        assert!(keep.contains("reg:5000/app:5"), "an image being pulled");
        assert!(keep.contains("local/busybox:1"), "a hand import");
        assert!(
            !keep.contains("reg:5000/app:1"),
            "an old pulled image is garbage"
        );
        pulls.end("uid-other");
        let keep = roots(&records, &pulls.images(), &stored);
        assert!(
            !keep.contains("reg:5000/app:5"),
            "a pull is no root once its pod runs it or left"
        );
    }

    #[test]
    fn docker_hub_short_names_keep_their_pulled_image() {
        let records = [record("busybox:1.37", &[&["nginx"]], &[])];
        let stored = [
            "docker.io/library/busybox:1.37".to_string(),
            "docker.io/library/nginx:latest".to_string(),
            "docker.io/library/redis:7".to_string(),
        ];
        let keep = roots(&records, &[], &stored);
        assert!(keep.contains("docker.io/library/busybox:1.37"));
        assert!(keep.contains("docker.io/library/nginx:latest"));
        assert!(!keep.contains("docker.io/library/redis:7"));
    }
}

//! A pod's Secret and Config data on this node: fetched and written into
//! the pod's tmpfs in `node/prepare-volumes`, and kept up to date while the
//! pod runs — a new revision of a Secret or Config the pod reads rewrites
//! its files in place (running containers see the new content at once) and
//! restarts, alone, each container whose env takes a value that changed.

use std::time::{Duration, Instant};

use base64::Engine;
use corral_api::kinds::PodSpec;
use corral_runtime::image::AuthFile;

use super::{PodWorkload, pod_host_base, pod_sandbox, typed_spec};
use crate::executor::StepOutcome;
use crate::pod_data::files::{self, FileOwner};
use crate::pod_data::follow::DataChange;
use crate::pod_data::{self, DataApi, PodData};

/// How long a data change whose fetch failed waits before it is tried again.
const RETRY: Duration = Duration::from_secs(5);

/// What the data step needs of the pod, taken before it runs on its own.
pub(super) struct DataStep {
    pub(super) client: Option<corral_client::Client>,
    pub(super) namespace: String,
    pub(super) pod: String,
}

impl DataStep {
    /// Fetches every Secret and Config `spec` reads (nothing if none); the
    /// error names what is missing (`secret db has no key password`).
    pub(super) async fn fetch(&self, spec: &PodSpec) -> Result<Option<PodData>, String> {
        if spec.data_refs().is_empty() {
            return Ok(None);
        }
        let Some(client) = &self.client else {
            return Err(
                "the pod reads Secrets or Configs and this node has no API to read them from"
                    .into(),
            );
        };
        pod_data::fetch_all(client, &self.namespace, &self.pod, spec)
            .await
            .map(Some)
            .map_err(|error| error.to_string())
    }
}

/// Mounts the pod's data tmpfs and writes `data` into it (blocking);
/// returns a note for the step's log: what was written, never a value.
pub(super) fn write_all(
    pods_dir: &std::path::Path,
    uid: &str,
    spec: &PodSpec,
    data: &PodData,
    host_base: Option<u32>,
) -> Result<String, String> {
    let dir = files::data_dir(pods_dir, uid);
    let owner = FileOwner::pod_root(host_base);
    files::mount(&dir, owner).map_err(|e| crate::chain(&e))?;
    files::write(&dir, spec, data, owner, None).map_err(|e| crate::chain(&e))?;
    let read: Vec<String> = data
        .sources
        .iter()
        .map(|(source, values)| {
            format!(
                "{source} revision {} ({} keys)",
                values.revision,
                values.values.len()
            )
        })
        .collect();
    Ok(format!("in memory: {}", read.join(", ")))
}

impl PodWorkload {
    pub(super) fn data_step(&self) -> DataStep {
        let key = self.key();
        DataStep {
            client: self.ctx.client.clone(),
            namespace: key.namespace,
            pod: key.name,
        }
    }

    /// Makes sure the pod's data is on the node before a container of
    /// `spec` starts: after a reboot the tmpfs is gone, and it is fetched
    /// again (an agent restart keeps it: nothing is fetched).
    pub(super) async fn ensure_data(&self, spec: &PodSpec) -> Result<(), String> {
        let (pods_dir, uid) = (self.ctx.runner.pods_dir.clone(), self.uid());
        if spec.data_refs().is_empty()
            || files::read(&files::data_dir(&pods_dir, &uid))
                .ok()
                .flatten()
                .is_some()
        {
            return Ok(());
        }
        let Some(data) = self.data_step().fetch(spec).await? else {
            return Ok(());
        };
        let (ranges, spec) = (self.ctx.id_ranges.clone(), spec.clone());
        let pool = self.ctx.sandbox_pool.clone();
        tokio::task::spawn_blocking(move || {
            let host_base = pod_host_base(&pool, &ranges, &uid, &spec)?;
            crate::volumes::prepare(
                &pods_dir,
                &uid,
                &spec,
                &crate::volumes::PodRange { host_base },
            )
            .map_err(|e| crate::chain(&e))?;
            write_all(&pods_dir, &uid, &spec, &data, host_base).map(|_| ())
        })
        .await
        .map_err(|e| e.to_string())?
    }

    /// A Secret or Config changed: if the running pod reads it and holds
    /// an older revision, fetch the new one, rewrite its files, and restart
    /// the containers whose env values changed. A failed fetch is tried
    /// again from supervision.
    pub(super) async fn apply_data_change(&mut self, change: &DataChange) {
        let Some(spec) = typed_spec(&self.record.pod) else {
            return;
        };
        if !spec.uses(&change.source) {
            return;
        }
        let dir = files::data_dir(&self.ctx.runner.pods_dir, &self.uid());
        let mut data = match files::read(&dir) {
            Ok(Some(data)) => data,
            // Not prepared yet: `node/prepare-volumes` fetches it all.
            Ok(None) => return,
            Err(error) => {
                tracing::warn!(pod = %self.key(), error = %crate::chain(&error), "cannot read the pod's data");
                return;
            }
        };
        let held = data.get(&change.source).map(|values| values.revision);
        if held.is_none_or(|held| held < change.revision) {
            let step = self.data_step();
            let fetched = match &step.client {
                Some(client) => {
                    DataApi::fetch(client, &step.namespace, &change.source, &step.pod).await
                }
                None => return,
            };
            let values = match fetched {
                Ok(values) => values,
                Err(error) => {
                    tracing::warn!(pod = %self.key(), source = %change.source, %error, "cannot fetch the new revision; trying again");
                    self.data_retry = Some((change.clone(), Instant::now() + RETRY));
                    return;
                }
            };
            let keys = pod_data::changed_keys(data.get(&change.source), &values);
            data.insert(&change.source, values);
            let host_base = match pod_host_base(
                &self.ctx.sandbox_pool,
                &self.ctx.id_ranges,
                &self.uid(),
                &spec,
            ) {
                Ok(base) => base,
                Err(error) => {
                    tracing::warn!(pod = %self.key(), %error, "cannot find the pod's id range");
                    return;
                }
            };
            let written = files::write(
                &dir,
                &spec,
                &data,
                FileOwner::pod_root(host_base),
                Some(&change.source),
            );
            match written {
                Ok(volumes) => {
                    tracing::info!(pod = %self.key(), source = %change.source, revision = change.revision, ?keys, ?volumes, "data files rewritten")
                }
                Err(error) => {
                    tracing::warn!(pod = %self.key(), error = %crate::chain(&error), "cannot rewrite the pod's data");
                    self.data_retry = Some((change.clone(), Instant::now() + RETRY));
                    return;
                }
            }
        }
        self.data_retry = None;
        self.restart_for_data(&spec, &data, change).await;
    }

    /// Tries a failed data change again once its wait is over.
    pub(super) async fn retry_data_change(&mut self) -> bool {
        match self.data_retry.clone() {
            Some((change, at)) if at <= Instant::now() => {
                self.apply_data_change(&change).await;
                true
            }
            _ => false,
        }
    }

    /// Restarts, one by one and alone, the running containers whose env
    /// takes a value of `change`'s source other than the one they started
    /// with; each records why (its status message).
    async fn restart_for_data(&mut self, spec: &PodSpec, data: &PodData, change: &DataChange) {
        let pods_dir = self.ctx.runner.pods_dir.clone();
        let grace = Duration::from_secs(u64::from(spec.termination_grace_seconds.unwrap_or(10)));
        for container in &spec.containers {
            if !container.env_refs().contains(&change.source) {
                continue;
            }
            let Some(record) = self.record.containers.get(&container.name).cloned() else {
                continue;
            };
            // One that is not running takes the new values when it starts.
            if !record.running || record.pid.is_none() {
                continue;
            }
            let Some(started) = files::started_env(&pods_dir, &self.uid(), &record.runtime_id)
            else {
                continue;
            };
            let changed = pod_data::changed_env(container, &started, data);
            if changed.is_empty() {
                continue;
            }
            let revision = data
                .get(&change.source)
                .map_or(change.revision, |v| v.revision);
            let why = format!(
                "restarted: {} revision {revision} changed {}",
                change.source,
                changed.join(", ")
            );
            tracing::info!(pod = %self.key(), container = %container.name, %why, "restarting a container for new env values");
            let Some(netns) = self.record.netns.clone() else {
                continue;
            };
            let (key, name) = (self.key(), container.name.clone());
            let generation = self.next_generation(&name);
            let (runner, ranges) = (self.ctx.runner.clone(), self.ctx.id_ranges.clone());
            let (uid, pod_name, pod_spec, container) = (
                self.uid(),
                self.record.pod.metadata.name.clone(),
                spec.clone(),
                container.clone(),
            );
            let old = record.clone();
            let (halter, halt_uid, halt_spec) = (runner.clone(), uid.clone(), pod_spec.clone());
            let halted = tokio::task::spawn_blocking(move || {
                halter.halt(&halt_spec, &old, grace)?;
                if let Err(error) = halter.cleanup(&halt_uid, &old) {
                    tracing::warn!(container = %old.runtime_id, error = %crate::chain(&error), "cannot remove a stopped container's files");
                }
                Ok(())
            })
            .await;
            // Wired again for gVisor's stack once the old sandbox is gone.
            let restarted = match halted {
                Ok(Ok(())) => {
                    if let Err(error) = self.rewire_for_gvisor_stack(spec).await {
                        tracing::warn!(pod = %key, container = %name, %error, "cannot wire the pod's namespace again");
                    }
                    tokio::task::spawn_blocking(move || {
                        let sandbox =
                            pod_sandbox(&ranges, &uid, &pod_spec, &container.name, &netns)?;
                        runner.start(&uid, &pod_name, &pod_spec, &container, generation, &sandbox)
                    })
                    .await
                }
                Ok(Err(error)) => Ok(Err(error)),
                Err(error) => Err(error),
            };
            let entry = self
                .record
                .containers
                .get_mut(&name)
                .expect("INVARIANT: the record was read from the map above");
            match restarted {
                Ok(Ok(mut started)) => {
                    started.restarts = record.restarts;
                    started.last_exit = record.last_exit.clone();
                    started.data_restart = Some(why);
                    *entry = started;
                }
                Ok(Err(error)) => {
                    let error = crate::chain(&error);
                    tracing::warn!(pod = %key, container = %name, %error, "restart for new env values failed");
                    // Supervision starts it again (after its backoff).
                    entry.pid = None;
                    entry.start_error = Some(format!("{why}, and could not start: {error}"));
                    entry.restart_after = Some(chrono::Utc::now());
                }
                Err(error) => tracing::error!(%error, "restart task failed"),
            }
            self.save();
        }
    }
}

/// The outcome of `node/prepare-volumes` from its parts' results.
pub(super) fn outcome(volumes: String, data: Option<String>) -> StepOutcome {
    let notes: Vec<String> = [Some(volumes), data]
        .into_iter()
        .flatten()
        .filter(|note| !note.is_empty())
        .collect();
    StepOutcome::Done(Some(notes.join("; ")).filter(|n| !n.is_empty()))
}

/// The keys of a pull secret that may hold a Docker `config.json`.
const PULL_SECRET_KEYS: [&str; 2] = ["config.json", ".dockerconfigjson"];

impl DataStep {
    /// The registry credentials of the pod's `imagePullSecret`, read for
    /// this pod (a node may read only the Secrets of its pods); the error
    /// names the Secret and what is wrong with it, never a value.
    pub(super) async fn pull_credentials(&self, secret: &str) -> Result<AuthFile, String> {
        let Some(client) = &self.client else {
            return Err(format!(
                "the pod's imagePullSecret {secret} needs the API, and this node has none"
            ));
        };
        let key =
            corral_api::ObjectKey::new(corral_api::Kind::Secret, Some(&self.namespace), secret);
        let revealed = client
            .reveal_for(&key, None, Some(&self.pod))
            .await
            .map_err(|error| match error.status() {
                Some(404) => format!(
                    "imagePullSecret: secret {secret} not found in namespace {}",
                    self.namespace
                ),
                _ => format!(
                    "imagePullSecret: cannot read secret {secret}: {}",
                    crate::chain(&error)
                ),
            })?;
        let encoded = PULL_SECRET_KEYS
            .iter()
            .find_map(|name| revealed.data.get(*name))
            .ok_or_else(|| {
                format!(
                    "imagePullSecret: secret {secret} has no key config.json (or .dockerconfigjson) holding a Docker config.json"
                )
            })?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .map_err(|_| format!("imagePullSecret: secret {secret}'s config.json is not base64"))?;
        let origin = std::path::PathBuf::from(format!("secret/{secret}"));
        AuthFile::parse(&bytes, &origin).map_err(|error| error.to_string())
    }
}

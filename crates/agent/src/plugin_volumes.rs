//! The node's side of plugin volumes: the steps a volume plugin's
//! `Controller` delegates to the node (`PLUGIN/prepare`, `PLUGIN/mount`,
//! before the `storage` target), and the teardown verbs (`unmount`, then
//! `release`) when the pod leaves the node. Talking to the plugin is
//! `crate::plugins`; where volumes live is `crate::volumes`. This module
//! does not talk to the API: the worker reports outcomes and log lines.

use std::path::Path;

use corral_api::Object;
use corral_api::kinds::{PodSpec, Volume};

use crate::plugins::{PluginRequest, Plugins, Verb, accept_path, log_lines};
use crate::volumes::{
    PodRange, VolumeOwner, record_plugin_path, recorded_plugin_path, volume_path,
};

/// The outcome of a delegated step: a note (or the error `why` shows), and
/// the plugin's output for the step log.
#[derive(Debug)]
pub struct StepRun {
    pub result: Result<Option<String>, String>,
    pub log: Vec<String>,
}

/// The pod's volumes that plugin `driver` makes.
fn volumes_of<'a>(spec: &'a PodSpec, driver: &'a str) -> impl Iterator<Item = &'a Volume> {
    spec.volumes
        .iter()
        .filter(move |v| v.plugin.as_ref().is_some_and(|p| p.driver == driver))
}

/// The delegated steps each plugin volume of `spec` needs and that its
/// workflow lacks (pure): `DRIVER/prepare` and `DRIVER/mount`, executed by
/// the node; `delegated(step, owner)` says whether the workflow has `step`
/// owned by `owner` and delegated to the node. Without them nothing would
/// run the plugin and the pod would start on an empty directory.
pub fn missing_steps(spec: &PodSpec, delegated: impl Fn(&str, &str) -> bool) -> Vec<String> {
    let mut missing = Vec::new();
    for volume in &spec.volumes {
        let Some(plugin) = &volume.plugin else {
            continue;
        };
        for verb in ["prepare", "mount"] {
            let name = format!("{}/{verb}", plugin.driver);
            if !delegated(&name, &plugin.driver) && !missing.contains(&name) {
                missing.push(name);
            }
        }
    }
    missing
}

/// The request for `volume` of `pod`, with `path` from an earlier verb.
fn request(
    pods_dir: &Path,
    pod: &Object,
    volume: &Volume,
    host_uid: Option<u32>,
) -> Option<PluginRequest> {
    let plugin = volume.plugin.as_ref()?;
    let uid = &pod.metadata.uid;
    let dir = volume_path(pods_dir, uid, volume).ok()?.path;
    Some(PluginRequest {
        volume: volume.name.clone(),
        pod: pod.metadata.name.clone(),
        namespace: pod.key().namespace,
        uid: uid.clone(),
        options: plugin.options.clone(),
        dir,
        host_uid,
        path: recorded_plugin_path(pods_dir, uid, &volume.name),
    })
}

/// Runs `plugin verb` (`prepare` or `mount`) for every volume of `spec`
/// the plugin makes. `prepare` first makes each volume's directory and
/// hands it to the pod's id `range`; an answered path is accepted only inside
/// that directory or under a `host-path` relaxation of the pod.
pub fn run_step(
    plugins: &Plugins,
    pods_dir: &Path,
    pod: &Object,
    spec: &PodSpec,
    range: PodRange,
    plugin: &str,
    verb: Verb,
) -> StepRun {
    let host_uid = range.host_base;
    let mut log = Vec::new();
    let mut notes = Vec::new();
    let result = (|| {
        let relax = crate::sandbox::relaxations(spec).map_err(|e| crate::chain(&e))?;
        for volume in volumes_of(spec, plugin) {
            let Some(request) = request(pods_dir, pod, volume, host_uid) else {
                continue;
            };
            if verb == Verb::Prepare {
                let io = |e: std::io::Error| {
                    format!(
                        "cannot prepare volume {} at {}: {e}",
                        volume.name,
                        request.dir.display()
                    )
                };
                std::fs::create_dir_all(&request.dir).map_err(io)?;
                range.adopt(&request.dir).map_err(io)?;
            }
            let called = plugins.call(plugin, verb, &request);
            let (reply, output) = match called {
                Ok(called) => (called.reply, called.output),
                Err(failure) => {
                    log.extend(log_lines(plugin, verb, &failure.output));
                    return Err(crate::chain(&failure.error));
                }
            };
            log.extend(log_lines(plugin, verb, &output));
            let answered = reply.path.or(request.path.clone());
            let path = accept_path(
                plugin,
                &volume.name,
                &request.dir,
                answered.as_deref(),
                &relax,
            )
            .map_err(|e| crate::chain(&e))?;
            record_plugin_path(pods_dir, &pod.metadata.uid, &volume.name, &path)
                .map_err(|e| crate::chain(&e))?;
            notes.push(match reply.message {
                Some(message) => format!("{} at {}: {message}", volume.name, path.display()),
                None => format!("{} at {}", volume.name, path.display()),
            });
        }
        Ok(())
    })();
    StepRun {
        result: result.map(|()| {
            Some(if notes.is_empty() {
                format!("no volume of plugin {plugin} in this pod")
            } else {
                notes.join(", ")
            })
        }),
        log,
    }
}

/// Runs `unmount`, then (if it worked) `release`, for every volume of
/// `spec` made by one of `drivers` (the pod is leaving the node without
/// those verbs as steps of its stop workflow). Failures are returned as
/// lines for the log: the directory is removed later anyway (after
/// detaching whatever is still mounted there).
pub fn teardown(
    plugins: &Plugins,
    pods_dir: &Path,
    pod: &Object,
    spec: &PodSpec,
    host_uid: Option<u32>,
    drivers: &[String],
) -> Vec<String> {
    let mut problems = Vec::new();
    for volume in &spec.volumes {
        let Some(plugin) = &volume.plugin else {
            continue;
        };
        if !drivers.contains(&plugin.driver) {
            continue;
        }
        let Some(request) = request(pods_dir, pod, volume, host_uid) else {
            continue;
        };
        for verb in [Verb::Unmount, Verb::Release] {
            // A volume that would not unmount is not released under it.
            if let Err(failure) = plugins.call(&plugin.driver, verb, &request) {
                problems.push(format!(
                    "volume {}: {}",
                    volume.name,
                    crate::chain(&failure.error)
                ));
                break;
            }
        }
    }
    problems
}

/// `PLUGIN/unmount` or `PLUGIN/release` as a step of the pod's stop
/// workflow: `verb` for every volume of `spec` the plugin makes, the
/// plugin's output as the step's log.
pub fn teardown_verb(
    plugins: &Plugins,
    pods_dir: &Path,
    pod: &Object,
    spec: &PodSpec,
    host_uid: Option<u32>,
    plugin: &str,
    verb: Verb,
) -> StepRun {
    let mut log = Vec::new();
    let mut done = Vec::new();
    for volume in volumes_of(spec, plugin) {
        let Some(request) = request(pods_dir, pod, volume, host_uid) else {
            continue;
        };
        match plugins.call(plugin, verb, &request) {
            Ok(called) => {
                log.extend(log_lines(plugin, verb, &called.output));
                done.push(volume.name.clone());
            }
            Err(failure) => {
                log.extend(log_lines(plugin, verb, &failure.output));
                return StepRun {
                    result: Err(format!(
                        "volume {}: {}",
                        volume.name,
                        crate::chain(&failure.error)
                    )),
                    log,
                };
            }
        }
    }
    let note = if done.is_empty() {
        format!("no volume of plugin {plugin} in this pod")
    } else {
        format!("{} {}", verb.as_str(), done.join(", "))
    };
    StepRun {
        result: Ok(Some(note)),
        log,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugins::{PluginExec, PluginOutput};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    /// Answers every call with `reply`, recording `VERB VOLUME path=…`.
    struct Fake {
        calls: Mutex<Vec<String>>,
        reply: String,
        code: i32,
    }

    impl PluginExec for Fake {
        fn run(
            &self,
            _executable: &Path,
            verb: Verb,
            input: &[u8],
            _timeout: Duration,
        ) -> std::io::Result<PluginOutput> {
            let request: PluginRequest = serde_json::from_slice(input).expect("request");
            self.calls.lock().unwrap().push(format!(
                "{} {} path={:?}",
                verb.as_str(),
                request.volume,
                request.path
            ));
            Ok(PluginOutput {
                code: Some(self.code),
                stdout: self.reply.clone(),
                stderr: "working\n".into(),
            })
        }
    }

    fn setup(reply: &str, code: i32) -> (tempfile::TempDir, Plugins, Arc<Fake>) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("plugins")).unwrap();
        std::fs::write(dir.path().join("plugins/dirvol"), "").unwrap();
        let fake = Arc::new(Fake {
            calls: Mutex::default(),
            reply: reply.into(),
            code,
        });
        let plugins = Plugins {
            dirs: vec![dir.path().join("plugins")],
            exec: fake.clone(),
            timeout: Duration::from_secs(1),
        };
        (dir, plugins, fake)
    }

    fn pod() -> (Object, PodSpec) {
        let spec = serde_json::json!({
            "volumes": [
                {"name": "a", "plugin": {"driver": "dirvol"}},
                {"name": "b", "emptyDir": {}},
                {"name": "c", "plugin": {"driver": "other"}}
            ],
            "containers": [{"name": "main", "image": "local/busybox:1"}]
        });
        let mut object: Object = serde_json::from_value(serde_json::json!({
            "kind": "Pod",
            "metadata": {"name": "web", "namespace": "default", "uid": "u1"},
            "spec": spec
        }))
        .unwrap();
        object.metadata.uid = "u1".into();
        (object, serde_json::from_value(spec).unwrap())
    }

    #[test]
    fn prepare_then_mount_pass_the_path_along() {
        let (dir, plugins, fake) = setup(r#"{"ok":true}"#, 0);
        let pods = dir.path().join("pods");
        let (pod, spec) = pod();
        let run = |verb| {
            run_step(
                &plugins,
                &pods,
                &pod,
                &spec,
                PodRange::default(),
                "dirvol",
                verb,
            )
        };
        let prepared = run(Verb::Prepare);
        assert!(pods.join("u1/volumes/a").is_dir());
        assert_eq!(
            prepared.log,
            [
                "dirvol prepare stdout: {\"ok\":true}",
                "dirvol prepare stderr: working"
            ]
        );
        assert!(prepared.result.unwrap().unwrap().starts_with("a at "));
        let mounted = run(Verb::Mount);
        assert!(mounted.result.is_ok());
        let calls = fake.calls.lock().unwrap().clone();
        let dir_a = pods.join("u1/volumes/a");
        assert_eq!(
            calls,
            [
                "prepare a path=None".to_string(),
                format!("mount a path={:?}", Some(&dir_a)),
            ]
        );
        let drivers = ["dirvol".to_string(), "other".to_string()];
        assert_eq!(
            teardown(&plugins, &pods, &pod, &spec, None, &drivers).len(),
            1,
            "plugin `other` is missing"
        );
        let calls = fake.calls.lock().unwrap().clone();
        assert_eq!(
            calls[2..],
            [
                format!("unmount a path={:?}", Some(&dir_a)),
                format!("release a path={:?}", Some(&dir_a))
            ]
        );
        // As steps of the stop workflow: one verb at a time, its note
        // naming the volumes.
        let released = teardown_verb(&plugins, &pods, &pod, &spec, None, "dirvol", Verb::Release);
        assert_eq!(released.result, Ok(Some("release a".to_string())));
        let none = teardown_verb(&plugins, &pods, &pod, &spec, None, "absent", Verb::Unmount);
        assert_eq!(
            none.result,
            Ok(Some("no volume of plugin absent in this pod".to_string()))
        );
    }

    #[test]
    fn a_failing_plugin_fails_the_step_with_its_message_and_output() {
        let (dir, plugins, _) = setup(r#"{"ok":false,"message":"no space on pool"}"#, 1);
        let (pod, spec) = pod();
        let run = run_step(
            &plugins,
            &dir.path().join("pods"),
            &pod,
            &spec,
            PodRange::default(),
            "dirvol",
            Verb::Prepare,
        );
        let error = run.result.unwrap_err();
        assert!(error.contains("no space on pool"), "{error}");
        assert!(run.log.iter().any(|l| l.contains("working")));
    }

    #[test]
    fn a_host_path_without_the_relaxation_is_refused() {
        let (dir, plugins, _) = setup(r#"{"ok":true,"path":"/srv/x"}"#, 0);
        let (pod, spec) = pod();
        let run = run_step(
            &plugins,
            &dir.path().join("pods"),
            &pod,
            &spec,
            PodRange::default(),
            "dirvol",
            Verb::Mount,
        );
        assert!(run.result.unwrap_err().contains("host-path"));
    }

    #[test]
    fn steps_for_pods_without_the_plugin_are_done_at_once() {
        let (dir, plugins, fake) = setup("", 0);
        let (pod, mut spec) = pod();
        spec.volumes.retain(|v| v.plugin.is_none());
        let run = run_step(
            &plugins,
            &dir.path().join("pods"),
            &pod,
            &spec,
            PodRange::default(),
            "dirvol",
            Verb::Prepare,
        );
        assert_eq!(
            run.result.unwrap().unwrap(),
            "no volume of plugin dirvol in this pod"
        );
        assert!(fake.calls.lock().unwrap().is_empty());
    }

    #[test]
    fn every_plugin_volume_needs_its_delegated_steps() {
        let (_, spec) = pod();
        // dirvol/mount is registered but not delegated to the node.
        let delegated = [
            ("dirvol/prepare", "dirvol"),
            ("other/prepare", "other"),
            ("other/mount", "other"),
        ];
        let missing = missing_steps(&spec, |step, owner| delegated.contains(&(step, owner)));
        assert_eq!(missing, ["dirvol/mount"]);
    }
}

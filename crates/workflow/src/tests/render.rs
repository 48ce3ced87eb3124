//! `why`, `blame`, `critical-chain` and `dot` on the illustrated scenario:
//! a storage plugin's slow mount holding a pod start.

use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::Value;

use super::*;
use crate::{
    blame_json, blame_text, critical_chain_json, critical_chain_text, dot, fail, instantiate,
    why_json, why_text,
};

const ADDRESS: &str = "fd5e:1c2a:77e0:1:9f3a:2b1c:5d4e:6f70";

/// Pod start with `acme/slow-mount` (owner `acme-storage`, 10m timeout)
/// before `storage`, claimed at 2s; everything else that could finish has.
fn slow_mount() -> WorkflowInstance {
    let spec = spec_with(vec![registration(
        "acme/slow-mount",
        &["scheduled"],
        &["storage"],
        "10m",
    )]);
    let controllers = [RegisteredController {
        name: "acme-storage",
        spec: &spec,
    }];
    let (mut instance, _) = instantiate(&pod_start(&controllers), "start-3", "uid-1", 3, at(0));
    let node = agent("node-1");
    run(
        &mut instance,
        "scheduler/place",
        &controller("scheduler"),
        0,
        3,
        Some("node-1"),
    );
    run(
        &mut instance,
        "ipam/assign-address",
        &controller("ipam"),
        3,
        4,
        Some(ADDRESS),
    );
    run(&mut instance, "node/create-sandbox", &node, 4, 22, None);
    run(&mut instance, "node/pull-image", &node, 3, 900, None);
    run(&mut instance, "node/prepare-volumes", &node, 3, 40, None);
    claim(
        &mut instance,
        "acme/slow-mount",
        &controller("acme-storage"),
        None,
        at(2_000),
    )
    .expect("claim");
    instance
}

/// 5m12s into the slow mount, 5m14s after the start.
fn now() -> chrono::DateTime<chrono::Utc> {
    at(2_000 + 312_000)
}

#[test]
fn why_text_gives_the_verdict_then_the_graph() {
    let text = why_text("pod/web", &slow_mount(), now());
    let mut lines = text.lines();
    assert_eq!(
        lines.next(),
        Some(
            "pod/web (revision 3) is not running: step acme/slow-mount running for 5m12s (timeout 10m)"
        )
    );
    assert_eq!(
        lines.next(),
        Some("start workflow start-3, begun 5m14s ago")
    );
    let line = |needle: &str| {
        text.lines()
            .skip(2)
            .find(|line| line.contains(needle))
            .unwrap_or_else(|| panic!("no line with {needle:?} in\n{text}"))
            .to_string()
    };
    let place = line("scheduler/place");
    assert!(place.starts_with("  ✓ scheduler/place"), "{place}");
    assert!(
        place.contains("+3ms") && place.ends_with("node-1"),
        "{place}"
    );
    assert!(line("ipam/assign-address").ends_with(ADDRESS));
    assert!(line("node/create-sandbox").contains("+18ms"));
    let mount = line("acme/slow-mount");
    assert!(mount.starts_with("  ● acme/slow-mount"), "{mount}");
    assert!(
        mount.contains("running 5m12s of 10m, 4m48s left"),
        "{mount}"
    );
    assert!(mount.ends_with("(owner acme-storage)"), "{mount}");
    let storage = line("storage (target)");
    assert!(storage.starts_with("  ○ storage (target)"), "{storage}");
    assert!(storage.ends_with("waiting on acme/slow-mount"), "{storage}");
    assert!(line("node/run-init-containers").ends_with("waiting on containers"));
    assert!(line("node/start-containers").ends_with("waiting on node/run-init-containers"));
    assert!(line("✓ network (target)").ends_with("@22ms"));
    assert!(line("running (target)").ends_with(
        "waiting on node/run-init-containers, node/start-containers, node/await-readiness"
    ));
    // Graph order: a step is listed before what waits on it.
    let graph = text.lines().skip(2).collect::<Vec<_>>().join("\n");
    let position = |needle: &str| graph.find(needle).expect(needle);
    assert!(position("acme/slow-mount") < position("storage (target)"));
    assert!(position("storage (target)") < position("node/run-init-containers"));
    assert!(position("node/run-init-containers") < position("node/start-containers"));
}

#[test]
fn why_json_has_name_owner_state_and_timing_per_step() {
    let json = why_json("pod/web", &slow_mount(), now());
    assert_eq!(json["verdict"]["state"], "running");
    assert_eq!(json["verdict"]["step"], "acme/slow-mount");
    assert_eq!(json["revision"], 3);
    let steps = json["steps"].as_array().expect("steps");
    for step in steps {
        for key in ["name", "owner", "kind", "state"] {
            assert!(step.get(key).is_some(), "{key} missing in {step}");
        }
    }
    let find = |name: &str| -> &Value {
        steps
            .iter()
            .find(|step| step["name"] == name)
            .unwrap_or_else(|| panic!("no {name}"))
    };
    let place = find("scheduler/place");
    assert_eq!(place["state"], "done");
    assert_eq!(place["durationMs"], 3);
    assert_eq!(place["startedAt"], "2026-01-01T00:00:00.000Z");
    assert_eq!(place["finishedAt"], "2026-01-01T00:00:00.003Z");
    assert_eq!(place["note"], "node-1");
    let mount = find("acme/slow-mount");
    assert_eq!(mount["owner"], "acme-storage");
    assert_eq!(mount["state"], "running");
    assert_eq!(mount["durationMs"], 312_000);
    assert_eq!(mount["timeoutMs"], 600_000);
    assert_eq!(mount["timeLeftMs"], 288_000);
    assert_eq!(mount["since"], "2026-01-01T00:00:02.000Z");
    assert_eq!(mount["claimedBy"], "acme-storage");
    let storage = find("storage");
    assert_eq!(storage["kind"], "target");
    assert_eq!(storage["state"], "waiting");
    assert_eq!(storage["waitingOn"], serde_json::json!(["acme/slow-mount"]));
}

#[test]
fn why_shows_failures_and_what_they_block() {
    let mut instance = slow_mount();
    fail(
        &mut instance,
        "acme/slow-mount",
        &controller("acme-storage"),
        None,
        at(3_000),
        "nfs server not responding",
    )
    .expect("fail");
    let text = why_text("pod/web", &instance, at(4_000));
    assert!(
        text.starts_with(
            "pod/web (revision 3) is not running: step acme/slow-mount failed: nfs server not responding (attempt 1 of 1)"
        ),
        "{text}"
    );
    assert!(text.contains("✗ acme/slow-mount"), "{text}");
    assert!(text.contains("⊘ storage (target)"), "{text}");
    assert!(
        text.contains("blocked: required acme/slow-mount failed"),
        "{text}"
    );
    assert!(
        text.contains("blocked: storage is blocked by failed acme/slow-mount"),
        "{text}"
    );
    let json = why_json("pod/web", &instance, at(4_000));
    let storage = json["steps"]
        .as_array()
        .and_then(|steps| steps.iter().find(|step| step["name"] == "storage"))
        .expect("storage");
    assert_eq!(storage["blockedBy"], "acme/slow-mount");
    assert_eq!(json["outcome"], "failed");
}

#[test]
fn blame_lists_steps_longest_first() {
    let text = blame_text("pod/web", &slow_mount(), now());
    let lines: Vec<&str> = text.lines().skip(1).collect();
    assert_eq!(lines[0].trim(), "5m12s acme/slow-mount (running)");
    assert_eq!(lines[1].trim(), "897ms node/pull-image");
    assert!(!text.contains("(target)"));
    let json = blame_json("pod/web", &slow_mount(), now());
    let durations: Vec<i64> = json["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .map(|step| step["durationMs"].as_i64().expect("duration"))
        .collect();
    assert!(
        durations.windows(2).all(|pair| pair[0] >= pair[1]),
        "{durations:?}"
    );
}

fn finished() -> WorkflowInstance {
    let mut instance = slow_mount();
    let node = agent("node-1");
    complete(
        &mut instance,
        "acme/slow-mount",
        &controller("acme-storage"),
        None,
        at(5_000),
        None,
    )
    .expect("complete");
    run(
        &mut instance,
        "node/run-init-containers",
        &node,
        5_000,
        5_000,
        None,
    );
    run(
        &mut instance,
        "node/start-containers",
        &node,
        5_000,
        5_200,
        None,
    );
    run(
        &mut instance,
        "node/await-readiness",
        &node,
        5_200,
        6_000,
        None,
    );
    assert_eq!(
        instance.outcome,
        corral_api::workflow::WorkflowOutcome::Succeeded
    );
    instance
}

#[test]
fn critical_chain_follows_the_last_dependency_to_settle() {
    let text = critical_chain_text("pod/web", &finished(), at(10_000));
    let chain: Vec<&str> = text.lines().skip(4).collect();
    assert_eq!(
        chain,
        [
            "running (target) @6s",
            "└─node/await-readiness @6s +800ms",
            "  └─node/start-containers @5.2s +200ms",
            "    └─node/run-init-containers @5s +0ms",
            "      └─containers (target) @5s",
            "        └─storage (target) @5s",
            "          └─acme/slow-mount @5s +3s",
            "            └─scheduled (target) @3ms",
            "              └─scheduler/place @3ms +3ms",
        ],
        "{text}"
    );
    let json = critical_chain_json("pod/web", &finished(), at(10_000));
    assert_eq!(json["chain"][0]["name"], "running");
    assert_eq!(json["chain"][6]["durationMs"], 3_000);
    assert_eq!(json["chain"][6]["atMs"], 5_000);
}

#[test]
fn critical_chain_of_a_running_workflow_leads_to_what_holds_it() {
    let text = critical_chain_text("pod/web", &slow_mount(), now());
    assert!(text.contains("running (target) (waiting)"), "{text}");
    assert!(text.contains("└─acme/slow-mount (running 5m12s)"), "{text}");
}

#[test]
fn dot_output_renders_with_graphviz() {
    let source = dot("pod/web", &slow_mount(), now());
    assert!(source.starts_with("digraph workflow {"), "{source}");
    assert!(
        source.contains("\"acme/slow-mount\" -> \"storage\" [color=black];"),
        "{source}"
    );
    assert!(
        source.contains("\"scheduled\" -> \"acme/slow-mount\" [color=darkgreen, style=dashed];"),
        "{source}"
    );
    let dot_binary = "/usr/bin/dot";
    assert!(
        std::path::Path::new(dot_binary).exists(),
        "{dot_binary} is missing: install graphviz (apt-get install graphviz) to run this test"
    );
    let mut child = Command::new(dot_binary)
        .arg("-Tsvg")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start dot");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(source.as_bytes())
        .expect("write to dot");
    let output = child.wait_with_output().expect("dot finishes");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "dot failed: {stderr}\n{source}");
    assert!(stderr.trim().is_empty(), "dot warned: {stderr}");
    let svg = String::from_utf8_lossy(&output.stdout);
    assert!(
        svg.contains("<svg") && svg.contains("acme/slow&#45;mount"),
        "{svg}"
    );
}

#[test]
fn svg_lays_out_every_step_after_its_dependencies() {
    let svg = crate::svg("pod/<web>", &slow_mount(), now());
    assert!(svg.starts_with("<svg "), "{svg}");
    assert!(svg.ends_with("</svg>"), "{svg}");
    assert!(svg.contains("pod/&lt;web&gt;"), "text is escaped: {svg}");
    assert!(!svg.contains("style="), "no inline styles (CSP): {svg}");
    let x_of = |step: &str| {
        let at = svg
            .find(&format!("data-step=\"{step}\""))
            .unwrap_or_else(|| panic!("{step} missing from {svg}"));
        let rect = &svg[at..];
        let x = rect.split("<rect x=\"").nth(1).expect("a rect");
        x.split('"')
            .next()
            .expect("x")
            .parse::<usize>()
            .expect("x is a number")
    };
    assert!(x_of("scheduled") < x_of("acme/slow-mount"), "{svg}");
    assert!(x_of("acme/slow-mount") < x_of("storage"), "{svg}");
}

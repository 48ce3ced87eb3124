//! The VM page's Stop and Start buttons (docs/design/0041-vm-stop-start.md):
//! Stop is a revision by the signed-in person and the page shows the VM
//! Stopped (its summary and its why verdict, naming who asked); a second
//! Stop writes nothing; Start boots it again (its marker on the console).

use std::time::Duration;

use corral_testkit::{Browser, VM_MARKER};
use serde_json::json;

use super::common::{self, Cluster};
use super::settled;

/// From the VM page of `name` (at `revision`, running): Stop, then Start.
pub fn stop_and_start(browser: &Browser, cluster: &Cluster, name: &str, revision: u64) {
    wait_phase(cluster, name, "Running");

    // Stop from the page: a revision by the signed-in person; the page
    // shows the VM Stopped (its summary and why), kept, with no QEMU.
    browser.script(
        "document.getElementById('power-result').className = ''",
        json!([]),
    );
    browser.click("#vm-stop");
    let result = browser.wait_for(
        "the stop to be written",
        Duration::from_secs(20),
        &settled("power-result"),
    );
    assert_eq!(result, format!("stop: revision {}", revision + 1));
    browser.wait_for(
        "Stopped in the page's summary",
        Duration::from_secs(90),
        "const r = document.querySelector('#summary tr[data-field=\"phase\"] td'); \
         return r && r.textContent === 'Stopped' ? r.textContent : null",
    );
    let verdict = browser.wait_for(
        "the why verdict of the stopped VM",
        Duration::from_secs(20),
        "const v = document.getElementById('verdict'); \
         return v && v.textContent.includes('is stopped') ? v.textContent : null",
    );
    let verdict = verdict.as_str().unwrap_or_default();
    assert!(
        verdict.contains("because its spec asks for it (spec.running: false)")
            && verdict.contains("\"vm stop (dashboard)\""),
        "{verdict}"
    );
    let vm = cluster.get_json(&format!("vm/{name}"));
    assert_eq!(vm["spec"]["running"], false, "{vm}");
    assert_eq!(vm["status"]["runState"], "stopped", "{vm}");
    let history = cluster.ok(&["history", &format!("vm/{name}")]);
    assert!(history.contains("vm stop (dashboard)"), "{history}");
    // A second Stop writes nothing.
    browser.script(
        "document.getElementById('power-result').className = ''",
        json!([]),
    );
    browser.click("#vm-stop");
    let again = browser.wait_for(
        "the second stop's answer",
        Duration::from_secs(20),
        &settled("power-result"),
    );
    assert_eq!(again, "already stopped: nothing written");
    // (The top of the page: its summary and why say Stopped.)
    browser.script("window.scrollTo(0, 0)", json!([]));
    browser.screenshot("4-vm-stopped");

    // Start from the page: a fresh boot; the console shows its marker again.
    let console_log = cluster
        .data_dir
        .path()
        .join("vms")
        .join(vm["metadata"]["uid"].as_str().unwrap())
        .join("console.log");
    let boots_before = std::fs::read_to_string(&console_log)
        .unwrap()
        .matches(VM_MARKER)
        .count();
    browser.script(
        "document.getElementById('power-result').className = ''",
        json!([]),
    );
    browser.click("#vm-start");
    let result = browser.wait_for(
        "the start to be written",
        Duration::from_secs(20),
        &settled("power-result"),
    );
    assert_eq!(result, format!("start: revision {}", revision + 2));
    wait_phase(cluster, name, "Running");
    let boots = std::fs::read_to_string(&console_log)
        .unwrap()
        .matches(VM_MARKER)
        .count();
    assert_eq!(boots, boots_before + 1, "one more boot");
    browser.script(
        "document.getElementById('console').textContent = ''",
        json!([]),
    );
    browser.click("#console-open");
    browser.wait_for(
        "the boot marker on the console again",
        Duration::from_secs(30),
        &format!("return document.getElementById('console').textContent.includes('{VM_MARKER}')"),
    );
    browser.wait_for(
        "Running in the page's summary",
        Duration::from_secs(30),
        "const r = document.querySelector('#summary tr[data-field=\"phase\"] td'); \
         return r && r.textContent === 'Running' ? r.textContent : null",
    );
    let vm = cluster.get_json(&format!("vm/{name}"));
    assert!(vm["spec"].get("running").is_none(), "{vm}");
    browser.screenshot("5-vm-started");
}

/// Waits until the VM's node reports `phase`.
fn wait_phase(cluster: &Cluster, name: &str, phase: &str) {
    common::wait_for(
        &format!("vm/{name} to be {phase}"),
        Duration::from_secs(240),
        || (cluster.get_json(&format!("vm/{name}"))["status"]["phase"] == phase).then_some(()),
    );
}

//! Secrets on the etcd backend: a known value, applied, changed, rolled
//! back and rotated through a real `corral server` on a real etcd, is
//! nowhere in etcd's keyspace (keys and values, every revision etcd keeps),
//! and is still revealed after the rotation; `corral migrate` carries the
//! sealed values from SQLite, and the old keyring opens them on etcd.

mod common;

use std::process::Command;

use common::Cluster;
use corral_testkit::etcd::EtcdCluster;

const VALUE: &str = "etcd-never-sees-4711";
const NEXT: &str = "etcd-never-sees-0815";

fn secret(value: &str) -> String {
    format!("kind: Secret\nmetadata: {{name: db}}\nspec:\n  stringData:\n    password: {value}\n")
}

/// Every key and value etcd holds now, and every revision it still keeps of
/// them, as text.
fn keyspace(etcd: &EtcdCluster) -> String {
    let etcdctl = corral_testkit::require_tool("etcdctl");
    let endpoints = etcd.endpoints().join(",");
    let run = |args: &[&str]| {
        let output = Command::new(&etcdctl)
            .env("ETCDCTL_API", "3")
            .arg("--endpoints")
            .arg(&endpoints)
            .args(args)
            .output()
            .expect("run etcdctl");
        assert!(output.status.success(), "etcdctl {args:?}: {output:?}");
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let mut all = run(&["get", "--prefix", ""]);
    // Older revisions too: etcd keeps them until it compacts.
    let status = run(&["endpoint", "status", "-w", "json"]);
    let revision: u64 = serde_json::from_str::<serde_json::Value>(&status).expect("status json")[0]
        ["Status"]["header"]["revision"]
        .as_u64()
        .expect("a revision");
    for rev in 1..=revision {
        let output = Command::new(&etcdctl)
            .env("ETCDCTL_API", "3")
            .arg("--endpoints")
            .arg(&endpoints)
            .args(["get", "--prefix", "", "--rev", &rev.to_string()])
            .output()
            .expect("run etcdctl");
        // A compacted revision is refused; what is kept is read.
        all.push_str(&String::from_utf8_lossy(&output.stdout));
    }
    all
}

#[test]
fn secret_values_never_reach_etcd_and_survive_a_rotation() {
    let etcd = EtcdCluster::start(1);
    let cluster = Cluster::start_with(&["server", "--datastore", &etcd.datastore_url()]);
    cluster.ok(&["apply", "-f", &cluster.manifest("v1.yaml", &secret(VALUE))]);
    cluster.ok(&["apply", "-f", &cluster.manifest("v2.yaml", &secret(NEXT))]);
    cluster.ok(&["rollback", "secret/db", "--to", "1"]);
    let rotated = cluster.ok(&["secrets", "rotate-key"]);
    assert!(rotated.contains("values sealed again"), "{rotated}");
    let revealed = cluster.ok(&["get", "secret/db", "--reveal"]);
    assert_eq!(revealed.trim(), format!("password: {VALUE}"));

    let keyspace = keyspace(&etcd);
    assert!(
        keyspace.contains("/sealed/default/db/"),
        "the sealed values are there"
    );
    for value in [VALUE, NEXT] {
        assert!(!keyspace.contains(value), "etcd holds {value}");
    }
}

#[test]
fn migrate_carries_secrets_sealed_and_the_old_keyring_opens_them() {
    let mut old = Cluster::start_with(&["server"]);
    old.ok(&["apply", "-f", &old.manifest("v1.yaml", &secret(VALUE))]);
    old.kill9();

    let etcd = EtcdCluster::start(1);
    let url = etcd.datastore_url();
    let store = old.data_dir.path().join("store.db");
    let output = Command::new(common::CORRAL)
        .args([
            "migrate",
            "--from",
            &format!("sqlite:{}", store.display()),
            "--to",
            &url,
        ])
        .output()
        .expect("run corral migrate");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "migrate: {stdout}{output:?}");
    assert!(stdout.contains("1 sealed values"), "{stdout}");
    assert!(!keyspace(&etcd).contains(VALUE), "the value reached etcd");

    // The new server reads them with the old cluster's keyring.
    let keyring = old.data_dir.path().join("secrets-keyring");
    let new = Cluster::start_with(&[
        "server",
        "--datastore",
        &url,
        "--secrets-keyring",
        keyring.to_str().expect("utf-8 path"),
    ]);
    let revealed = new.ok(&["get", "secret/db", "--reveal"]);
    assert_eq!(revealed.trim(), format!("password: {VALUE}"));
}

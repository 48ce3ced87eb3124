//! `corral-bench volume-start`: pod start latency (apply → running, seen
//! through a watch) with an `emptyDir` volume next to the same pod with a
//! volume of the example plugin `dirvol` (examples/volume-plugins: a shell
//! script that makes a backing directory and bind-mounts it), on one
//! `corral up` node. First `emptyDir` pods before any plugin is registered,
//! then, with dirvol's `Controller` registered (its two delegated steps
//! join every pod's start), `emptyDir` and `dirvol` pods alternately, so
//! drift hits both alike. Root (the node runs containers) and `jq`.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use corral_api::{Kind, Object};
use serde_json::json;

use crate::corral_pods::{CorralNode, NAMESPACE};
use crate::machine;
use crate::pod_start::{one_after_another, row, start_on_a_node};
use crate::report::{self, Row};

const BARE: &str = "emptyDir, no plugin registered";
const EMPTY: &str = "emptyDir, dirvol registered";
const PLUGIN: &str = "dirvol plugin volume";

#[derive(Debug, Args)]
pub struct VolumeStartArgs {
    /// The corral binary to benchmark. Default: `corral` next to this binary.
    #[arg(long, value_name = "PATH")]
    corral: Option<PathBuf>,
    /// The example plugin's directory (dirvol and dirvol-controller.yaml).
    #[arg(long, value_name = "DIR", default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/volume-plugins"))]
    examples: PathBuf,
    /// Pods started of each kind, one after another.
    #[arg(long, default_value_t = 20)]
    pods: usize,
}

/// A busybox `sleep 3600` pod whose one volume is `volume`, mounted at /v.
fn pod(name: &str, volume: serde_json::Value) -> Object {
    let mut volume = volume;
    volume["name"] = json!("v");
    let spec = json!({
        "terminationGraceSeconds": 0,
        "volumes": [volume],
        "containers": [{
            "name": "c",
            "image": corral_testkit::BUSYBOX_IMAGE,
            "command": ["sleep", "3600"],
            "mounts": [{"volume": "v", "path": "/v"}],
        }],
    });
    Object::new(Kind::Pod, Some(NAMESPACE), name, spec)
}

pub async fn run(args: VolumeStartArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.pods > 0, "--pods must be at least 1");
    let (corral_binary, _image_dir, image_tar) = start_on_a_node(args.corral).await?;
    let controller_text = std::fs::read_to_string(args.examples.join("dirvol-controller.yaml"))
        .with_context(|| {
            format!(
                "cannot read dirvol-controller.yaml in {}",
                args.examples.display()
            )
        })?;
    let controller = corral_api::manifest::parse_manifests(&controller_text)
        .context("dirvol-controller.yaml")?;

    let node = CorralNode::start(&corral_binary, &image_tar).await?;
    let plugins = node.process.data_dir().join("plugins");
    std::fs::create_dir_all(&plugins)?;
    std::fs::copy(args.examples.join("dirvol"), plugins.join("dirvol"))
        .context("cannot install dirvol")?;
    let root = node.process.data_dir().join("dirvol-root");
    std::fs::write(
        plugins.join("dirvol.conf"),
        format!("root={}\n", root.display()),
    )
    .context("cannot configure dirvol")?;
    let dirvol = json!({"plugin": {"driver": "dirvol", "options": {}}});
    let empty = json!({"emptyDir": {}});

    let n = args.pods;
    let mut rows: Vec<Row> = Vec::new();
    node.start_object(&pod("warm-up", empty.clone())).await?;
    println!("{BARE}: {n} one after another …");
    let node_ref = &node;
    let summary = one_after_another(n, |i| {
        let object = pod(&format!("bare-{i}"), empty.clone());
        async move { node_ref.start_object(&object).await }
    })
    .await?;
    rows.push(row(BARE, 1, summary));
    node.delete_all_pods().await?;

    for object in &controller {
        node.client
            .apply(object, Some("bench: register dirvol"))
            .await
            .context("cannot register dirvol's Controller")?;
    }
    node.start_object(&pod("warm-up-plugin", dirvol.clone()))
        .await?;
    println!("{EMPTY} and {PLUGIN}: {n} each, alternately …");
    let (mut empties, mut plugged) = (Vec::new(), Vec::new());
    let started = std::time::Instant::now();
    for i in 0..n {
        empties.push(
            node.start_object(&pod(&format!("empty-{i}"), empty.clone()))
                .await?,
        );
        plugged.push(
            node.start_object(&pod(&format!("plugin-{i}"), dirvol.clone()))
                .await?,
        );
    }
    let wall = started.elapsed();
    for (system, latencies) in [(EMPTY, empties), (PLUGIN, plugged)] {
        let summary = crate::stats::Summary::new(latencies, wall).context("no pods")?;
        rows.push(row(system, 1, summary));
    }
    node.delete_all_pods().await?;
    drop(node);

    println!();
    println!("load at the end: {}", machine::load());
    println!();
    print!(
        "{}",
        report::latency_table(&rows, &[(BARE, "bare emptyDir")])
    );
    Ok(())
}

//! `corral image import|ls|prune|pack`: the images on the cluster's nodes.
//! Images are not API objects; each node's agent owns its node's store.
//! `import`, `ls` and `prune` go through the API server of the client
//! config, which asks the agents (`POST /v1/images/import`, `GET
//! /v1/images`, `POST /v1/nodes/NAME/images/prune`) and answers node by
//! node. Only with an explicit `--data-dir DIR` do `import` and `ls` act
//! on a local data dir's store directly (a node whose agent is not
//! running; `corral lab up --image` does so before its agents start).

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Args, Subcommand};
use corral_api::Kind;
use corral_api::kinds::{NodeImage, NodeImages, NodeImagesReport};
use corral_runtime::image::{ImageStore, Reference};

use super::connect;
use crate::output::{Format, Table, print_structured};

#[derive(Debug, Args)]
pub struct ImageArgs {
    #[command(subcommand)]
    command: ImageCommand,
    /// `import` and `ls` only: act on this node data dir's image store
    /// directly instead of through the API (the dir `corral up` or `corral
    /// agent` uses; its agent should not be running).
    #[arg(long, global = true, value_name = "DIR")]
    data_dir: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
enum ImageCommand {
    /// Import an image archive into the cluster's nodes: an OCI layout tar
    /// (`podman save --format oci-archive`, `corral image pack`) or a
    /// docker-archive tar (`docker save`). The archive is uploaded to the
    /// API server of the client config, which streams it to each node's
    /// agent; every node answers what it imported or its error (then it
    /// imported nothing), and the command fails if any node failed.
    /// Operators only. Layers are unpacked once per node and shared by
    /// every container that uses them.
    #[command(after_help = "Examples:
  corral image import busybox.tar                        onto every Ready node
  corral image import web.tar --name local/web:2         stored as local/web:2
  corral image import web.tar --node node-1 --node node-2   onto these nodes only
  corral image import web.tar -o json                    each node's answer, for scripts
  corral image import web.tar --data-dir /var/lib/corral   into a local data dir, without the API")]
    Import {
        /// The archive.
        file: PathBuf,
        /// Store it under this NAME:TAG instead of the archive's own name.
        #[arg(long, value_name = "NAME:TAG")]
        name: Option<String>,
        /// Import on this node (repeatable; asked whatever its phase).
        /// Default: every Ready node.
        #[arg(long = "node", value_name = "NAME")]
        nodes: Vec<String>,
        #[arg(short = 'o', long, value_enum, default_value_t)]
        output: Format,
    },
    /// Make an image from a directory: one layer with its files,
    /// directories and symbolic links (owned by root), written as an OCI
    /// layout archive for `corral image import`. The same directory makes
    /// the same image digest.
    #[command(after_help = "Examples:
  corral image pack ./rootfs --name local/app:1 -o app.tar      then corral image import app.tar
  corral image pack ./rootfs --name local/app:1 -o app.tar --cmd /bin/app --cmd serve
  # a busybox image from the host's busybox-static (what the README tour uses):
  mkdir -p bb/bin && cp /bin/busybox bb/bin/
  for a in $(bb/bin/busybox --list); do [ \"$a\" = busybox ] || ln -sf busybox bb/bin/$a; done
  corral image pack bb --name local/busybox:1 -o busybox.tar")]
    Pack {
        /// The directory whose contents become the image's root.
        dir: PathBuf,
        /// The image's name, NAME:TAG (`local/app:1`).
        #[arg(long, value_name = "NAME:TAG")]
        name: String,
        /// The archive to write.
        #[arg(short = 'o', long, value_name = "FILE")]
        output: PathBuf,
        /// The image's default command, one argument per `--cmd`.
        #[arg(long = "cmd", value_name = "ARG")]
        command: Vec<String>,
    },
    /// Have a node's agent delete the pulled images no pod on the node
    /// uses or used in its last revisions, now (it does so every 10
    /// minutes anyway; history is the GC root, hand-imported images are
    /// never deleted). Goes through the API: operators only.
    #[command(after_help = "Examples:
  corral image prune                   collect on the cluster's only node
  corral image prune --node node-1     collect on node-1")]
    Prune {
        /// The node. Default: the cluster's only node.
        #[arg(long, value_name = "NAME")]
        node: Option<String>,
    },
    /// List the images on the cluster's nodes: NODE, REFERENCE, DIGEST,
    /// SIZE (of the stored layers) and PODS (how many pods on the node use
    /// it), asked of each node's agent through the API. The command fails
    /// if a node cannot answer.
    #[command(after_help = "Examples:
  corral image ls                                 every Ready node's images
  corral image ls --node node-1                   node-1's images
  corral image ls -o wide                         full digests and the pods using each image
  corral image ls -o json                         each node's answer, for scripts
  corral image ls --data-dir /var/lib/corral      a local data dir's images, without the API")]
    Ls {
        /// List this node's images (repeatable). Default: every Ready node.
        #[arg(long = "node", value_name = "NAME")]
        nodes: Vec<String>,
        #[arg(short = 'o', long, value_enum, default_value_t)]
        output: Format,
    },
}

pub async fn run(config: Option<PathBuf>, args: ImageArgs) -> anyhow::Result<()> {
    let data_dir = args.data_dir;
    match args.command {
        ImageCommand::Import {
            file,
            name,
            nodes,
            output,
        } => {
            if let Some(name) = &name {
                name.parse::<Reference>()
                    .with_context(|| format!("--name {name:?} is not an image reference"))?;
            }
            if let Some(dir) = data_dir {
                anyhow::ensure!(
                    nodes.is_empty(),
                    "--node and --data-dir: a data dir is one node's store; drop one of them"
                );
                return import_local(&dir, file, name).await;
            }
            let client = connect(config)?;
            let report = client
                .import_image(&file, name.as_deref(), &nodes)
                .await
                .with_context(|| format!("importing {}", file.display()))?;
            if !print_structured(output, &report)? {
                print_imported(&report);
            }
            fail_for(&report, "import")
        }
        ImageCommand::Pack {
            dir,
            name,
            output,
            command,
        } => {
            let out = output.clone();
            let packed = tokio::task::spawn_blocking(move || {
                corral_runtime::image::pack::pack_dir(&dir, &name, &command, &out)
            })
            .await?
            .context("pack failed")?;
            println!(
                "packed {} ({} entries, layer {} bytes) into {}: `corral image import {}`",
                packed.reference,
                packed.entries,
                packed.layer_bytes,
                output.display(),
                output.display()
            );
            Ok(())
        }
        ImageCommand::Prune { node } => {
            anyhow::ensure!(
                data_dir.is_none(),
                "--data-dir: prune asks the node's agent through the API (it owns the store); drop --data-dir"
            );
            let client = connect(config)?;
            let node = match node {
                Some(node) => node,
                None => only_node(&client).await?,
            };
            let report = client
                .prune_images(&node)
                .await
                .with_context(|| format!("collecting the images of node {node}"))?;
            for image in &report.removed_images {
                println!("deleted {image}");
            }
            println!(
                "{} images, {} blobs, {} layers deleted on node {node}",
                report.removed_images.len(),
                report.removed_blobs,
                report.removed_layers
            );
            Ok(())
        }
        ImageCommand::Ls { nodes, output } => {
            let report = match data_dir {
                Some(dir) => {
                    anyhow::ensure!(
                        nodes.is_empty(),
                        "--node and --data-dir: a data dir is one node's store; drop one of them"
                    );
                    list_local(&dir).await?
                }
                None => connect(config)?
                    .list_images(&nodes)
                    .await
                    .context("listing the nodes' images")?,
            };
            if !print_structured(output, &report)? {
                print_images(&report, output == Format::Wide);
            }
            fail_for(&report, "listing images")
        }
    }
}

/// Opens the image store of data dir `dir`.
fn open(dir: &Path) -> anyhow::Result<ImageStore> {
    let images = dir.join("images");
    ImageStore::open(&images)
        .with_context(|| format!("cannot open the image store in {}", images.display()))
}

/// `import --data-dir DIR`: straight into that store.
async fn import_local(dir: &Path, file: PathBuf, name: Option<String>) -> anyhow::Result<()> {
    let store = open(dir)?;
    let images = tokio::task::spawn_blocking(move || store.import(&file, name.as_deref()))
        .await?
        .context("import failed; nothing was added")?;
    for image in images {
        println!("imported {} ({})", image.reference, image.manifest_digest);
    }
    Ok(())
}

/// `ls --data-dir DIR`: that store's images, as one "node" named by the dir.
async fn list_local(dir: &Path) -> anyhow::Result<NodeImagesReport> {
    let store = open(dir)?;
    let images =
        tokio::task::spawn_blocking(move || corral_agent::image_upload::inventory(&store, &[]))
            .await?
            .context("cannot list the image store")?;
    Ok(NodeImagesReport {
        nodes: vec![NodeImages {
            node: dir.display().to_string(),
            images,
            error: None,
        }],
        skipped: Vec::new(),
    })
}

/// An error naming the nodes that failed, if any did.
fn fail_for(report: &NodeImagesReport, what: &str) -> anyhow::Result<()> {
    let failed: Vec<&str> = report.failed().map(|n| n.node.as_str()).collect();
    anyhow::ensure!(
        failed.is_empty(),
        "{what} failed on {} of {} nodes: {}",
        failed.len(),
        report.nodes.len(),
        failed.join(", ")
    );
    Ok(())
}

fn print_skipped(report: &NodeImagesReport) {
    for skipped in &report.skipped {
        eprintln!(
            "skipped node {}: {} (name it with --node to try it anyway)",
            skipped.node, skipped.reason
        );
    }
}

fn print_imported(report: &NodeImagesReport) {
    for node in &report.nodes {
        match &node.error {
            Some(error) => eprintln!("{}: failed: {error}", node.node),
            None => {
                for image in &node.images {
                    println!(
                        "{}: imported {} ({})",
                        node.node, image.reference, image.digest
                    );
                }
            }
        }
    }
    print_skipped(report);
}

fn print_images(report: &NodeImagesReport, wide: bool) {
    let mut table = Table::new(&["NODE", "REFERENCE", "DIGEST", "SIZE", "PODS"]);
    for node in &report.nodes {
        for image in &node.images {
            table.row(image_row(&node.node, image, wide));
        }
    }
    table.print();
    for node in report.failed() {
        eprintln!(
            "{}: cannot list images: {}",
            node.node,
            node.error.as_deref().unwrap_or_default()
        );
    }
    print_skipped(report);
}

fn image_row(node: &str, image: &NodeImage, wide: bool) -> Vec<String> {
    let digest = if wide {
        image.digest.clone()
    } else {
        let hex = image
            .digest
            .strip_prefix("sha256:")
            .unwrap_or(&image.digest);
        hex.chars().take(12).collect()
    };
    let pods = if wide && !image.pods.is_empty() {
        image.pods.join(",")
    } else {
        image.pods.len().to_string()
    };
    vec![
        node.to_string(),
        image.reference.clone(),
        digest,
        human_size(image.size),
        pods,
    ]
}

/// `812 B`, `4.2 KiB`, `1.1 MiB`, `2.0 GiB`.
fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    // Display only: the precision an f64 loses here is far below a tenth.
    #[allow(clippy::cast_precision_loss)]
    let mut size = bytes as f64 / 1024.0;
    let mut unit = 0;
    while size >= 1024.0 && unit + 1 < UNITS.len() {
        size /= 1024.0;
        unit += 1;
    }
    format!("{size:.1} {}", UNITS[unit])
}

/// The cluster's node when it has exactly one.
async fn only_node(client: &corral_client::Client) -> anyhow::Result<String> {
    let nodes = client.list(Kind::Node, None, None).await?.items;
    match nodes.as_slice() {
        [node] => Ok(node.metadata.name.clone()),
        [] => anyhow::bail!("the cluster has no nodes"),
        _ => {
            let names: Vec<&str> = nodes.iter().map(|n| n.metadata.name.as_str()).collect();
            anyhow::bail!(
                "the cluster has {} nodes ({}): name one with --node",
                names.len(),
                names.join(", ")
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_like_ls() {
        assert_eq!(human_size(812), "812 B");
        assert_eq!(human_size(4300), "4.2 KiB");
        assert_eq!(human_size(1_153_434), "1.1 MiB");
        assert_eq!(human_size(2 * 1024 * 1024 * 1024), "2.0 GiB");
    }

    #[test]
    fn rows_shorten_digests_unless_wide() {
        let image = NodeImage {
            reference: "local/busybox:1".into(),
            digest: format!("sha256:{}", "ab".repeat(32)),
            size: 2048,
            pods: vec!["pod/web".into(), "pod/team-a/db".into()],
        };
        assert_eq!(
            image_row("node-1", &image, false),
            vec!["node-1", "local/busybox:1", "abababababab", "2.0 KiB", "2"]
        );
        let wide = image_row("node-1", &image, true);
        assert_eq!(wide[2], image.digest);
        assert_eq!(wide[4], "pod/web,pod/team-a/db");
    }

    #[test]
    fn a_failed_node_fails_the_command_and_is_named() {
        let report = NodeImagesReport {
            nodes: vec![
                NodeImages {
                    node: "node-1".into(),
                    ..NodeImages::default()
                },
                NodeImages {
                    node: "node-2".into(),
                    images: Vec::new(),
                    error: Some("cannot reach the agent".into()),
                },
            ],
            skipped: Vec::new(),
        };
        let error = fail_for(&report, "import").unwrap_err();
        assert_eq!(error.to_string(), "import failed on 1 of 2 nodes: node-2");
    }
}

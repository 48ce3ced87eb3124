//! `corral image import|ls|prune`: a node's image store. Images live on
//! nodes, not in the API. `import` and `ls` act on this machine's data dir
//! directly, like `k3s ctr images import`; `prune` asks the node's agent,
//! through the API server, to collect: only the agent deletes images, so
//! nothing races its own collection or the pulls it is making.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};
use corral_api::Kind;
use corral_runtime::image::ImageStore;

use super::{connect, default_data_dir};
use crate::output::{Format, Table, print_structured};

#[derive(Debug, Args)]
pub struct ImageArgs {
    #[command(subcommand)]
    command: ImageCommand,
    /// `import` and `ls`: the node's data dir (the one `corral up` or
    /// `corral agent` uses).
    #[arg(long, global = true, value_name = "DIR")]
    data_dir: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
enum ImageCommand {
    /// Import an image archive: an OCI layout tar (`podman save --format
    /// oci-archive`) or a docker-archive tar (`podman save --format
    /// docker-archive`, `docker save`). Layers are unpacked once and shared
    /// by every container that uses them.
    #[command(after_help = "Examples:
  corral image import /tmp/image-oci.tar                 into this node's default data dir
  corral image import web.tar --name local/web:2         stored as local/web:2
  corral image import web.tar --data-dir /run/corral-lab/node-1   into a lab node's store")]
    Import {
        /// The archive.
        file: PathBuf,
        /// Store it under this NAME:TAG instead of the archive's own name.
        #[arg(long, value_name = "NAME:TAG")]
        name: Option<String>,
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
    /// List the images on this node.
    #[command(after_help = "Examples:
  corral image ls                                 NAME and DIGEST of each image
  corral image ls -o json                         the same, for scripts
  corral image ls --data-dir /run/corral-lab/node-1   a lab node's images")]
    Ls {
        #[arg(short = 'o', long, value_enum, default_value_t)]
        output: Format,
    },
}

fn open(data_dir: Option<PathBuf>) -> anyhow::Result<ImageStore> {
    let dir = data_dir.unwrap_or_else(default_data_dir).join("images");
    ImageStore::open(&dir)
        .with_context(|| format!("cannot open the image store in {}", dir.display()))
}

pub async fn run(config: Option<PathBuf>, args: ImageArgs) -> anyhow::Result<()> {
    match args.command {
        ImageCommand::Import { file, name } => {
            let store = open(args.data_dir)?;
            let images = tokio::task::spawn_blocking(move || store.import(&file, name.as_deref()))
                .await?
                .context("import failed; nothing was added")?;
            for image in images {
                println!("imported {} ({})", image.reference, image.manifest_digest);
            }
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
        }
        ImageCommand::Prune { node } => {
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
        }
        ImageCommand::Ls { output } => {
            let images = open(args.data_dir)?.list()?;
            let rows: Vec<serde_json::Value> = images
                .iter()
                .map(|i| serde_json::json!({"name": i.reference, "digest": i.manifest_digest.to_string()}))
                .collect();
            if !print_structured(output, &rows)? {
                let mut table = Table::new(&["NAME", "DIGEST"]);
                for row in &rows {
                    table.row(vec![
                        row["name"].as_str().unwrap_or_default().to_string(),
                        row["digest"].as_str().unwrap_or_default().to_string(),
                    ]);
                }
                table.print();
            }
        }
    }
    Ok(())
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

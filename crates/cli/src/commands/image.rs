//! `corral image import|ls`: the node's local image store. These act on
//! this machine's data dir directly, like `k3s ctr images import`: images
//! live on nodes, not in the API.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};
use corral_runtime::image::ImageStore;

use super::default_data_dir;
use crate::output::{Format, Table, print_structured};

#[derive(Debug, Args)]
pub struct ImageArgs {
    #[command(subcommand)]
    command: ImageCommand,
    /// The node's data dir (the one `corral up` or `corral agent` uses).
    #[arg(long, global = true, value_name = "DIR")]
    data_dir: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
enum ImageCommand {
    /// Import an image archive: an OCI layout tar (`podman save --format
    /// oci-archive`) or a docker-archive tar (`podman save --format
    /// docker-archive`, `docker save`). Layers are unpacked once and shared
    /// by every container that uses them.
    Import {
        /// The archive.
        file: PathBuf,
        /// Store it under this NAME:TAG instead of the archive's own name.
        #[arg(long, value_name = "NAME:TAG")]
        name: Option<String>,
    },
    /// Delete pulled images no pod on this node uses or used in its last
    /// revisions (the agent does this every 10 minutes; history is the GC
    /// root, hand-imported images are never deleted).
    Prune,
    /// List the images on this node.
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

pub async fn run(args: ImageArgs) -> anyhow::Result<()> {
    let data_dir = args.data_dir.clone().unwrap_or_else(default_data_dir);
    let store = open(args.data_dir)?;
    match args.command {
        ImageCommand::Import { file, name } => {
            let images = tokio::task::spawn_blocking(move || store.import(&file, name.as_deref()))
                .await?
                .context("import failed; nothing was added")?;
            for image in images {
                println!("imported {} ({})", image.reference, image.manifest_digest);
            }
        }
        ImageCommand::Prune => {
            let state = corral_agent::state::LocalState::open(data_dir.join("agent").join("pods"))?;
            let report = tokio::task::spawn_blocking(move || {
                let records = state.load_all()?;
                anyhow::Ok(corral_agent::images::collect(&store, &records)?)
            })
            .await??;
            for image in &report.removed_images {
                println!("deleted {image}");
            }
            println!(
                "{} images, {} blobs, {} layers deleted",
                report.removed_images.len(),
                report.removed_blobs,
                report.removed_layers
            );
        }
        ImageCommand::Ls { output } => {
            let images = store.list()?;
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

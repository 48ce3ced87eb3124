//! `corral node forget NAME`: declare a node gone, so that its pods move.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use corral_api::kinds::NodeSpec;
use corral_api::{Kind, ObjectKey};

use super::connect;

#[derive(Debug, Args)]
pub struct NodeArgs {
    #[command(subcommand)]
    command: NodeCommand,
}

#[derive(Debug, Subcommand)]
enum NodeCommand {
    /// Declare the node Lost now (not waiting for --lost-after): every pod
    /// on it that is not pinned there is placed elsewhere. If the machine
    /// comes back, its agent stops those pods' old copies.
    #[command(after_help = "Examples:
  corral node forget node-2           node-2 is Lost now: its unpinned pods move
  corral history node/node-2          who declared it lost, and when")]
    Forget { name: String },
    /// Undo `forget`: the node is Ready again once it heartbeats.
    #[command(after_help = "Examples:
  corral node remember node-2         node-2 is Ready again once it heartbeats")]
    Remember { name: String },
}

pub async fn run(config: Option<PathBuf>, args: NodeArgs) -> anyhow::Result<()> {
    let (name, forgotten) = match args.command {
        NodeCommand::Forget { name } => (name, true),
        NodeCommand::Remember { name } => (name, false),
    };
    let client = connect(config)?;
    let key = ObjectKey::new(Kind::Node, None, &name);
    let message = if forgotten {
        "node forget: declared lost by an operator"
    } else {
        "node remember: no longer declared lost"
    };
    super::update_spec::<NodeSpec, _>(
        &client,
        &key,
        |_| message.to_string(),
        |spec| {
            spec.forgotten = forgotten;
            Ok(())
        },
    )
    .await?;
    if forgotten {
        println!("{key} forgotten: it is Lost, and its pods (pinned ones excepted) move");
    } else {
        println!("{key} remembered: Ready again once it heartbeats");
    }
    Ok(())
}

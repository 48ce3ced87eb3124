//! `corral secrets rotate-key`: the cluster's Secrets under a new key.

use std::path::PathBuf;

use clap::{Args, Subcommand};

use super::connect;

#[derive(Debug, Args)]
pub struct SecretsArgs {
    #[command(subcommand)]
    command: SecretsCommand,
}

#[derive(Debug, Subcommand)]
enum SecretsCommand {
    /// Make a new data key current, encrypt every Secret's values (every
    /// kept revision) again with it, then forget the old key: a copy of the
    /// old keyring decrypts nothing afterwards. Operators only. Pods keep
    /// running; values and their hashes do not change. Safe to run again
    /// if it was interrupted.
    ///
    /// The keyring is the file `secrets-keyring` in the server's data dir;
    /// back it up with the store, and give every server of an HA cluster
    /// the same one.
    #[command(after_help = "Examples:
  corral secrets rotate-key     e.g. `key 3 current; 41 values sealed again; retired key 2`")]
    RotateKey,
}

pub async fn run(config: Option<PathBuf>, args: SecretsArgs) -> anyhow::Result<()> {
    match args.command {
        SecretsCommand::RotateKey => {
            let report = connect(config)?.rotate_secrets_key().await?;
            let retired: Vec<String> = report["retired"]
                .as_array()
                .map(|ids| ids.iter().map(ToString::to_string).collect())
                .unwrap_or_default();
            println!(
                "key {} current; {} values sealed again; retired key {}",
                report["key"],
                report["resealed"],
                if retired.is_empty() {
                    "none".to_string()
                } else {
                    retired.join(", ")
                }
            );
        }
    }
    Ok(())
}

//! `corral token create` and `corral whoami`.

use std::path::PathBuf;

use anyhow::bail;
use clap::{Args, Subcommand};
use corral_api::Role;

use super::connect;

#[derive(Debug, Args)]
pub struct TokenArgs {
    #[command(subcommand)]
    command: TokenCommand,
}

#[derive(Debug, Subcommand)]
enum TokenCommand {
    /// Mint a token (operators only). It is printed once; only its hash is kept.
    ///
    /// Exactly one of --user, --operator, --controller or --node names the
    /// identity. People's changes are recorded in history as `external`,
    /// controllers' and nodes' as `system`.
    Create {
        /// A person limited to namespaced objects.
        #[arg(long, value_name = "NAME")]
        user: Option<String>,
        /// A person with every right.
        #[arg(long, value_name = "NAME")]
        operator: Option<String>,
        /// A controller: writes only the fields it owns.
        #[arg(long, value_name = "NAME")]
        controller: Option<String>,
        /// A node agent.
        #[arg(long, value_name = "NAME")]
        node: Option<String>,
        /// With --user: a namespace the user may act in (repeat it; `*`
        /// for every namespace). A user token needs at least one.
        #[arg(long = "namespace", short = 'n', value_name = "NAMESPACE")]
        namespaces: Vec<String>,
    },
}

pub async fn run(config: Option<PathBuf>, args: TokenArgs) -> anyhow::Result<()> {
    let TokenCommand::Create {
        user,
        operator,
        controller,
        node,
        namespaces,
    } = args.command;
    let chosen: Vec<(String, Role)> = [
        (user, Role::User),
        (operator, Role::Operator),
        (controller, Role::Controller),
        (node, Role::Node),
    ]
    .into_iter()
    .filter_map(|(name, role)| name.map(|n| (n, role)))
    .collect();
    let [(name, role)] = chosen.as_slice() else {
        bail!("give exactly one of --user, --operator, --controller or --node");
    };
    if *role == Role::User && namespaces.is_empty() {
        bail!(
            "a user token needs --namespace NAME (repeat it, or `--namespace '*'` for every namespace)"
        );
    }
    let client = connect(config)?;
    let created = client.create_token(name, *role, &namespaces).await?;
    println!("{}", created.token);
    Ok(())
}

pub async fn whoami(config: Option<PathBuf>) -> anyhow::Result<()> {
    let identity = connect(config)?.whoami().await?;
    println!(
        "{} ({}, {})",
        identity.name,
        serde_json::to_value(identity.role)?.as_str().unwrap_or("?"),
        identity.class().as_str()
    );
    Ok(())
}

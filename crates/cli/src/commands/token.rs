//! `corral token create|list|revoke` and `corral whoami`.

use std::path::PathBuf;

use anyhow::bail;
use clap::{Args, Subcommand};
use corral_api::Role;

use corral_client::ClientConfig;

use super::{config_path, connect};
use crate::output::{Format, Table, age, print_structured};

#[derive(Debug, Args)]
pub struct TokenArgs {
    #[command(subcommand)]
    command: TokenCommand,
}

#[derive(Debug, Subcommand)]
enum TokenCommand {
    /// Mint a token (operators only). It is printed once; only its hash is kept.
    ///
    /// Exactly one of --user, --operator, --controller, --node or --join
    /// names the identity. People's changes are recorded in history as
    /// `external`, controllers' and nodes' as `system`.
    ///
    /// To add nodes, prefer a join token: `corral token create --join`, then
    /// on each new machine `corral agent --server URL --ca ca.pem
    /// --join-token TOKEN`. The agent exchanges it once for the node's own
    /// token and keeps that; the join token expires (a day by default).
    #[command(after_help = "Examples:
  corral token create --join                                      for new nodes, valid 24h
  corral token create --user alice --namespace team-a --ttl 7d    alice, in team-a, for a week
  corral token create --controller lb-l4-proxy                    for `corral lb-proxy`
  corral token create --user bob -n dev -o config > bob.json      a ready client config for bob
  corral token create --user ci -n prod --read-secrets            may also reveal Secrets in prod
  CORRAL_CONFIG=bob.json corral whoami                            … which bob uses as it is")]
    Create(CreateArgs),
    /// List every token (operators only): its id, identity, role,
    /// namespaces, when it was made, last used (to within five minutes) and
    /// expires. Never the token itself.
    #[command(after_help = "Examples:
  corral token list             ID, NAME, ROLE, NAMESPACES, CREATED, LAST USED, EXPIRES
  corral token list -o json     the same as JSON")]
    List {
        #[arg(short = 'o', long, value_enum, default_value_t)]
        output: Format,
    },
    /// Revoke a token by its id (from `token list`, 8 or more hex digits)
    /// or every token of a name (operators only). It stops working on every
    /// server within 5 seconds. A node's tokens are also revoked when it is
    /// forgotten or a new machine joins under its name.
    #[command(after_help = "Examples:
  corral token revoke 3f2a9c01b7d4    one token, by id
  corral token revoke alice           every token named alice")]
    Revoke {
        /// An id from `corral token list`, or a name.
        token: String,
    },
}

/// The flags of `token create`.
#[derive(Debug, Args)]
struct CreateArgs {
    /// A person limited to namespaced objects.
    #[arg(long, value_name = "NAME")]
    user: Option<String>,
    /// A person with every right.
    #[arg(long, value_name = "NAME")]
    operator: Option<String>,
    /// A controller: writes only the fields it owns.
    #[arg(long, value_name = "NAME")]
    controller: Option<String>,
    /// A node agent (a fixed name; see --join for adding nodes).
    #[arg(long, value_name = "NAME")]
    node: Option<String>,
    /// A join token: any number of new nodes may exchange it for their
    /// own identity (`corral agent --join-token`) until it expires.
    #[arg(long)]
    join: bool,
    /// The token stops working after this long (`30m`, `12h`, `7d`).
    /// Join tokens default to 24h; other tokens never expire unless set.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    ttl: Option<std::time::Duration>,
    /// With --user: a namespace the user may act in (repeat it; `*`
    /// for every namespace). A user token needs at least one.
    #[arg(long = "namespace", short = 'n', value_name = "NAMESPACE")]
    namespaces: Vec<String>,
    /// With --user: may also read Secrets' values in those namespaces
    /// (`corral get secret/x --reveal`). Without it a user sees only
    /// which keys a Secret has.
    #[arg(long, requires = "user")]
    read_secrets: bool,
    /// `token` prints the token alone; `config` prints a client config
    /// (this cluster's server and CA, the new token) to save as a file
    /// for `--config`, `$CORRAL_CONFIG` or `corral config add`.
    #[arg(short = 'o', long, value_enum, default_value_t)]
    output: TokenOutput,
}

/// What `token create` prints.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
enum TokenOutput {
    #[default]
    Token,
    Config,
}

pub async fn run(config: Option<PathBuf>, args: TokenArgs) -> anyhow::Result<()> {
    match args.command {
        TokenCommand::Create(create_args) => create(config, create_args).await,
        TokenCommand::List { output } => list(config, output).await,
        TokenCommand::Revoke { token } => revoke(config, &token).await,
    }
}

async fn list(config: Option<PathBuf>, output: Format) -> anyhow::Result<()> {
    let tokens = connect(config)?.list_tokens().await?;
    if print_structured(output, &tokens)? {
        return Ok(());
    }
    let now = chrono::Utc::now();
    let mut table = Table::new(&[
        "ID",
        "NAME",
        "ROLE",
        "NAMESPACES",
        "CREATED",
        "LAST USED",
        "EXPIRES",
    ]);
    for token in &tokens {
        let identity = &token.identity;
        let mut namespaces = identity.namespaces.join(",");
        if identity.read_secrets {
            namespaces.push_str(" (+secrets)");
        }
        table.row(vec![
            token.id.clone(),
            identity.name.clone(),
            format!("{:?}", identity.role).to_lowercase(),
            if namespaces.is_empty() {
                "-".into()
            } else {
                namespaces
            },
            age(Some(token.created_at), now),
            token
                .last_used_at
                .map_or_else(|| "never".into(), |at| age(Some(at), now)),
            identity
                .expires_at
                .map_or_else(|| "never".into(), |at| at.to_rfc3339()),
        ]);
    }
    table.print();
    Ok(())
}

async fn revoke(config: Option<PathBuf>, token: &str) -> anyhow::Result<()> {
    let revoked = connect(config)?.revoke_token(token).await?;
    for token in &revoked.revoked {
        println!(
            "revoked {} ({}, {:?})",
            token.id, token.identity.name, token.identity.role
        );
    }
    Ok(())
}

async fn create(config: Option<PathBuf>, args: CreateArgs) -> anyhow::Result<()> {
    let CreateArgs {
        user,
        operator,
        controller,
        node,
        join,
        ttl,
        namespaces,
        read_secrets,
        output,
    } = args;
    let chosen: Vec<(String, Role)> = [
        (user, Role::User),
        (operator, Role::Operator),
        (controller, Role::Controller),
        (node, Role::Node),
        (join.then(|| "join".to_string()), Role::Joiner),
    ]
    .into_iter()
    .filter_map(|(name, role)| name.map(|n| (n, role)))
    .collect();
    let [(name, role)] = chosen.as_slice() else {
        bail!("give exactly one of --user, --operator, --controller, --node or --join");
    };
    if *role == Role::User && namespaces.is_empty() {
        bail!(
            "a user token needs --namespace NAME (repeat it, or `--namespace '*'` for every namespace)"
        );
    }
    let path = config_path(config);
    let client = connect(Some(path.clone()))?;
    let ttl = ttl.map(|ttl| ttl.as_secs().max(1));
    let created = client
        .create_token(name, *role, &namespaces, ttl, read_secrets)
        .await?;
    if let Some(expires_at) = created.identity.expires_at {
        eprintln!("expires at {}", expires_at.to_rfc3339());
    }
    match output {
        TokenOutput::Token => println!("{}", created.token),
        TokenOutput::Config => {
            let mine = ClientConfig::load(&path)?;
            let theirs = ClientConfig {
                token: created.token,
                ..mine
            };
            println!("{}", serde_json::to_string_pretty(&theirs)?);
        }
    }
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

//! `corral controllers list|check|transfer` and `corral explain`: who owns
//! which field, who reads it, and whether the controllers' declared reads
//! and writes form a cycle.
//!
//! The registry is the cluster's `Controller` objects; the rules applied to
//! them are `corral_ownership`'s, the same the API server enforces.

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use corral_api::{Kind, Object};
use corral_client::Client;
use corral_ownership::{FieldRef, Owner, Registry, Rule, Source};
use serde::Serialize;

use super::connect;
use crate::output::{Format, Table, print_structured};

#[derive(Debug, Args)]
pub struct ControllersArgs {
    #[command(subcommand)]
    command: ControllersCommand,
}

#[derive(Debug, Subcommand)]
enum ControllersCommand {
    /// Show every registered controller (what it owns, reads and adds to
    /// workflows) and the owner of every field, built-in defaults included
    /// (people own spec, labels and annotations).
    #[command(after_help = "Examples:
  corral controllers list             controllers, then every field's owner and readers
  corral controllers list -o yaml     the same, for scripts")]
    List {
        #[arg(short = 'o', long, value_enum, default_value_t)]
        output: Format,
    },
    /// Look for feedback cycles between the controllers: build the graph
    /// "A writes a field B reads" from their registrations (what they
    /// declare, not what they do) and print `converges` when it has no
    /// cycle, or name every cycle (`A writes X read by B; B writes Y read
    /// by A`) and exit non-zero.
    ///
    /// A controller reading its own fields is not a cycle; step hand-offs
    /// through workflows are not field writes (a step only moves forward).
    #[command(after_help = "Examples:
  corral controllers check            `converges`, or every cycle (and exit 1)
  corral controllers check -o json    the cycles as JSON, for scripts")]
    Check {
        #[arg(short = 'o', long, value_enum, default_value_t)]
        output: Format,
    },
    /// Hand a field over to another controller (operators only). This is the
    /// only way a field changes owner; both Controller objects get a new
    /// revision naming the transfer.
    ///
    /// Example: corral controllers transfer Pod:status.address --to my-ipam
    Transfer {
        /// The field, as KIND:PATH (`Pod:status.node`).
        #[arg(value_name = "KIND:PATH")]
        field: String,
        /// The controller that owns the field afterwards.
        #[arg(long, value_name = "NAME")]
        to: String,
        /// The current owner; default: the controller that owns it now.
        #[arg(long, value_name = "NAME")]
        from: Option<String>,
    },
}

#[derive(Debug, Args)]
#[command(after_help = "Examples:
  corral explain pod.status.node                    owned by the scheduler
  corral explain 'pod.spec.containers[*].image'     people own spec
  corral explain node.status.prefix -o json         owner and readers, for scripts")]
pub struct ExplainArgs {
    /// The field, as KIND.PATH: `pod.status.node`, `node.status.prefix`,
    /// `pod.spec.containers[*].image`.
    #[arg(value_name = "KIND.PATH")]
    field: String,
    #[arg(short = 'o', long, value_enum, default_value_t)]
    output: Format,
}

pub async fn run(config: Option<PathBuf>, args: ControllersArgs) -> anyhow::Result<()> {
    let client = connect(config)?;
    match args.command {
        ControllersCommand::List { output } => list(&client, output).await,
        ControllersCommand::Check { output } => check(&client, output).await,
        ControllersCommand::Transfer { field, to, from } => {
            transfer(&client, &field, &to, from).await
        }
    }
}

/// The registry of the cluster's `Controller` objects.
async fn registry(client: &Client) -> anyhow::Result<Registry> {
    let listed = client
        .list(Kind::Controller, None, None)
        .await
        .context("cannot list controllers")?;
    let objects: Vec<Object> = listed.items;
    Ok(Registry::from_objects(&objects))
}

#[derive(Debug, Serialize)]
struct ControllerRow {
    name: String,
    owns: Vec<String>,
    reads: Vec<String>,
    steps: Vec<String>,
}

#[derive(Debug, Serialize)]
struct FieldRow {
    field: String,
    owner: Owner,
    #[serde(rename = "ownerText")]
    owner_text: String,
    source: Source,
    readers: Vec<String>,
}

#[derive(Debug, Serialize)]
struct Listing {
    controllers: Vec<ControllerRow>,
    fields: Vec<FieldRow>,
}

fn field_row(registry: &Registry, rule: Rule) -> FieldRow {
    FieldRow {
        readers: registry.readers_of(rule.field.kind, &rule.field.path),
        field: rule.field.to_string(),
        owner_text: rule.owner.to_string(),
        owner: rule.owner,
        source: rule.source,
    }
}

async fn list(client: &Client, output: Format) -> anyhow::Result<()> {
    let registry = registry(client).await?;
    let controllers: Vec<ControllerRow> = registry
        .controllers()
        .iter()
        .map(|c| ControllerRow {
            name: c.name.clone(),
            owns: c.spec.owns.clone(),
            reads: c.spec.reads.clone(),
            steps: c.spec.steps.iter().map(|s| s.name.clone()).collect(),
        })
        .collect();
    let mut rules = registry.effective_rules();
    rules.sort_by(|a, b| a.field.cmp(&b.field));
    let fields: Vec<FieldRow> = rules.into_iter().map(|r| field_row(&registry, r)).collect();
    let listing = Listing {
        controllers,
        fields,
    };
    if print_structured(output, &listing)? {
        return Ok(());
    }
    let joined = |items: &[String]| {
        if items.is_empty() {
            "-".to_string()
        } else {
            items.join(", ")
        }
    };
    for c in &listing.controllers {
        println!("controller {}", c.name);
        println!("  owns:  {}", joined(&c.owns));
        println!("  reads: {}", joined(&c.reads));
        println!("  steps: {}", joined(&c.steps));
    }
    if !listing.controllers.is_empty() {
        println!();
    }
    let mut table = Table::new(&["FIELD", "OWNER", "SOURCE", "READERS"]);
    for f in &listing.fields {
        let source = match f.source {
            Source::Default => "default",
            Source::Registered => "registered",
        };
        table.row(vec![
            f.field.clone(),
            f.owner_text.clone(),
            source.into(),
            joined(&f.readers),
        ]);
    }
    table.print();
    Ok(())
}

async fn check(client: &Client, output: Format) -> anyhow::Result<()> {
    let convergence = registry(client).await?.check_convergence();
    if !print_structured(output, &convergence)? {
        if convergence.converges() {
            println!("converges");
        } else {
            for cycle in &convergence.cycles {
                println!("{cycle}");
            }
        }
    }
    if !convergence.converges() {
        let more = if convergence.truncated {
            " (more not enumerated)"
        } else {
            ""
        };
        bail!(
            "the controllers do not converge: {} cycle(s){more}",
            convergence.cycles.len()
        );
    }
    Ok(())
}

async fn transfer(
    client: &Client,
    field: &str,
    to: &str,
    from: Option<String>,
) -> anyhow::Result<()> {
    let field: FieldRef = field.parse()?;
    let from = match from {
        Some(from) => from,
        None => {
            let owner = registry(client).await?.owner_of(field.kind, &field.path);
            match owner.controller() {
                Some(name) => name.to_string(),
                None => {
                    bail!("{field} is owned by {owner}, not by a controller: nothing to transfer")
                }
            }
        }
    };
    client
        .transfer_field(&from, &field.to_string(), to)
        .await
        .with_context(|| format!("cannot transfer {field}"))?;
    println!("{field}: transferred from {from} to {to}");
    Ok(())
}

#[derive(Debug, Serialize)]
struct Explanation {
    field: String,
    owner: Owner,
    #[serde(rename = "ownerText")]
    owner_text: String,
    readers: Vec<String>,
}

pub async fn explain(config: Option<PathBuf>, args: ExplainArgs) -> anyhow::Result<()> {
    let (kind, path) = args
        .field
        .split_once('.')
        .with_context(|| format!("{:?}: expected KIND.PATH, like pod.status.node", args.field))?;
    let kind: Kind = kind.parse()?;
    let registry = registry(&connect(config)?).await?;
    let owner = registry.owner_of(kind, path);
    let explanation = Explanation {
        field: FieldRef::new(kind, path).to_string(),
        owner_text: owner.to_string(),
        owner,
        readers: registry.readers_of(kind, path),
    };
    if print_structured(args.output, &explanation)? {
        return Ok(());
    }
    println!("{}", explanation.field);
    println!("  owner:   {}", explanation.owner_text);
    let readers = if explanation.readers.is_empty() {
        "no controller declares reading it".to_string()
    } else {
        explanation.readers.join(", ")
    };
    println!("  readers: {readers}");
    Ok(())
}

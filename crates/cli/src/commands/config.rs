//! `corral config`: named client configs (one per cluster or identity) and
//! which one commands use. They live in `$XDG_CONFIG_HOME/corral/configs/`
//! (else `~/.config/corral/configs/`), the chosen name in `…/current`.
//!
//! Which config a command uses: `--config`/`$CORRAL_CONFIG`, else the
//! current named one, else the admin config `corral up` wrote.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use corral_client::ClientConfig;

use crate::output::Table;

#[derive(Debug, Args)]
pub struct ConfigArgs {
    #[command(subcommand)]
    command: ConfigCommand,
}

#[derive(Debug, Subcommand)]
enum ConfigCommand {
    /// Keep a client config under a name (copied; the file may go).
    #[command(after_help = "Examples:
  corral config add prod prod.json                  keep prod.json as `prod`
  corral token create --user alice -n team-a -o config > alice.json
  corral config add alice alice.json                then `corral config use alice`")]
    Add {
        /// The name to use it by (letters, digits, `-`, `_`, `.`).
        name: String,
        /// A client config (`server`, `token`, `ca`), e.g. from
        /// `corral token create … -o config` or `corral up`'s admin.json.
        file: PathBuf,
    },
    /// Make the named config the one commands use.
    #[command(after_help = "Examples:
  corral config use prod        every command now talks to prod
  corral config use --none      back to $CORRAL_CONFIG or corral up's admin config")]
    Use {
        #[arg(required_unless_present = "none")]
        name: Option<String>,
        /// Use no named config any more.
        #[arg(long, conflicts_with = "name")]
        none: bool,
    },
    /// The named configs, their servers, and which one is in use (*).
    #[command(after_help = "Example:
  corral config list")]
    List,
    /// Forget a named config.
    #[command(after_help = "Example:
  corral config remove prod")]
    Remove { name: String },
}

/// `$XDG_CONFIG_HOME/corral`, else `~/.config/corral`.
fn home() -> PathBuf {
    if let Some(dir) = std::env::var_os("XDG_CONFIG_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir).join("corral");
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("."), PathBuf::from);
    home.join(".config").join("corral")
}

fn named(name: &str) -> PathBuf {
    home().join("configs").join(format!("{name}.json"))
}

fn current_file() -> PathBuf {
    home().join("current")
}

/// The config of the current name, if one is in use.
pub fn current() -> Option<PathBuf> {
    let name = std::fs::read_to_string(current_file()).ok()?;
    let name = name.trim();
    (!name.is_empty()).then(|| named(name))
}

fn check_name(name: &str) -> anyhow::Result<()> {
    let fine = !name.is_empty()
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if !fine {
        bail!("config name {name:?}: use letters, digits, '-', '_' and '.' (not first)");
    }
    Ok(())
}

pub fn run(args: ConfigArgs) -> anyhow::Result<()> {
    match args.command {
        ConfigCommand::Add { name, file } => add(&name, &file),
        ConfigCommand::Use { name, none } => match (name, none) {
            (_, true) => {
                match std::fs::remove_file(current_file()) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
                    _ => {}
                }
                println!("no named config in use");
                Ok(())
            }
            (Some(name), false) => use_name(&name),
            (None, false) => bail!("name a config, or give --none"),
        },
        ConfigCommand::List => list(),
        ConfigCommand::Remove { name } => {
            check_name(&name)?;
            std::fs::remove_file(named(&name))
                .with_context(|| format!("no config named {name}"))?;
            if current().is_some_and(|path| path == named(&name)) {
                let _ = std::fs::remove_file(current_file());
            }
            println!("config {name} removed");
            Ok(())
        }
    }
}

fn add(name: &str, file: &Path) -> anyhow::Result<()> {
    check_name(name)?;
    let config = ClientConfig::load(file)?;
    config.save(&named(name))?;
    println!(
        "config {name} added ({}); `corral config use {name}` to use it",
        config.server
    );
    Ok(())
}

fn use_name(name: &str) -> anyhow::Result<()> {
    check_name(name)?;
    let path = named(name);
    ClientConfig::load(&path).with_context(|| {
        format!("no config named {name}: add one with `corral config add {name} FILE`")
    })?;
    std::fs::create_dir_all(home())?;
    std::fs::write(current_file(), format!("{name}\n"))?;
    println!("using config {name}");
    Ok(())
}

fn list() -> anyhow::Result<()> {
    let dir = home().join("configs");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| {
                    e.file_name()
                        .to_str()
                        .and_then(|n| n.strip_suffix(".json"))
                        .map(str::to_string)
                })
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    if names.is_empty() {
        eprintln!("no named configs; add one with `corral config add NAME FILE`");
        return Ok(());
    }
    let current = current();
    let mut table = Table::new(&["CURRENT", "NAME", "SERVER"]);
    for name in names {
        let path = named(&name);
        let server = ClientConfig::load(&path).map_or_else(|e| format!("<{e}>"), |c| c.server);
        let marker = if current.as_ref() == Some(&path) {
            "*"
        } else {
            ""
        };
        table.row(vec![marker.into(), name, server]);
    }
    table.print();
    Ok(())
}

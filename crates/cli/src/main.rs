//! `corral` — one binary for the whole system, like k3s.
//!
//! `corral up` runs a single-node cluster in one process; every other
//! subcommand is a client of the API. This crate parses the command line and
//! prints; it holds no logic the API does not also expose.

mod commands;
mod output;
mod target;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

/// mimalloc, not glibc's malloc: the server's request path, its watch fan-out
/// and the in-process controllers allocate small JSON values from many
/// threads, where glibc's arenas spent a quarter of the server's CPU under
/// concurrent applies (docs/BENCHMARKS.md, apply).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use crate::commands::{
    apply, completion, config, console, controllers, datastore, describe, exec, get, history,
    image, lab, lb, node, port_forward, rollout, secrets, security, token, up, vm, workflow,
};

/// corral: a container and VM orchestrator you can learn in a week.
///
/// Start a single-node cluster with `corral up`, then in another shell run
/// the `export CORRAL_CONFIG=…` line it prints and try:
///
///   corral apply -f pod.yaml -m "first version"
///   corral get pods
///   corral history pod/web
///   corral diff pod/web 1 2
///   corral rollback pod/web --to 1
///   corral history --since 1h --external
///   corral why pod/web
///   corral retry pod/web
///   corral logs pod/web --steps
///   corral logs pod/web -f
///   corral exec pod/web -- id
///   corral console vm/builder
#[derive(Debug, Parser)]
#[command(name = "corral", version, about, long_about, verbatim_doc_comment)]
struct Cli {
    /// Client config (server URL and token). Default: $CORRAL_CONFIG, else
    /// the config `corral up` writes in its default data dir.
    #[arg(long, global = true, env = "CORRAL_CONFIG", value_name = "PATH")]
    config: Option<PathBuf>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a single-node cluster in this process: store, API server,
    /// built-in controllers and a node agent.
    Up(up::UpArgs),
    /// Run the control plane alone (API server, store, built-in
    /// controllers) for a cluster of `corral agent` nodes.
    Server(up::ServerArgs),
    /// Run a node agent alone, joining the server named by --server with a
    /// node token. Pods keep running while the server is unreachable.
    Agent(up::AgentArgs),
    /// A multi-node cluster on this machine, each node a network namespace
    /// (up, down, exec, stop-agent, start-agent).
    Lab(lab::LabArgs),
    /// Copy a cluster's whole store — objects, every revision with its
    /// author and message, tokens, step logs — from SQLite to etcd.
    Migrate(datastore::MigrateArgs),
    /// Run the default load balancer: register as owner of
    /// LoadBalancer:status and proxy TCP from IPv4/IPv6 frontends to the
    /// ready pods (needs a controller token).
    LbProxy(lb::LbProxyArgs),
    /// Import, list and prune the images on the cluster's nodes (through
    /// the API), or pack one from a directory.
    Image(image::ImageArgs),
    /// Create or update the objects in a manifest (YAML or JSON, several
    /// documents allowed). Each spec change becomes a numbered revision.
    Apply(apply::ApplyArgs),
    /// List objects of a kind, or show one.
    Get(get::GetArgs),
    /// Show one object in full, with its recent history.
    Describe(describe::DescribeArgs),
    /// Edit an object in $EDITOR and apply it (refused if it changed meanwhile).
    Edit(apply::EditArgs),
    /// Delete objects, by KIND/NAME or from a manifest.
    Delete(apply::DeleteArgs),
    /// Show an object's revisions, or what changed cluster-wide (--since).
    History(history::HistoryArgs),
    /// Show what changed between two revisions of an object.
    Diff(history::DiffArgs),
    /// Make a new revision whose spec is an earlier revision's.
    Rollback(history::RollbackArgs),
    /// Explain an object's newest operation: a verdict line, then every step
    /// of its workflow (done, running, failed, waiting, blocked).
    Why(workflow::WhyArgs),
    /// Run the failed steps of an object's newest workflow again (after
    /// fixing the cause); done steps stay done.
    Retry(workflow::RetryArgs),
    /// Nodes: `forget NAME` declares one lost so its pods move.
    Node(node::NodeArgs),
    /// Move a PinnedDeployment's share to its next template (`--percent`),
    /// follow it (`status`), or make next the new previous (`promote`).
    Rollout(rollout::RolloutArgs),
    /// Analyze an object's workflow: blame, critical-chain, dot.
    Analyze(workflow::AnalyzeArgs),
    /// Show a pod's container output or a VM's console output (-f to
    /// follow), or what the workflow
    /// and its controllers did about an object (--steps).
    Logs(workflow::LogsArgs),
    /// Run a command in a pod's container (-i for stdin, -t for a TTY);
    /// exits with the command's exit code.
    Exec(exec::ExecArgs),
    /// Reach a port of a pod from this machine: listens on localhost and
    /// carries each connection to the pod through the API server.
    PortForward(port_forward::PortForwardArgs),
    /// VM operations: snapshot (take, list, delete), restore, stop, start, restart,
    /// reset — each a revision of the VM, applied by its node in place.
    Vm(vm::VmArgs),
    /// Attach to a VM's serial console (Ctrl-] detaches; piped input
    /// detaches once it is sent and the console is quiet).
    Console(console::ConsoleArgs),
    /// Field ownership: who owns and reads what, and whether the
    /// controllers converge (list, check, transfer).
    Controllers(controllers::ControllersArgs),
    /// Show who owns a field and which controllers read it
    /// (`corral explain pod.status.node`).
    Explain(controllers::ExplainArgs),
    /// Show a pod's effective sandbox and which Policy granted each relaxation.
    ExplainSecurity(security::ExplainSecurityArgs),
    /// Secrets' encryption: rotate-key.
    Secrets(secrets::SecretsArgs),
    /// Manage API tokens.
    Token(token::TokenArgs),
    /// Named client configs, one per cluster or identity: add, use, list,
    /// remove.
    Config(config::ConfigArgs),
    /// Show who the configured token authenticates as.
    #[command(after_help = "Examples:
  corral whoami                              e.g. `admin (operator, external)`
  CORRAL_CONFIG=alice.json corral whoami     the identity in another client config")]
    Whoami,
    /// Print a shell completion script (bash, zsh or fish) for corral's
    /// subcommands and flags.
    Completion(completion::CompletionArgs),
    /// Print the API's OpenAPI document.
    #[command(after_help = "Examples:
  corral openapi > openapi.json              save it (docs/openapi.json is this output)
  corral openapi | jq '.paths | keys'        every API path")]
    Openapi,
}

fn main() -> ExitCode {
    quiet_on_closed_stdout();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// `corral describe pod/web | head` ends quietly when `head` closes the
/// pipe, like other Unix tools (exit status 141, as if by SIGPIPE), instead
/// of panicking in `println!`. SIGPIPE itself stays ignored: the daemons and
/// the API client write to sockets and pipes whose peers may go away, and
/// an error there must be reported, not kill the process.
fn quiet_on_closed_stdout() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or_default();
        if message.starts_with("failed printing to stdout") && message.contains("Broken pipe") {
            std::process::exit(141);
        }
        default(info);
    }));
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let config = cli.config;
    match cli.command {
        Command::Up(args) => up::up(args).await,
        Command::Server(args) => up::server(args).await,
        Command::Agent(args) => up::agent(args).await,
        Command::Image(args) => image::run(config, args).await,
        Command::LbProxy(args) => lb::lb_proxy(config, args).await,
        Command::Lab(args) => lab::run(args).await,
        Command::Migrate(args) => datastore::migrate(args).await,
        Command::Apply(args) => apply::apply(config, args).await,
        Command::Get(args) => get::get(config, args).await,
        Command::Describe(args) => describe::describe(config, args).await,
        Command::Edit(args) => apply::edit(config, args).await,
        Command::Delete(args) => apply::delete(config, args).await,
        Command::History(args) => history::history(config, args).await,
        Command::Diff(args) => history::diff(config, args).await,
        Command::Rollback(args) => history::rollback(config, args).await,
        Command::Retry(args) => workflow::retry(config, args).await,
        Command::Secrets(args) => secrets::run(config, args).await,
        Command::Why(args) => workflow::why(config, args).await,
        Command::Node(args) => node::run(config, args).await,
        Command::Rollout(args) => rollout::rollout(config, args).await,
        Command::Analyze(args) => workflow::analyze(config, args).await,
        Command::Logs(args) => workflow::logs(config, args).await,
        Command::Exec(args) => {
            let code = exec::exec(config, args).await?;
            // Exit now: a read of the terminal may still block a runtime thread.
            std::process::exit(code)
        }
        Command::Console(args) => {
            let code = console::console(config, args).await?;
            // Exit now: a read of the terminal may still block a runtime thread.
            std::process::exit(code)
        }
        Command::Vm(args) => vm::run(config, args).await,
        Command::PortForward(args) => port_forward::port_forward(config, args).await,
        Command::Controllers(args) => controllers::run(config, args).await,
        Command::Explain(args) => controllers::explain(config, args).await,
        Command::ExplainSecurity(args) => security::explain_security(config, args).await,
        Command::Token(args) => token::run(config, args).await,
        Command::Config(args) => config::run(args),
        Command::Whoami => token::whoami(config).await,
        Command::Completion(args) => completion::completion(&args, &mut Cli::command()),
        Command::Openapi => {
            println!(
                "{}",
                serde_json::to_string_pretty(&corral_server::openapi::document())?
            );
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::Cli;

    /// Every command a person runs, with its path (`corral node forget`).
    fn leaves(command: &clap::Command, path: String, out: &mut Vec<(String, clap::Command)>) {
        let subcommands: Vec<&clap::Command> = command
            .get_subcommands()
            .filter(|c| c.get_name() != "help")
            .collect();
        if subcommands.is_empty() {
            out.push((path.clone(), command.clone()));
        }
        for sub in subcommands {
            leaves(sub, format!("{path} {}", sub.get_name()), out);
        }
    }

    #[test]
    fn every_command_has_an_example_in_its_help() {
        let mut all = Vec::new();
        leaves(&Cli::command(), "corral".into(), &mut all);
        let missing: Vec<&str> = all
            .iter()
            .filter(|(_, command)| {
                let help = command.clone().render_long_help().to_string();
                !help.contains("Example")
            })
            .map(|(path, _)| path.as_str())
            .collect();
        assert!(missing.is_empty(), "no example in --help: {missing:#?}");
    }

    /// The `corral …` command of one line of an example, split into words
    /// as a shell would (quotes, a leading `VAR=value`, `source <(…)`,
    /// `… | corral …`); None for lines that are not a corral command.
    fn example_command(line: &str) -> Option<Vec<String>> {
        let line = line.trim();
        let line = line.strip_prefix("Example:").unwrap_or(line).trim_start();
        let line = match line.strip_prefix("source <(") {
            Some(rest) => rest.split_once(')')?.0,
            None => line,
        };
        let line = match line.find(" | corral ") {
            Some(at) if !line.starts_with("corral ") => &line[at + 3..],
            _ => line,
        };
        // Drop the comment (after two spaces), pipes and redirections.
        let line = line.split("  ").next()?;
        let line = line.split(" | ").next()?.split(" > ").next()?;
        let mut words = Vec::new();
        let mut word: Option<String> = None;
        let mut quote = None;
        for c in line.chars() {
            match (quote, c) {
                (Some(q), c) if c == q => quote = None,
                (Some(_), c) => word.get_or_insert_default().push(c),
                (None, '\'' | '"') => {
                    quote = Some(c);
                    word.get_or_insert_default();
                }
                (None, c) if c.is_whitespace() => words.extend(word.take()),
                (None, c) => word.get_or_insert_default().push(c),
            }
        }
        words.extend(word);
        let assignment = |w: &String| w.contains('=') && !w.starts_with('-');
        let start = words.iter().position(|w| !assignment(w))?;
        (words.get(start).map(String::as_str) == Some("corral")).then(|| words.split_off(start))
    }

    /// Every example line in every `--help`, with line continuations joined.
    fn example_lines(command: &clap::Command, out: &mut Vec<String>) {
        let texts = [command.get_after_help(), command.get_long_about()];
        for text in texts.into_iter().flatten() {
            let text = text.to_string().replace("\\\n", " ");
            out.extend(text.lines().map(str::to_string));
        }
        for sub in command.get_subcommands() {
            example_lines(sub, out);
        }
    }

    #[test]
    fn every_example_in_help_parses() {
        let mut lines = Vec::new();
        example_lines(&Cli::command(), &mut lines);
        let commands: Vec<Vec<String>> = lines.iter().filter_map(|l| example_command(l)).collect();
        assert!(
            commands.len() > 50,
            "found only {} examples",
            commands.len()
        );
        let wrong: Vec<String> = commands
            .iter()
            .filter_map(|words| {
                let error = Cli::try_parse_from(words).err()?;
                Some(format!("{}: {}", words.join(" "), error.kind()))
            })
            .collect();
        assert!(wrong.is_empty(), "examples that do not parse: {wrong:#?}");
    }
}

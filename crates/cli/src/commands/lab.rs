//! `corral lab`: a multi-node cluster on one machine. Each node is a
//! network namespace on a bridge that lives in the lab's own hub
//! namespace; the server runs inside node-0, one agent inside each node.
//! Everything lives under one directory, so `corral lab down` removes
//! every namespace, link, mount and process the lab made, from any shell.
//!
//! ```text
//!  DIR/lab.json        what `up` built (nodes, addresses, server URL)
//!  DIR/netns/hub       the bridge br0
//!  DIR/netns/node-N    eth0 on the bridge; the agent (and on node-0 the server)
//!  DIR/server/         the server's data dir (admin.json, store)
//!  DIR/node-N/         node-N's agent data dir (pods, images, runc state)
//!  DIR/logs/           server and agent logs
//! ```
//!
//! The API server listens on node-0's lab address, reachable only inside
//! the lab: run the CLI there with `corral lab exec -- corral get nodes`.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use corral_net::lab::{self, Lab, LabConfig};
use corral_net::netns;
use serde::{Deserialize, Serialize};

/// Where labs live by default.
pub const DEFAULT_LAB_DIR: &str = "/run/corral-lab";
const STATE_FILE: &str = "lab.json";
const API_PORT: u16 = 7443;
const AGENT_PORT: u16 = 7444;

#[derive(Debug, Args)]
pub struct LabArgs {
    #[command(subcommand)]
    command: LabCommand,
}

#[derive(Debug, Subcommand)]
enum LabCommand {
    /// Build N nodes (namespaces on a bridge), start the server in node-0
    /// and an agent in every node, and wait until every node is ready.
    #[command(after_help = "Examples:
  corral lab up                                   3 nodes, node-0 to node-2, under /run/corral-lab
  corral lab up --nodes 3 --image /tmp/image-oci.tar   with an image imported on every node
  corral lab up --nodes 2 --wireguard --dir /tmp/lab   pod traffic between nodes through WireGuard
  corral lab up --server-arg=--fence-after=5 --server-arg=--silent-after=3   short node-loss clocks")]
    Up {
        #[arg(long, default_value_t = 3)]
        nodes: usize,
        #[arg(long, default_value = DEFAULT_LAB_DIR)]
        dir: PathBuf,
        /// Import this image tarball (or OCI layout) into every node.
        #[arg(long, value_name = "PATH")]
        image: Vec<PathBuf>,
        /// Start every agent with `--wireguard`: pod traffic between nodes
        /// crosses WireGuard tunnels.
        #[arg(long)]
        wireguard: bool,
        /// One more flag for the lab's `corral server` (repeat it), e.g.
        /// `--server-arg=--fence-after=5`.
        #[arg(long = "server-arg", value_name = "FLAG", allow_hyphen_values = true)]
        server_args: Vec<String>,
    },
    /// Remove the lab: every process, container, mount and namespace.
    #[command(after_help = "Examples:
  corral lab down                   remove the lab in /run/corral-lab
  corral lab down --dir /tmp/lab    remove the one `corral lab up --dir /tmp/lab` built")]
    Down {
        #[arg(long, default_value = DEFAULT_LAB_DIR)]
        dir: PathBuf,
    },
    /// Run a command inside a lab node (CORRAL_CONFIG set to the lab's admin config).
    #[command(after_help = "Examples:
  corral lab exec -- corral get nodes                 the CLI, in node-0, against the lab's API
  corral lab exec --node node-1 -- ip -6 route        node-1's IPv6 routes
  alias labc='corral lab exec -- corral'              then: labc apply -f web.yaml")]
    Exec {
        #[arg(long, default_value = DEFAULT_LAB_DIR)]
        dir: PathBuf,
        #[arg(long, default_value = "node-0")]
        node: String,
        #[arg(trailing_var_arg = true, required = true)]
        command: Vec<String>,
    },
    /// Stop a node's agent (its containers keep running), as a node failure would.
    #[command(after_help = "Examples:
  corral lab stop-agent node-2                   as if node-2 crashed: it turns Silent
  corral lab exec -- corral get nodes            see its status change")]
    StopAgent {
        #[arg(long, default_value = DEFAULT_LAB_DIR)]
        dir: PathBuf,
        node: String,
    },
    /// Start a node's agent again (after stop-agent); it registers and joins.
    #[command(after_help = "Examples:
  corral lab start-agent node-2                  node-2 heartbeats again and rejoins
  corral lab exec -- corral why node/node-2      its join workflow, step by step")]
    StartAgent {
        #[arg(long, default_value = DEFAULT_LAB_DIR)]
        dir: PathBuf,
        node: String,
    },
}

/// What `lab up` built, for the other subcommands.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LabState {
    pub server: String,
    pub config: PathBuf,
    pub bridge_ipv6: String,
    pub bridge_ipv4: String,
    pub nodes: Vec<LabNode>,
    /// Agents run with `--wireguard`.
    #[serde(default)]
    pub wireguard: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LabNode {
    pub name: String,
    pub netns: PathBuf,
    pub ipv6: Ipv6Addr,
    pub ipv4: Ipv4Addr,
    pub data_dir: PathBuf,
    #[serde(default)]
    pub agent_pid: Option<u32>,
}

pub async fn run(args: LabArgs) -> anyhow::Result<()> {
    match args.command {
        LabCommand::Up {
            nodes,
            dir,
            image,
            wireguard,
            server_args,
        } => {
            let result = up(nodes, &dir, &image, wireguard, &server_args).await;
            if result.is_err() {
                let _ = down(&dir);
            }
            result
        }
        LabCommand::Down { dir } => down(&dir),
        LabCommand::Exec { dir, node, command } => {
            let state = load(&dir)?;
            let netns = node_netns(&state, &node)?;
            let mut child = Command::new(&command[0]);
            child
                .args(&command[1..])
                .env("CORRAL_CONFIG", &state.config);
            let status = netns::spawn(Some(&netns), &mut child)?
                .with_context(|| format!("cannot run {}", command[0]))?
                .wait()?;
            std::process::exit(status.code().unwrap_or(1));
        }
        LabCommand::StopAgent { dir, node } => {
            let mut state = load(&dir)?;
            let entry = state
                .nodes
                .iter_mut()
                .find(|n| n.name == node)
                .with_context(|| format!("the lab has no node {node}"))?;
            if let Some(pid) = entry.agent_pid.take() {
                stop_process(pid);
            }
            save(&dir, &state)
        }
        LabCommand::StartAgent { dir, node } => {
            let mut state = load(&dir)?;
            let index = state
                .nodes
                .iter()
                .position(|n| n.name == node)
                .with_context(|| format!("the lab has no node {node}"))?;
            if let Some(pid) = state.nodes[index].agent_pid {
                bail!("node {node}'s agent runs already (pid {pid})");
            }
            let pid = start_agent(&dir, &state, &state.nodes[index])?;
            state.nodes[index].agent_pid = Some(pid);
            save(&dir, &state)
        }
    }
}

fn node_netns(state: &LabState, node: &str) -> anyhow::Result<PathBuf> {
    state
        .nodes
        .iter()
        .find(|n| n.name == node)
        .map(|n| n.netns.clone())
        .with_context(|| format!("the lab has no node {node}"))
}

fn load(dir: &Path) -> anyhow::Result<LabState> {
    let path = dir.join(STATE_FILE);
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("no lab in {} (corral lab up first)", dir.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is corrupt", path.display()))
}

fn save(dir: &Path, state: &LabState) -> anyhow::Result<()> {
    let path = dir.join(STATE_FILE);
    std::fs::write(&path, serde_json::to_vec_pretty(state)?)
        .with_context(|| format!("cannot write {}", path.display()))
}

async fn up(
    count: usize,
    dir: &Path,
    images: &[PathBuf],
    wireguard: bool,
    server_args: &[String],
) -> anyhow::Result<()> {
    anyhow::ensure!(
        (1..=50).contains(&count),
        "--nodes {count}: expected 1 to 50"
    );
    if dir.join(STATE_FILE).exists() || dir.join("netns").exists() {
        bail!(
            "a lab exists in {} already: corral lab down --dir {0} first",
            dir.display()
        );
    }
    std::fs::create_dir_all(dir.join("logs"))
        .with_context(|| format!("cannot create {}", dir.display()))?;
    let bytes: [u8; 5] = rand::random();
    let bridge_ipv6: ipnet::Ipv6Net = format!(
        "fd{:02x}:{:02x}{:02x}:{:02x}{:02x}::/64",
        bytes[0], bytes[1], bytes[2], bytes[3], bytes[4]
    )
    .parse()?;
    let bridge_ipv4: ipnet::Ipv4Net = "192.168.87.0/24".parse()?;
    let built = Lab::up(LabConfig {
        dir: dir.join("netns"),
        nodes: count,
        ipv6: bridge_ipv6,
        ipv4: bridge_ipv4,
    })
    .await
    .context("cannot build the lab's namespaces")?;
    let nodes: Vec<LabNode> = built
        .nodes()
        .iter()
        .map(|host| LabNode {
            name: host.name.clone(),
            netns: host.netns.clone(),
            ipv6: host.ipv6,
            ipv4: host.ipv4,
            data_dir: dir.join(&host.name),
            agent_pid: None,
        })
        .collect();
    // From here the namespaces stay after this process; `down` removes them.
    built.keep();
    let server_dir = dir.join("server");
    let mut state = LabState {
        server: format!("https://[{}]:{API_PORT}", nodes[0].ipv6),
        config: server_dir.join(super::ADMIN_CONFIG),
        bridge_ipv6: bridge_ipv6.to_string(),
        bridge_ipv4: bridge_ipv4.to_string(),
        nodes,
        wireguard,
    };
    save(dir, &state)?;

    let mut server = corral_command(&dir.join("logs").join("server.log"))?;
    server
        .args(["server", "--data-dir"])
        .arg(&server_dir)
        .args(["--listen", &format!("[{}]:{API_PORT}", state.nodes[0].ipv6)])
        .args(server_args);
    netns::spawn(Some(&state.nodes[0].netns), &mut server)?
        .context("cannot start the lab's server")?;
    wait_until(
        "the lab's API server to answer",
        Duration::from_secs(30),
        || state.config.exists() && corral_in(&state, &state.nodes[0].netns, &["whoami"]).is_ok(),
    )?;

    for image in images {
        for node in &state.nodes {
            let status = Command::new(std::env::current_exe()?)
                .args(["image", "import"])
                .arg(image)
                .arg("--data-dir")
                .arg(&node.data_dir)
                .stdout(Stdio::null())
                .status()?;
            anyhow::ensure!(
                status.success(),
                "cannot import {} into {}",
                image.display(),
                node.name
            );
        }
    }
    for index in 0..state.nodes.len() {
        let pid = start_agent(dir, &state, &state.nodes[index])?;
        state.nodes[index].agent_pid = Some(pid);
        save(dir, &state)?;
    }
    let names: Vec<String> = state.nodes.iter().map(|n| n.name.clone()).collect();
    wait_until("every lab node to join", Duration::from_secs(60), || {
        names.iter().all(|name| node_joined(&state, name))
    })?;
    println!("lab up in {}: API {}", dir.display(), state.server);
    for node in &state.nodes {
        println!("  {}  {}  {}", node.name, node.ipv6, node.ipv4);
    }
    println!(
        "use it with: corral lab exec --dir {} -- corral get nodes",
        dir.display()
    );
    Ok(())
}

/// Whether the node's join workflow succeeded.
fn node_joined(state: &LabState, name: &str) -> bool {
    let Ok(text) = corral_in(
        state,
        &state.nodes[0].netns,
        &["get", &format!("node/{name}"), "-o", "json"],
    ) else {
        return false;
    };
    let Ok(node) = serde_json::from_str::<serde_json::Value>(&text) else {
        return false;
    };
    node.pointer("/status/workflow/instances")
        .and_then(|i| i.as_array())
        .and_then(|i| i.last())
        .and_then(|i| i.get("outcome"))
        .and_then(|o| o.as_str())
        == Some("succeeded")
}

fn start_agent(dir: &Path, state: &LabState, node: &LabNode) -> anyhow::Result<u32> {
    let token = corral_in(
        state,
        &state.nodes[0].netns,
        &["token", "create", "--node", &node.name],
    )?;
    let mut agent = corral_command(&dir.join("logs").join(format!("{}.log", node.name)))?;
    agent
        .args(["agent", "--server", &state.server, "--name", &node.name])
        .arg("--ca")
        .arg(dir.join("server").join("tls").join("ca.pem"))
        .arg("--data-dir")
        .arg(&node.data_dir)
        .args(["--listen", &format!("[{}]:{AGENT_PORT}", node.ipv6)])
        .args(["--address", &node.ipv6.to_string()])
        .args(["--forwarding", "node", "--egress-uplink", lab::UPLINK])
        .args(state.wireguard.then_some("--wireguard"))
        .env("CORRAL_NODE_TOKEN", token.trim());
    let child = netns::spawn(Some(&node.netns), &mut agent)?
        .with_context(|| format!("cannot start {}'s agent", node.name))?;
    Ok(child.id())
}

/// `corral` (this binary) with output to `log`, in its own process group
/// so the terminal's Ctrl-C does not reach it.
fn corral_command(log: &Path) -> anyhow::Result<Command> {
    use std::os::unix::process::CommandExt;
    let out =
        std::fs::File::create(log).with_context(|| format!("cannot create {}", log.display()))?;
    let mut command = Command::new(std::env::current_exe()?);
    command
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .env(
            "CORRAL_LOG",
            std::env::var("CORRAL_LOG").unwrap_or_else(|_| "info".into()),
        )
        .process_group(0);
    Ok(command)
}

/// Runs this binary's CLI inside `netns` against the lab; stdout on success.
fn corral_in(state: &LabState, netns: &Path, args: &[&str]) -> anyhow::Result<String> {
    let mut command = Command::new(std::env::current_exe()?);
    command.args(args).env("CORRAL_CONFIG", &state.config);
    let output = netns::output(Some(netns), &mut command)??;
    anyhow::ensure!(
        output.status.success(),
        "corral {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

fn wait_until(
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> bool,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    while !check() {
        if Instant::now() > deadline {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(())
}

fn stop_process(pid: u32) {
    use nix::sys::signal::{Signal, kill};
    let pid = nix::unistd::Pid::from_raw(pid as i32);
    let _ = kill(pid, Signal::SIGKILL);
    // It is not our child once `lab up` exited: wait for it to vanish.
    let deadline = Instant::now() + Duration::from_secs(5);
    while kill(pid, None).is_ok() && Instant::now() < deadline {
        let _ = nix::sys::wait::waitpid(pid, Some(nix::sys::wait::WaitPidFlag::WNOHANG));
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Removes everything under `dir`: the processes inside the lab's node
/// namespaces (server, agents), the containers in the pods' namespaces,
/// their runc state, mounts and cgroups, the namespaces, the directory.
pub fn down(dir: &Path) -> anyhow::Result<()> {
    if !dir.exists() {
        return Ok(());
    }
    let netns_dir = dir.join("netns");
    for entry in std::fs::read_dir(&netns_dir)
        .into_iter()
        .flatten()
        .flatten()
    {
        lab::kill_processes_in(&entry.path());
    }
    let node_dirs: Vec<PathBuf> = std::fs::read_dir(dir)?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.join("netns").is_dir() || p.join("runc").is_dir() || p.join("wireguard").is_dir()
        })
        .collect();
    for node_dir in &node_dirs {
        for pod_ns in std::fs::read_dir(node_dir.join("netns"))
            .into_iter()
            .flatten()
            .flatten()
        {
            lab::kill_processes_in(&pod_ns.path());
        }
        let runc_root = node_dir.join("runc");
        if runc_root.exists()
            && let Ok(listed) = Command::new("runc")
                .arg(format!("--root={}", runc_root.display()))
                .args(["list", "-q"])
                .output()
        {
            for id in String::from_utf8_lossy(&listed.stdout).lines() {
                let _ = Command::new("runc")
                    .arg(format!("--root={}", runc_root.display()))
                    .args(["delete", "--force", id.trim()])
                    .stderr(Stdio::null())
                    .status();
            }
        }
    }
    let first_error = lab::remove(&netns_dir).err();
    // wireguard-go, killed above, leaves its control socket behind.
    for node_dir in &node_dirs {
        let name_file = node_dir
            .join("wireguard")
            .join(corral_agent::tunnel::INTERFACE_FILE);
        if let Ok(name) = std::fs::read_to_string(name_file) {
            corral_net::wireguard::remove_stale_socket(name.trim(), Duration::from_secs(3));
        }
    }
    corral_runtime::mounts::unmount_all_under(dir);
    for node_dir in &node_dirs {
        corral_agent::leftover_cgroups::remove(node_dir);
    }
    std::fs::remove_dir_all(dir).with_context(|| format!("cannot remove {}", dir.display()))?;
    match first_error {
        Some(error) => Err(error).context("removing the lab's namespaces"),
        None => Ok(()),
    }
}

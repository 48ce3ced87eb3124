//! `corral-bench apply`: how many spec revisions per second corral's API
//! records, next to the same number of writes of the same bytes to etcd.
//!
//! Rows, each at every requested client count C (C concurrent tokio tasks
//! sharing N operations; client i always writes its own object):
//! - corral apply: `Client::apply` of a pod whose env changes every time, so
//!   every request is a new revision (an fsynced SQLite transaction plus the
//!   history record), through HTTP with a keep-alive connection pool, to
//!   `corral server` with its built-in controllers and one hollow node that
//!   works on none of its pods: each pod is placed and addressed once, before
//!   timing, then every revision's node steps wait for that node, as on a
//!   node busy elsewhere — the API's write path with no node reacting;
//! - corral apply (on etcd): the same, through `corral server --datastore
//!   etcd://…` on the benchmark's etcd (one raft-committed transaction per
//!   write, plus the reads that build the history delta);
//! - etcd v3 HTTP put: `POST /v3/kv/put` on etcd's JSON gateway with a
//!   keep-alive connection pool and the same bytes corral receives — the fair
//!   peer for "a store behind an HTTP API";
//! - etcdctl put (process per op): the literal command, one process each,
//!   which mostly measures process start-up; shown because it is what a shell
//!   script pays;
//! - floor: append the same bytes to a file and `fdatasync` it (one file per
//!   client) in the same temp dir — the disk's cost of one durable write.
//!
//! A second table gives the server CPU per write of the first three rows
//! (`utime + stime` of the server's processes over the row, divided by the
//! requests), which depends far less on the machine's load than ops/s, and
//! the CPU per write of the benchmark's own clients, which share the
//! machine with the server.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use clap::Args;
use corral_api::{Kind, Object, ObjectKey};
use corral_client::{Client, ClientConfig};
use serde_json::json;

use crate::hollow::{HollowCluster, HollowOptions, NodeSettings};
use crate::processes::{CorralProcess, EtcdProcess};
use crate::report::{self, Row};
use crate::{load, machine};

const CORRAL: &str = "corral apply";
const CORRAL_ETCD: &str = "corral apply (on etcd)";
const ETCD_HTTP: &str = "etcd v3 HTTP put";
const ETCDCTL: &str = "etcdctl put (process per op)";
const FLOOR: &str = "floor: write+fdatasync";
const NAMESPACE: &str = "default";
/// How long the busy node may take to be Ready, and a pod to be placed.
const PLACED_WITHIN: Duration = Duration::from_secs(60);

#[derive(Debug, Args)]
pub struct ApplyArgs {
    /// The corral binary to benchmark. Default: `corral` next to this binary
    /// (target/release/corral after `cargo build --release -p corral-cli`).
    #[arg(long, value_name = "PATH")]
    corral: Option<PathBuf>,
    /// Operations per row (per system and client count).
    #[arg(long, default_value_t = 2000)]
    requests: usize,
    /// Client counts to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,16")]
    clients: Vec<usize>,
    /// Rows to measure, comma-separated. Default: all. Only the processes
    /// those rows use are started (etcd for its rows and corral-etcd). For
    /// profiling one row on its own; the ratio column needs etcd-http.
    #[arg(long, value_delimiter = ',', value_enum)]
    only: Vec<Measured>,
}

/// The rows `--only` picks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Measured {
    Corral,
    CorralEtcd,
    EtcdHttp,
    Etcdctl,
    Floor,
}

pub async fn run(args: ApplyArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.requests > 0, "--requests must be at least 1");
    anyhow::ensure!(
        !args.clients.is_empty() && args.clients.iter().all(|c| *c > 0),
        "--clients must list counts of at least 1"
    );
    let corral_binary = match args.corral {
        Some(path) => path,
        None => default_corral_binary()?,
    };
    println!("machine: {}", machine::describe());
    println!("corral: {}", corral_binary.display());

    let measured = |row: Measured| args.only.is_empty() || args.only.contains(&row);
    // Only what the measured rows use is started: etcd for its own rows and
    // as corral's datastore, each corral server with its busy node.
    let wants_etcd = [Measured::CorralEtcd, Measured::EtcdHttp, Measured::Etcdctl]
        .into_iter()
        .any(measured);
    // `corral server`, not `corral up`: this measures the API's write path,
    // on both backends alike, without a node reacting to every revision
    // (the benchmark pod's image is not pullable; `pod-start` measures nodes).
    let (mut corral, mut etcd) = tokio::try_join!(
        started_if(
            measured(Measured::Corral),
            Served::start(&corral_binary, &["server"])
        ),
        started_if(wants_etcd, EtcdProcess::start())
    )?;
    // The same corral, as `corral server` on the benchmark's etcd.
    let mut corral_etcd = match &etcd {
        Some(etcd) if measured(Measured::CorralEtcd) => {
            let datastore = format!("etcd://{}", etcd.client_url.trim_start_matches("http://"));
            let command = ["server", "--datastore", &datastore];
            Some(Served::start(&corral_binary, &command).await?)
        }
        _ => None,
    };
    let http = reqwest::Client::builder()
        .timeout(corral_client::REQUEST_TIMEOUT)
        .build()?;
    let floor_dir = tempfile::Builder::new()
        .prefix("corral-bench-floor-")
        .tempdir()?;
    println!(
        "request body: {} bytes of pod JSON; temp dirs under {}",
        body(&pod("bench-c16-15", 0)).len(),
        std::env::temp_dir().display()
    );

    let mut rows = Vec::new();
    let mut cpu_rows = Vec::new();
    for &clients in &args.clients {
        let requests = args.requests;
        if let Some(corral) = &mut corral {
            println!("C={clients}: {CORRAL} …");
            let (summary, cpu) = row_cpu(
                &[corral.process.pid()],
                corral_apply(&corral.client, requests, clients),
            )
            .await?;
            rows.push(row(CORRAL, clients, summary));
            cpu_rows.push((CORRAL, clients, cpu.per_request(requests)));
            corral.process.ensure_running()?;
        }

        // Whose CPU each system's server side is: corral on etcd is both.
        if let (Some(corral_etcd), Some(etcd)) = (&mut corral_etcd, &etcd) {
            println!("C={clients}: {CORRAL_ETCD} …");
            let (summary, cpu) = row_cpu(
                &[corral_etcd.process.pid(), etcd.pid()],
                corral_apply(&corral_etcd.client, requests, clients),
            )
            .await?;
            rows.push(row(CORRAL_ETCD, clients, summary));
            cpu_rows.push((CORRAL_ETCD, clients, cpu.per_request(requests)));
            corral_etcd.process.ensure_running()?;
        }

        if let Some(etcd) = etcd.as_ref().filter(|_| measured(Measured::EtcdHttp)) {
            println!("C={clients}: {ETCD_HTTP} …");
            let (summary, cpu) = row_cpu(
                &[etcd.pid()],
                etcd_http_put(&http, &etcd.client_url, requests, clients),
            )
            .await?;
            rows.push(row(ETCD_HTTP, clients, summary));
            cpu_rows.push((ETCD_HTTP, clients, cpu.per_request(requests)));
        }

        if let Some(etcd) = etcd.as_mut().filter(|_| measured(Measured::Etcdctl)) {
            println!("C={clients}: {ETCDCTL} …");
            let summary = etcdctl_put(&etcd.client_url, requests, clients).await?;
            rows.push(row(ETCDCTL, clients, summary));
            etcd.ensure_running()?;
        }

        if measured(Measured::Floor) {
            println!("C={clients}: {FLOOR} …");
            let summary = fdatasync_floor(
                &floor_dir.path().join(format!("c{clients}")),
                requests,
                clients,
            )
            .await?;
            rows.push(row(FLOOR, clients, summary));
        }
    }
    let order = [CORRAL, CORRAL_ETCD, ETCD_HTTP, ETCDCTL, FLOOR];
    rows.sort_by_key(|row| {
        let system = order.iter().position(|name| *name == row.system);
        (system, row.clients)
    });
    println!();
    println!("load at the end: {}", machine::load());
    print!("{}", report::table(&rows, ETCD_HTTP));
    println!();
    print!("{}", cpu_table(&cpu_rows));
    Ok(())
}

/// A `corral server` under measurement, its admin client and its busy node.
struct Served {
    // Dropped first: the node goes before its server.
    _node: HollowCluster,
    client: Client,
    process: CorralProcess,
}

impl Served {
    /// Starts `corral COMMAND_ARGS` and its busy node: a pod on no node is
    /// placed again at each revision; one on a node is updated in place,
    /// which is what this measures.
    async fn start(binary: &std::path::Path, command_args: &[&str]) -> anyhow::Result<Served> {
        let process = CorralProcess::start_with(binary, command_args).await?;
        let client = Client::new(&process.config)?;
        let node = busy_node(&client, &process.config).await?;
        Ok(Served {
            _node: node,
            client,
            process,
        })
    }
}

/// `start`'s result when `wanted`, else `None` (and nothing started: the
/// future is never polled).
async fn started_if<T>(
    wanted: bool,
    start: impl std::future::Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<Option<T>> {
    if wanted {
        start.await.map(Some)
    } else {
        Ok(None)
    }
}

/// CPU time (user + system, all threads) over a row: the server's
/// processes, and this benchmark's own (its clients: encoding requests,
/// TLS or plain HTTP, decoding answers).
#[derive(Debug, Clone, Copy)]
struct RowCpu {
    server: Duration,
    client: Duration,
}

impl RowCpu {
    fn per_request(self, requests: usize) -> RowCpu {
        RowCpu {
            server: self.server / count(requests),
            client: self.client / count(requests),
        }
    }
}

/// Runs `work` and returns its result with the CPU time the server
/// processes `pids` and this process used meanwhile: what a write costs
/// each side, which — unlike ops/s — hardly depends on what else the
/// machine is doing.
async fn row_cpu<T>(
    pids: &[u32],
    work: impl std::future::Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<(T, RowCpu)> {
    let total = || -> anyhow::Result<RowCpu> {
        let server = pids
            .iter()
            .map(|pid| crate::scale::cpu_time(Some(*pid)))
            .sum::<anyhow::Result<Duration>>()?;
        let client = crate::scale::cpu_time(None)?;
        Ok(RowCpu { server, client })
    };
    let before = total()?;
    let result = work.await?;
    let after = total()?;
    let used = RowCpu {
        server: after.server.saturating_sub(before.server),
        client: after.client.saturating_sub(before.client),
    };
    Ok((result, used))
}

/// `requests` as a divisor of a [`Duration`].
pub(crate) fn count(requests: usize) -> u32 {
    u32::try_from(requests).unwrap_or(u32::MAX).max(1)
}

/// Server CPU per write beside etcd's for its HTTP put at the same client
/// count, and what the benchmark's clients spent per write. For `corral
/// apply` the measured window also holds the benchmark's unmeasured creates
/// and history checks, a few per client.
fn cpu_table(rows: &[(&str, usize, RowCpu)]) -> String {
    let mut out = String::from(
        "| system | clients | server CPU per write (its processes) | ÷ etcd v3 HTTP put | client CPU per write (this benchmark) |\n|---|---:|---:|---:|---:|\n",
    );
    for (system, clients, cpu) in rows {
        let base = rows
            .iter()
            .find(|(other, c, _)| *other == ETCD_HTTP && c == clients)
            .map(|(_, _, base)| base.server);
        let ratio = match base {
            Some(base) if !base.is_zero() => {
                format!("{:.2}×", cpu.server.as_secs_f64() / base.as_secs_f64())
            }
            _ => "-".into(),
        };
        let who = match *system {
            CORRAL => "corral",
            CORRAL_ETCD => "corral + etcd",
            _ => "etcd",
        };
        out.push_str(&format!(
            "| {system} | {clients} | {:.0} µs ({who}) | {ratio} | {:.0} µs |\n",
            cpu.server.as_secs_f64() * 1e6,
            cpu.client.as_secs_f64() * 1e6
        ));
    }
    out
}

fn row(system: &str, clients: usize, summary: crate::stats::Summary) -> Row {
    Row {
        system: system.into(),
        clients,
        summary,
    }
}

/// `corral` in the directory of the running binary.
pub fn default_corral_binary() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("cannot locate this binary")?;
    let dir = exe
        .parent()
        .context("this binary has no parent directory")?;
    Ok(dir.join("corral"))
}

/// Pod `name` at revision `revision`: about 500 bytes of JSON, the env value
/// changing with every revision.
fn pod(name: &str, revision: usize) -> Object {
    let spec = json!({
        "containers": [{
            "name": "app",
            "image": "registry.example.com/bench/app:1.24.3",
            "command": ["/usr/local/bin/app"],
            "args": ["--listen=:8080", "--log-format=json", "--cache-dir=/var/cache/app"],
            "env": {
                "BENCH_REVISION": revision.to_string(),
                "DATABASE_URL": "postgres://app@db.default.svc:5432/app",
                "FEATURE_FLAGS": "search,recommendations,new-checkout",
                "LOG_LEVEL": "info",
            },
            "ports": [8080, 9090],
            "resources": {"cpu": "500m", "memory": "256Mi"},
        }],
    });
    Object::new(Kind::Pod, Some(NAMESPACE), name, spec)
}

fn body(object: &Object) -> Vec<u8> {
    // INVARIANT: an Object is plain data (strings, numbers, maps) and always serialises.
    serde_json::to_vec(object).unwrap_or_default()
}

async fn corral_apply(
    client: &Client,
    requests: usize,
    clients: usize,
) -> anyhow::Result<crate::stats::Summary> {
    let name = move |client_index: usize| format!("bench-c{clients}-{client_index}");
    // Create every pod first, unmeasured, so each measured request is an
    // update, and wait until each is placed and addressed.
    for client_index in 0..clients {
        client
            .apply(&pod(&name(client_index), 0), Some("bench: create"))
            .await
            .context("cannot create the benchmark pods")?;
    }
    for client_index in 0..clients {
        wait_placed(client, &pod(&name(client_index), 0).key()).await?;
    }
    let api = client.clone();
    let summary = load::run(requests, clients, move |client_index, sequence| {
        let api = api.clone();
        async move {
            let object = pod(&name(client_index), sequence + 1);
            api.apply(&object, Some("bench")).await?;
            Ok(())
        }
    })
    .await?;
    // Every request must have made a revision, or this measured something else.
    for client_index in 0..clients {
        let key = pod(&name(client_index), 0).key();
        let revisions = client.history(&key).await?.len();
        let expected = load::share(requests, clients, client_index) + 1;
        if revisions != expected {
            bail!(
                "{} has {revisions} revisions, expected {expected}",
                key.name
            );
        }
    }
    Ok(summary)
}

/// One hollow node, Ready, that works on none of its pods.
async fn busy_node(admin: &Client, config: &ClientConfig) -> anyhow::Result<HollowCluster> {
    let options = HollowOptions {
        nodes: 1,
        name_prefix: "bench-busy".into(),
        node: NodeSettings {
            index: 0,
            pod_capacity: 1_000,
            heartbeat: Duration::from_secs(5),
            parallel_pods: 0,
        },
    };
    let node = HollowCluster::start(admin, config, &options).await?;
    node.wait_ready(admin, PLACED_WITHIN).await?;
    Ok(node)
}

/// Waits until pod `key` is bound to a node and has its address.
async fn wait_placed(client: &Client, key: &ObjectKey) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    loop {
        let pod = client.get(key).await?;
        let set = |field: &str| pod.status.get(field).is_some_and(|v| v.is_string());
        if set("node") && set("address") {
            return Ok(());
        }
        if started.elapsed() > PLACED_WITHIN {
            bail!("{key} was not placed and addressed within {PLACED_WITHIN:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn etcd_key(clients: usize, client_index: usize) -> String {
    format!("/registry/pods/{NAMESPACE}/bench-c{clients}-{client_index}")
}

async fn etcd_http_put(
    http: &reqwest::Client,
    client_url: &str,
    requests: usize,
    clients: usize,
) -> anyhow::Result<crate::stats::Summary> {
    let url = format!("{client_url}/v3/kv/put");
    let put = move |http: reqwest::Client, url: String, client_index: usize, revision: usize| async move {
        let key = etcd_key(clients, client_index);
        let value = body(&pod(&key, revision));
        let request = json!({"key": BASE64.encode(key), "value": BASE64.encode(value)});
        let response = http.post(&url).json(&request).send().await?;
        let status = response.status();
        let answer = response.bytes().await?;
        if !status.is_success() {
            bail!(
                "etcd answered {status}: {}",
                String::from_utf8_lossy(&answer)
            );
        }
        anyhow::Ok(())
    };
    for client_index in 0..clients {
        put(http.clone(), url.clone(), client_index, 0)
            .await
            .context("cannot create the benchmark keys in etcd")?;
    }
    let http = http.clone();
    load::run(requests, clients, move |client_index, sequence| {
        put(http.clone(), url.clone(), client_index, sequence + 1)
    })
    .await
}

async fn etcdctl_put(
    client_url: &str,
    requests: usize,
    clients: usize,
) -> anyhow::Result<crate::stats::Summary> {
    let client_url = client_url.to_string();
    load::run(requests, clients, move |client_index, sequence| {
        let client_url = client_url.clone();
        async move {
            let key = etcd_key(clients, client_index);
            let value = String::from_utf8(body(&pod(&key, sequence + 1)))?;
            let output = tokio::process::Command::new("etcdctl")
                .env("ETCDCTL_API", "3")
                .args(["--endpoints", &client_url, "put", &key, &value])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .kill_on_drop(true)
                .output()
                .await
                .context("cannot run etcdctl (Debian: apt-get install etcd-client)")?;
            if !output.status.success() {
                bail!(
                    "etcdctl put failed ({}): {}",
                    output.status,
                    String::from_utf8_lossy(&output.stderr)
                );
            }
            Ok(())
        }
    })
    .await
}

async fn fdatasync_floor(
    dir: &std::path::Path,
    requests: usize,
    clients: usize,
) -> anyhow::Result<crate::stats::Summary> {
    std::fs::create_dir_all(dir)?;
    let files = (0..clients)
        .map(|client_index| {
            let path = dir.join(format!("client-{client_index}"));
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .map(Mutex::new)
                .with_context(|| format!("cannot open {}", path.display()))
        })
        .collect::<anyhow::Result<Vec<Mutex<File>>>>()?;
    let files = Arc::new(files);
    let value = Arc::new(body(&pod("bench-floor", 1)));
    load::run(requests, clients, move |client_index, _| {
        let files = files.clone();
        let value = value.clone();
        async move {
            tokio::task::spawn_blocking(move || {
                let mut file = files[client_index]
                    .lock()
                    .map_err(|_| anyhow::anyhow!("floor file lock poisoned"))?;
                file.write_all(&value)?;
                file.sync_data()?;
                anyhow::Ok(())
            })
            .await?
        }
    })
    .await
}

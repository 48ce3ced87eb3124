//! Real etcd clusters (Debian's `etcd-server`) of one or more members on
//! loopback ports, each member in its own temp data dir, killed and removed
//! on drop.

use std::fs::{self, File};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::unique_name;

/// How long a cluster may take to answer health checks: on a loaded
/// 2-core machine (QEMU guests and a browser in other tests) a single
/// member once took more than 30 s.
const READY_TIMEOUT: Duration = Duration::from_secs(90);

fn free_loopback_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("bind a free loopback port")
}

/// One etcd process: its name, ports, data dir and log.
#[derive(Debug)]
pub struct EtcdMember {
    name: String,
    client: SocketAddr,
    peer: SocketAddr,
    data_dir: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

impl EtcdMember {
    /// `http://127.0.0.1:<client port>`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.client)
    }

    /// `127.0.0.1:<client port>`, as `etcd://` URLs want it.
    pub fn client_addr(&self) -> SocketAddr {
        self.client
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    fn spawn(&mut self, initial_cluster: &str, token: &str, state: &str) {
        let binary = crate::require_tool("etcd");
        let log = File::options()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("open etcd log");
        let child = Command::new(binary)
            .arg("--name")
            .arg(&self.name)
            .arg("--data-dir")
            .arg(&self.data_dir)
            .arg("--listen-client-urls")
            .arg(format!("http://{}", self.client))
            .arg("--advertise-client-urls")
            .arg(format!("http://{}", self.client))
            .arg("--listen-peer-urls")
            .arg(format!("http://{}", self.peer))
            .arg("--initial-advertise-peer-urls")
            .arg(format!("http://{}", self.peer))
            .arg("--initial-cluster")
            .arg(initial_cluster)
            .arg("--initial-cluster-token")
            .arg(token)
            .arg("--initial-cluster-state")
            .arg(state)
            .arg("--logger")
            .arg("zap")
            .arg("--log-level")
            .arg("warn")
            // Elections in a loaded 2-core CI box: be patient.
            .arg("--heartbeat-interval")
            .arg("100")
            .arg("--election-timeout")
            .arg("1000")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone etcd log fd"))
            .stderr(log)
            .spawn()
            .expect("spawn etcd");
        self.child = Some(child);
    }

    /// SIGKILLs the process (no graceful shutdown) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// A running etcd cluster. Dropping it kills every member and removes
/// their data.
#[derive(Debug)]
pub struct EtcdCluster {
    members: Vec<EtcdMember>,
    initial_cluster: String,
    token: String,
    dir: tempfile::TempDir,
}

impl EtcdCluster {
    /// Starts `size` members (1 or 3 are the useful sizes) and waits until
    /// every one answers `etcdctl endpoint health`.
    pub fn start(size: usize) -> Self {
        assert!(size >= 1, "an etcd cluster needs at least one member");
        let dir = tempfile::Builder::new()
            .prefix("corral-etcd-")
            .tempdir()
            .expect("create etcd temp dir");
        let token = unique_name("corral-etcd");
        let mut members: Vec<EtcdMember> = (0..size)
            .map(|index| {
                let name = format!("member-{index}");
                EtcdMember {
                    data_dir: dir.path().join(format!("{name}.etcd")),
                    log: dir.path().join(format!("{name}.log")),
                    name,
                    client: free_loopback_addr(),
                    peer: free_loopback_addr(),
                    child: None,
                }
            })
            .collect();
        let initial_cluster = members
            .iter()
            .map(|member| format!("{}=http://{}", member.name, member.peer))
            .collect::<Vec<_>>()
            .join(",");
        for member in &mut members {
            member.spawn(&initial_cluster, &token, "new");
        }
        let cluster = Self {
            members,
            initial_cluster,
            token,
            dir,
        };
        cluster.wait_healthy();
        cluster
    }

    /// The client URLs of the running members.
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .filter(|member| member.is_running())
            .map(EtcdMember::endpoint)
            .collect()
    }

    /// `etcd://127.0.0.1:A,127.0.0.1:B,…` over every member (running or
    /// not, as a configured server would list them).
    pub fn datastore_url(&self) -> String {
        let hosts: Vec<String> = self
            .members
            .iter()
            .map(|member| member.client.to_string())
            .collect();
        format!("etcd://{}", hosts.join(","))
    }

    pub fn members(&self) -> &[EtcdMember] {
        &self.members
    }

    /// SIGKILLs member `index`.
    pub fn kill_member(&mut self, index: usize) {
        self.members[index].kill();
    }

    /// Starts a killed member again on its old data dir and waits for it.
    pub fn restart_member(&mut self, index: usize) {
        let (initial_cluster, token) = (self.initial_cluster.clone(), self.token.clone());
        let member = &mut self.members[index];
        if !member.is_running() {
            member.spawn(&initial_cluster, &token, "existing");
        }
        self.wait_healthy();
    }

    /// Waits until every running member reports healthy.
    pub fn wait_healthy(&self) {
        let etcdctl = crate::require_tool("etcdctl");
        let deadline = Instant::now() + READY_TIMEOUT;
        for member in self.members.iter().filter(|member| member.is_running()) {
            loop {
                let healthy = Command::new(&etcdctl)
                    .env("ETCDCTL_API", "3")
                    .arg("--endpoints")
                    .arg(member.endpoint())
                    .arg("--command-timeout=2s")
                    .arg("endpoint")
                    .arg("health")
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|status| status.success());
                if healthy {
                    break;
                }
                if Instant::now() > deadline {
                    panic!(
                        "etcd {} at {} was not healthy within {READY_TIMEOUT:?}; its log:\n{}",
                        member.name,
                        member.endpoint(),
                        member.log_text()
                    );
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }

    /// Where the members keep their data and logs.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for member in &mut self.members {
            member.kill();
        }
    }
}

/// A one-member cluster, for tests that need an etcd but not HA.
pub fn single() -> EtcdCluster {
    EtcdCluster::start(1)
}

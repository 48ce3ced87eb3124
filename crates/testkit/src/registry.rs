//! A real `docker-registry` (Debian's distribution 2.8) on a loopback port,
//! killed on drop, and a minimal distribution-API push of an OCI layout tar.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Read;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// A running registry; dropping it kills the process.
#[derive(Debug)]
pub struct RegistryServer {
    child: Child,
    addr: SocketAddr,
    log: PathBuf,
}

fn free_loopback_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind a free loopback port")
        .port()
}

impl RegistryServer {
    /// Starts `docker-registry` storing into `dir/storage`, listening on
    /// 127.0.0.1 only, and waits until `/v2/` answers.
    pub fn start(dir: &Path) -> Self {
        let binary = crate::require_tool("docker-registry");
        let addr: SocketAddr = ([127, 0, 0, 1], free_loopback_port()).into();
        let storage = dir.join("storage");
        fs::create_dir_all(&storage).expect("create registry storage dir");
        let config = dir.join("config.yml");
        fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {addr}\n",
                storage.display()
            ),
        )
        .expect("write registry config");
        let log = dir.join("registry.log");
        let log_file = File::create(&log).expect("create registry log");
        let child = Command::new(binary)
            .arg("serve")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().expect("clone log fd"))
            .stderr(log_file)
            .spawn()
            .expect("spawn docker-registry");
        let server = Self { child, addr, log };
        server.wait_ready();
        server
    }

    fn wait_ready(&self) {
        let client = client();
        let deadline = Instant::now() + Duration::from_secs(15);
        let url = format!("http://{}/v2/", self.addr);
        while Instant::now() < deadline {
            if client
                .get(&url)
                .send()
                .is_ok_and(|r| r.status().is_success())
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "docker-registry did not answer on {url} within 15 s; its log:\n{}",
            fs::read_to_string(&self.log).unwrap_or_default()
        );
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for RegistryServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("build HTTP client")
}

fn push_blob(
    client: &reqwest::blocking::Client,
    base: &str,
    repo: &str,
    digest: &str,
    bytes: Vec<u8>,
) {
    let start = client
        .post(format!("{base}/v2/{repo}/blobs/uploads/"))
        .send()
        .expect("start blob upload");
    assert_eq!(start.status().as_u16(), 202, "start upload of {digest}");
    let location = start
        .headers()
        .get("location")
        .and_then(|v| v.to_str().ok())
        .expect("upload Location header")
        .to_string();
    let location = if location.starts_with("http") {
        location
    } else {
        format!("{base}{location}")
    };
    let separator = if location.contains('?') { '&' } else { '?' };
    let done = client
        .put(format!("{location}{separator}digest={digest}"))
        .header("content-type", "application/octet-stream")
        .body(bytes)
        .send()
        .expect("finish blob upload");
    assert_eq!(done.status().as_u16(), 201, "finish upload of {digest}");
}

/// Pushes the (single-image) OCI layout tar `tar_path` to `registry` as
/// `repo:tag` with the distribution API: monolithic blob uploads
/// (POST + PUT), then PUT of the manifest.
pub fn push_oci_layout(registry: SocketAddr, repo: &str, tag: &str, tar_path: &Path) {
    let mut files = BTreeMap::new();
    let mut archive = tar::Archive::new(File::open(tar_path).expect("open OCI layout tar"));
    for entry in archive.entries().expect("read OCI layout tar") {
        let mut entry = entry.expect("tar entry");
        let name = entry.path().expect("entry path").display().to_string();
        let mut bytes = Vec::new();
        entry.read_to_end(&mut bytes).expect("read tar entry");
        files.insert(name, bytes);
    }
    let blob = |digest: &str| -> Vec<u8> {
        let hex = digest.trim_start_matches("sha256:");
        files
            .get(&format!("blobs/sha256/{hex}"))
            .cloned()
            .unwrap_or_else(|| panic!("layout has no blob {digest}"))
    };
    let index: Value = serde_json::from_slice(&files["index.json"]).expect("parse index.json");
    let manifest_digest = index["manifests"][0]["digest"]
        .as_str()
        .expect("index manifest digest");
    let manifest_bytes = blob(manifest_digest);
    let manifest: Value = serde_json::from_slice(&manifest_bytes).expect("parse manifest");
    let client = client();
    let base = format!("http://{registry}");
    let config_digest = manifest["config"]["digest"]
        .as_str()
        .expect("config digest");
    let layers = manifest["layers"].as_array().expect("layers");
    for digest in layers
        .iter()
        .map(|l| l["digest"].as_str().expect("layer digest"))
        .chain([config_digest])
    {
        push_blob(&client, &base, repo, digest, blob(digest));
    }
    let media_type = manifest["mediaType"]
        .as_str()
        .unwrap_or("application/vnd.oci.image.manifest.v1+json");
    let put = client
        .put(format!("{base}/v2/{repo}/manifests/{tag}"))
        .header("content-type", media_type)
        .body(manifest_bytes)
        .send()
        .expect("put manifest");
    assert_eq!(
        put.status().as_u16(),
        201,
        "put manifest: {}",
        put.text().unwrap_or_default()
    );
}

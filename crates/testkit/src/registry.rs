//! A real `docker-registry` (Debian's distribution 2.8) on a loopback port,
//! killed on drop — plain, or with TLS from a test CA and htpasswd auth —
//! and a minimal distribution-API push of an OCI layout tar.

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
    /// The CA that signed its certificate, when it speaks TLS.
    ca_pem: Option<String>,
    /// The user and password its htpasswd file admits.
    credentials: Option<(String, String)>,
}

/// A test CA (made with rcgen) and a server certificate for 127.0.0.1
/// signed by it, as PEM.
#[derive(Debug, Clone)]
pub struct TestCa {
    pub ca_pem: String,
    pub server_cert_pem: String,
    pub server_key_pem: String,
}

impl TestCa {
    /// A fresh CA and a certificate for `127.0.0.1` and `localhost`.
    pub fn for_loopback() -> Self {
        use rcgen::{
            BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair,
            KeyUsagePurpose,
        };
        let mut ca_params = CertificateParams::default();
        let mut name = DistinguishedName::new();
        name.push(DnType::CommonName, "corral test registry CA");
        ca_params.distinguished_name = name;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_key = KeyPair::generate().expect("generate CA key");
        let ca_pem = ca_params.self_signed(&ca_key).expect("self-sign CA").pem();
        let issuer = Issuer::new(ca_params, ca_key);
        let key = KeyPair::generate().expect("generate server key");
        let params = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
            .expect("server cert params");
        let cert = params.signed_by(&key, &issuer).expect("sign server cert");
        Self {
            ca_pem,
            server_cert_pem: cert.pem(),
            server_key_pem: key.serialize_pem(),
        }
    }
}

/// A bcrypt htpasswd line, as `htpasswd -B` writes (registry 2.8 accepts
/// only bcrypt).
pub fn htpasswd_line(user: &str, password: &str) -> String {
    let hash = bcrypt::hash(password, 4).expect("bcrypt hash");
    format!("{user}:{hash}\n")
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
        Self::start_with(dir, None, None)
    }

    /// Starts one serving HTTPS with `ca`'s server certificate and
    /// admitting only `user`/`password` (htpasswd, HTTP basic auth).
    pub fn start_secure(dir: &Path, ca: &TestCa, user: &str, password: &str) -> Self {
        Self::start_with(dir, Some(ca), Some((user, password)))
    }

    fn start_with(dir: &Path, tls: Option<&TestCa>, auth: Option<(&str, &str)>) -> Self {
        let binary = crate::require_tool("docker-registry");
        let addr: SocketAddr = ([127, 0, 0, 1], free_loopback_port()).into();
        let storage = dir.join("storage");
        fs::create_dir_all(&storage).expect("create registry storage dir");
        let mut text = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {addr}\n",
            storage.display()
        );
        if let Some(ca) = tls {
            let (cert, key) = (dir.join("server.crt"), dir.join("server.key"));
            fs::write(&cert, &ca.server_cert_pem).expect("write server cert");
            fs::write(&key, &ca.server_key_pem).expect("write server key");
            text.push_str(&format!(
                "  tls:\n    certificate: {}\n    key: {}\n",
                cert.display(),
                key.display()
            ));
        }
        if let Some((user, password)) = auth {
            let htpasswd = dir.join("htpasswd");
            fs::write(&htpasswd, htpasswd_line(user, password)).expect("write htpasswd");
            text.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: corral-test\n    path: {}\n",
                htpasswd.display()
            ));
        }
        let config = dir.join("config.yml");
        fs::write(&config, text).expect("write registry config");
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
        let server = Self {
            child,
            addr,
            log,
            ca_pem: tls.map(|ca| ca.ca_pem.clone()),
            credentials: auth.map(|(u, p)| (u.to_string(), p.to_string())),
        };
        server.wait_ready();
        server
    }

    fn wait_ready(&self) {
        let client = self.client();
        let deadline = Instant::now() + Duration::from_secs(15);
        let url = format!("{}/v2/", self.base_url());
        while Instant::now() < deadline {
            // Any HTTP answer (401 with auth on) means it serves.
            if client.get(&url).send().is_ok() {
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

    /// `http://127.0.0.1:<port>` or `https://…` when it speaks TLS.
    pub fn base_url(&self) -> String {
        let scheme = if self.ca_pem.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}", self.addr)
    }

    /// The PEM of the CA its certificate chains to, when it speaks TLS.
    pub fn ca_pem(&self) -> Option<&str> {
        self.ca_pem.as_deref()
    }

    /// A Docker `config.json` holding its credentials (`{"auths": {}}`
    /// when it wants none), as a node's `--registry-auth` file.
    pub fn docker_config_json(&self) -> String {
        use base64::Engine as _;
        match &self.credentials {
            Some((user, password)) => {
                let auth =
                    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
                format!(r#"{{"auths": {{"{}": {{"auth": "{auth}"}}}}}}"#, self.addr)
            }
            None => r#"{"auths": {}}"#.to_string(),
        }
    }

    /// Writes its CA as `certs_dir/127.0.0.1:PORT/ca.crt`, the layout a
    /// node's `--registry-certs-dir` reads.
    pub fn install_ca(&self, certs_dir: &Path) {
        let pem = self.ca_pem.as_deref().expect("the registry speaks TLS");
        let dir = certs_dir.join(self.addr.to_string());
        fs::create_dir_all(&dir).expect("create the registry's certs dir");
        fs::write(dir.join("ca.crt"), pem).expect("write ca.crt");
    }

    /// A client trusting its CA (when it speaks TLS).
    fn client(&self) -> reqwest::blocking::Client {
        let mut builder = reqwest::blocking::Client::builder().timeout(Duration::from_secs(30));
        if let Some(pem) = &self.ca_pem {
            builder = builder.add_root_certificate(
                reqwest::Certificate::from_pem(pem.as_bytes()).expect("parse test CA"),
            );
        }
        builder.build().expect("build HTTP client")
    }

    /// Pushes an OCI layout tar as `repo:tag`, over TLS and with
    /// credentials when the registry wants them.
    pub fn push(&self, repo: &str, tag: &str, tar_path: &Path) {
        let target = PushTarget {
            client: self.client(),
            base: self.base_url(),
            credentials: self.credentials.clone(),
        };
        push_layout(&target, repo, tag, tar_path);
    }
}

/// Where a push goes.
struct PushTarget {
    client: reqwest::blocking::Client,
    base: String,
    credentials: Option<(String, String)>,
}

impl PushTarget {
    fn authorized(
        &self,
        request: reqwest::blocking::RequestBuilder,
    ) -> reqwest::blocking::RequestBuilder {
        match &self.credentials {
            Some((user, password)) => request.basic_auth(user, Some(password)),
            None => request,
        }
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

fn push_blob(target: &PushTarget, repo: &str, digest: &str, bytes: Vec<u8>) {
    let base = &target.base;
    let start = target
        .authorized(
            target
                .client
                .post(format!("{base}/v2/{repo}/blobs/uploads/")),
        )
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
    let done = target
        .authorized(
            target
                .client
                .put(format!("{location}{separator}digest={digest}")),
        )
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
    let target = PushTarget {
        client: client(),
        base: format!("http://{registry}"),
        credentials: None,
    };
    push_layout(&target, repo, tag, tar_path);
}

fn push_layout(target: &PushTarget, repo: &str, tag: &str, tar_path: &Path) {
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
    let base = &target.base;
    let config_digest = manifest["config"]["digest"]
        .as_str()
        .expect("config digest");
    let layers = manifest["layers"].as_array().expect("layers");
    for digest in layers
        .iter()
        .map(|l| l["digest"].as_str().expect("layer digest"))
        .chain([config_digest])
    {
        push_blob(target, repo, digest, blob(digest));
    }
    let media_type = manifest["mediaType"]
        .as_str()
        .unwrap_or("application/vnd.oci.image.manifest.v1+json");
    let put = target
        .authorized(
            target
                .client
                .put(format!("{base}/v2/{repo}/manifests/{tag}")),
        )
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

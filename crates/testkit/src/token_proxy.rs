//! A registry token server in front of a real `docker-registry`: what the
//! distribution token flow looks like to a client (Docker Hub, GHCR,
//! Harbor), on loopback. `/token` issues bearer tokens for the right basic
//! credentials; `/v2/…` answers 401 with a `Bearer` challenge unless the
//! request carries an issued token, and otherwise forwards the GET to the
//! registry behind. Stops on drop.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;

/// What the proxy saw, for assertions.
#[derive(Debug, Default)]
struct Seen {
    /// Scopes asked for at `/token` with the right credentials.
    token_scopes: Vec<String>,
    /// `/token` requests refused (no or wrong credentials).
    refused_token_requests: usize,
    issued: Vec<String>,
}

/// A running token-auth front; dropping it stops it.
#[derive(Debug)]
pub struct TokenAuthProxy {
    addr: SocketAddr,
    seen: Arc<Mutex<Seen>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

struct Shared {
    backend: String,
    /// The `Authorization` a token request must carry; `None`: tokens for
    /// anyone (Docker Hub's public images).
    basic: Option<String>,
    realm: String,
    seen: Arc<Mutex<Seen>>,
}

impl TokenAuthProxy {
    /// Serves on a loopback port in front of `backend` (`http://HOST:PORT`
    /// of a plain registry), issuing tokens to `user`/`password`.
    pub fn start(backend: &str, user: &str, password: &str) -> Self {
        let basic = format!("Basic {}", BASE64.encode(format!("{user}:{password}")));
        Self::start_with(backend, Some(basic))
    }

    /// Like [`start`](Self::start), but tokens are issued to anyone, as
    /// Docker Hub does for public images (the 401 and the token dance are
    /// still required).
    pub fn start_anonymous(backend: &str) -> Self {
        Self::start_with(backend, None)
    }

    fn start_with(backend: &str, basic: Option<String>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind token proxy");
        let addr = listener.local_addr().expect("token proxy address");
        let seen = Arc::new(Mutex::new(Seen::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let shared = Arc::new(Shared {
            backend: backend.trim_end_matches('/').to_string(),
            basic,
            realm: format!("http://{addr}/token"),
            seen: seen.clone(),
        });
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stopping.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(stream) = stream else { continue };
                let shared = shared.clone();
                std::thread::spawn(move || {
                    let _ = serve(stream, &shared);
                });
            }
        });
        Self {
            addr,
            seen,
            stop,
            thread: Some(thread),
        }
    }

    /// `127.0.0.1:<port>`: the registry name to pull from.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The scopes tokens were issued for, in order.
    pub fn token_scopes(&self) -> Vec<String> {
        self.seen.lock().expect("lock").token_scopes.clone()
    }

    /// How many `/token` requests came without the right credentials.
    pub fn refused_token_requests(&self) -> usize {
        self.seen.lock().expect("lock").refused_token_requests
    }
}

impl Drop for TokenAuthProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

struct Request {
    method: String,
    target: String,
    authorization: Option<String>,
}

fn read_request(stream: &TcpStream) -> std::io::Result<Request> {
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_string();
    let target = parts.next().unwrap_or_default().to_string();
    let mut authorization = None;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header)? == 0 || header.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':')
            && name.trim().eq_ignore_ascii_case("authorization")
        {
            authorization = Some(value.trim().to_string());
        }
    }
    Ok(Request {
        method,
        target,
        authorization,
    })
}

fn respond(
    mut stream: &TcpStream,
    status: u16,
    headers: &[(&str, String)],
    body: &[u8],
) -> std::io::Result<()> {
    let mut head = format!(
        "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    stream.write_all(body)?;
    stream.flush()
}

fn query_value(target: &str, key: &str) -> Option<String> {
    let query = target.split_once('?')?.1;
    form_pairs(query).find(|(k, _)| k == key).map(|(_, v)| v)
}

fn form_pairs(query: &str) -> impl Iterator<Item = (String, String)> + '_ {
    query.split('&').filter_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        Some((decode(k), decode(v)))
    })
}

fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => out.push(b),
                    Err(_) => out.extend_from_slice(&bytes[i..i + 3]),
                }
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn serve(stream: TcpStream, shared: &Shared) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let request = read_request(&stream)?;
    if request.method != "GET" {
        return respond(&stream, 405, &[], b"only GET");
    }
    if request.target.starts_with("/token") {
        let mut seen = shared.seen.lock().expect("lock");
        if let Some(basic) = &shared.basic
            && request.authorization.as_deref() != Some(basic.as_str())
        {
            seen.refused_token_requests += 1;
            drop(seen);
            return respond(&stream, 401, &[], br#"{"details":"bad credentials"}"#);
        }
        let scope = query_value(&request.target, "scope").unwrap_or_default();
        seen.token_scopes.push(scope);
        let token = format!("token-{}", seen.issued.len() + 1);
        seen.issued.push(token.clone());
        drop(seen);
        let body = format!(r#"{{"token":"{token}","expires_in":300}}"#);
        return respond(
            &stream,
            200,
            &[("Content-Type", "application/json".to_string())],
            body.as_bytes(),
        );
    }
    let issued = request
        .authorization
        .as_deref()
        .and_then(|a| a.strip_prefix("Bearer "))
        .is_some_and(|t| {
            shared
                .seen
                .lock()
                .expect("lock")
                .issued
                .iter()
                .any(|i| i == t)
        });
    if !issued {
        let repository = request
            .target
            .strip_prefix("/v2/")
            .and_then(|rest| {
                rest.rfind("/manifests/")
                    .or_else(|| rest.rfind("/blobs/"))
                    .map(|end| rest[..end].to_string())
            })
            .unwrap_or_default();
        let challenge = format!(
            r#"Bearer realm="{}",service="corral-test",scope="repository:{repository}:pull""#,
            shared.realm
        );
        return respond(&stream, 401, &[("WWW-Authenticate", challenge)], b"{}");
    }
    let forwarded = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .and_then(|c| {
            let mut request_to = c.get(format!("{}{}", shared.backend, request.target));
            for accept in [
                "application/vnd.oci.image.manifest.v1+json",
                "application/vnd.oci.image.index.v1+json",
                "application/vnd.docker.distribution.manifest.v2+json",
                "application/vnd.docker.distribution.manifest.list.v2+json",
            ] {
                request_to = request_to.header("Accept", accept);
            }
            request_to.send()
        });
    let Ok(mut answer) = forwarded else {
        return respond(&stream, 502, &[], b"backend unreachable");
    };
    let status = answer.status().as_u16();
    let mut headers = Vec::new();
    for name in ["content-type", "docker-content-digest"] {
        if let Some(value) = answer.headers().get(name).and_then(|v| v.to_str().ok()) {
            headers.push((name, value.to_string()));
        }
    }
    let mut body = Vec::new();
    answer.read_to_end(&mut body)?;
    respond(&stream, status, &headers, &body)
}

//! Latency the default LB's proxy adds, in-process on loopback: a client
//! reaching a backend on `[::1]` directly against the same client reaching
//! it through the proxy's IPv4 frontend on 127.0.0.1 (IPv4 in, IPv6 out,
//! as in a cluster). Two shapes, interleaved in batches so both paths see
//! the same machine noise:
//!
//! - `connect`: a new TCP connection per request (connect, 64-byte request,
//!   64-byte response, close) — what the proxy adds per connection;
//! - `round trip`: 64-byte ping-pong on one open connection — what it adds
//!   per message once connected.
//!
//! Run: `cargo run --release -p corral-controllers --example lb_bench`.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};
use std::time::{Duration, Instant};

use corral_api::{Kind, ObjectKey};
use corral_controllers::loadbalancer::plan::{Frontends, Route};
use corral_controllers::loadbalancer::proxy::Proxy;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

const MESSAGE: usize = 64;
const CONNECTS: usize = 4000;
const ROUND_TRIPS: usize = 40_000;
const BATCH: usize = 200;

/// A backend answering every 64-byte message with 64 bytes, until EOF.
async fn backend() -> SocketAddrV6 {
    let listener = TcpListener::bind((Ipv6Addr::LOCALHOST, 0))
        .await
        .expect("bind the backend");
    let SocketAddr::V6(address) = listener.local_addr().expect("backend address") else {
        unreachable!("bound on ::1")
    };
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let _ = stream.set_nodelay(true);
            tokio::spawn(async move {
                let mut buffer = [0u8; MESSAGE];
                while stream.read_exact(&mut buffer).await.is_ok() {
                    if stream.write_all(&buffer).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    address
}

async fn exchange(stream: &mut TcpStream) {
    let mut buffer = [7u8; MESSAGE];
    stream.write_all(&buffer).await.expect("send");
    stream.read_exact(&mut buffer).await.expect("receive");
}

async fn one_connection(target: SocketAddr) -> Duration {
    let start = Instant::now();
    let mut stream = TcpStream::connect(target).await.expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    exchange(&mut stream).await;
    drop(stream);
    start.elapsed()
}

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort();
    let index = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples[index]
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn report(shape: &str, direct: &mut [Duration], proxied: &mut [Duration]) {
    let (d50, d99) = (percentile(direct, 0.5), percentile(direct, 0.99));
    let (p50, p99) = (percentile(proxied, 0.5), percentile(proxied, 0.99));
    println!(
        "{shape:<11} direct p50 {:>7.1} µs p99 {:>7.1} µs | via proxy p50 {:>7.1} µs p99 {:>7.1} µs | p50 ratio {:.2}, added {:.1} µs",
        micros(d50),
        micros(d99),
        micros(p50),
        micros(p99),
        micros(p50) / micros(d50),
        micros(p50) - micros(d50),
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let backend = backend().await;
    let port = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let mut proxy = Proxy::new(
        Frontends {
            ipv4: Some(Ipv4Addr::LOCALHOST),
            ipv6: None,
        },
        CancellationToken::new(),
    );
    let routes = BTreeMap::from([(
        port,
        Route {
            load_balancer: ObjectKey::new(Kind::LoadBalancer, None, "bench"),
            backends: vec![backend],
        },
    )]);
    assert!(proxy.apply(&routes).is_empty(), "the frontend listens");
    let direct_target = SocketAddr::V6(backend);
    let proxy_target = SocketAddr::from((Ipv4Addr::LOCALHOST, port));

    // Warm up both paths.
    for _ in 0..200 {
        one_connection(direct_target).await;
        one_connection(proxy_target).await;
    }

    let (mut direct, mut proxied) = (Vec::new(), Vec::new());
    while direct.len() < CONNECTS {
        for _ in 0..BATCH {
            direct.push(one_connection(direct_target).await);
        }
        for _ in 0..BATCH {
            proxied.push(one_connection(proxy_target).await);
        }
    }
    report("connect", &mut direct, &mut proxied);

    let mut direct_stream = TcpStream::connect(direct_target).await.expect("connect");
    let mut proxy_stream = TcpStream::connect(proxy_target).await.expect("connect");
    direct_stream.set_nodelay(true).expect("nodelay");
    proxy_stream.set_nodelay(true).expect("nodelay");
    let (mut direct, mut proxied) = (Vec::new(), Vec::new());
    while direct.len() < ROUND_TRIPS {
        for _ in 0..BATCH {
            let start = Instant::now();
            exchange(&mut direct_stream).await;
            direct.push(start.elapsed());
        }
        for _ in 0..BATCH {
            let start = Instant::now();
            exchange(&mut proxy_stream).await;
            proxied.push(start.elapsed());
        }
    }
    report("round trip", &mut direct, &mut proxied);
}

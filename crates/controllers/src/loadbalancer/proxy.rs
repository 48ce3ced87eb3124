//! The L4 proxy: one TCP listener per frontend address and port; each
//! accepted connection goes to the port's next ready backend
//! (round-robin, skipping backends that refuse) and bytes are copied both
//! ways until either side closes. The backend set is swapped under the
//! listeners without dropping open connections.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr, SocketAddrV6};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use super::plan::{Frontends, Route};

/// How long a backend has to accept a connection before the next is tried.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("cannot listen on {address}")]
    Listen {
        address: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// The ready backends of one frontend port and where round-robin stands.
#[derive(Debug, Default)]
struct PortBackends {
    backends: Vec<SocketAddrV6>,
    next: AtomicUsize,
}

impl PortBackends {
    /// The backends in the order this connection tries them.
    fn rotation(&self) -> Vec<SocketAddrV6> {
        let count = self.backends.len();
        if count == 0 {
            return Vec::new();
        }
        let start = self.next.fetch_add(1, Ordering::Relaxed) % count;
        (0..count)
            .map(|offset| self.backends[(start + offset) % count])
            .collect()
    }
}

type Table = Arc<RwLock<BTreeMap<u16, Arc<PortBackends>>>>;

/// The running proxy: listeners per port, and the backend table they read.
#[derive(Debug)]
pub struct Proxy {
    frontends: Frontends,
    table: Table,
    listeners: BTreeMap<u16, CancellationToken>,
    shutdown: CancellationToken,
}

impl Proxy {
    /// A proxy listening on `frontends` (nothing yet: ports come with
    /// [`Proxy::apply`]); every listener ends with `shutdown`.
    pub fn new(frontends: Frontends, shutdown: CancellationToken) -> Proxy {
        Proxy {
            frontends,
            table: Arc::default(),
            listeners: BTreeMap::new(),
            shutdown,
        }
    }

    pub fn frontends(&self) -> Frontends {
        self.frontends
    }

    /// Makes the proxy serve exactly `routes`: new ports start listening,
    /// gone ports stop listening and close their open connections, and
    /// changed backend sets are swapped (open connections keep their
    /// backend; new ones use the new set).
    /// Returns the ports that could not listen; they are retried on the
    /// next call.
    pub fn apply(&mut self, routes: &BTreeMap<u16, Route>) -> BTreeMap<u16, ProxyError> {
        let mut failed = BTreeMap::new();
        let gone: Vec<u16> = self
            .listeners
            .keys()
            .filter(|port| !routes.contains_key(port))
            .copied()
            .collect();
        for port in gone {
            if let Some(listening) = self.listeners.remove(&port) {
                listening.cancel();
            }
            self.write_table().remove(&port);
        }
        for (&port, route) in routes {
            let unchanged = self
                .read_table()
                .get(&port)
                .is_some_and(|current| current.backends == route.backends);
            if !unchanged {
                let entry = Arc::new(PortBackends {
                    backends: route.backends.clone(),
                    next: AtomicUsize::new(0),
                });
                self.write_table().insert(port, entry);
            }
            if self.listeners.contains_key(&port) {
                continue;
            }
            match self.listen(port) {
                Ok(listening) => {
                    tracing::info!(port, backends = route.backends.len(), "frontend listening");
                    self.listeners.insert(port, listening);
                }
                Err(error) => {
                    self.write_table().remove(&port);
                    failed.insert(port, error);
                }
            }
        }
        failed
    }

    /// Binds every frontend address on `port` and spawns their accept loops.
    fn listen(&self, port: u16) -> Result<CancellationToken, ProxyError> {
        let addresses: Vec<SocketAddr> = [
            self.frontends.ipv4.map(IpAddr::V4),
            self.frontends.ipv6.map(IpAddr::V6),
        ]
        .into_iter()
        .flatten()
        .map(|ip| SocketAddr::new(ip, port))
        .collect();
        let mut bound = Vec::new();
        for address in addresses {
            let listener =
                bind(address).map_err(|source| ProxyError::Listen { address, source })?;
            bound.push(listener);
        }
        let listening = self.shutdown.child_token();
        for listener in bound {
            tokio::spawn(accept_loop(
                listener,
                port,
                self.table.clone(),
                listening.clone(),
            ));
        }
        Ok(listening)
    }

    fn read_table(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<u16, Arc<PortBackends>>> {
        self.table.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write_table(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<u16, Arc<PortBackends>>> {
        self.table.write().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A non-blocking listener on `address`, with `SO_REUSEADDR` so a
/// restarted proxy binds again at once.
fn bind(address: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = match address {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(address)?;
    socket.listen(1024)
}

async fn accept_loop(listener: TcpListener, port: u16, table: Table, stop: CancellationToken) {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = stop.cancelled() => return,
        };
        match accepted {
            Ok((client, peer)) => {
                let backends = table
                    .read()
                    .unwrap_or_else(PoisonError::into_inner)
                    .get(&port)
                    .cloned();
                tokio::spawn(forward(client, peer, port, backends, stop.clone()));
            }
            Err(error) => {
                tracing::warn!(port, %error, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Connects `client` to the first backend of its rotation that accepts
/// and copies both ways; with no backend left the client is closed.
async fn forward(
    mut client: TcpStream,
    peer: SocketAddr,
    port: u16,
    backends: Option<Arc<PortBackends>>,
    stop: CancellationToken,
) {
    let rotation = backends.map(|b| b.rotation()).unwrap_or_default();
    for backend in rotation {
        let connected = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(backend)).await;
        let mut upstream = match connected {
            Ok(Ok(upstream)) => upstream,
            Ok(Err(error)) => {
                tracing::debug!(port, %backend, %error, "backend refused; trying the next");
                continue;
            }
            Err(_) => {
                tracing::debug!(port, %backend, "backend timed out; trying the next");
                continue;
            }
        };
        let _ = client.set_nodelay(true);
        let _ = upstream.set_nodelay(true);
        tokio::select! {
            copied = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {
                if let Err(error) = copied {
                    tracing::debug!(port, %peer, %backend, %error, "connection ended with an error");
                }
            }
            () = stop.cancelled() => {}
        }
        return;
    }
    tracing::debug!(port, %peer, "no ready backend; closing");
}

#[cfg(test)]
mod tests {
    use super::*;
    use corral_api::{Kind, ObjectKey};
    use std::net::{Ipv4Addr, Ipv6Addr};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A backend on `[::1]` answering every connection with `body`.
    async fn backend(body: &'static str) -> SocketAddrV6 {
        let listener = TcpListener::bind((Ipv6Addr::LOCALHOST, 0)).await.unwrap();
        let SocketAddr::V6(address) = listener.local_addr().unwrap() else {
            unreachable!()
        };
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut request = [0u8; 64];
                    let _ = stream.read(&mut request).await;
                    let _ = stream.write_all(body.as_bytes()).await;
                });
            }
        });
        address
    }

    /// A port free on 127.0.0.1 right now.
    fn free_port() -> u16 {
        std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    fn routes(port: u16, backends: &[SocketAddrV6]) -> BTreeMap<u16, Route> {
        BTreeMap::from([(
            port,
            Route {
                load_balancer: ObjectKey::new(Kind::LoadBalancer, None, "front"),
                backends: backends.to_vec(),
            },
        )])
    }

    async fn fetch(address: SocketAddr) -> std::io::Result<String> {
        let mut stream = TcpStream::connect(address).await?;
        stream.write_all(b"hi").await?;
        let mut body = String::new();
        stream.read_to_string(&mut body).await?;
        Ok(body)
    }

    fn v4_only() -> Frontends {
        Frontends {
            ipv4: Some(Ipv4Addr::LOCALHOST),
            ipv6: None,
        }
    }

    #[tokio::test]
    async fn round_robin_over_backends_then_follows_the_set() {
        let (a, b) = (backend("A").await, backend("B").await);
        let mut proxy = Proxy::new(v4_only(), CancellationToken::new());
        let port = free_port();
        assert!(proxy.apply(&routes(port, &[a, b])).is_empty());
        let front = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let mut seen = Vec::new();
        for _ in 0..4 {
            seen.push(fetch(front).await.unwrap());
        }
        assert_eq!(seen, ["A", "B", "A", "B"]);

        // B leaves the ready set: everything goes to A, same listener.
        assert!(proxy.apply(&routes(port, &[a])).is_empty());
        for _ in 0..3 {
            assert_eq!(fetch(front).await.unwrap(), "A");
        }

        // No backends: connections are accepted and closed at once.
        assert!(proxy.apply(&routes(port, &[])).is_empty());
        assert_eq!(fetch(front).await.unwrap_or_default(), "");

        // The port leaves the plan: nothing listens any more.
        assert!(proxy.apply(&BTreeMap::new()).is_empty());
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(fetch(front).await.is_err(), "the listener is closed");
    }

    #[tokio::test]
    async fn a_refusing_backend_is_skipped() {
        let a = backend("A").await;
        let dead = {
            let listener = std::net::TcpListener::bind((Ipv6Addr::LOCALHOST, 0)).unwrap();
            let SocketAddr::V6(address) = listener.local_addr().unwrap() else {
                unreachable!()
            };
            address
        };
        let mut proxy = Proxy::new(v4_only(), CancellationToken::new());
        let port = free_port();
        assert!(proxy.apply(&routes(port, &[dead, a])).is_empty());
        let front = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        for _ in 0..3 {
            assert_eq!(fetch(front).await.unwrap(), "A");
        }
    }

    #[tokio::test]
    async fn a_taken_port_is_reported_and_retried() {
        let taken = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let port = taken.local_addr().unwrap().port();
        let a = backend("A").await;
        let mut proxy = Proxy::new(v4_only(), CancellationToken::new());
        let failed = proxy.apply(&routes(port, &[a]));
        assert_eq!(
            failed[&port].to_string(),
            format!("cannot listen on 127.0.0.1:{port}")
        );
        drop(taken);
        assert!(proxy.apply(&routes(port, &[a])).is_empty());
        let front = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        assert_eq!(fetch(front).await.unwrap(), "A");
    }
}

//! A TCP listener whose connections are TLS, for the agent's endpoint
//! (the same shape as the API server's). Handshakes run concurrently (a
//! slow or plain-HTTP client never holds up others) and a failed one —
//! plain HTTP, no client certificate, the wrong one — closes only its
//! connection, before any request is read.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// How long a client may take to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

pub struct TlsListener {
    tcp: TcpListener,
    acceptor: TlsAcceptor,
    handshakes: JoinSet<Option<(TlsStream<TcpStream>, SocketAddr)>>,
}

impl std::fmt::Debug for TlsListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsListener")
            .field("tcp", &self.tcp)
            .field("handshakes", &self.handshakes.len())
            .finish_non_exhaustive()
    }
}

impl TlsListener {
    pub fn new(tcp: TcpListener, config: Arc<rustls::ServerConfig>) -> Self {
        TlsListener {
            tcp,
            acceptor: TlsAcceptor::from(config),
            handshakes: JoinSet::new(),
        }
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            tokio::select! {
                accepted = self.tcp.accept() => match accepted {
                    Ok((stream, address)) => {
                        if let Err(error) = stream.set_nodelay(true) {
                            tracing::debug!(%address, %error, "cannot set TCP_NODELAY");
                        }
                        let acceptor = self.acceptor.clone();
                        self.handshakes.spawn(async move {
                            let handshake = acceptor.accept(stream);
                            match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
                                Ok(Ok(tls)) => Some((tls, address)),
                                Ok(Err(error)) => {
                                    tracing::info!(%address, %error, "refused a connection to the agent endpoint at the TLS handshake");
                                    None
                                }
                                Err(_) => None,
                            }
                        });
                    }
                    Err(error) => {
                        tracing::warn!(%error, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
                Some(done) = self.handshakes.join_next(), if !self.handshakes.is_empty() => {
                    if let Ok(Some(connection)) = done {
                        return connection;
                    }
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}

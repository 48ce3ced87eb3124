//! A client configured with several servers moves on from one that refuses
//! connections, and stays on the one that answers.

use corral_client::{Client, ClientConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A one-route HTTP server on loopback answering `/v1/whoami`.
async fn whoami_server() -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().expect("address");
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let mut request = Vec::new();
            let mut buffer = [0u8; 1024];
            while !request.windows(4).any(|window| window == b"\r\n\r\n") {
                match socket.read(&mut buffer).await {
                    Ok(0) | Err(_) => break,
                    Ok(read) => request.extend_from_slice(&buffer[..read]),
                }
            }
            let body = r#"{"name":"alice","role":"operator"}"#;
            let response = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = socket.write_all(response.as_bytes()).await;
        }
    });
    addr
}

/// A loopback address nothing listens on.
fn refused_addr() -> std::net::SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind loopback");
    listener.local_addr().expect("address")
}

#[tokio::test]
async fn an_unreachable_server_fails_over_to_the_next() {
    let dead = refused_addr();
    let live = whoami_server().await;
    let client = Client::new(&ClientConfig {
        server: format!("http://{dead}, http://{live}/"),
        token: "t".into(),
        ca: None,
    })
    .expect("client");
    assert_eq!(client.servers().len(), 2);
    let identity = client
        .whoami()
        .await
        .expect("whoami through the live server");
    assert_eq!(identity.name, "alice");
    assert_eq!(
        client.server(),
        format!("http://{live}"),
        "stays on the live one"
    );
    client.whoami().await.expect("again");
}

#[tokio::test]
async fn one_unreachable_server_is_a_transport_error() {
    let dead = refused_addr();
    let client = Client::new(&ClientConfig {
        server: format!("http://{dead}"),
        token: "t".into(),
        ca: None,
    })
    .expect("client");
    assert!(matches!(
        client.whoami().await,
        Err(corral_client::ClientError::Transport { .. })
    ));
}

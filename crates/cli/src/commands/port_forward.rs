//! `corral port-forward pod/web 8080` or `LOCAL:REMOTE`: listens on this
//! machine's loopback and carries each connection to the port on the pod's
//! loopback, through the API server and the pod's node (no route to the
//! pod's address needed), until interrupted.

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Args;
use corral_api::ObjectKey;
use corral_client::Client;
use tokio::net::{TcpListener, TcpStream};

use super::connect;
use crate::target::Target;

#[derive(Debug, Args)]
#[command(after_help = "Examples:
  corral port-forward pod/web 8080          localhost:8080 reaches the pod's port 8080
  corral port-forward pod/web 9000:8080     localhost:9000 reaches the pod's port 8080
  corral port-forward pod/web 0:8080        a free local port, printed on the first line")]
pub struct PortForwardArgs {
    /// The pod: pod/NAME.
    target: String,
    /// `PORT`, or `LOCAL:REMOTE` (LOCAL 0 picks a free port).
    ports: String,
    #[arg(short = 'n', long, value_name = "NS", default_value = "default")]
    namespace: String,
}

/// `LOCAL:REMOTE` or `PORT`.
fn parse_ports(text: &str) -> anyhow::Result<(u16, u16)> {
    let port = |part: &str, what: &str| -> anyhow::Result<u16> {
        part.parse::<u16>()
            .with_context(|| format!("{text}: the {what} port {part:?} is not a number 0–65535"))
    };
    let (local, remote) = match text.split_once(':') {
        Some((local, remote)) => (port(local, "local")?, port(remote, "pod's")?),
        None => {
            let both = port(text, "")?;
            (both, both)
        }
    };
    if remote == 0 {
        bail!("{text}: the pod's port must be 1–65535");
    }
    Ok((local, remote))
}

pub async fn port_forward(config: Option<PathBuf>, args: PortForwardArgs) -> anyhow::Result<()> {
    let target = Target::parse(&args.target, None)?;
    if target.kind != corral_api::Kind::Pod {
        bail!("port-forward reaches pods: write pod/NAME");
    }
    let key = target.key(Some(&args.namespace))?;
    let (local, remote) = parse_ports(&args.ports)?;
    let client = connect(config)?;
    // The pod must exist and run somewhere before anything listens.
    client.get(&key).await?;
    let v4 = TcpListener::bind(("127.0.0.1", local))
        .await
        .with_context(|| format!("cannot listen on 127.0.0.1:{local}"))?;
    let port = v4.local_addr()?.port();
    // The same port on ::1 when this machine has it.
    let v6 = TcpListener::bind(("::1", port)).await.ok();
    println!("forwarding 127.0.0.1:{port} to {key} port {remote}");
    loop {
        let accepted = match &v6 {
            Some(v6) => tokio::select! {
                accepted = v4.accept() => accepted,
                accepted = v6.accept() => accepted,
            },
            None => v4.accept().await,
        };
        let (stream, _) = accepted?;
        let (client, key) = (client.clone(), key.clone());
        tokio::spawn(async move {
            if let Err(error) = carry(&client, &key, remote, stream).await {
                eprintln!("port-forward: {error:#}");
            }
        });
    }
}

/// One local connection, relayed to the pod's port until either side closes.
async fn carry(
    client: &Client,
    key: &ObjectKey,
    port: u16,
    mut local: TcpStream,
) -> anyhow::Result<()> {
    let mut remote = client.port_forward(key, port).await?;
    tokio::io::copy_bidirectional(&mut local, &mut remote).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_ports;

    #[test]
    fn ports_read_as_one_or_local_colon_remote() {
        assert_eq!(parse_ports("8080").unwrap(), (8080, 8080));
        assert_eq!(parse_ports("9000:80").unwrap(), (9000, 80));
        assert_eq!(parse_ports("0:80").unwrap(), (0, 80));
        assert!(parse_ports("80:0").is_err());
        assert!(
            parse_ports("web")
                .unwrap_err()
                .to_string()
                .contains("not a number")
        );
    }
}

//! `POST /v1/pods/{namespace}/{name}/portforward?port=P` on the agent's
//! endpoint: a TCP connection to a port on the pod's loopback, for
//! `corral port-forward`. The socket is made on a thread inside the pod's
//! network namespace (so a server listening on localhost only is reached,
//! as on any machine), connected before the upgrade (so "nothing listens"
//! is an answer, not a dropped stream), then its bytes are relayed both
//! ways, unframed, until either side closes. A pod on gVisor's own network
//! stack has its loopback inside the sandbox: it is reached on its address
//! from the node instead.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

use axum::extract::{Path as UrlPath, RawQuery, Request, State};
use axum::response::Response;
use corral_api::kinds::RuntimeClass;
use corral_api::security::{NetworkStack, network_stack};
use corral_runtime::oci::netns;
use hyper_util::rt::TokioIo;

use crate::serve::{
    EndpointError, Shared, find_pod, parse_query, require_upgrade, switching_protocols,
};

/// How long connecting to the pod's port may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

pub(crate) async fn port_forward(
    State(endpoint): State<Shared>,
    UrlPath((namespace, name)): UrlPath<(String, String)>,
    RawQuery(query): RawQuery,
    mut request: Request,
) -> Result<Response, EndpointError> {
    require_upgrade(request.headers(), "port-forward")?;
    let params = parse_query(query.as_deref());
    let port = params
        .get("port")
        .and_then(|values| values.last())
        .and_then(|port| port.parse::<u16>().ok())
        .filter(|port| *port > 0)
        .ok_or_else(|| EndpointError::BadRequest("port: a TCP port (1–65535)".into()))?;
    let (record, spec) = find_pod(&endpoint, &namespace, &name).await?;
    let netns = record.netns.clone().ok_or_else(|| {
        EndpointError::Conflict(format!(
            "pod/{name} has no network namespace yet (see `corral why pod/{name}`)"
        ))
    })?;
    let relax = crate::sandbox::relaxations(&spec).unwrap_or_default();
    let runtime = spec.runtime.unwrap_or(RuntimeClass::Runc);
    let on_gvisor_stack = network_stack(runtime, &relax) == NetworkStack::Gvisor;
    let address = record.address;
    let stream = tokio::task::spawn_blocking(move || match (on_gvisor_stack, address) {
        (false, _) => connect_in(&netns, port),
        (true, Some(address)) => connect_to(address, port),
        (true, None) => Err(std::io::Error::other(
            "the pod runs on gVisor's network stack and has no address to reach it on",
        )),
    })
    .await
    .map_err(|error| EndpointError::Internal(error.to_string()))?
    .map_err(|error| {
        EndpointError::Conflict(format!(
            "nothing accepts connections on port {port} in pod/{name}: {error}"
        ))
    })?;
    let mut pod = tokio::net::TcpStream::from_std(stream)
        .map_err(|error| EndpointError::Internal(error.to_string()))?;
    let upgrade = hyper::upgrade::on(&mut request);
    tracing::info!(pod = %format!("{namespace}/{name}"), port, "port-forward");
    tokio::spawn(async move {
        match upgrade.await {
            Ok(upgraded) => {
                let mut client = TokioIo::new(upgraded);
                if let Err(error) = tokio::io::copy_bidirectional(&mut client, &mut pod).await {
                    tracing::debug!(%error, "port-forward ended");
                }
            }
            Err(error) => tracing::warn!(%error, "the port-forward connection was not upgraded"),
        }
    });
    Ok(switching_protocols())
}

/// Connects to `port` on `address` from the node.
fn connect_to(address: Ipv6Addr, port: u16) -> std::io::Result<TcpStream> {
    let connected =
        TcpStream::connect_timeout(&SocketAddr::from((address, port)), CONNECT_TIMEOUT)?;
    connected.set_nonblocking(true)?;
    Ok(connected)
}

/// Connects to `port` on the loopback of the namespace at `netns`: IPv6
/// first, then IPv4. The socket stays in that namespace wherever it is used.
fn connect_in(netns: &Path, port: u16) -> std::io::Result<TcpStream> {
    let connected = netns::run_in(netns, || {
        let v6 = SocketAddr::from((Ipv6Addr::LOCALHOST, port));
        let v4 = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        TcpStream::connect_timeout(&v6, CONNECT_TIMEOUT)
            .or_else(|_| TcpStream::connect_timeout(&v4, CONNECT_TIMEOUT))
    })
    .map_err(std::io::Error::other)??;
    connected.set_nonblocking(true)?;
    Ok(connected)
}

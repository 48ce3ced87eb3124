//! The node's view of the cluster's network: routes to the other nodes'
//! /64s, WireGuard peers, and the DNS table of pods and PinnedDeployments,
//! kept equal to what the informers show as it changes.

use std::sync::Arc;
use std::time::Duration;

use corral_client::Client;
use corral_client::runtime::{Cache, Change, Informer, Scope};
use tokio_util::sync::CancellationToken;

use crate::{chain, dns, network};

/// One pass of the tunnel's peers over `nodes` and the migrated VMs in
/// `vms` (nothing without a tunnel).
async fn sync_peers(
    node: &str,
    nodes: &[corral_api::Object],
    vms: &[network::VmPlace],
    network: &network::PodNetwork,
) {
    match network.reconcile_tunnel(node, nodes, vms).await {
        Ok(Some((_, plan))) if !plan.is_empty() => {
            let set: Vec<String> = plan.set.iter().map(|p| p.endpoint.to_string()).collect();
            let removed = plan.remove.len();
            tracing::info!(?set, removed, "wireguard peers changed");
        }
        Ok(_) => {}
        Err(error) => tracing::warn!(error = %chain(&error), "cannot reconcile wireguard peers"),
    }
}

/// One pass of the routes to other nodes over `nodes`, and to the
/// migrated VMs in `vms`.
async fn sync_routes(
    node: &str,
    nodes: &[corral_api::Object],
    vms: &[network::VmPlace],
    network: &network::PodNetwork,
) {
    match network.reconcile_routes(node, nodes, vms).await {
        Ok((_, plan)) if !plan.is_empty() => {
            let added: Vec<String> = plan
                .ensure
                .iter()
                .map(|r| r.destination.to_string())
                .collect();
            let removed: Vec<String> = plan.remove.iter().map(ToString::to_string).collect();
            tracing::info!(
                ?added,
                ?removed,
                "routes to other nodes and moved VMs changed"
            );
        }
        Ok(_) => {}
        Err(error) => tracing::warn!(error = %chain(&error), "cannot reconcile node routes"),
    }
}

/// Starts the node's DNS server once the node has its /64.
fn start_dns(node: &str, nodes: &Cache<corral_api::Object>, network: &network::PodNetwork) {
    if network.dns_address().is_some() {
        return;
    }
    let prefix = nodes
        .get(&corral_api::ObjectKey::new(
            corral_api::Kind::Node,
            None,
            node,
        ))
        .and_then(|n| n.typed_status::<corral_api::kinds::NodeStatus>().ok())
        .and_then(|s| s.prefix?.parse().ok());
    let Some(prefix) = prefix else {
        return;
    };
    if let Err(error) = network.start_dns(prefix) {
        tracing::warn!(error = %chain(&error), "pods get no DNS");
    }
}

/// What DNS keeps of a pod: its name, labels and, once it has an address,
/// its address and readiness; nothing for a pod without an address.
fn dns_record(pod: &corral_api::Object) -> Option<corral_api::Object> {
    let status: corral_api::kinds::PodStatus = pod.typed_status().ok()?;
    status.address.as_ref()?;
    let mut record = corral_api::Object::new(
        pod.kind,
        pod.metadata.namespace.as_deref(),
        &pod.metadata.name,
        serde_json::Value::Null,
    );
    record.metadata.labels = pod.metadata.labels.clone();
    record.status = serde_json::json!({
        "phase": pod.status.get("phase"),
        "address": status.address,
        "containers": pod.status.get("containers"),
    });
    Some(record)
}

/// How often routes and peers are compared with the cached `Node` objects
/// even when nothing changed (someone may have removed a route by hand).
pub const ROUTES_RECHECK: Duration = Duration::from_secs(30);

/// How long changes are gathered before routes, peers or the DNS table are
/// made again.
const COALESCE: Duration = Duration::from_millis(100);

/// Keeps the routes to other nodes' /64s (and, with `--wireguard`, the
/// tunnel's peers) equal to what the `Node` objects say, the `/128`s of
/// live-migrated VMs equal to where their guests run
/// ([`network::vm_routes`]), and the DNS table equal to the pods and
/// PinnedDeployments, as they change: informers feed them, so nothing is
/// listed again. With the API away the routes, peers and names stay.
pub async fn routes_loop(
    client: Client,
    node: String,
    nodes: Informer,
    network: Arc<network::PodNetwork>,
    shutdown: CancellationToken,
) {
    use corral_api::Kind;
    let pods = Informer::start_projected(
        client.clone(),
        Scope::all(Kind::Pod),
        dns_record,
        Vec::new(),
        shutdown.clone(),
    );
    let deployments = Informer::start(
        client.clone(),
        Scope::all(Kind::PinnedDeployment),
        Vec::new(),
        shutdown.clone(),
    );
    // Where each VM's guest runs: only a change of that moves routes.
    let vms = Informer::start_projected(
        client,
        Scope::all(Kind::VirtualMachine),
        network::VmPlace::of,
        Vec::new(),
        shutdown.clone(),
    );
    let routes_changed = Arc::new(tokio::sync::Notify::new());
    let names_changed = Arc::new(tokio::sync::Notify::new());
    {
        let (routes, names) = (routes_changed.clone(), names_changed.clone());
        nodes.on_change(
            |_, _| {},
            move |_| {
                routes.notify_one();
                names.notify_one();
            },
        );
    }
    {
        let routes = routes_changed.clone();
        vms.on_change(
            |_, _| {},
            move |change| {
                let moved = match change {
                    Change::Applied { old, new, .. } => *old != Some(*new),
                    Change::Deleted { old, .. } => old.is_some(),
                };
                if moved {
                    routes.notify_one();
                }
            },
        );
    }
    {
        let names = names_changed.clone();
        pods.on_change(|_, _| {}, move |_| names.notify_one());
        let names = names_changed.clone();
        deployments.on_change(|_, _| {}, move |_| names.notify_one());
    }
    nodes.synced().await;
    vms.synced().await;
    routes_changed.notify_one();
    names_changed.notify_one();
    loop {
        tokio::select! {
            () = routes_changed.notified() => {}
            () = names_changed.notified() => {
                tokio::time::sleep(COALESCE).await;
                start_dns(&node, nodes.cache(), &network);
                let table = {
                    let pods: Vec<corral_api::Object> = pods
                        .cache()
                        .list()
                        .into_iter()
                        .filter_map(|(_, pod)| pod.as_ref().clone())
                        .collect();
                    let deployments: Vec<corral_api::Object> = deployments
                        .cache()
                        .list()
                        .into_iter()
                        .map(|(_, d)| d.as_ref().clone())
                        .collect();
                    dns::build_table(&pods, &deployments)
                };
                network.set_dns_table(table);
                continue;
            }
            () = tokio::time::sleep(ROUTES_RECHECK) => {}
            () = shutdown.cancelled() => return,
        }
        tokio::time::sleep(COALESCE).await;
        let list: Vec<corral_api::Object> = nodes
            .cache()
            .list()
            .into_iter()
            .map(|(_, n)| n.as_ref().clone())
            .collect();
        let places: Vec<network::VmPlace> = vms
            .cache()
            .list()
            .into_iter()
            .filter_map(|(_, place)| place.as_ref().clone())
            .collect();
        // Peers first: a route through the tunnel needs its peer.
        sync_peers(&node, &list, &places, &network).await;
        sync_routes(&node, &list, &places, &network).await;
    }
}

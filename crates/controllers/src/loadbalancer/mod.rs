//! The default load balancer, `l4-proxy`: a controller that registers as
//! the owner of `LoadBalancer:status`, and the TCP proxy it drives.
//!
//! Load balancers live outside the core (docs/design/0014): this module
//! holds no special rights. It authenticates with an ordinary controller
//! token, registers itself like any third-party controller (a second LB
//! controller is refused by field ownership), reads LoadBalancers and
//! pods through the API (masked to what it declared), and on every change
//! makes the proxy's backend set equal to the ready pods' addresses and
//! writes each LoadBalancer's frontend addresses and backends to its
//! status. Decisions are [`plan`]'s; [`proxy`] only moves bytes.

pub mod plan;
pub mod proxy;

use std::collections::BTreeMap;

use std::sync::Arc;

use corral_api::kinds::{ControllerSpec, LoadBalancerStatus};
use corral_api::{Kind, Object, Role};
use corral_client::runtime::{Informer, Scope};
use corral_client::{Client, ClientError};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use plan::Frontends;
use proxy::Proxy;

/// The identity the shipped LB controller is meant to run as.
pub const DEFAULT_NAME: &str = "lb-l4-proxy";

/// What the LB controller owns and reads.
pub fn registration() -> ControllerSpec {
    ControllerSpec {
        owns: vec!["LoadBalancer:status".into()],
        reads: vec![
            "LoadBalancer:spec".into(),
            "Pod:status.phase".into(),
            "Pod:status.address".into(),
            "Pod:status.containers".into(),
        ],
        steps: Vec::new(),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LoadBalancerError {
    #[error("cannot ask the API who this token is")]
    Whoami(#[source] ClientError),
    #[error("the LB controller needs a controller token; {name} is a {role:?} identity")]
    NotAController { name: String, role: Role },
    #[error("cannot register controller {name} as owner of LoadBalancer:status")]
    Register {
        name: String,
        #[source]
        source: ClientError,
    },
}

/// How the controller runs: the class it serves and where it listens.
#[derive(Debug, Clone)]
pub struct LoadBalancerConfig {
    pub class: String,
    pub frontends: Frontends,
}

/// Registers the caller (a controller token) as owner of
/// `LoadBalancer:status`; returns its name. Refused, naming the owner,
/// when another controller owns it.
pub async fn register(client: &Client) -> Result<String, LoadBalancerError> {
    let identity = client.whoami().await.map_err(LoadBalancerError::Whoami)?;
    if identity.role != Role::Controller {
        return Err(LoadBalancerError::NotAController {
            name: identity.name,
            role: identity.role,
        });
    }
    let spec = serde_json::to_value(registration()).unwrap_or_default();
    let object = Object::new(Kind::Controller, None, &identity.name, spec);
    client
        .apply(&object, Some("register as the LoadBalancer controller"))
        .await
        .map_err(|source| LoadBalancerError::Register {
            name: identity.name.clone(),
            source,
        })?;
    Ok(identity.name)
}

/// How long changes are gathered before the plan is made again.
const COALESCE: std::time::Duration = std::time::Duration::from_millis(50);

/// Registers, then serves LoadBalancers of `config.class` until
/// `shutdown`: the plan is made again from the informers' caches whenever
/// a LoadBalancer or a pod changes.
pub async fn run(
    client: Client,
    config: LoadBalancerConfig,
    shutdown: CancellationToken,
) -> Result<(), LoadBalancerError> {
    let name = register(&client).await?;
    tracing::info!(controller = %name, class = %config.class, "serving LoadBalancers");
    let follow = |kind| {
        Informer::start(
            client.clone(),
            Scope::all(kind),
            Vec::new(),
            shutdown.clone(),
        )
    };
    let (load_balancers, pods) = (follow(Kind::LoadBalancer), follow(Kind::Pod));
    load_balancers.synced().await;
    pods.synced().await;
    let changed = Arc::new(Notify::new());
    for informer in [&load_balancers, &pods] {
        let changed = changed.clone();
        informer.on_change(|_, _| {}, move |_| changed.notify_one());
    }
    let mut proxy = Proxy::new(config.frontends, shutdown.child_token());
    while !shutdown.is_cancelled() {
        let snapshot = |cache: &corral_client::runtime::Cache<Object>| -> Vec<Object> {
            cache
                .list()
                .into_iter()
                .map(|(_, o)| o.as_ref().clone())
                .collect()
        };
        let state = (snapshot(load_balancers.cache()), snapshot(pods.cache()));
        if let Err(error) = round(&client, &name, &config.class, &mut proxy, state).await {
            tracing::debug!(controller = %name, %error, "round failed; retrying");
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            continue;
        }
        tokio::select! {
            () = changed.notified() => {}
            () = shutdown.cancelled() => break,
        }
        tokio::time::sleep(COALESCE).await;
    }
    Ok(())
}

/// One pass over the LoadBalancers and pods given: plan, make the proxy
/// match, write the statuses that changed.
pub async fn round(
    client: &Client,
    name: &str,
    class: &str,
    proxy: &mut Proxy,
    (load_balancers, pods): (Vec<Object>, Vec<Object>),
) -> Result<(), ClientError> {
    let plan = plan::plan(name, class, &proxy.frontends(), &load_balancers, &pods);
    let failed = proxy.apply(&plan.routes);
    let mut listen_errors: BTreeMap<_, Vec<String>> = BTreeMap::new();
    for (port, error) in &failed {
        tracing::warn!(port, error = %error_chain(error), "frontend cannot listen");
        if let Some(route) = plan.routes.get(port) {
            listen_errors
                .entry(route.load_balancer.clone())
                .or_default()
                .push(error_chain(error));
        }
    }
    let mut unwritten = None;
    for mut load_balancer in load_balancers {
        let key = load_balancer.key();
        let Some(mut status) = plan.statuses.get(&key).cloned() else {
            continue;
        };
        if let Some(errors) = listen_errors.get(&key) {
            let mut messages: Vec<String> = status.message.into_iter().collect();
            messages.extend(errors.iter().cloned());
            status.message = Some(messages.join("; "));
        }
        let current: LoadBalancerStatus = load_balancer.typed_status().unwrap_or_default();
        if current == status {
            continue;
        }
        load_balancer.status = serde_json::to_value(&status).unwrap_or_default();
        match client.put_status(&load_balancer).await {
            Ok(_) => tracing::info!(
                load_balancer = %key, ready = status.ready, backends = ?status.backends,
                "status written"
            ),
            Err(error) => {
                tracing::debug!(load_balancer = %key, %error, "status not written; retried");
                unwritten = Some(error);
            }
        }
    }
    unwritten.map_or(Ok(()), Err)
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

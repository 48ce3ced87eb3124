//! `corral lb-proxy`: the default load balancer, run as its own process
//! like any add-on controller. It authenticates with a controller token,
//! registers as owner of `LoadBalancer:status` and proxies TCP from its
//! IPv4 and IPv6 frontends to the ready pods (see docs/design/0014).

use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use corral_api::kinds::DEFAULT_LB_CLASS;
use corral_client::{Client, ClientConfig};
use corral_controllers::loadbalancer::{self, LoadBalancerConfig, plan::Frontends};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Args)]
#[command(after_help = "Examples:
  corral lb-proxy --listen-v4 192.0.2.10 --listen-v6 2001:db8::10
                                      with the controller token in $CORRAL_CONFIG
  corral lb-proxy --token \"$TOKEN\" --listen-v6 2001:db8::10 --class internal
                                      the config's server, this token; LoadBalancers of class internal
  corral lb-proxy --server https://10.0.0.1:7443 --ca ca.pem --listen-v4 192.0.2.10
                                      no config: the token comes from $CORRAL_CONTROLLER_TOKEN")]
pub struct LbProxyArgs {
    /// The API server's URL; without it, server and token come from the
    /// client config (--config / $CORRAL_CONFIG), which must then hold a
    /// controller token.
    #[arg(long, value_name = "URL")]
    server: Option<String>,
    /// The cluster CA certificate (the server's DATA/tls/ca.pem).
    #[arg(long, value_name = "PATH", requires = "server")]
    ca: Option<PathBuf>,
    /// A controller token (`corral token create --controller lb-l4-proxy`).
    #[arg(
        long,
        value_name = "TOKEN",
        env = "CORRAL_CONTROLLER_TOKEN",
        hide_env_values = true
    )]
    token: Option<String>,
    /// The IPv4 frontend address clients connect to (on this host).
    #[arg(long, value_name = "IPV4", required_unless_present = "listen_v6")]
    listen_v4: Option<Ipv4Addr>,
    /// The IPv6 frontend address clients connect to (on this host).
    #[arg(long, value_name = "IPV6")]
    listen_v6: Option<Ipv6Addr>,
    /// Serve LoadBalancers of this class.
    #[arg(long, default_value = DEFAULT_LB_CLASS)]
    class: String,
}

pub async fn lb_proxy(config: Option<PathBuf>, args: LbProxyArgs) -> anyhow::Result<()> {
    super::up::init_logging();
    let client_config = match &args.server {
        Some(server) => ClientConfig {
            server: server.clone(),
            token: args.token.clone().context(
                "--server needs a controller token: --token or $CORRAL_CONTROLLER_TOKEN",
            )?,
            ca: match &args.ca {
                Some(path) => Some(std::fs::read_to_string(path).with_context(|| {
                    format!("--ca {}: cannot read the cluster CA", path.display())
                })?),
                None => None,
            },
        },
        None => {
            let mut loaded = ClientConfig::load(&super::config_path(config))?;
            if let Some(token) = &args.token {
                loaded.token.clone_from(token);
            }
            loaded
        }
    };
    let client = Client::new(&client_config)?;
    let shutdown = CancellationToken::new();
    tokio::spawn(super::up::stop_on_signal(shutdown.clone()));
    let frontends = Frontends {
        ipv4: args.listen_v4,
        ipv6: args.listen_v6,
    };
    loadbalancer::run(
        client,
        LoadBalancerConfig {
            class: args.class,
            frontends,
        },
        shutdown,
    )
    .await?;
    Ok(())
}

//! The leader-only work: the built-in controllers, each an ordinary API
//! client with its own token (its informers reading this server's watch
//! cache in-process), the workflow driver and history compaction.

use corral_api::history::CompactionPolicy;
use corral_client::{Client, ClientConfig};
use corral_controllers::lifecycle::Timing;
use corral_ipam::ClusterPrefix;
use tokio_util::sync::CancellationToken;

use super::ControlPlaneError;
use crate::SharedServer;
use crate::local_reads::InProcessReads;
use crate::ownership::BuiltinTokens;

/// What the leader needs to start the built-in controllers.
pub(super) struct Builtins {
    pub url: String,
    pub ca: String,
    pub tokens: BuiltinTokens,
    pub prefix: ClusterPrefix,
    pub timing: Timing,
    pub server: SharedServer,
    pub history_keep: CompactionPolicy,
}

impl Builtins {
    /// A client of the API acting as built-in controller `name`: it writes
    /// through the API, and its informers read this server's watch cache
    /// in-process ([`crate::local_reads`]).
    fn client(&self, name: &str) -> Result<Client, ControlPlaneError> {
        let token = self
            .tokens
            .get(name)
            .ok_or_else(|| ControlPlaneError::MissingToken(name.to_string()))?;
        Client::new(&ClientConfig {
            server: self.url.clone(),
            token: token.clone(),
            ca: Some(self.ca.clone()),
        })
        .map(|client| client.with_local_reads(InProcessReads::new(self.server.clone())))
        .map_err(|source| ControlPlaneError::Client {
            name: name.to_string(),
            source,
        })
    }

    /// Starts every built-in controller, the workflow driver and history
    /// compaction, until `term` is cancelled.
    pub fn spawn(&self, term: &CancellationToken) -> Result<(), ControlPlaneError> {
        corral_controllers::spawn_all_timed(
            self.client("scheduler")?,
            self.client("ipam")?,
            self.client("node-lifecycle")?,
            self.prefix,
            self.timing,
            term.clone(),
        );
        corral_controllers::spawn_pinned(
            self.client(corral_controllers::pinned::NAME)?,
            term.clone(),
        );
        corral_controllers::spawn_per_node(
            self.client(corral_controllers::per_node::NAME)?,
            term.clone(),
        );
        corral_controllers::spawn_job(self.client(corral_controllers::job::NAME)?, term.clone());
        tokio::spawn(crate::workflows::drive(self.server.clone(), term.clone()));
        tokio::spawn(crate::retention::compact_loop(
            self.server.clone(),
            self.history_keep,
            crate::retention::COMPACTION_INTERVAL,
            term.clone(),
        ));
        self.server.metrics.set_leading(true);
        let (server, term) = (self.server.clone(), term.clone());
        tokio::spawn(async move {
            term.cancelled().await;
            server.metrics.set_leading(false);
        });
        Ok(())
    }
}

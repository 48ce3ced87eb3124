//! An in-memory [`NetworkOps`] for tests of code that drives the data path.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

use async_trait::async_trait;
use ipnet::Ipv6Net;

use super::{
    DatapathError, NetworkOps, NodeRoute, PodInterface, PodInterfaceInfo, VmLink,
    validate_host_interface,
};

/// What the fake data path holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FakeState {
    pub forwarding: bool,
    /// Pod interfaces by host interface name.
    pub pods: BTreeMap<String, PodInterface>,
    /// Spare veths (down, no pod yet) by node end, with their namespace.
    pub spares: BTreeMap<String, std::path::PathBuf>,
    /// Node routes by destination.
    pub routes: BTreeMap<Ipv6Net, NodeRoute>,
    /// Every mutating call, in order, e.g. `ensure_node_route fd00::/64`.
    pub calls: Vec<String>,
}

/// In-memory data path with the same idempotence rules as the real one.
#[derive(Debug, Default)]
pub struct FakeNetworkOps {
    state: Mutex<FakeState>,
}

impl FakeNetworkOps {
    pub fn new() -> Self {
        Self::default()
    }

    /// A copy of the current state.
    pub fn snapshot(&self) -> FakeState {
        self.lock().clone()
    }

    fn lock(&self) -> MutexGuard<'_, FakeState> {
        // A panic while holding the lock only happens in a failing test;
        // the state is still readable.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[async_trait]
impl NetworkOps for FakeNetworkOps {
    async fn enable_forwarding(&self) -> Result<(), DatapathError> {
        let mut state = self.lock();
        state.forwarding = true;
        state.calls.push("enable_forwarding".into());
        Ok(())
    }

    async fn ensure_pod_interface(&self, pod: &PodInterface) -> Result<(), DatapathError> {
        validate_host_interface(&pod.host_interface)?;
        let mut state = self.lock();
        state
            .calls
            .push(format!("ensure_pod_interface {}", pod.host_interface));
        state.pods.insert(pod.host_interface.clone(), pod.clone());
        Ok(())
    }

    async fn ensure_vm_interface(
        &self,
        vm: &PodInterface,
        link: &VmLink,
    ) -> Result<(), DatapathError> {
        validate_host_interface(&vm.host_interface)?;
        let mut state = self.lock();
        state.calls.push(format!(
            "ensure_vm_interface {} {} {}",
            vm.host_interface, link.inner, link.port
        ));
        state.pods.insert(vm.host_interface.clone(), vm.clone());
        Ok(())
    }

    async fn create_spare_interface(
        &self,
        host_interface: &str,
        netns: &std::path::Path,
    ) -> Result<(), DatapathError> {
        validate_host_interface(host_interface)?;
        let mut state = self.lock();
        state
            .calls
            .push(format!("create_spare_interface {host_interface}"));
        state
            .spares
            .insert(host_interface.to_string(), netns.to_path_buf());
        Ok(())
    }

    async fn rename_interface(&self, from: &str, to: &str) -> Result<(), DatapathError> {
        validate_host_interface(to)?;
        let mut state = self.lock();
        state.calls.push(format!("rename_interface {from} {to}"));
        let netns = state
            .spares
            .remove(from)
            .ok_or_else(|| DatapathError::MissingInterface {
                name: from.to_string(),
                netns: None,
            })?;
        state.spares.insert(to.to_string(), netns);
        Ok(())
    }

    async fn remove_pod_interface(&self, host_interface: &str) -> Result<(), DatapathError> {
        let mut state = self.lock();
        state
            .calls
            .push(format!("remove_pod_interface {host_interface}"));
        state.pods.remove(host_interface);
        state.spares.remove(host_interface);
        Ok(())
    }

    async fn list_pod_interfaces(&self) -> Result<Vec<PodInterfaceInfo>, DatapathError> {
        Ok(self
            .lock()
            .pods
            .values()
            .map(|pod| PodInterfaceInfo {
                host_interface: pod.host_interface.clone(),
                owner: pod.owner.clone(),
            })
            .collect())
    }

    async fn ensure_node_route(&self, route: &NodeRoute) -> Result<(), DatapathError> {
        let mut state = self.lock();
        state
            .calls
            .push(format!("ensure_node_route {}", route.destination));
        state.routes.insert(route.destination, route.clone());
        Ok(())
    }

    async fn remove_node_route(&self, destination: Ipv6Net) -> Result<(), DatapathError> {
        let mut state = self.lock();
        state.calls.push(format!("remove_node_route {destination}"));
        state.routes.remove(&destination);
        Ok(())
    }

    async fn list_node_routes(&self) -> Result<Vec<NodeRoute>, DatapathError> {
        Ok(self.lock().routes.values().cloned().collect())
    }

    async fn add_host_address(
        &self,
        host_interface: &str,
        address: std::net::Ipv6Addr,
    ) -> Result<(), DatapathError> {
        self.lock()
            .calls
            .push(format!("add_host_address {host_interface} {address}"));
        Ok(())
    }
}

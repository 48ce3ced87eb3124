//! One node inside the scheduler: what it offers, what its workloads use,
//! and the compact [`Room`] every decision reads.

use std::collections::BTreeMap;

use corral_api::ObjectKey;
use corral_api::kinds::{NodeCapacity, NodePhase, RuntimeClass};
use corral_api::quantity::{Cpu, Memory};

use crate::request::{BoundWorkload, Request};
use crate::snapshot::NodeInfo;

/// What a node has left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Free {
    pub cpu: Cpu,
    pub memory: Memory,
    pub pods: u32,
}

pub(crate) fn runtime_bit(runtime: RuntimeClass) -> u8 {
    match runtime {
        RuntimeClass::Runc => 1,
        RuntimeClass::Gvisor => 2,
    }
}

/// The figures the hot loop reads, kept small so 5,000 of them stay in
/// cache. Rebuilt from its [`Node`] whenever a reservation changes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Room {
    free_cpu: u64,
    free_memory: u64,
    /// 1/capacity of cpu, memory and pod slots; 0 where the capacity is 0.
    inverse: [f64; 3],
    /// 1 where the capacity is 0, so that resource never is the scarcest
    /// (nothing asking for it fits there anyway); 0 elsewhere.
    unlimited: [f64; 3],
    free_pods: u32,
    /// How many host ports its workloads hold.
    host_ports: u32,
    runtimes: u8,
    /// Ready and not marked unschedulable.
    open: bool,
    pub(crate) kvm: bool,
}

impl Room {
    /// The cheap filters: open, runtime, a pod slot, cpu, memory. A node
    /// passing them may still fail the others in [`crate::Scheduler`].
    #[inline]
    pub(crate) fn admits(&self, request: &Request, runtime: u8) -> bool {
        self.open
            && self.runtimes & runtime == runtime
            && self.free_pods > 0
            && self.free_cpu >= request.cpu.millis
            && self.free_memory >= request.memory.bytes
    }

    pub(crate) fn holds_host_ports(&self) -> bool {
        self.host_ports > 0
    }

    /// The smallest share of capacity (cpu, memory, pod slots) left after
    /// adding the request, in 0..=1.
    #[inline]
    pub(crate) fn least_share_left(&self, request: &Request) -> f64 {
        let share = |left: u64, dimension: usize| {
            left as f64 * self.inverse[dimension] + self.unlimited[dimension]
        };
        let cpu = share(self.free_cpu.saturating_sub(request.cpu.millis), 0);
        let memory = share(self.free_memory.saturating_sub(request.memory.bytes), 1);
        let pods = share(u64::from(self.free_pods.saturating_sub(1)), 2);
        let least = if cpu < memory { cpu } else { memory };
        if pods < least { pods } else { least }
    }
}

#[derive(Debug)]
pub(crate) struct Node {
    pub(crate) name: String,
    pub(crate) labels: BTreeMap<String, String>,
    pub(crate) phase: NodePhase,
    pub(crate) unschedulable: bool,
    pub(crate) capacity: NodeCapacity,
    pub(crate) runtimes: u8,
    kvm: bool,
    used_cpu: u64,
    used_memory: u64,
    used_pods: u32,
    /// Host ports taken, and by whom.
    pub(crate) host_ports: Vec<(u16, ObjectKey)>,
}

impl Node {
    pub(crate) fn new(info: &NodeInfo) -> Self {
        Node {
            name: info.name.clone(),
            labels: info.labels.clone(),
            phase: info.phase,
            unschedulable: info.unschedulable,
            capacity: info.capacity.clone(),
            runtimes: info
                .runtimes
                .iter()
                .fold(0, |mask, r| mask | runtime_bit(*r)),
            kvm: info.kvm_usable(),
            used_cpu: 0,
            used_memory: 0,
            used_pods: 0,
            host_ports: Vec::new(),
        }
    }

    pub(crate) fn free(&self) -> Free {
        Free {
            cpu: Cpu {
                millis: self.capacity.cpu.millis.saturating_sub(self.used_cpu),
            },
            memory: Memory {
                bytes: self.capacity.memory.bytes.saturating_sub(self.used_memory),
            },
            pods: self.capacity.pods.saturating_sub(self.used_pods),
        }
    }

    pub(crate) fn room(&self) -> Room {
        let inverse = |capacity: u64| {
            if capacity == 0 {
                0.0
            } else {
                1.0 / capacity as f64
            }
        };
        let capacities = [
            self.capacity.cpu.millis,
            self.capacity.memory.bytes,
            u64::from(self.capacity.pods),
        ];
        let free = self.free();
        Room {
            free_cpu: free.cpu.millis,
            free_memory: free.memory.bytes,
            inverse: capacities.map(inverse),
            unlimited: capacities.map(|capacity| if capacity == 0 { 1.0 } else { 0.0 }),
            free_pods: free.pods,
            host_ports: self.host_ports.len().try_into().unwrap_or(u32::MAX),
            runtimes: self.runtimes,
            open: self.phase == NodePhase::Ready && !self.unschedulable,
            kvm: self.kvm,
        }
    }

    /// Counts a workload against this node.
    pub(crate) fn reserve(&mut self, workload: &BoundWorkload) {
        self.used_cpu = self.used_cpu.saturating_add(workload.cpu.millis);
        self.used_memory = self.used_memory.saturating_add(workload.memory.bytes);
        self.used_pods = self.used_pods.saturating_add(1);
        self.host_ports.extend(
            workload
                .host_ports
                .iter()
                .map(|port| (*port, workload.workload.clone())),
        );
    }

    /// Gives a workload's reservation back.
    pub(crate) fn unreserve(&mut self, workload: &BoundWorkload) {
        self.used_cpu = self.used_cpu.saturating_sub(workload.cpu.millis);
        self.used_memory = self.used_memory.saturating_sub(workload.memory.bytes);
        self.used_pods = self.used_pods.saturating_sub(1);
        if !workload.host_ports.is_empty() {
            self.host_ports
                .retain(|(_, holder)| *holder != workload.workload);
        }
    }
}

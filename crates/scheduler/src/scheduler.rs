//! The indexed scheduler: nodes sorted by name, free resources kept up to
//! date as placements are made, filters in a fixed order, then a score.
//!
//! A decision walks only the candidate nodes — the pinned node, the node a
//! `local` volume lives on, the nodes carrying every selector label (from a
//! label index), else all — reading a compact [`Room`] per node, and
//! allocates only to intersect a multi-label selector or to record the
//! placement. Only when no node fits does a second walk over every node
//! collect the reasons.

use std::borrow::Cow;
use std::collections::HashMap;

use corral_api::kinds::NodePhase;
use corral_api::{Kind, ObjectKey};

use crate::node::{Free, Node, Room, runtime_bit};
use crate::reason::{NodeReason, Reason, Unschedulable};
use crate::request::{BoundWorkload, Request};
use crate::snapshot::{NodeInfo, Snapshot};

/// Added to the score of a KVM node when a VM wants KVM.
const KVM_BONUS: f64 = 2.0;

/// How to choose among the nodes that fit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Strategy {
    /// Least allocated first: the node whose scarcest resource (cpu, memory
    /// or pod slots, as a share of capacity) has the most left after placing.
    #[default]
    Spread,
    /// Most allocated first: the node with the least left, among those that fit.
    BinPack,
}

/// Where a workload goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub workload: ObjectKey,
    pub node: String,
    /// How many nodes passed every filter.
    pub feasible: usize,
    /// How many nodes the cluster has.
    pub nodes: usize,
}

/// The first filter a node failed, cheap to make; turned into a [`Reason`]
/// only when the workload is unschedulable.
#[derive(Debug, Clone, Copy)]
enum Failure {
    NotReady,
    Unschedulable,
    Pinned,
    /// Index into the request's located volumes.
    Volume(usize),
    Selector,
    Runtime,
    /// Index into the node's host ports.
    HostPort(usize),
    PodSlots,
    Cpu,
    Memory,
}

/// The request resolved against the index once per decision.
#[derive(Debug)]
struct Prepared<'r> {
    /// `Some(None)`: pinned to a node the cluster does not have.
    pinned: Option<Option<u32>>,
    /// `local` volumes that already live somewhere: name, node, node index.
    located: Vec<(&'r str, String, Option<u32>)>,
    /// 0 when no runtime is needed (virtual machines).
    runtime: u8,
}

/// A placed workload, remembered so it can be released or re-placed.
#[derive(Debug)]
struct Binding {
    node: Option<u32>,
    workload: BoundWorkload,
}

/// An indexed snapshot that places workloads one after another, each
/// placement reserving its resources for the next decision.
#[derive(Debug)]
pub struct Scheduler {
    strategy: Strategy,
    /// Sorted by name; a node's index is its rank.
    nodes: Vec<Node>,
    /// `rooms[i]` mirrors `nodes[i]`'s figures for the hot loop.
    rooms: Vec<Room>,
    all: Vec<u32>,
    by_name: HashMap<String, u32>,
    /// label key → value → indexes of the nodes carrying it, ascending.
    labels: HashMap<String, HashMap<String, Vec<u32>>>,
    /// `local` volume → the node it lives on.
    volumes: HashMap<String, String>,
    bindings: HashMap<ObjectKey, Binding>,
}

impl Scheduler {
    /// Indexes a snapshot. A node name given twice keeps its first entry; a
    /// volume's first location wins.
    pub fn new(snapshot: &Snapshot, strategy: Strategy) -> Self {
        let mut infos: Vec<&NodeInfo> = snapshot.nodes.iter().collect();
        infos.sort_by(|a, b| a.name.cmp(&b.name));
        infos.dedup_by(|later, earlier| later.name == earlier.name);
        let nodes: Vec<Node> = infos.into_iter().map(Node::new).collect();
        let mut by_name = HashMap::with_capacity(nodes.len());
        let mut labels: HashMap<String, HashMap<String, Vec<u32>>> = HashMap::new();
        for (index, node) in (0u32..).zip(&nodes) {
            by_name.insert(node.name.clone(), index);
            for (key, value) in &node.labels {
                labels
                    .entry(key.clone())
                    .or_default()
                    .entry(value.clone())
                    .or_default()
                    .push(index);
            }
        }
        let mut scheduler = Scheduler {
            strategy,
            all: (0..nodes.len() as u32).collect(),
            rooms: nodes.iter().map(Node::room).collect(),
            nodes,
            by_name,
            labels,
            volumes: snapshot
                .volumes
                .iter()
                .map(|(volume, node)| (volume.clone(), node.clone()))
                .collect(),
            bindings: HashMap::new(),
        };
        for bound in &snapshot.bound {
            scheduler.bind(bound.clone());
        }
        scheduler
    }

    pub fn strategy(&self) -> Strategy {
        self.strategy
    }

    /// What `node` has left, or `None` if there is no such node.
    pub fn free(&self, node: &str) -> Option<Free> {
        let index = *self.by_name.get(node)?;
        Some(self.nodes[index as usize].free())
    }

    /// Where a `local` volume lives, if anywhere yet.
    pub fn volume_node(&self, volume: &str) -> Option<&str> {
        self.volumes.get(volume).map(String::as_str)
    }

    /// Chooses a node for the workload and reserves it there. A workload
    /// already bound is re-placed: its own reservation does not count
    /// against it, and it keeps it if no node fits.
    pub fn place(&mut self, request: &Request) -> Result<Placement, Unschedulable> {
        let previous = self.unbind(&request.workload);
        match self.choose(request) {
            Ok((index, feasible)) => {
                let node = self.nodes[index as usize].name.clone();
                self.bind(BoundWorkload::new(request, &node));
                Ok(Placement {
                    workload: request.workload.clone(),
                    node,
                    feasible,
                    nodes: self.nodes.len(),
                })
            }
            Err(unschedulable) => {
                if let Some(previous) = previous {
                    self.bind(previous.workload);
                }
                Err(unschedulable)
            }
        }
    }

    /// Whether the workload, with its new request, still fits `node` — the
    /// question behind an in-place update. Its current reservation does not
    /// count against it. Changes nothing.
    pub fn fits(&mut self, request: &Request, node: &str) -> Result<(), Reason> {
        let Some(&index) = self.by_name.get(node) else {
            return Err(Reason::NoSuchNode);
        };
        let previous = self.unbind(&request.workload);
        let prepared = self.prepare(request);
        let verdict = self
            .check(index, request, &prepared)
            .map_err(|failure| self.reason(index, request, &prepared, failure));
        if let Some(previous) = previous {
            self.bind(previous.workload);
        }
        verdict
    }

    /// Frees a workload's reservation (it was deleted or finished). Its
    /// `local` volumes stay where they are. Returns whether it was bound.
    pub fn release(&mut self, workload: &ObjectKey) -> bool {
        self.unbind(workload).is_some()
    }

    /// Moves a workload's reservation to `workload.node` together with its
    /// `local` volumes (a VM's disks, which a live migration copies there).
    pub fn relocate(&mut self, workload: BoundWorkload) {
        self.unbind(&workload.workload);
        for volume in &workload.local_volumes {
            self.volumes.insert(volume.clone(), workload.node.clone());
        }
        self.bind(workload);
    }

    /// Counts a workload already bound to its node (seen bound in the
    /// cluster) against that node, replacing its earlier reservation.
    pub fn reserve(&mut self, workload: BoundWorkload) {
        self.bind(workload);
    }

    fn bind(&mut self, workload: BoundWorkload) {
        self.unbind(&workload.workload);
        let index = self.by_name.get(&workload.node).copied();
        if let Some(index) = index {
            let node = &mut self.nodes[index as usize];
            node.reserve(&workload);
            self.rooms[index as usize] = node.room();
        }
        for volume in &workload.local_volumes {
            if !self.volumes.contains_key(volume) {
                self.volumes.insert(volume.clone(), workload.node.clone());
            }
        }
        self.bindings.insert(
            workload.workload.clone(),
            Binding {
                node: index,
                workload,
            },
        );
    }

    fn unbind(&mut self, workload: &ObjectKey) -> Option<Binding> {
        let binding = self.bindings.remove(workload)?;
        if let Some(index) = binding.node {
            let node = &mut self.nodes[index as usize];
            node.unreserve(&binding.workload);
            self.rooms[index as usize] = node.room();
        }
        Some(binding)
    }

    /// The best node and how many fit, or every node's reason.
    fn choose(&self, request: &Request) -> Result<(u32, usize), Unschedulable> {
        let prepared = self.prepare(request);
        let single: [u32; 1];
        // A pin or a placed volume leaves one node to check in full; else the
        // candidates already match the selector and only the room and the
        // host ports remain to check.
        let mut thorough = true;
        let candidates: Cow<'_, [u32]> = if let Some(pinned) = prepared.pinned {
            single = [pinned.unwrap_or(u32::MAX)];
            Cow::Borrowed(if pinned.is_some() { &single } else { &[] })
        } else if let Some((_, _, located)) = prepared.located.first() {
            single = [located.unwrap_or(u32::MAX)];
            Cow::Borrowed(if located.is_some() { &single } else { &[] })
        } else {
            thorough = false;
            self.selector_candidates(request)
        };
        let mut best: Option<(u32, f64)> = None;
        let mut feasible = 0;
        for &index in candidates.iter() {
            let room = &self.rooms[index as usize];
            let fits = room.admits(request, prepared.runtime)
                && if thorough {
                    self.check(index, request, &prepared).is_ok()
                } else {
                    request.host_ports.is_empty()
                        || !room.holds_host_ports()
                        || self.host_port_taken(index, request).is_none()
                };
            if !fits {
                continue;
            }
            feasible += 1;
            let share = room.least_share_left(request);
            let mut score = match self.strategy {
                Strategy::Spread => share,
                Strategy::BinPack => -share,
            };
            // Shares lie in 0..=1, so a KVM bonus of 2 outranks any of them.
            if request.wants_kvm && room.kvm {
                score += KVM_BONUS;
            }
            // Strictly better only: the first node by name keeps a tie.
            if best.is_none_or(|(_, best)| score > best) {
                best = Some((index, score));
            }
        }
        match best {
            Some((index, _)) => Ok((index, feasible)),
            None => Err(self.explain(request, &prepared)),
        }
    }

    /// The nodes carrying every `key=value` of the selector (all nodes for
    /// an empty one), ascending.
    fn selector_candidates(&self, request: &Request) -> Cow<'_, [u32]> {
        let mut lists = Vec::new();
        for (key, value) in &request.selector {
            match self.labels.get(key).and_then(|values| values.get(value)) {
                Some(nodes) => lists.push(nodes.as_slice()),
                None => return Cow::Borrowed(&[]),
            }
        }
        lists.sort_by_key(|list| list.len());
        match lists.split_first() {
            None => Cow::Borrowed(&self.all),
            Some((smallest, [])) => Cow::Borrowed(smallest),
            Some((smallest, others)) => Cow::Owned(
                smallest
                    .iter()
                    .copied()
                    .filter(|index| others.iter().all(|list| list.binary_search(index).is_ok()))
                    .collect(),
            ),
        }
    }

    /// The position in the node's host ports of one the request also wants.
    fn host_port_taken(&self, index: u32, request: &Request) -> Option<usize> {
        let taken = &self.nodes[index as usize].host_ports;
        request
            .host_ports
            .iter()
            .find_map(|port| taken.iter().position(|(used, _)| used == port))
    }

    fn prepare<'r>(&self, request: &'r Request) -> Prepared<'r> {
        let index_of = |name: &str| self.by_name.get(name).copied();
        Prepared {
            pinned: request.node.as_deref().map(index_of),
            located: request
                .local_volumes
                .iter()
                .filter_map(|volume| {
                    let node = self.volumes.get(volume)?;
                    Some((volume.as_str(), node.clone(), index_of(node)))
                })
                .collect(),
            runtime: if request.workload.kind == Kind::VirtualMachine {
                0
            } else {
                runtime_bit(request.runtime_or_default())
            },
        }
    }

    /// Every filter, in the order of [`Reason`]'s variants.
    fn check(&self, index: u32, request: &Request, prepared: &Prepared) -> Result<(), Failure> {
        let node = &self.nodes[index as usize];
        if node.phase != NodePhase::Ready {
            return Err(Failure::NotReady);
        }
        if node.unschedulable {
            return Err(Failure::Unschedulable);
        }
        if prepared.pinned.is_some_and(|pinned| pinned != Some(index)) {
            return Err(Failure::Pinned);
        }
        if let Some(position) = prepared
            .located
            .iter()
            .position(|(_, _, located)| *located != Some(index))
        {
            return Err(Failure::Volume(position));
        }
        if !request
            .selector
            .iter()
            .all(|(key, value)| node.labels.get(key) == Some(value))
        {
            return Err(Failure::Selector);
        }
        if node.runtimes & prepared.runtime != prepared.runtime {
            return Err(Failure::Runtime);
        }
        if let Some(position) = self.host_port_taken(index, request) {
            return Err(Failure::HostPort(position));
        }
        let free = node.free();
        if free.pods == 0 {
            return Err(Failure::PodSlots);
        }
        if free.cpu.millis < request.cpu.millis {
            return Err(Failure::Cpu);
        }
        if free.memory.bytes < request.memory.bytes {
            return Err(Failure::Memory);
        }
        Ok(())
    }

    /// Every node's reason, in name order. Called only when no node fits,
    /// so every node has one.
    fn explain(&self, request: &Request, prepared: &Prepared) -> Unschedulable {
        let mut reasons = Vec::with_capacity(self.nodes.len());
        for &index in &self.all {
            if let Err(failure) = self.check(index, request, prepared) {
                reasons.push(NodeReason {
                    node: self.nodes[index as usize].name.clone(),
                    reason: self.reason(index, request, prepared, failure),
                });
            }
        }
        Unschedulable {
            workload: request.workload.clone(),
            reasons,
        }
    }

    fn reason(
        &self,
        index: u32,
        request: &Request,
        prepared: &Prepared,
        failure: Failure,
    ) -> Reason {
        let node = &self.nodes[index as usize];
        match failure {
            Failure::NotReady => Reason::NotReady { phase: node.phase },
            Failure::Unschedulable => Reason::Unschedulable,
            Failure::Pinned => Reason::PinnedElsewhere {
                node: request.node.clone().unwrap_or_default(),
            },
            Failure::Volume(position) => {
                let (volume, node, _) = &prepared.located[position];
                Reason::VolumeElsewhere {
                    volume: volume.to_string(),
                    node: node.clone(),
                }
            }
            Failure::Selector => Reason::SelectorMismatch {
                selector: request.selector.clone(),
            },
            Failure::Runtime => Reason::RuntimeUnavailable {
                runtime: request.runtime_or_default(),
            },
            Failure::HostPort(position) => {
                let (port, holder) = &node.host_ports[position];
                Reason::HostPortInUse {
                    port: *port,
                    holder: holder.clone(),
                }
            }
            Failure::PodSlots => Reason::NoPodSlots {
                capacity: node.capacity.pods,
            },
            Failure::Cpu => Reason::InsufficientCpu {
                free: node.free().cpu,
                requested: request.cpu,
            },
            Failure::Memory => Reason::InsufficientMemory {
                free: node.free().memory,
                requested: request.memory,
            },
        }
    }
}

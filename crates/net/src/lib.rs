//! corral's IPv6-only pod networking (design idea 6): no overlay, no CNI,
//! no Services.
//!
//! Owns:
//! - [`ipam`]: the pure allocation rules, re-exported from `corral-ipam`
//!   (the cluster's prefix, a /64 per node, a random address per pod, the
//!   node-local IPv4 egress range);
//! - [`datapath`]: a veth per pod and plain routes between nodes, over
//!   rtnetlink, behind the [`datapath::NetworkOps`] trait;
//! - [`dns`]: answers pods' queries for `corral.` names, forwards the rest;
//! - [`egress`]: the nftables masquerade that gives pods IPv4 egress;
//! - [`wireguard`]: optional encrypted node-to-node links (kernel module or
//!   `wireguard-go`);
//! - [`netns`]: persistent network namespaces named by path, re-exported
//!   from `corral-runtime`, which owns them (pods' sandboxes need them too);
//! - [`lab`]: N "nodes" as namespaces on one bridge, for tests and `corral lab`.
//!
//! Must not: talk to the API server, keep state on disk (the agent persists
//! allocations), or touch any interface, route or table it did not create —
//! everything it makes is named or tagged as corral's.

pub mod datapath;
pub mod dns;
pub mod egress;
pub mod lab;
pub mod wireguard;

pub use corral_ipam as ipam;
pub use corral_runtime::oci::netns;

//! corral's address allocation, pure: the cluster's IPv6 prefix, each
//! node's /64, each pod's address, and the node-local IPv4 egress range.
//!
//! Owns the allocation rules and nothing else: it does no I/O and knows no
//! API objects, so the IPAM controller (`corral-controllers`) and the node
//! data path (`corral-net`, which re-exports this crate as
//! `corral_net::ipam`) share it without pulling netlink into the control
//! plane. Randomness comes in as `&mut impl RngCore`, so a test (or a
//! replayed workflow step) passes a seeded or scripted generator and gets
//! the same answer every time.
//!
//! Rules chosen here (decision record `docs/design/0012-ipv6-networking.md`):
//! - A cluster prefix is a unicast prefix from the ULA (`fc00::/7`) or global
//!   unicast (`2000::/3`) space, between /32 and /64 long, with no host bits
//!   set. /48 is the default (a random RFC 4193 ULA); a /64 is allowed and
//!   means a single-node cluster.
//! - Node subnets are always /64s (SLAAC-sized, and what pods are drawn from).
//! - Inside a node's /64 the interface identifiers `::` (subnet-router
//!   anycast, RFC 4291), `::1` (the node's own gateway/service address) and
//!   the RFC 2526 reserved subnet anycast block are never handed to pods.

mod egress_range;

pub use egress_range::{DEFAULT_EGRESS_RANGE, EgressRange};

use std::collections::BTreeSet;
use std::fmt;
use std::net::Ipv6Addr;
use std::str::FromStr;

use ipnet::Ipv6Net;
use rand::RngCore;

/// Length of a generated RFC 4193 ULA cluster prefix.
pub const ULA_PREFIX_LEN: u8 = 48;
/// Length of every node subnet.
pub const NODE_SUBNET_LEN: u8 = 64;
/// Shortest cluster prefix accepted.
pub const MIN_CLUSTER_PREFIX_LEN: u8 = 32;
/// Longest cluster prefix accepted (a single node subnet).
pub const MAX_CLUSTER_PREFIX_LEN: u8 = NODE_SUBNET_LEN;

/// How many random draws are tried before an allocator gives up (pod
/// addresses) or falls back to a scan (node subnets).
pub const RANDOM_ATTEMPTS: u32 = 64;

/// Interface identifier of the node's own address in its /64 (`<subnet>::1`).
pub const NODE_GATEWAY_INTERFACE_ID: u64 = 1;

/// Why an address could not be parsed or allocated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IpamError {
    #[error("cluster prefix {input:?} is not an IPv6 prefix like fd12:3456:789a::/48")]
    UnparsablePrefix { input: String },
    #[error(
        "cluster prefix {prefix} is /{len}: expected a length between /{MIN_CLUSTER_PREFIX_LEN} and /{MAX_CLUSTER_PREFIX_LEN}"
    )]
    PrefixLength { prefix: Ipv6Net, len: u8 },
    #[error("cluster prefix {prefix} has host bits set: expected {expected}")]
    HostBitsSet { prefix: Ipv6Net, expected: Ipv6Net },
    #[error(
        "cluster prefix {prefix} is not unicast address space: expected a ULA (fc00::/7) or global unicast (2000::/3) prefix"
    )]
    NotUnicast { prefix: Ipv6Net },
    #[error("node subnet {subnet} is not a /{NODE_SUBNET_LEN} with its host bits clear")]
    NotNodeSubnet { subnet: Ipv6Net },
    #[error("cluster prefix {prefix} has no free /{NODE_SUBNET_LEN} left ({total} in use)")]
    NoFreeNodeSubnet { prefix: Ipv6Net, total: u128 },
    #[error("node subnet {subnet} gave no free pod address after {attempts} random draws")]
    NoFreePodAddress { subnet: Ipv6Net, attempts: u32 },
    #[error("egress range {input:?} is not an IPv4 prefix like 10.87.0.0/22")]
    UnparsableEgressRange { input: String },
    #[error(
        "egress range {range} is not usable: expected an RFC 1918 prefix between /16 and /29 with its host bits clear"
    )]
    InvalidEgressRange { range: ipnet::Ipv4Net },
    #[error("egress range {range} has no free pod address left")]
    NoFreeEgressAddress { range: ipnet::Ipv4Net },
}

/// The cluster's one IPv6 prefix, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClusterPrefix(Ipv6Net);

impl ClusterPrefix {
    /// Generates a random RFC 4193 ULA /48: `fd` followed by a 40-bit global ID.
    pub fn generate_ula(rng: &mut impl RngCore) -> Self {
        let mut global_id = [0u8; 5];
        rng.fill_bytes(&mut global_id);
        let mut octets = [0u8; 16];
        octets[0] = 0xfd;
        octets[1..6].copy_from_slice(&global_id);
        // INVARIANT: 48 <= 128, so the prefix length is always valid.
        #[allow(clippy::unwrap_used)]
        let net = Ipv6Net::new(Ipv6Addr::from(octets), ULA_PREFIX_LEN).unwrap();
        ClusterPrefix(net)
    }

    /// Validates an operator-given prefix (`--cluster-prefix`).
    pub fn new(prefix: Ipv6Net) -> Result<Self, IpamError> {
        let len = prefix.prefix_len();
        if !(MIN_CLUSTER_PREFIX_LEN..=MAX_CLUSTER_PREFIX_LEN).contains(&len) {
            return Err(IpamError::PrefixLength { prefix, len });
        }
        if prefix.trunc() != prefix {
            return Err(IpamError::HostBitsSet {
                prefix,
                expected: prefix.trunc(),
            });
        }
        let first = prefix.network().octets()[0];
        let unique_local = first & 0xfe == 0xfc;
        let global_unicast = first & 0xe0 == 0x20;
        if !unique_local && !global_unicast {
            return Err(IpamError::NotUnicast { prefix });
        }
        Ok(ClusterPrefix(prefix))
    }

    /// The prefix itself.
    pub fn net(&self) -> Ipv6Net {
        self.0
    }

    /// How many node /64s fit in this prefix.
    pub fn node_subnet_capacity(&self) -> u128 {
        1u128 << (NODE_SUBNET_LEN - self.0.prefix_len())
    }

    /// The `index`-th /64 of the prefix (`index < node_subnet_capacity()`).
    fn node_subnet(&self, index: u128) -> Ipv6Net {
        let base = u128::from(self.0.network());
        let addr = base | (index << (128 - u32::from(NODE_SUBNET_LEN)));
        // INVARIANT: 64 is a valid IPv6 prefix length.
        #[allow(clippy::unwrap_used)]
        Ipv6Net::new(Ipv6Addr::from(addr), NODE_SUBNET_LEN).unwrap()
    }

    /// Allocates a /64 for a joining node: a random free one, deterministic
    /// for a given generator. `taken` may hold subnets outside this prefix;
    /// they are ignored.
    pub fn allocate_node_subnet(
        &self,
        taken: &BTreeSet<Ipv6Net>,
        rng: &mut impl RngCore,
    ) -> Result<Ipv6Net, IpamError> {
        let capacity = self.node_subnet_capacity();
        let used = taken
            .iter()
            .filter(|s| s.prefix_len() == NODE_SUBNET_LEN && self.0.contains(*s))
            .count() as u128;
        if used >= capacity {
            return Err(IpamError::NoFreeNodeSubnet {
                prefix: self.0,
                total: capacity,
            });
        }
        let mask = capacity - 1;
        for _ in 0..RANDOM_ATTEMPTS {
            let candidate = self.node_subnet(u128::from(rng.next_u64()) & mask);
            if !taken.contains(&candidate) {
                return Ok(candidate);
            }
        }
        // Nearly full: scan from a random start. A free subnet exists (checked
        // above), so this ends within `used + 1` steps.
        let start = u128::from(rng.next_u64()) & mask;
        (0..capacity)
            .map(|offset| self.node_subnet((start + offset) & mask))
            .find(|candidate| !taken.contains(candidate))
            .ok_or(IpamError::NoFreeNodeSubnet {
                prefix: self.0,
                total: capacity,
            })
    }
}

impl fmt::Display for ClusterPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for ClusterPrefix {
    type Err = IpamError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let net = input
            .trim()
            .parse::<Ipv6Net>()
            .map_err(|_| IpamError::UnparsablePrefix {
                input: input.to_string(),
            })?;
        ClusterPrefix::new(net)
    }
}

/// Checks that `subnet` is a node subnet (a /64 with host bits clear).
pub fn validate_node_subnet(subnet: Ipv6Net) -> Result<(), IpamError> {
    if subnet.prefix_len() != NODE_SUBNET_LEN || subnet.trunc() != subnet {
        return Err(IpamError::NotNodeSubnet { subnet });
    }
    Ok(())
}

/// The node's own address in its subnet (`<subnet>::1`), never given to a pod.
pub fn node_gateway_address(subnet: Ipv6Net) -> Ipv6Addr {
    with_interface_id(subnet, NODE_GATEWAY_INTERFACE_ID)
}

/// True for interface identifiers no pod may get: the subnet-router anycast
/// `::`, the node's `::1`, and the RFC 2526 reserved subnet anycast block
/// (`fdff:ffff:ffff:ff80`–`fdff:ffff:ffff:ffff`).
pub fn is_reserved_interface_id(interface_id: u64) -> bool {
    interface_id == 0
        || interface_id == NODE_GATEWAY_INTERFACE_ID
        || (0xfdff_ffff_ffff_ff80..=0xfdff_ffff_ffff_ffff).contains(&interface_id)
}

fn with_interface_id(subnet: Ipv6Net, interface_id: u64) -> Ipv6Addr {
    let base = u128::from(subnet.network()) & !u128::from(u64::MAX);
    Ipv6Addr::from(base | u128::from(interface_id))
}

/// Allocates a random pod address in `subnet` (a node's /64) that is neither
/// reserved nor in `taken` (the node's addresses in use).
pub fn allocate_pod_address(
    subnet: Ipv6Net,
    taken: &BTreeSet<Ipv6Addr>,
    rng: &mut impl RngCore,
) -> Result<Ipv6Addr, IpamError> {
    validate_node_subnet(subnet)?;
    for _ in 0..RANDOM_ATTEMPTS {
        let interface_id = rng.next_u64();
        if is_reserved_interface_id(interface_id) {
            continue;
        }
        let candidate = with_interface_id(subnet, interface_id);
        if !taken.contains(&candidate) {
            return Ok(candidate);
        }
    }
    Err(IpamError::NoFreePodAddress {
        subnet,
        attempts: RANDOM_ATTEMPTS,
    })
}

#[cfg(test)]
mod tests;

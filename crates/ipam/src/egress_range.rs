//! The node-local IPv4 egress range: identical on every node, never in the
//! API. Pods get an address from it only to reach the IPv4 internet through
//! the node's masquerade; pods never talk IPv4 to each other across nodes.

use std::collections::BTreeSet;
use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;

use ipnet::Ipv4Net;

use super::IpamError;

/// The default egress range: 1,021 pod addresses per node.
pub const DEFAULT_EGRESS_RANGE: &str = "10.87.0.0/22";

/// A validated RFC 1918 egress range. Its first host address is the gateway
/// (on the node's side of every pod veth); pods get the rest, lowest free first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EgressRange(Ipv4Net);

impl EgressRange {
    /// Validates a range: RFC 1918, /16 to /29, host bits clear.
    pub fn new(range: Ipv4Net) -> Result<Self, IpamError> {
        let private = [
            Ipv4Net::new(Ipv4Addr::new(10, 0, 0, 0), 8),
            Ipv4Net::new(Ipv4Addr::new(172, 16, 0, 0), 12),
            Ipv4Net::new(Ipv4Addr::new(192, 168, 0, 0), 16),
        ]
        .into_iter()
        .flatten()
        .any(|block| block.contains(&range));
        if !private || !(16..=29).contains(&range.prefix_len()) || range.trunc() != range {
            return Err(IpamError::InvalidEgressRange { range });
        }
        Ok(EgressRange(range))
    }

    /// The range itself.
    pub fn net(&self) -> Ipv4Net {
        self.0
    }

    /// The gateway pods route IPv4 through: the first host address (`.1`).
    pub fn gateway(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.0.network()) + 1)
    }

    /// The address a workload named by `seed` (a VM's uid) prefers, the
    /// same on every node: a host address other than the gateway, picked by
    /// an FNV-1a hash of the seed. A live-migrated VM thus finds its
    /// address free on the target, unless a workload there holds it.
    pub fn preferred(&self, seed: &[u8]) -> Ipv4Addr {
        let hash = seed.iter().fold(0x811c_9dc5_u32, |hash, byte| {
            (hash ^ u32::from(*byte)).wrapping_mul(0x0100_0193)
        });
        let first = u32::from(self.0.network()) + 2;
        let count = u32::from(self.0.broadcast()) - 1 - first + 1;
        Ipv4Addr::from(first + hash % count)
    }

    /// [`EgressRange::allocate`], but `preferred` when it is free (and one
    /// of the range's pod addresses).
    pub fn allocate_preferring(
        &self,
        taken: &BTreeSet<Ipv4Addr>,
        preferred: Option<Ipv4Addr>,
    ) -> Result<Ipv4Addr, IpamError> {
        let first = u32::from(self.0.network()) + 2;
        let last = u32::from(self.0.broadcast()) - 1;
        match preferred {
            Some(address)
                if (first..=last).contains(&u32::from(address)) && !taken.contains(&address) =>
            {
                Ok(address)
            }
            _ => self.allocate(taken),
        }
    }

    /// Allocates the lowest free pod address: not the network, gateway or
    /// broadcast address, and not in `taken`.
    pub fn allocate(&self, taken: &BTreeSet<Ipv4Addr>) -> Result<Ipv4Addr, IpamError> {
        let first = u32::from(self.0.network()) + 2;
        let last = u32::from(self.0.broadcast()) - 1;
        (first..=last)
            .map(Ipv4Addr::from)
            .find(|candidate| !taken.contains(candidate))
            .ok_or(IpamError::NoFreeEgressAddress { range: self.0 })
    }
}

impl Default for EgressRange {
    fn default() -> Self {
        // INVARIANT: the constant is a valid RFC 1918 /22 (tested below).
        #[allow(clippy::unwrap_used)]
        DEFAULT_EGRESS_RANGE.parse().unwrap()
    }
}

impl fmt::Display for EgressRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for EgressRange {
    type Err = IpamError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let net =
            input
                .trim()
                .parse::<Ipv4Net>()
                .map_err(|_| IpamError::UnparsableEgressRange {
                    input: input.to_string(),
                })?;
        EgressRange::new(net)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_range_is_valid_and_gateway_is_dot_one() {
        let range = EgressRange::default();
        assert_eq!(range.net().to_string(), "10.87.0.0/22");
        assert_eq!(range.gateway(), Ipv4Addr::new(10, 87, 0, 1));
    }

    #[test]
    fn a_preferred_address_is_stable_in_range_and_used_when_free() {
        let range: EgressRange = "10.87.0.0/29".parse().unwrap();
        let pods =
            |a: Ipv4Addr| (2..=6).contains(&(u32::from(a) - u32::from(range.net().network())));
        for seed in ["a", "b", "0b1d9c2e-uid", ""] {
            let preferred = range.preferred(seed.as_bytes());
            assert_eq!(preferred, range.preferred(seed.as_bytes()), "{seed}");
            assert!(pods(preferred), "{seed}: {preferred}");
        }
        let preferred = range.preferred(b"uid-1");
        let none = BTreeSet::new();
        assert_eq!(
            range.allocate_preferring(&none, Some(preferred)).unwrap(),
            preferred
        );
        // Taken there: the lowest free one instead.
        let taken = BTreeSet::from([preferred]);
        let other = range.allocate_preferring(&taken, Some(preferred)).unwrap();
        assert_ne!(other, preferred);
        assert_eq!(other, range.allocate(&taken).unwrap());
        // Outside the pods' addresses (the gateway): not used.
        assert_eq!(
            range
                .allocate_preferring(&none, Some(range.gateway()))
                .unwrap(),
            range.allocate(&none).unwrap()
        );
    }

    #[test]
    fn accepts_each_rfc1918_block() {
        for ok in [
            "10.0.0.0/16",
            "172.16.4.0/24",
            "172.31.255.248/29",
            "192.168.1.0/24",
        ] {
            assert!(ok.parse::<EgressRange>().is_ok(), "{ok}");
        }
    }

    #[test]
    fn rejects_public_too_large_too_small_and_host_bits() {
        for bad in [
            "8.8.8.0/24",
            "172.32.0.0/24",
            "10.0.0.0/8",
            "10.0.0.0/15",
            "10.0.0.0/30",
            "10.87.0.1/22",
            "100.64.0.0/24",
        ] {
            let err = bad.parse::<EgressRange>().unwrap_err();
            assert!(
                matches!(err, IpamError::InvalidEgressRange { .. }),
                "{bad}: {err}"
            );
            assert!(err.to_string().contains("RFC 1918"));
        }
        assert!(matches!(
            "nope".parse::<EgressRange>(),
            Err(IpamError::UnparsableEgressRange { .. })
        ));
    }

    #[test]
    fn allocates_lowest_free_skipping_gateway_and_taken() {
        let range: EgressRange = "10.87.0.0/29".parse().unwrap();
        let mut taken = BTreeSet::new();
        let first = range.allocate(&taken).unwrap();
        assert_eq!(first, Ipv4Addr::new(10, 87, 0, 2));
        taken.insert(first);
        taken.insert(Ipv4Addr::new(10, 87, 0, 4));
        assert_eq!(range.allocate(&taken).unwrap(), Ipv4Addr::new(10, 87, 0, 3));
    }

    #[test]
    fn exhaustion_names_the_range_and_never_hands_out_broadcast() {
        let range: EgressRange = "192.168.9.0/29".parse().unwrap();
        let mut taken = BTreeSet::new();
        for _ in 0..5 {
            let addr = range.allocate(&taken).unwrap();
            assert_ne!(addr, Ipv4Addr::new(192, 168, 9, 7));
            taken.insert(addr);
        }
        let err = range.allocate(&taken).unwrap_err();
        assert_eq!(err, IpamError::NoFreeEgressAddress { range: range.net() });
        assert!(err.to_string().contains("192.168.9.0/29"));
    }
}

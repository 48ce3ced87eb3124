use super::*;
use rand::SeedableRng;
use rand::rngs::StdRng;

/// Returns the scripted values in order, then repeats the last one.
struct ScriptedRng {
    values: Vec<u64>,
    next: usize,
}

impl ScriptedRng {
    fn new(values: &[u64]) -> Self {
        ScriptedRng {
            values: values.to_vec(),
            next: 0,
        }
    }
}

impl RngCore for ScriptedRng {
    fn next_u32(&mut self) -> u32 {
        self.next_u64() as u32
    }
    fn next_u64(&mut self) -> u64 {
        let value = self.values[self.next.min(self.values.len() - 1)];
        self.next += 1;
        value
    }
    fn fill_bytes(&mut self, dest: &mut [u8]) {
        for chunk in dest.chunks_mut(8) {
            let bytes = self.next_u64().to_be_bytes();
            chunk.copy_from_slice(&bytes[..chunk.len()]);
        }
    }
}

fn net(s: &str) -> Ipv6Net {
    s.parse().unwrap()
}

#[test]
fn generated_ula_is_fd_slash_48_with_40_random_bits() {
    let mut rng = ScriptedRng::new(&[0x1122_3344_5566_7788]);
    let prefix = ClusterPrefix::generate_ula(&mut rng);
    assert_eq!(prefix.net(), net("fd11:2233:4455::/48"));
    // And every generated prefix passes our own validation.
    let mut rng = StdRng::seed_from_u64(7);
    for _ in 0..100 {
        let prefix = ClusterPrefix::generate_ula(&mut rng);
        assert_eq!(prefix.net().prefix_len(), 48);
        assert_eq!(prefix.net().network().octets()[0], 0xfd);
        assert_eq!(ClusterPrefix::new(prefix.net()), Ok(prefix));
    }
}

#[test]
fn generated_ula_is_deterministic_for_a_seed() {
    let a = ClusterPrefix::generate_ula(&mut StdRng::seed_from_u64(42));
    let b = ClusterPrefix::generate_ula(&mut StdRng::seed_from_u64(42));
    assert_eq!(a, b);
}

#[test]
fn parses_ula_and_global_prefixes_of_allowed_lengths() {
    for ok in [
        "fd00:1:2::/48",
        "2001:db8::/32",
        "2001:db8:1:2::/64",
        "fc00:aa::/40",
        " fd12:3456:789a::/56 ",
    ] {
        let prefix: ClusterPrefix = ok.parse().unwrap_or_else(|e| panic!("{ok}: {e}"));
        assert_eq!(prefix.net(), net(ok.trim()));
    }
}

#[test]
fn rejects_bad_prefixes_naming_them() {
    let err = "fd00::/31".parse::<ClusterPrefix>().unwrap_err();
    assert_eq!(
        err,
        IpamError::PrefixLength {
            prefix: net("fd00::/31"),
            len: 31
        }
    );
    assert!(err.to_string().contains("fd00::/31"), "{err}");

    let err = "fd00::/65".parse::<ClusterPrefix>().unwrap_err();
    assert!(matches!(err, IpamError::PrefixLength { len: 65, .. }));

    let err = "fd00:1:2:3::/48".parse::<ClusterPrefix>().unwrap_err();
    assert_eq!(
        err,
        IpamError::HostBitsSet {
            prefix: net("fd00:1:2:3::/48"),
            expected: net("fd00:1:2::/48")
        }
    );
    assert!(err.to_string().contains("expected fd00:1:2::/48"), "{err}");

    for not_unicast in [
        "fe80::/64",
        "ff02::/48",
        "::/48",
        "::ffff:0:0/96",
        "4000::/48",
    ] {
        let parsed = not_unicast.parse::<ClusterPrefix>();
        assert!(
            matches!(
                parsed,
                Err(IpamError::NotUnicast { .. }) | Err(IpamError::PrefixLength { .. })
            ),
            "{not_unicast}: {parsed:?}"
        );
    }
    assert!(matches!(
        "fe80::/48".parse::<ClusterPrefix>(),
        Err(IpamError::NotUnicast { .. })
    ));

    let err = "10.0.0.0/8".parse::<ClusterPrefix>().unwrap_err();
    assert_eq!(
        err,
        IpamError::UnparsablePrefix {
            input: "10.0.0.0/8".into()
        }
    );
    assert!(err.to_string().contains("\"10.0.0.0/8\""));
}

#[test]
fn capacity_follows_prefix_length() {
    let p48: ClusterPrefix = "fd00::/48".parse().unwrap();
    assert_eq!(p48.node_subnet_capacity(), 65_536);
    let p64: ClusterPrefix = "fd00::/64".parse().unwrap();
    assert_eq!(p64.node_subnet_capacity(), 1);
    let p32: ClusterPrefix = "2001:db8::/32".parse().unwrap();
    assert_eq!(p32.node_subnet_capacity(), 1 << 32);
}

#[test]
fn node_subnet_is_the_random_index_inside_the_prefix() {
    let prefix: ClusterPrefix = "fd00:1:2::/48".parse().unwrap();
    let mut rng = ScriptedRng::new(&[0xabcd_0000_0000_0042]);
    let subnet = prefix
        .allocate_node_subnet(&BTreeSet::new(), &mut rng)
        .unwrap();
    // Only the low 16 bits of the draw pick the subnet of a /48.
    assert_eq!(subnet, net("fd00:1:2:42::/64"));
}

#[test]
fn node_subnet_skips_taken_draws() {
    let prefix: ClusterPrefix = "fd00:1:2::/48".parse().unwrap();
    let taken: BTreeSet<_> = [net("fd00:1:2:1::/64"), net("fd00:1:2:2::/64")].into();
    let mut rng = ScriptedRng::new(&[1, 2, 1, 3]);
    let subnet = prefix.allocate_node_subnet(&taken, &mut rng).unwrap();
    assert_eq!(subnet, net("fd00:1:2:3::/64"));
}

#[test]
fn node_subnet_falls_back_to_a_scan_when_draws_keep_colliding() {
    let prefix: ClusterPrefix = "fd00:1:2::/62".parse().unwrap();
    let taken: BTreeSet<_> = [
        net("fd00:1:2::/64"),
        net("fd00:1:2:1::/64"),
        net("fd00:1:2:3::/64"),
    ]
    .into();
    // Every draw hits subnet 0; the scan starts at 3 and wraps to 2.
    let mut draws = vec![0; RANDOM_ATTEMPTS as usize];
    draws.push(3);
    let mut rng = ScriptedRng::new(&draws);
    let subnet = prefix.allocate_node_subnet(&taken, &mut rng).unwrap();
    assert_eq!(subnet, net("fd00:1:2:2::/64"));
}

#[test]
fn node_subnet_exhaustion_names_the_prefix() {
    let prefix: ClusterPrefix = "fd00:1:2::/63".parse().unwrap();
    let taken: BTreeSet<_> = [net("fd00:1:2::/64"), net("fd00:1:2:1::/64")].into();
    let err = prefix
        .allocate_node_subnet(&taken, &mut StdRng::seed_from_u64(1))
        .unwrap_err();
    assert_eq!(
        err,
        IpamError::NoFreeNodeSubnet {
            prefix: net("fd00:1:2::/63"),
            total: 2
        }
    );
    assert!(err.to_string().contains("fd00:1:2::/63"), "{err}");
}

#[test]
fn node_subnet_ignores_taken_subnets_outside_the_prefix() {
    let prefix: ClusterPrefix = "fd00:1:2::/64".parse().unwrap();
    let taken: BTreeSet<_> = [net("fd00:9::/64"), net("fd00:1:2::/56")].into();
    let subnet = prefix
        .allocate_node_subnet(&taken, &mut StdRng::seed_from_u64(1))
        .unwrap();
    assert_eq!(subnet, net("fd00:1:2::/64"));
}

#[test]
fn node_subnets_from_a_seed_are_distinct_and_inside() {
    let prefix: ClusterPrefix = "fd00:1:2::/56".parse().unwrap();
    let mut rng = StdRng::seed_from_u64(3);
    let mut taken = BTreeSet::new();
    for _ in 0..256 {
        let subnet = prefix.allocate_node_subnet(&taken, &mut rng).unwrap();
        assert!(prefix.net().contains(&subnet));
        assert!(taken.insert(subnet), "{subnet} handed out twice");
    }
    assert!(prefix.allocate_node_subnet(&taken, &mut rng).is_err());
}

#[test]
fn pod_address_is_subnet_plus_random_interface_id() {
    let subnet = net("fd00:1:2:3::/64");
    let mut rng = ScriptedRng::new(&[0x9f3a_2b1c_5d4e_6f70]);
    let addr = allocate_pod_address(subnet, &BTreeSet::new(), &mut rng).unwrap();
    assert_eq!(
        addr,
        "fd00:1:2:3:9f3a:2b1c:5d4e:6f70"
            .parse::<Ipv6Addr>()
            .unwrap()
    );
}

#[test]
fn pod_address_skips_reserved_and_taken() {
    let subnet = net("fd00:1:2:3::/64");
    let taken: BTreeSet<Ipv6Addr> = ["fd00:1:2:3::5".parse().unwrap()].into();
    let mut rng = ScriptedRng::new(&[0, 1, 0xfdff_ffff_ffff_ff80, 0xfdff_ffff_ffff_ffff, 5, 6]);
    let addr = allocate_pod_address(subnet, &taken, &mut rng).unwrap();
    assert_eq!(addr, "fd00:1:2:3::6".parse::<Ipv6Addr>().unwrap());
}

#[test]
fn reserved_interface_ids() {
    assert!(is_reserved_interface_id(0));
    assert!(is_reserved_interface_id(1));
    assert!(is_reserved_interface_id(0xfdff_ffff_ffff_ffc0));
    assert!(!is_reserved_interface_id(2));
    assert!(!is_reserved_interface_id(0xfdff_ffff_ffff_ff7f));
    assert!(!is_reserved_interface_id(u64::MAX));
    assert_eq!(
        node_gateway_address(net("fd00:1:2:3::/64")),
        "fd00:1:2:3::1".parse::<Ipv6Addr>().unwrap()
    );
}

#[test]
fn pod_address_exhaustion_names_the_subnet() {
    let subnet = net("fd00:1:2:3::/64");
    let taken: BTreeSet<Ipv6Addr> = ["fd00:1:2:3::7".parse().unwrap()].into();
    let mut rng = ScriptedRng::new(&[7]);
    let err = allocate_pod_address(subnet, &taken, &mut rng).unwrap_err();
    assert_eq!(
        err,
        IpamError::NoFreePodAddress {
            subnet,
            attempts: RANDOM_ATTEMPTS
        }
    );
    assert!(err.to_string().contains("fd00:1:2:3::/64"), "{err}");
}

#[test]
fn pod_address_needs_a_node_subnet() {
    for bad in ["fd00:1:2::/48", "fd00:1:2:3::/96", "fd00:1:2:3::1/64"] {
        let err = allocate_pod_address(net(bad), &BTreeSet::new(), &mut StdRng::seed_from_u64(1))
            .unwrap_err();
        assert_eq!(err, IpamError::NotNodeSubnet { subnet: net(bad) });
    }
}

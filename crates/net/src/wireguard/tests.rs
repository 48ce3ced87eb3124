use super::*;
use rand::SeedableRng;
use rand::rngs::StdRng;

fn hex32(s: &str) -> [u8; 32] {
    let bytes: Vec<u8> = (0..32)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    bytes.try_into().unwrap()
}

#[test]
fn public_key_matches_rfc7748_vector() {
    let private = PrivateKey(hex32(
        "77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a",
    ));
    let expected = PublicKey(hex32(
        "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a",
    ));
    assert_eq!(private.public_key(), expected);
}

#[test]
fn generated_keys_are_clamped_deterministic_and_round_trip() {
    let a = PrivateKey::generate(&mut StdRng::seed_from_u64(5));
    let b = PrivateKey::generate(&mut StdRng::seed_from_u64(5));
    assert_eq!(a, b);
    assert_eq!(a.0[0] & 7, 0);
    assert_eq!(a.0[31] & 128, 0);
    assert_eq!(a.0[31] & 64, 64);
    let text = a.to_base64();
    assert_eq!(text.len(), 44);
    assert_eq!(text.parse::<PrivateKey>().unwrap(), a);
    let public = a.public_key();
    assert_eq!(public.to_string().parse::<PublicKey>().unwrap(), public);
    assert_eq!(format!("{a:?}"), "PrivateKey(<redacted>)");
}

#[test]
fn bad_keys_are_refused_with_the_input() {
    for bad in ["", "not base64!", "AAAA", &BASE64.encode([0u8; 31])] {
        let err = bad.parse::<PublicKey>().unwrap_err();
        assert!(matches!(err, WireguardError::InvalidKey { .. }), "{bad:?}");
    }
}

#[test]
fn peer_arguments_for_wg_set() {
    let key = PrivateKey::generate(&mut StdRng::seed_from_u64(1)).public_key();
    let peer = Peer {
        public_key: key,
        endpoint: "[fd00:99::2]:51820".parse().unwrap(),
        allowed_ips: vec![
            "fd00:1:2:3::/64".parse().unwrap(),
            "fd00:1:2:4::/64".parse().unwrap(),
        ],
        persistent_keepalive: Some(25),
    };
    assert_eq!(
        peer_arguments("wg-a", &peer),
        vec![
            "set".to_string(),
            "wg-a".into(),
            "peer".into(),
            key.to_string(),
            "endpoint".into(),
            "[fd00:99::2]:51820".into(),
            "allowed-ips".into(),
            "fd00:1:2:3::/64,fd00:1:2:4::/64".into(),
            "persistent-keepalive".into(),
            "25".into(),
        ]
    );
    let quiet = Peer {
        persistent_keepalive: None,
        ..peer
    };
    assert_eq!(peer_arguments("wg-a", &quiet).len(), 8);
}

#[test]
fn parses_transfer_output() {
    let a = PrivateKey::generate(&mut StdRng::seed_from_u64(1)).public_key();
    let b = PrivateKey::generate(&mut StdRng::seed_from_u64(2)).public_key();
    let text = format!("{a}\t100\t200\n{b}\t0\t0\n\n");
    assert_eq!(
        parse_transfer(&text).unwrap(),
        vec![
            PeerTransfer {
                public_key: a,
                received: 100,
                sent: 200
            },
            PeerTransfer {
                public_key: b,
                received: 0,
                sent: 0
            },
        ]
    );
    assert!(parse_transfer("").unwrap().is_empty());
    for bad in [
        format!("{a}\t1"),
        format!("{a}\tx\t2"),
        "zz\t1\t2".to_string(),
    ] {
        assert!(matches!(
            parse_transfer(&bad),
            Err(WireguardError::UnparsableTransfer { .. })
        ));
    }
}

#[test]
fn interface_names_are_checked() {
    for bad in ["", "sixteen-chars-xx", "a/b", "a b", "wg\"0"] {
        assert!(validate_name(bad).is_err(), "{bad:?}");
    }
    validate_name("crwg-123-4").unwrap();
}

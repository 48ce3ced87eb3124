//! Reading `wg show <interface> dump`: the interface's line, then one line
//! per peer, tab-separated: public key, preshared key, endpoint, allowed
//! IPs, latest handshake, bytes received, bytes sent, persistent keepalive.

use super::{Peer, WireguardError};

/// The peers in `wg show <interface> dump` output (the first line, the
/// interface's own, is skipped). A peer without an endpoint is left out:
/// corral never configures one, so it is someone else's to keep.
pub fn parse_dump(output: &str) -> Result<Vec<Peer>, WireguardError> {
    output
        .lines()
        .skip(1)
        .filter(|line| !line.trim().is_empty())
        .filter_map(|line| parse_peer(line).transpose())
        .collect()
}

fn parse_peer(line: &str) -> Result<Option<Peer>, WireguardError> {
    let bad = || WireguardError::UnparsableDump {
        line: line.to_string(),
    };
    let fields: Vec<&str> = line.split('\t').collect();
    let [
        key,
        _preshared,
        endpoint,
        allowed,
        _handshake,
        _rx,
        _tx,
        keepalive,
    ] = fields.as_slice()
    else {
        return Err(bad());
    };
    if *endpoint == "(none)" {
        return Ok(None);
    }
    let allowed_ips = if *allowed == "(none)" {
        Vec::new()
    } else {
        allowed
            .split(',')
            .map(|net| net.trim().parse().map_err(|_| bad()))
            .collect::<Result<_, _>>()?
    };
    Ok(Some(Peer {
        public_key: key.parse().map_err(|_| bad())?,
        endpoint: endpoint.parse().map_err(|_| bad())?,
        allowed_ips,
        persistent_keepalive: match *keepalive {
            "off" => None,
            seconds => Some(seconds.parse().map_err(|_| bad())?),
        },
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wireguard::PrivateKey;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    #[test]
    fn parses_peers_and_skips_the_interface_line() {
        let own = PrivateKey::generate(&mut StdRng::seed_from_u64(1));
        let a = PrivateKey::generate(&mut StdRng::seed_from_u64(2)).public_key();
        let b = PrivateKey::generate(&mut StdRng::seed_from_u64(3)).public_key();
        let c = PrivateKey::generate(&mut StdRng::seed_from_u64(4)).public_key();
        let text = format!(
            "{}\t{}\t51820\toff\n\
             {a}\t(none)\t[fd00:99::2]:51820\tfd00:1:2:2::/64\t0\t10\t20\toff\n\
             {b}\t(none)\t[fd00:99::3]:51821\tfd00:1:2:3::/64,fd00:1:2:4::/64\t5\t0\t0\t25\n\
             {c}\t(none)\t(none)\t(none)\t0\t0\t0\toff\n",
            own.to_base64(),
            own.public_key()
        );
        let peers = parse_dump(&text).unwrap();
        assert_eq!(
            peers,
            vec![
                Peer {
                    public_key: a,
                    endpoint: "[fd00:99::2]:51820".parse().unwrap(),
                    allowed_ips: vec!["fd00:1:2:2::/64".parse().unwrap()],
                    persistent_keepalive: None,
                },
                Peer {
                    public_key: b,
                    endpoint: "[fd00:99::3]:51821".parse().unwrap(),
                    allowed_ips: vec![
                        "fd00:1:2:3::/64".parse().unwrap(),
                        "fd00:1:2:4::/64".parse().unwrap()
                    ],
                    persistent_keepalive: Some(25),
                },
            ]
        );
        assert!(parse_dump("").unwrap().is_empty());
        assert!(parse_dump("interface line only\n").unwrap().is_empty());
    }

    #[test]
    fn refuses_malformed_peer_lines() {
        let a = PrivateKey::generate(&mut StdRng::seed_from_u64(2)).public_key();
        for bad in [
            format!("iface\n{a}\t(none)\t[fd00::2]:1"),
            format!("iface\n{a}\t(none)\tnot-an-endpoint\tfd00::/64\t0\t0\t0\toff"),
            format!("iface\n{a}\t(none)\t[fd00::2]:1\tnot-a-net\t0\t0\t0\toff"),
            format!("iface\n{a}\t(none)\t[fd00::2]:1\tfd00::/64\t0\t0\t0\tsoon"),
            "iface\nzz\t(none)\t[fd00::2]:1\tfd00::/64\t0\t0\t0\toff".to_string(),
        ] {
            assert!(
                matches!(parse_dump(&bad), Err(WireguardError::UnparsableDump { .. })),
                "{bad:?}"
            );
        }
    }
}

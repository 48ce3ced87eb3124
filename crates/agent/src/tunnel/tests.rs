use std::collections::BTreeMap;

use super::*;
use corral_api::Kind;
use rand::SeedableRng;
use rand::rngs::StdRng;
use std::sync::Mutex;

fn key(seed: u64) -> PrivateKey {
    PrivateKey::generate(&mut StdRng::seed_from_u64(seed))
}

fn node(name: &str, prefix: Option<&str>, wireguard: Option<(u64, &str)>) -> Object {
    let mut object = Object::new(Kind::Node, None, name, serde_json::json!({}));
    object.status = serde_json::json!({"prefix": prefix, "address": "fd99::9"});
    if let Some((seed, endpoint)) = wireguard {
        object.status["wireguard"] = serde_json::json!({
            "publicKey": key(seed).public_key().to_string(),
            "endpoint": endpoint,
        });
    }
    object
}

#[derive(Default)]
struct FakeTunnel {
    peers: Mutex<Vec<Peer>>,
}

impl TunnelOps for FakeTunnel {
    fn peers(&self) -> Result<Vec<Peer>, WireguardError> {
        Ok(self.peers.lock().unwrap().clone())
    }
    fn set_peer(&self, peer: &Peer) -> Result<(), WireguardError> {
        let mut peers = self.peers.lock().unwrap();
        peers.retain(|p| p.public_key != peer.public_key);
        peers.push(peer.clone());
        Ok(())
    }
    fn remove_peer(&self, public_key: &PublicKey) -> Result<(), WireguardError> {
        self.peers
            .lock()
            .unwrap()
            .retain(|p| p.public_key != *public_key);
        Ok(())
    }
}

#[test]
fn peers_are_the_other_nodes_with_a_prefix_and_a_valid_tunnel() {
    let nodes = vec![
        node("a", Some("fd00:1:2:1::/64"), Some((1, "[fd99::1]:51820"))),
        node("c", Some("fd00:1:2:3::/64"), Some((3, "[fd99::3]:51821"))),
        node("b", Some("fd00:1:2:2::/64"), None),
        node("d", None, Some((4, "[fd99::4]:51820"))),
        node("e", Some("fd00:1:2:5::/64"), Some((5, "not an endpoint"))),
    ];
    let peers = desired_peers("a", &nodes, &BTreeMap::new());
    assert_eq!(
        peers,
        vec![NodePeer {
            node: "c".into(),
            peer: Peer {
                public_key: key(3).public_key(),
                endpoint: "[fd99::3]:51821".parse().unwrap(),
                allowed_ips: vec!["fd00:1:2:3::/64".parse().unwrap()],
                persistent_keepalive: None,
            },
        }]
    );
    assert!(has_tunnel(&nodes[1]));
    assert!(!has_tunnel(&nodes[2]));
    assert!(!has_tunnel(&nodes[4]));
}

#[test]
fn plan_sets_missing_or_changed_peers_and_removes_unknown_ones() {
    let peer = |seed: u64, net: &str| Peer {
        public_key: key(seed).public_key(),
        endpoint: "[fd99::1]:51820".parse().unwrap(),
        allowed_ips: vec![net.parse().unwrap()],
        persistent_keepalive: None,
    };
    let existing = vec![peer(1, "fd00::/64"), peer(2, "fd00:0:0:2::/64")];
    let desired = vec![
        peer(1, "fd00::/64"),
        peer(2, "fd00:0:0:9::/64"),
        peer(3, "fd00:0:0:3::/64"),
    ];
    let plan = plan_peers(&desired, &existing);
    let mut expected = vec![desired[1].clone(), desired[2].clone()];
    expected.sort_by_key(|p| p.public_key);
    assert_eq!(plan.set, expected);
    assert!(plan.remove.is_empty());
    let plan = plan_peers(&desired[..1], &existing);
    assert!(plan.set.is_empty());
    assert_eq!(plan.remove, vec![key(2).public_key()]);
    assert!(plan_peers(&existing, &existing).is_empty());
    // A live-migrated VM's /128 besides the /64: the order `wg show`
    // lists them in does not matter, a new one does.
    let mut moved = peer(1, "fd00::/64");
    moved
        .allowed_ips
        .push("fd00:0:0:2::10/128".parse().unwrap());
    let mut listed = moved.clone();
    listed.allowed_ips.reverse();
    assert!(plan_peers(std::slice::from_ref(&moved), &[listed]).is_empty());
    assert_eq!(
        plan_peers(std::slice::from_ref(&moved), &existing[..1]).set,
        vec![moved.clone()]
    );
}

#[tokio::test]
async fn reconcile_follows_nodes_joining_and_leaving() {
    let fake = Arc::new(FakeTunnel::default());
    let tunnel = Tunnel::with_ops(fake.clone(), "crwg0", key(1).public_key(), 51820);
    let mut nodes = vec![
        node("a", Some("fd00:1:2:1::/64"), Some((1, "[fd99::1]:51820"))),
        node("b", Some("fd00:1:2:2::/64"), Some((2, "[fd99::2]:51820"))),
        node("c", Some("fd00:1:2:3::/64"), Some((3, "[fd99::3]:51820"))),
    ];
    let (peers, plan) = tunnel
        .reconcile("a", &nodes, &BTreeMap::new())
        .await
        .unwrap();
    assert_eq!(plan.set.len(), 2);
    assert_eq!(fake.peers.lock().unwrap().len(), 2);
    let note = tunnel.describe(&peers);
    assert!(
        note.contains("b at [fd99::2]:51820 for fd00:1:2:2::/64"),
        "{note}"
    );
    assert!(note.contains("crwg0"), "{note}");
    let (_, plan) = tunnel
        .reconcile("a", &nodes, &BTreeMap::new())
        .await
        .unwrap();
    assert!(plan.is_empty());
    nodes.remove(1);
    let (_, plan) = tunnel
        .reconcile("a", &nodes, &BTreeMap::new())
        .await
        .unwrap();
    assert_eq!(plan.remove, vec![key(2).public_key()]);
    assert_eq!(fake.peers.lock().unwrap().len(), 1);
    assert_eq!(
        tunnel.describe(&[]),
        format!(
            "tunnel crwg0 (fake) on UDP port 51820, key {}; peers: no other node has a tunnel yet",
            key(1).public_key()
        )
    );
    assert_eq!(
        tunnel.status("fd99::1".parse().unwrap()),
        NodeWireguard {
            public_key: key(1).public_key().to_string(),
            endpoint: "[fd99::1]:51820".into(),
        }
    );
}

#[test]
fn interface_names_are_stable_distinct_and_short() {
    let a = TunnelConfig::for_data_dir(Path::new("/run/lab/node-0"), 51820);
    let b = TunnelConfig::for_data_dir(Path::new("/run/lab/node-1"), 51820);
    assert_eq!(
        a,
        TunnelConfig::for_data_dir(Path::new("/run/lab/node-0"), 51820)
    );
    assert_ne!(a.interface, b.interface);
    assert_eq!(a.interface.len(), 12);
    assert!(a.interface.starts_with("crwg"));
    assert_eq!(a.dir, Path::new("/run/lab/node-0/wireguard"));
}

#[test]
fn the_key_is_created_once_with_mode_0600() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let wg = dir.path().join("wireguard");
    let first = load_or_create_key(&wg).unwrap();
    let mode = std::fs::metadata(wg.join(KEY_FILE))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let dir_mode = std::fs::metadata(&wg).unwrap().permissions().mode();
    assert_eq!(dir_mode & 0o777, 0o700);
    assert_eq!(load_or_create_key(&wg).unwrap(), first);
    std::fs::write(wg.join(KEY_FILE), "garbage").unwrap();
    assert!(matches!(
        load_or_create_key(&wg),
        Err(TunnelError::BadKey { .. })
    ));
}

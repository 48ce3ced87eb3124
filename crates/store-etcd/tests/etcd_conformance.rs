//! The backend conformance suite against a real etcd (Debian's
//! `etcd-server`) on loopback: a fresh one-member cluster per check, since
//! the suite wants an empty store at revision 0.

use corral_store::conformance;
use corral_store_etcd::{EtcdConfig, EtcdStore};
use corral_testkit::etcd::EtcdCluster;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_store_passes_the_conformance_suite() {
    let mut clusters = Vec::new();
    conformance::run_all(|| {
        let cluster = EtcdCluster::start(1);
        let config = EtcdConfig::new(cluster.endpoints());
        clusters.push(cluster);
        async move { EtcdStore::connect(&config).await.expect("connect to etcd") }
    })
    .await;
    assert!(clusters.len() >= 12, "every check ran against its own etcd");
}

//! Pull through the OCI distribution API from a real `docker-registry` on
//! loopback, then run the pulled image.

mod common;

use std::time::Duration;

use corral_runtime::image::{HttpRegistry, ImageStore};
use corral_testkit::{
    BUSYBOX_IMAGE, ImageFormat, RegistryServer, busybox_image_tar, push_oci_layout, require_root,
};

#[test]
fn pushes_to_docker_registry_and_pulls_back() {
    require_root();
    let dir = tempfile::tempdir().expect("tempdir");
    let registry = RegistryServer::start(&dir.path().join("registry"));
    let tar = busybox_image_tar(dir.path(), ImageFormat::OciLayout);
    push_oci_layout(registry.addr(), "corral/busybox", "1", &tar);

    let store = ImageStore::open(dir.path().join("store")).expect("store");
    let client = HttpRegistry::new(Duration::from_secs(60)).expect("client");
    let reference = format!("{}/corral/busybox:1", registry.addr());
    let pulled = store.pull(&client, &reference).expect("pull");
    assert_eq!(pulled.reference.to_string(), reference);
    assert_eq!(pulled.config.cmd, Some(vec!["sh".to_string()]));
    assert!(
        store
            .layer_path(&pulled.diff_ids[0])
            .join("bin/busybox")
            .is_file()
    );
    assert_eq!(store.resolve(&reference).expect("resolve"), pulled);

    // The pulled image is the imported one, byte for byte.
    let imported = store.import(&tar, None).expect("import").remove(0);
    assert_eq!(imported.reference.to_string(), BUSYBOX_IMAGE);
    assert_eq!(imported.manifest_digest, pulled.manifest_digest);

    // A missing tag is a registry error, not a panic or a partial image.
    let missing = format!("{}/corral/busybox:nope", registry.addr());
    assert!(store.pull(&client, &missing).is_err());
    assert!(store.resolve(&missing).is_err());

    // Keeping only the pulled name keeps the shared blobs and layers.
    let report = store.retain(&[&reference]).expect("retain");
    assert_eq!(report.removed_images, vec![BUSYBOX_IMAGE.to_string()]);
    assert_eq!((report.removed_blobs, report.removed_layers), (0, 0));
}

//! Pull through the OCI distribution API from a real `docker-registry` on
//! loopback: plain HTTP (the loopback fallback), HTTPS with a test CA and
//! htpasswd auth, and the bearer token flow; then the pulled rootfs.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use corral_runtime::image::{
    AuthFile, HttpRegistry, ImageError, ImageStore, PullOptions, RegistryConfig, RegistryError,
};
use corral_testkit::{
    BUSYBOX_IMAGE, ImageFormat, RegistryServer, TestCa, TokenAuthProxy, busybox_image_tar,
    push_oci_layout, require_root,
};

const TIMEOUT: Duration = Duration::from_secs(60);

/// A Docker `config.json` with `user:password` for `registry`.
fn write_auth_file(dir: &Path, registry: &str, user: &str, password: &str) -> AuthFile {
    use base64::Engine as _;
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    let path = dir.join(format!("auth-{user}.json"));
    std::fs::write(
        &path,
        format!(r#"{{"auths": {{"{registry}": {{"auth": "{auth}"}}}}}}"#),
    )
    .expect("write auth file");
    AuthFile::load(&path).expect("load auth file")
}

#[test]
fn pushes_to_docker_registry_and_pulls_back() {
    require_root();
    let dir = tempfile::tempdir().expect("tempdir");
    let registry = RegistryServer::start(&dir.path().join("registry"));
    let tar = busybox_image_tar(dir.path(), ImageFormat::OciLayout);
    push_oci_layout(registry.addr(), "corral/busybox", "1", &tar);

    let store = ImageStore::open(dir.path().join("store")).expect("store");
    // No insecure flag: a loopback registry that does not speak TLS is
    // reached over HTTP.
    let client = HttpRegistry::new(RegistryConfig::new(TIMEOUT));
    let reference = format!("{}/corral/busybox:1", registry.addr());
    let pulled = store
        .pull(&client, &reference, PullOptions::default())
        .expect("pull");
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
    assert!(
        store
            .pull(&client, &missing, PullOptions::default())
            .is_err()
    );
    assert!(store.resolve(&missing).is_err());

    // Keeping only the pulled name keeps the shared blobs and layers.
    let report = store.retain(&[&reference]).expect("retain");
    assert_eq!(report.removed_images, vec![BUSYBOX_IMAGE.to_string()]);
    assert_eq!((report.removed_blobs, report.removed_layers), (0, 0));
}

#[test]
fn pulls_over_tls_with_htpasswd_credentials() {
    require_root();
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = TestCa::for_loopback();
    let registry =
        RegistryServer::start_secure(&dir.path().join("registry"), &ca, "puller", "pull-pw");
    let tar = busybox_image_tar(dir.path(), ImageFormat::OciLayout);
    registry.push("corral/busybox", "1", &tar);
    let host = registry.addr().to_string();
    let reference = format!("{host}/corral/busybox:1");
    let certs_dir = dir.path().join("certs.d");

    // No CA for it: a TLS error naming the host and both fixes.
    let store = ImageStore::open(dir.path().join("store")).expect("store");
    let mut config = RegistryConfig::new(TIMEOUT);
    config.certs_dir = certs_dir.clone();
    config.auth = write_auth_file(dir.path(), &host, "puller", "pull-pw");
    let error = store
        .pull(
            &HttpRegistry::new(config.clone()),
            &reference,
            PullOptions::default(),
        )
        .expect_err("untrusted certificate");
    let message = error.to_string();
    assert!(
        matches!(&error, ImageError::Registry(RegistryError::Tls { host: h, .. }) if *h == host),
        "{message}"
    );
    for part in [
        "certificate/TLS problem",
        &format!("{}/{host}/ca.crt", certs_dir.display()),
        &format!("--insecure-registry {host}"),
    ] {
        assert!(message.contains(part), "{part:?} in {message}");
    }

    // The CA in the registry's certs dir, and the right credentials: pulled.
    std::fs::create_dir_all(certs_dir.join(&host)).expect("certs dir");
    std::fs::write(certs_dir.join(&host).join("ca.crt"), &ca.ca_pem).expect("write CA");
    let pulled = store
        .pull(
            &HttpRegistry::new(config.clone()),
            &reference,
            PullOptions::default(),
        )
        .expect("pull over TLS with credentials");
    assert!(
        store
            .layer_path(&pulled.diff_ids[0])
            .join("bin/busybox")
            .is_file()
    );

    // Wrong credentials: 401, naming the registry.
    let other = ImageStore::open(dir.path().join("other-store")).expect("store");
    let mut wrong = config.clone();
    wrong.auth = write_auth_file(dir.path(), &host, "puller", "wrong-pw");
    let error = other
        .pull(
            &HttpRegistry::new(wrong),
            &reference,
            PullOptions::default(),
        )
        .expect_err("wrong password");
    let message = error.to_string();
    assert!(
        matches!(
            &error,
            ImageError::Registry(RegistryError::Status {
                status: 401,
                sent_credentials: true,
                ..
            })
        ),
        "{message}"
    );
    assert!(message.contains(&format!("registry {host}")), "{message}");
    assert!(message.contains("401"), "{message}");
    assert!(!message.contains("wrong-pw"), "{message}");

    // No credentials at all: 401 saying the node has none for it.
    let mut anonymous = config;
    anonymous.auth = AuthFile::default();
    let error = other
        .pull(
            &HttpRegistry::new(anonymous),
            &reference,
            PullOptions::default(),
        )
        .expect_err("anonymous");
    assert!(
        error.to_string().contains("this node has none for it"),
        "{error}"
    );
    assert!(other.list().expect("list").is_empty());
}

#[test]
fn token_flow_fetches_a_token_with_credentials_and_reuses_it() {
    require_root();
    let dir = tempfile::tempdir().expect("tempdir");
    let backend = RegistryServer::start(&dir.path().join("registry"));
    let tar = busybox_image_tar(dir.path(), ImageFormat::OciLayout);
    push_oci_layout(backend.addr(), "corral/busybox", "1", &tar);
    let proxy = TokenAuthProxy::start(&format!("http://{}", backend.addr()), "tok-user", "tok-pw");
    let host = proxy.addr().to_string();
    let reference = format!("{host}/corral/busybox:1");

    let mut config = RegistryConfig::new(TIMEOUT);
    config.insecure = vec![host.clone()];
    config.certs_dir = dir.path().join("certs.d");
    config.auth = write_auth_file(dir.path(), &host, "tok-user", "tok-pw");
    let store = ImageStore::open(dir.path().join("store")).expect("store");
    let pulled = store
        .pull(
            &HttpRegistry::new(config.clone()),
            &reference,
            PullOptions::default(),
        )
        .expect("pull with a token");
    assert!(
        store
            .layer_path(&pulled.diff_ids[0])
            .join("bin/busybox")
            .is_file()
    );
    // One token for the repository, reused by the manifest and every blob
    // request (three of them at once).
    assert_eq!(proxy.token_scopes(), vec!["repository:corral/busybox:pull"]);

    // A second pull through a new client of the same node reuses the
    // cached token: no new token request.
    let again = ImageStore::open(dir.path().join("store-2")).expect("store");
    again
        .pull(
            &HttpRegistry::new(config.clone()),
            &reference,
            PullOptions::default(),
        )
        .expect("pull again");
    assert_eq!(proxy.token_scopes().len(), 1, "token reused from the cache");

    // Wrong credentials: the token server's 401, naming the registry.
    let mut wrong = config;
    wrong.auth = write_auth_file(dir.path(), &host, "tok-user", "nope");
    wrong.tokens = Arc::default();
    let error = ImageStore::open(dir.path().join("store-3"))
        .expect("store")
        .pull(
            &HttpRegistry::new(wrong),
            &reference,
            PullOptions::default(),
        )
        .expect_err("wrong token credentials");
    assert!(
        matches!(
            &error,
            ImageError::Registry(RegistryError::Token { status: 401, .. })
        ),
        "{error}"
    );
    assert!(
        error.to_string().contains(&format!("registry {host}")),
        "{error}"
    );
    assert_eq!(proxy.refused_token_requests(), 1);
}

#[test]
fn anonymous_token_flow_pulls_a_public_image() {
    require_root();
    let dir = tempfile::tempdir().expect("tempdir");
    let backend = RegistryServer::start(&dir.path().join("registry"));
    let tar = busybox_image_tar(dir.path(), ImageFormat::OciLayout);
    push_oci_layout(backend.addr(), "library/busybox", "1", &tar);
    let proxy = TokenAuthProxy::start_anonymous(&format!("http://{}", backend.addr()));
    let host = proxy.addr().to_string();
    let mut config = RegistryConfig::new(TIMEOUT);
    config.insecure = vec![host.clone()];
    config.certs_dir = dir.path().join("certs.d");
    let store = ImageStore::open(dir.path().join("store")).expect("store");
    let pulled = store
        .pull(
            &HttpRegistry::new(config),
            &format!("{host}/library/busybox:1"),
            PullOptions::default(),
        )
        .expect("pull with an anonymous token");
    assert!(
        store
            .layer_path(&pulled.diff_ids[0])
            .join("bin/busybox")
            .is_file()
    );
    assert_eq!(
        proxy.token_scopes(),
        vec!["repository:library/busybox:pull"]
    );
}

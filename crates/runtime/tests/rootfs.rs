//! Overlayfs rootfs over shared, unpacked layers (root): whiteouts hide
//! lower files, writes stay per container, layers are never copied.

mod common;

use std::fs;
use std::os::unix::fs::MetadataExt;

use corral_runtime::image::{ImageStore, unmount_rootfs};
use corral_testkit::{Defer, ImageBuilder, ImageFormat, LayerBuilder, require_root};
use serde_json::json;

#[test]
fn overlay_applies_whiteouts_and_isolates_writes() {
    require_root();
    let dir = tempfile::tempdir().expect("tempdir");
    let tar = ImageBuilder::new("local/layered:1")
        .layer(
            LayerBuilder::new()
                .dir("etc", 0o755)
                .file("etc/motd", b"bottom\n", 0o644)
                .file("etc/keep", b"kept\n", 0o644)
                .dir("cache", 0o755)
                .file("cache/old", b"old\n", 0o644),
        )
        .layer(
            LayerBuilder::new()
                .whiteout("etc", "motd")
                .dir("cache", 0o755)
                .opaque("cache")
                .file("cache/new", b"new\n", 0o644)
                .file("etc/keep", b"replaced\n", 0o644),
        )
        .config("Cmd", json!(["sh"]))
        .write_tar(dir.path(), ImageFormat::DockerArchive)
        .expect("tar");
    let store = ImageStore::open(dir.path().join("store")).expect("store");
    let image = store.import(&tar, None).expect("import").remove(0);

    let a_dir = dir.path().join("a");
    let b_dir = dir.path().join("b");
    let (a_guard_dir, b_guard_dir) = (a_dir.clone(), b_dir.clone());
    let _unmount = Defer::new(move || {
        let _ = unmount_rootfs(&a_guard_dir);
        let _ = unmount_rootfs(&b_guard_dir);
    });
    let a = store.mount_rootfs(&image, &a_dir).expect("mount a");
    let b = store.mount_rootfs(&image, &b_dir).expect("mount b");

    assert!(!a.rootfs.join("etc/motd").exists(), "whiteout hides motd");
    assert_eq!(
        fs::read_to_string(a.rootfs.join("etc/keep")).expect("keep"),
        "replaced\n"
    );
    assert!(!a.rootfs.join("cache/old").exists(), "opaque dir hides old");
    assert_eq!(
        fs::read_to_string(a.rootfs.join("cache/new")).expect("new"),
        "new\n"
    );

    fs::write(a.rootfs.join("etc/written-by-a"), "a\n").expect("write in a");
    fs::remove_file(a.rootfs.join("etc/keep")).expect("delete in a");
    assert!(
        a.upper.join("etc/written-by-a").is_file(),
        "writes land in a's upper dir"
    );
    assert!(
        !b.rootfs.join("etc/written-by-a").exists(),
        "b does not see a's writes"
    );
    assert!(
        b.rootfs.join("etc/keep").exists(),
        "b does not see a's deletes"
    );

    // Both mounts read the very same layer inodes: nothing was copied.
    let top = store.layer_path(&image.diff_ids[1]);
    assert_eq!(
        fs::metadata(top.join("cache/new"))
            .expect("layer file")
            .ino(),
        fs::metadata(b.rootfs.join("cache/new"))
            .expect("merged file")
            .ino(),
    );
    assert!(
        top.join("etc/keep").exists(),
        "lower layer untouched by a's delete"
    );

    store.unmount_rootfs(&a).expect("unmount a");
    store.unmount_rootfs(&b).expect("unmount b");
    assert!(!a.rootfs.join("etc").exists(), "unmounted");
    unmount_rootfs(&a_dir).expect("second unmount is a no-op");
}

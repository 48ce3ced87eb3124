//! Boot artifacts from the image store: a kernel image holds
//! `/boot/vmlinuz`, an initramfs image `/boot/initrd.img`, a disk image
//! `/disk.qcow2`. They are found in the image's unpacked layers, top first.

use std::path::{Path, PathBuf};

use crate::containers::ContainerRunner;

/// Where a kernel is in its image.
pub const KERNEL_PATH: &str = "boot/vmlinuz";
/// Where an initramfs is in its image.
pub const INITRD_PATH: &str = "boot/initrd.img";
/// Where a disk image is in its image.
pub const DISK_PATH: &str = "disk.qcow2";

/// The host path of `inner` in `reference` (pulled when missing).
pub fn artifact(runner: &ContainerRunner, reference: &str, inner: &str) -> Result<PathBuf, String> {
    let image = runner
        .ensure_image(reference)
        .map_err(|error| crate::chain(&error))?;
    let layers = runner
        .images
        .ensure_layers(&image)
        .map_err(|error| crate::chain(&error))?;
    find_in_layers(&layers, inner).ok_or_else(|| format!("image {reference} has no /{inner}"))
}

/// The topmost layer's copy of `inner`.
pub fn find_in_layers(layers: &[PathBuf], inner: &str) -> Option<PathBuf> {
    layers
        .iter()
        .rev()
        .map(|layer| layer.join(inner))
        .find(|path| Path::new(path).is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_top_layer_wins() {
        let dir = tempfile::tempdir().unwrap();
        let (low, high) = (dir.path().join("low"), dir.path().join("high"));
        for layer in [&low, &high] {
            std::fs::create_dir_all(layer.join("boot")).unwrap();
        }
        std::fs::write(low.join(KERNEL_PATH), b"old").unwrap();
        std::fs::write(high.join(KERNEL_PATH), b"new").unwrap();
        std::fs::write(low.join(INITRD_PATH), b"initrd").unwrap();
        let layers = vec![low.clone(), high.clone()];
        assert_eq!(
            find_in_layers(&layers, KERNEL_PATH),
            Some(high.join(KERNEL_PATH))
        );
        assert_eq!(
            find_in_layers(&layers, INITRD_PATH),
            Some(low.join(INITRD_PATH))
        );
        assert_eq!(find_in_layers(&layers, DISK_PATH), None);
    }
}

//! Writes a tiny image built from the host's busybox-static as an OCI
//! layout tar: `cargo run -p corral-testkit --example busybox-image -- DIR`
//! prints the tar's path; `corral image import` it. The image is named
//! `local/busybox:1`.

fn main() {
    let dir = std::env::args().nth(1).unwrap_or_else(|| ".".to_string());
    let path = corral_testkit::busybox_image_tar(
        std::path::Path::new(&dir),
        corral_testkit::ImageFormat::OciLayout,
    );
    println!("{}", path.display());
}

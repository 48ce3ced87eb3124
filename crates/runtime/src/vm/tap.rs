//! The VM's tap device, made with the kernel's own interface rather than
//! `ip tuntap` under `nsenter`: `TUNSETIFF` on `/dev/net/tun` creates (or
//! re-attaches to) the device by name, `TUNSETPERSIST` keeps it after the
//! descriptor closes (QEMU opens it again by name), then it is set up. All
//! of it runs on a thread inside the VM's network namespace.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

use nix::libc;

use crate::oci::netns::link;

nix::ioctl_write_ptr_bad!(
    tun_set_iff,
    nix::request_code_write!(b'T', 202, size_of::<libc::c_int>()),
    libc::ifreq
);
nix::ioctl_write_int!(tun_set_persist, b'T', 203);

/// Creates the persistent tap device `name` in the calling thread's
/// network namespace and sets it up; an existing one is kept and set up.
pub fn create_here(name: &str) -> io::Result<()> {
    let mut request = link::request(name)?;
    request.ifr_ifru.ifru_flags = (libc::IFF_TAP | libc::IFF_NO_PI) as libc::c_short;
    let tun = File::options()
        .read(true)
        .write(true)
        .open("/dev/net/tun")?;
    // SAFETY: `tun` is open /dev/net/tun for the whole call and `request` a
    // valid `ifreq` naming the device, which TUNSETIFF only reads.
    unsafe { tun_set_iff(tun.as_raw_fd(), &request) }?;
    // SAFETY: TUNSETPERSIST takes a plain integer on the attached descriptor.
    unsafe { tun_set_persist(tun.as_raw_fd(), 1) }?;
    drop(tun);
    link::set_up(name)
}

/// Attaches to the tap device `name` in the calling thread's network
/// namespace (made by [`create_here`]) and returns the descriptor, for a
/// sandboxed QEMU that may not open `/dev/net/tun` itself.
pub fn open_here(name: &str) -> io::Result<File> {
    let mut request = link::request(name)?;
    request.ifr_ifru.ifru_flags =
        (libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR) as libc::c_short;
    let tun = File::options()
        .read(true)
        .write(true)
        .open("/dev/net/tun")?;
    // SAFETY: as in `create_here`: TUNSETIFF only reads `request`.
    unsafe { tun_set_iff(tun.as_raw_fd(), &request) }?;
    Ok(tun)
}

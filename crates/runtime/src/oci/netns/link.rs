//! Links by name in the calling thread's network namespace, through the
//! kernel's interface ioctls (no `ip` process).

use std::io;
use std::os::fd::AsRawFd;

use nix::libc;
use nix::sys::socket::{AddressFamily, SockFlag, SockType};

/// An `ifreq` naming `name`; refuses a name the kernel would refuse or cut
/// (empty, 16 bytes or more, or holding a NUL, '/' or whitespace).
pub fn request(name: &str) -> io::Result<libc::ifreq> {
    let bytes = name.as_bytes();
    if bytes.is_empty()
        || bytes.len() >= libc::IFNAMSIZ
        || bytes
            .iter()
            .any(|b| *b == 0 || *b == b'/' || b.is_ascii_whitespace())
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{name:?} is not a link name (1 to 15 bytes, no '/', NUL or space)"),
        ));
    }
    // SAFETY: `ifreq` is a plain C struct (arrays and a union of plain
    // integers); all-zero bytes are a valid value.
    let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
    for (slot, byte) in request.ifr_name.iter_mut().zip(bytes) {
        *slot = *byte as libc::c_char;
    }
    Ok(request)
}

/// Sets the link `name` up.
pub fn set_up(name: &str) -> io::Result<()> {
    let mut request = request(name)?;
    let socket = nix::sys::socket::socket(
        AddressFamily::Inet6,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    // SAFETY: `socket` is an open socket for the whole call and `request` a
    // valid, NUL-terminated `ifreq` that SIOCGIFFLAGS only writes into.
    if unsafe { libc::ioctl(socket.as_raw_fd(), libc::SIOCGIFFLAGS, &mut request) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: SIOCGIFFLAGS succeeded, so the union holds `ifru_flags`.
    unsafe {
        request.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
    }
    // SAFETY: as above; SIOCSIFFLAGS only reads `request`.
    if unsafe { libc::ioctl(socket.as_raw_fd(), libc::SIOCSIFFLAGS, &request) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_kernel_would_refuse_are_refused_before_any_call() {
        for name in ["", "a/b", "sixteen-bytes-xx", "a b", "a\0b"] {
            let error = request(name).expect_err(name);
            assert_eq!(error.kind(), io::ErrorKind::InvalidInput, "{name:?}");
        }
        let named = request("tap0").unwrap();
        let bytes: Vec<u8> = named.ifr_name[..5].iter().map(|c| *c as u8).collect();
        assert_eq!(bytes, b"tap0\0");
    }
}

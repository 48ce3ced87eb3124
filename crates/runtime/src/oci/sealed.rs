//! A sealed in-memory copy of the `runc` binary, executed in place of the
//! file on disk.
//!
//! Every container process runc makes starts as `runc init`, re-executed
//! from `/proc/self/exe`. Against CVE-2019-5736 (a container overwriting
//! the host's runc through that link) runc 1.1 first makes the binary
//! read-only for that process: it bind-mounts `/proc/self/exe` onto a
//! file in its state directory, remounts it read-only, executes itself a
//! second time from there and unmounts it again — a mount and an unmount
//! in the host's mount namespace and a second exec of a 9 MB binary per
//! container start and per `runc exec`. runc skips all of it when it runs
//! from a memfd carrying exactly the seals that make it immutable (its
//! `is_self_cloned` check; runc's own `memfd-bind` tool relies on it):
//! nothing, the container included, can write such a file. So the agent
//! keeps one such copy and runs runc from it.
//!
//! The copy follows the file: when the binary on disk changes (an upgrade),
//! the next command makes a new copy. A binary that is not an ELF program
//! (a wrapper script, say) is run from its path: a script cannot be run
//! from a descriptor closed on exec.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use nix::fcntl::{FcntlArg, SealFlag, fcntl};
use nix::sys::memfd::{MFdFlags, memfd_create};

/// The seals runc takes for proof that its binary cannot change.
pub const RUNC_SEALS: SealFlag = SealFlag::F_SEAL_SEAL
    .union(SealFlag::F_SEAL_SHRINK)
    .union(SealFlag::F_SEAL_GROW)
    .union(SealFlag::F_SEAL_WRITE);

/// `MFD_EXEC` (Linux 6.3): says the memfd is meant to be executed, where
/// `vm.memfd_noexec` would otherwise warn or refuse. Older kernels refuse
/// the flag, and then a memfd is executable anyway.
const MFD_EXEC: MFdFlags = MFdFlags::from_bits_retain(0x10);

/// A binary on disk and its sealed copy, made again when the file changes.
#[derive(Debug)]
pub struct SealedBinary {
    source: PathBuf,
    copy: Mutex<Option<Arc<Copy>>>,
}

/// Two are the same when they copy the same file.
impl PartialEq for SealedBinary {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

impl Eq for SealedBinary {}

/// One sealed copy, and the file it was made from.
#[derive(Debug)]
pub struct Copy {
    fd: OwnedFd,
    made_from: Identity,
}

/// What tells one version of a file from another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Identity {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: i64,
    mtime_nsec: i64,
}

impl Identity {
    fn of(path: &Path) -> io::Result<Identity> {
        let meta = std::fs::metadata(path)?;
        Ok(Identity {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime: meta.mtime(),
            mtime_nsec: meta.mtime_nsec(),
        })
    }
}

impl Copy {
    /// The path that executes this copy, valid while `self` lives (the
    /// spawning thread holds it until the child has executed).
    pub fn program(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.fd.as_raw_fd()))
    }

    /// The seals the copy carries.
    pub fn seals(&self) -> io::Result<SealFlag> {
        let bits = fcntl(&self.fd, FcntlArg::F_GET_SEALS).map_err(io::Error::from)?;
        Ok(SealFlag::from_bits_retain(bits))
    }
}

impl SealedBinary {
    /// A sealed copy of `source` (a path, or a name looked up in `PATH`),
    /// made now so that a problem shows at start; `None` when the binary
    /// is not found or not an ELF program.
    pub fn of(source: &Path) -> io::Result<Option<SealedBinary>> {
        let source = if source.components().count() > 1 {
            source.to_path_buf()
        } else {
            match source.to_str().and_then(crate::find_binary) {
                Some(found) => found,
                None => return Ok(None),
            }
        };
        if !is_elf(&source)? {
            return Ok(None);
        }
        let sealed = SealedBinary {
            source,
            copy: Mutex::new(None),
        };
        sealed.current()?;
        Ok(Some(sealed))
    }

    /// The binary this copies.
    pub fn source(&self) -> &Path {
        &self.source
    }

    /// The copy of the file as it is now, made again if it changed.
    pub fn current(&self) -> io::Result<Arc<Copy>> {
        let now = Identity::of(&self.source)?;
        let mut copy = self.copy.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(existing) = copy.as_ref()
            && existing.made_from == now
        {
            return Ok(existing.clone());
        }
        let fresh = Arc::new(seal_copy(&self.source, now)?);
        *copy = Some(fresh.clone());
        Ok(fresh)
    }
}

fn is_elf(path: &Path) -> io::Result<bool> {
    use std::io::Read;
    let mut magic = [0u8; 4];
    let mut file = File::open(path)?;
    Ok(file.read_exact(&mut magic).is_ok() && magic == *b"\x7fELF")
}

fn seal_copy(source: &Path, made_from: Identity) -> io::Result<Copy> {
    let flags = MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING;
    let fd = match memfd_create(c"corral-runc", flags | MFD_EXEC) {
        Err(nix::errno::Errno::EINVAL) => memfd_create(c"corral-runc", flags),
        other => other,
    }
    .map_err(io::Error::from)?;
    let mut into = File::from(fd);
    let mut from = File::open(source)?;
    let copied = io::copy(&mut from, &mut into)?;
    if copied != made_from.size {
        return Err(io::Error::other(format!(
            "{} changed while it was copied ({copied} of {} bytes)",
            source.display(),
            made_from.size
        )));
    }
    let fd = OwnedFd::from(into);
    fcntl(&fd, FcntlArg::F_ADD_SEALS(RUNC_SEALS)).map_err(io::Error::from)?;
    Ok(Copy { fd, made_from })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_is_sealed_as_runc_checks_and_holds_the_same_bytes() {
        let source = std::env::current_exe().expect("the test binary");
        let sealed = SealedBinary::of(&source)
            .expect("a sealed copy")
            .expect("the test binary is an ELF program");
        let copy = sealed.current().expect("the copy");
        assert_eq!(copy.seals().expect("its seals"), RUNC_SEALS);
        let bytes = std::fs::read(copy.program()).expect("read through /proc/self/fd");
        assert_eq!(bytes, std::fs::read(&source).expect("the source"));
        // Sealed: not even its owner can write it.
        let written = std::fs::OpenOptions::new()
            .write(true)
            .open(copy.program())
            .and_then(|mut writer| std::io::Write::write_all(&mut writer, b"x"));
        assert!(written.is_err(), "a sealed copy was written");
        assert!(
            Arc::ptr_eq(&copy, &sealed.current().expect("again")),
            "an unchanged file keeps its copy"
        );
    }

    #[test]
    fn a_changed_binary_is_copied_again_and_a_script_is_not_copied() {
        let dir = tempfile::tempdir().expect("tempdir");
        let program = dir.path().join("program");
        std::fs::copy(std::env::current_exe().expect("the test binary"), &program).expect("copy");
        let sealed = SealedBinary::of(&program).expect("sealed").expect("ELF");
        let first = sealed.current().expect("first");
        let mut bytes = std::fs::read(&program).expect("read");
        bytes.extend_from_slice(b"appended");
        std::fs::write(&program, &bytes).expect("rewrite");
        let second = sealed.current().expect("second");
        assert!(
            !Arc::ptr_eq(&first, &second),
            "a changed file is copied again"
        );
        assert_eq!(std::fs::read(second.program()).expect("read"), bytes);

        let script = dir.path().join("script");
        std::fs::write(&script, "#!/bin/sh\nexec runc \"$@\"\n").expect("script");
        assert!(SealedBinary::of(&script).expect("no error").is_none());
        assert!(
            SealedBinary::of(Path::new("no-such-runtime-binary"))
                .expect("no error")
                .is_none()
        );
    }
}

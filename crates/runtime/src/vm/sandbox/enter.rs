//! Entering a prepared [`super::Sandbox`] in the forked child: raw system
//! calls on data made before the fork, nothing that allocates or locks.

use std::ffi::CString;
use std::io;

use nix::libc;

use super::{MAX_TAP_FDS, TAP_FD};

/// One step of entering the sandbox, its paths as C strings.
#[derive(Debug)]
pub(super) enum Step {
    JoinCgroup(CString),
    /// Every mount of this process private: nothing propagates to the host.
    PrivateMounts,
    MountRoot(CString),
    Mkdir(CString),
    Touch(CString),
    Bind {
        source: CString,
        target: CString,
        writable: bool,
    },
    Symlink {
        target: CString,
        path: CString,
    },
    /// `owner`: the VM's uid and gid, mode 0600; else root's, 0666.
    Mknod {
        path: CString,
        major: u32,
        minor: u32,
        owner: Option<(u32, u32)>,
    },
    MountProc(CString),
    PivotRoot(CString),
}

/// A [`Sandbox`] ready to enter in a forked child.
#[derive(Debug)]
pub struct Prepared {
    pub(super) uid: u32,
    pub(super) gid: u32,
    pub(super) steps: Vec<(Step, CString)>,
}

/// The calling process's errno as an error (no allocation).
fn last_error() -> io::Error {
    io::Error::last_os_error()
}

fn check(result: libc::c_int) -> io::Result<()> {
    if result < 0 {
        Err(last_error())
    } else {
        Ok(())
    }
}

/// Writes `words` and a newline to stderr (QEMU's log) without
/// allocating.
fn report(words: &[&[u8]]) {
    for bytes in words {
        // SAFETY: writing a valid buffer to fd 2; a failure is ignored.
        unsafe { libc::write(2, bytes.as_ptr().cast(), bytes.len()) };
    }
}

impl Prepared {
    /// Enters the sandbox: meant for the forked child between `fork` and
    /// `execve` (it changes this whole process: its mounts, root, ids and
    /// capabilities), so it only makes system calls. `taps`: descriptors
    /// to hand QEMU as [`TAP_FD`] and the numbers after it, in order (at
    /// most [`MAX_TAP_FDS`]).
    pub fn enter(&self, taps: &[i32]) -> io::Result<()> {
        self.pass_taps(taps)?;
        for (step, what) in &self.steps {
            if let Err(error) = run(step) {
                report(&[b"corral: cannot sandbox QEMU: ", what.as_bytes(), b"\n"]);
                return Err(error);
            }
        }
        if let Err(error) = self.drop_privileges() {
            report(&[b"corral: cannot sandbox QEMU: drop privileges\n"]);
            return Err(error);
        }
        Ok(())
    }

    /// Puts `taps` on [`TAP_FD`], [`TAP_FD`] + 1, …, open across exec.
    /// Each is first copied above every target number, so a tap already
    /// open on a later target is not overwritten before it is moved.
    fn pass_taps(&self, taps: &[i32]) -> io::Result<()> {
        if taps.len() > MAX_TAP_FDS {
            return Err(io::Error::from_raw_os_error(libc::EMFILE));
        }
        let above = TAP_FD + MAX_TAP_FDS as i32;
        let mut copies = [0i32; MAX_TAP_FDS];
        for (copy, fd) in copies.iter_mut().zip(taps) {
            // SAFETY: plain fcntl on an open descriptor; the copy closes
            // on exec (only the dup2'd one below stays).
            *copy = unsafe { libc::fcntl(*fd, libc::F_DUPFD_CLOEXEC, above) };
            check(*copy)?;
        }
        for (index, copy) in copies.iter().take(taps.len()).enumerate() {
            // SAFETY: dup2 onto a fixed number; the new descriptor does
            // not close on exec.
            check(unsafe { libc::dup2(*copy, TAP_FD + index as i32) })?;
        }
        Ok(())
    }

    /// No supplementary groups, the VM's gid and uid (every one of real,
    /// effective and saved), an empty bounding set, no inheritable or
    /// ambient capabilities, and `no_new_privs`.
    fn drop_privileges(&self) -> io::Result<()> {
        // SAFETY (every call below): plain system calls on integers and
        // null pointers, in a child that is about to exec.
        let zero: libc::c_ulong = 0;
        unsafe {
            for cap in 0..=63 as libc::c_ulong {
                // EINVAL past the kernel's last capability is fine.
                libc::prctl(libc::PR_CAPBSET_DROP, cap, zero, zero, zero);
            }
            check(libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
                zero,
                zero,
                zero,
            ))?;
            check(libc::setgroups(0, std::ptr::null()))?;
            check(libc::setresgid(self.gid, self.gid, self.gid))?;
            check(libc::setresuid(self.uid, self.uid, self.uid))?;
            let mut header = libc_cap_header();
            let data = [CapData::default(); 2];
            check(libc::syscall(
                libc::SYS_capset,
                &mut header as *mut CapHeader,
                data.as_ptr(),
            ) as libc::c_int)?;
            check(libc::prctl(
                libc::PR_SET_NO_NEW_PRIVS,
                1 as libc::c_ulong,
                zero,
                zero,
                zero,
            ))?;
        }
        Ok(())
    }
}

/// `struct __user_cap_header_struct`.
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

/// `struct __user_cap_data_struct`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

fn libc_cap_header() -> CapHeader {
    // _LINUX_CAPABILITY_VERSION_3
    CapHeader {
        version: 0x2008_0522,
        pid: 0,
    }
}

fn run(step: &Step) -> io::Result<()> {
    let null = std::ptr::null::<libc::c_char>();
    // SAFETY (every call below): system calls on NUL-terminated strings
    // that live in `step` for the call, and null pointers where the kernel
    // takes them.
    unsafe {
        match step {
            Step::JoinCgroup(procs) => {
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(last_error());
                }
                // "0" is the writing process itself.
                let written = libc::write(fd, b"0".as_ptr().cast(), 1);
                libc::close(fd);
                if written < 0 {
                    return Err(last_error());
                }
                Ok(())
            }
            Step::PrivateMounts => {
                check(libc::unshare(libc::CLONE_NEWNS))?;
                check(libc::mount(
                    null,
                    c"/".as_ptr(),
                    null,
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ))
            }
            Step::MountRoot(root) => check(libc::mount(
                c"tmpfs".as_ptr(),
                root.as_ptr(),
                c"tmpfs".as_ptr(),
                libc::MS_NOSUID,
                c"mode=0755,size=1m,nr_inodes=4096".as_ptr().cast(),
            )),
            Step::Mkdir(path) => match libc::mkdir(path.as_ptr(), 0o755) {
                0 => Ok(()),
                _ if *libc::__errno_location() == libc::EEXIST => Ok(()),
                _ => Err(last_error()),
            },
            Step::Touch(path) => {
                let fd = libc::open(
                    path.as_ptr(),
                    libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC,
                    0o644,
                );
                if fd < 0 {
                    return Err(last_error());
                }
                libc::close(fd);
                Ok(())
            }
            Step::Bind {
                source,
                target,
                writable,
            } => {
                check(libc::mount(
                    source.as_ptr(),
                    target.as_ptr(),
                    null,
                    libc::MS_BIND | libc::MS_REC,
                    std::ptr::null(),
                ))?;
                let mut flags = libc::MS_REMOUNT | libc::MS_BIND | libc::MS_NOSUID | libc::MS_NODEV;
                if !writable {
                    flags |= libc::MS_RDONLY;
                } else {
                    flags |= libc::MS_NOEXEC;
                }
                check(libc::mount(
                    null,
                    target.as_ptr(),
                    null,
                    flags,
                    std::ptr::null(),
                ))
            }
            Step::Symlink { target, path } => check(libc::symlink(target.as_ptr(), path.as_ptr())),
            Step::Mknod {
                path,
                major,
                minor,
                owner,
            } => {
                let mode = if owner.is_some() { 0o600 } else { 0o666 };
                check(libc::mknod(
                    path.as_ptr(),
                    libc::S_IFCHR | mode,
                    libc::makedev(*major, *minor),
                ))?;
                // mknod's mode went through the umask.
                check(libc::chmod(path.as_ptr(), mode))?;
                if let Some((uid, gid)) = owner {
                    check(libc::chown(path.as_ptr(), *uid, *gid))?;
                }
                Ok(())
            }
            Step::MountProc(path) => check(libc::mount(
                c"proc".as_ptr(),
                path.as_ptr(),
                c"proc".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                std::ptr::null(),
            )),
            Step::PivotRoot(root) => {
                check(libc::chdir(root.as_ptr()))?;
                // pivot_root(".", "."): the old root ends up on top of the
                // new one, and is detached right away.
                check(
                    libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c".".as_ptr())
                        as libc::c_int,
                )?;
                check(libc::umount2(c".".as_ptr(), libc::MNT_DETACH))?;
                check(libc::chdir(c"/".as_ptr()))?;
                // The root itself is read-only: QEMU writes only where a
                // writable bind is.
                check(libc::mount(
                    null,
                    c"/".as_ptr(),
                    null,
                    libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY | libc::MS_NOSUID,
                    std::ptr::null(),
                ))
            }
        }
    }
}

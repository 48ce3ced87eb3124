//! Boot assets for VM tests: a kernel from Debian's `linux-image-cloud-amd64`
//! (`apt-get download` + `dpkg -x`, no install) and an initramfs built from
//! `/bin/busybox` (Debian's `busybox-static`) whose `/init`:
//!
//! 1. loads the virtio modules the cloud kernel keeps outside its image;
//! 2. prints [`VM_MARKER`] on the serial console;
//! 3. if a disk (`/dev/vda`) is present, mounts it (formatting it ext2 the
//!    first time), prints `CORRAL-DISK-FILE: <content>` of `/corral-file` or
//!    `CORRAL-DISK-EMPTY`, and writes the value of the kernel argument
//!    `corral.write=VALUE` there (then `CORRAL-DISK-WROTE: VALUE`);
//! 4. if the kernel argument `corral.addr=ADDR/LEN` is given (the agent
//!    passes the VM's address as a /128), puts it on `eth0` with a default
//!    route via `fe80::1` (the node's end of the VM's link), and serves
//!    `CORRAL-VM-HTTP` over HTTP on port 8080 (IPv6 and IPv4); each
//!    `corral.addrN=ADDR/LEN` (a further NIC's address) goes on `ethN`
//!    (`CORRAL-VM-ADDRESS-N: ADDR/LEN`), and `corral.ipv4=ADDR/32` with
//!    `corral.gw4=GATEWAY` on `eth0` with a default route via the gateway
//!    (`CORRAL-VM-IPV4: ADDR/32`);
//! 5. if the kernel argument `corral.acpi=1` is given, handles the ACPI
//!    power button: on a press it prints [`VM_POWEROFF_MARKER`], unmounts
//!    the disk and powers off (without it, the button does nothing, like
//!    a guest with no ACPI daemon);
//! 6. if the kernel argument `corral.count=1` is given, prints
//!    [`VM_COUNT_PREFIX`] and a counter once a second in the background
//!    (the counter goes on across a live migration, and starts over on a
//!    reboot);
//! 7. prints [`VM_READY_MARKER`] and keeps a shell on the console.
//!
//! The kernel is cached under [`cache_dir`] (reused across runs; `scripts/setup`
//! pre-fetches it), the initramfs is rebuilt next to it when missing.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// What the test guest's `/init` prints once its modules are loaded.
pub const VM_MARKER: &str = "CORRAL-VM-BOOTED";
/// What it prints last, after the disk and the network.
pub const VM_READY_MARKER: &str = "CORRAL-VM-READY";
/// What it prints when the ACPI power button makes it power off.
pub const VM_POWEROFF_MARKER: &str = "CORRAL-VM-POWEROFF";
/// With `corral.count=1` the guest prints this and the seconds since it
/// started counting, once a second (`CORRAL-VM-COUNT: 41`): a guest that
/// was not rebooted keeps counting up.
pub const VM_COUNT_PREFIX: &str = "CORRAL-VM-COUNT: ";
/// The Debian package whose dependency names the kernel package.
pub const KERNEL_METAPACKAGE: &str = "linux-image-cloud-amd64";
/// The environment variable overriding [`cache_dir`].
pub const CACHE_ENV: &str = "CORRAL_TEST_VM_CACHE";

/// The modules the cloud kernel needs for virtio (PCI or MMIO) disk and network, in
/// load order (each after its dependencies).
const MODULES: &[&str] = &[
    "drivers/virtio/virtio_ring.ko",
    "drivers/virtio/virtio.ko",
    "drivers/virtio/virtio_mmio.ko",
    "drivers/virtio/virtio_pci_modern_dev.ko",
    "drivers/virtio/virtio_pci_legacy_dev.ko",
    "drivers/virtio/virtio_pci.ko",
    "drivers/block/virtio_blk.ko",
    "net/core/failover.ko",
    "drivers/net/net_failover.ko",
    "drivers/net/virtio_net.ko",
    "drivers/acpi/button.ko",
    "drivers/input/evdev.ko",
];

/// A kernel and an initramfs ready for `-kernel` and `-initrd`.
#[derive(Debug, Clone)]
pub struct VmAssets {
    pub kernel: PathBuf,
    pub initramfs: PathBuf,
    /// The kernel's release, e.g. `6.1.0-57-cloud-amd64`.
    pub release: String,
}

/// Where the assets are cached: `$CORRAL_TEST_VM_CACHE`, else
/// `/var/cache/corral-test/vm`.
pub fn cache_dir() -> PathBuf {
    std::env::var_os(CACHE_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/corral-test/vm"))
}

/// The assets in [`cache_dir`], fetched or built when missing. Panics with
/// the reason when they cannot be had (a test missing them must fail).
pub fn vm_assets() -> VmAssets {
    match prepare(&cache_dir()) {
        Ok(assets) => assets,
        Err(error) => panic!(
            "cannot prepare the VM test assets in {}: {error} (run scripts/setup as root; it needs apt-get, dpkg and /bin/busybox)",
            cache_dir().display()
        ),
    }
}

/// Fetches the kernel into `cache` (once) and builds the initramfs (once),
/// holding a lock so concurrent tests do not collide.
pub fn prepare(cache: &Path) -> io::Result<VmAssets> {
    fs::create_dir_all(cache)?;
    let lock_file = fs::File::create(cache.join(".lock"))?;
    let _lock = nix::fcntl::Flock::lock(lock_file, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, errno)| io::Error::from(errno))?;
    let root = cache.join("root");
    let release = match kernel_release(&root) {
        Some(release) => release,
        None => {
            fetch_kernel(cache, &root)?;
            kernel_release(&root).ok_or_else(|| {
                io::Error::other(format!("no kernel in {} after dpkg -x", root.display()))
            })?
        }
    };
    let kernel = root.join("boot").join(format!("vmlinuz-{release}"));
    let initramfs = cache.join(format!("initramfs-{release}-{}.cpio", init_digest()));
    if !initramfs.exists() {
        let modules = root.join("lib/modules").join(&release).join("kernel");
        let bytes = build_initramfs(Path::new("/bin/busybox"), &modules)?;
        let partial = initramfs.with_extension("partial");
        fs::write(&partial, bytes)?;
        fs::rename(&partial, &initramfs)?;
    }
    Ok(VmAssets {
        kernel,
        initramfs,
        release,
    })
}

/// The release of the kernel unpacked under `root`, if any.
fn kernel_release(root: &Path) -> Option<String> {
    fs::read_dir(root.join("boot"))
        .ok()?
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .find_map(|name| name.strip_prefix("vmlinuz-").map(str::to_string))
}

fn run(command: &mut Command) -> io::Result<String> {
    let output = command.output()?;
    if !output.status.success() {
        return Err(io::Error::other(format!(
            "{command:?} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// `apt-get download` of the package the metapackage depends on, then
/// `dpkg -x` into `root`.
fn fetch_kernel(cache: &Path, root: &Path) -> io::Result<()> {
    let depends = run(Command::new("apt-cache")
        .arg("depends")
        .arg(KERNEL_METAPACKAGE))?;
    let package = depends
        .lines()
        .filter_map(|line| line.trim().strip_prefix("Depends:"))
        .map(str::trim)
        .find(|name| name.starts_with("linux-image-"))
        .ok_or_else(|| io::Error::other(format!("{KERNEL_METAPACKAGE} names no kernel package")))?
        .to_string();
    let debs = cache.join("debs");
    fs::create_dir_all(&debs)?;
    // `_apt` must be able to write there, or apt warns (and still works).
    let _ = fs::set_permissions(&debs, fs::Permissions::from_mode(0o777));
    run(Command::new("apt-get")
        .arg("download")
        .arg("-qq")
        .arg(&package)
        .current_dir(&debs))?;
    let deb = fs::read_dir(&debs)?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .find(|path| {
            path.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&package) && n.ends_with(".deb"))
        })
        .ok_or_else(|| io::Error::other(format!("apt-get download left no {package} .deb")))?;
    let partial = cache.join("root.partial");
    let _ = fs::remove_dir_all(&partial);
    run(Command::new("dpkg").arg("-x").arg(&deb).arg(&partial))?;
    let _ = fs::remove_dir_all(root);
    fs::rename(&partial, root)?;
    let _ = fs::remove_file(&deb);
    Ok(())
}

/// The guest's `/init`.
fn init_script() -> String {
    let mut script = String::from(
        "#!/bin/busybox sh\n\
         /bin/busybox mkdir -p /proc /sys /dev /mnt /tmp /www\n\
         /bin/busybox --install -s /bin\n\
         mount -t proc proc /proc\n\
         mount -t sysfs sys /sys\n\
         mount -t devtmpfs dev /dev\n",
    );
    for module in MODULES {
        script.push_str(&format!(
            "insmod /modules/{} 2>/dev/null\n",
            module_file(module)
        ));
    }
    script.push_str(&format!("echo {VM_MARKER}\n"));
    script.push_str(
        r#"arg() { for word in $(cat /proc/cmdline); do case "$word" in "$1"=*) echo "${word#*=}";; esac; done; }
if [ -b /dev/vda ]; then
  mount /dev/vda /mnt 2>/dev/null || { mke2fs -q -F /dev/vda && mount /dev/vda /mnt; }
  if [ -f /mnt/corral-file ]; then echo "CORRAL-DISK-FILE: $(cat /mnt/corral-file)"; else echo CORRAL-DISK-EMPTY; fi
  value=$(arg corral.write)
  if [ -n "$value" ]; then echo "$value" > /mnt/corral-file; sync; echo "CORRAL-DISK-WROTE: $value"; fi
fi
addr=$(arg corral.addr)
ip link set lo up
if [ -n "$addr" ]; then
  # busybox ip knows no nodad: switch DAD off before the address goes on.
  echo 0 > /proc/sys/net/ipv6/conf/eth0/accept_dad
  ip link set eth0 up
  ip -6 addr add "$addr" dev eth0
  ip -6 route add default via fe80::1 dev eth0
  echo CORRAL-VM-HTTP > /www/index.html
  httpd -p 8080 -h /www
  echo "CORRAL-VM-ADDRESS: $addr"
fi
for n in 1 2 3 4 5 6 7; do
  a=$(arg corral.addr$n)
  [ -n "$a" ] || continue
  echo 0 > /proc/sys/net/ipv6/conf/eth$n/accept_dad
  ip link set eth$n up
  ip -6 addr add "$a" dev eth$n
  echo "CORRAL-VM-ADDRESS-$n: $a"
done
v4=$(arg corral.ipv4)
gw4=$(arg corral.gw4)
if [ -n "$v4" ] && [ -n "$gw4" ]; then
  ip link set eth0 up
  ip addr add "$v4" dev eth0
  ip route add "$gw4" dev eth0
  ip route add default via "$gw4" dev eth0
  echo "CORRAL-VM-IPV4: $v4"
fi
"#,
    );
    script.push_str(&format!(
        r#"if [ "$(arg corral.acpi)" = 1 ]; then
  # The button's input device (button.ko names it), its evdev node.
  dev=
  for try in 1 2 3 4 5 6 7 8 9 10; do
    for dir in /sys/class/input/input*; do
      [ "$(cat $dir/name 2>/dev/null)" = "Power Button" ] || continue
      for event in $dir/event*; do [ -e "$event" ] && dev=/dev/input/${{event##*/}}; done
    done
    [ -n "$dev" ] && [ -c "$dev" ] && break
    sleep 0.5
  done
  if [ -z "$dev" ]; then echo CORRAL-VM-NO-POWER-BUTTON; else
    # Opened before the marker says so: a press that comes before the
    # reader below runs waits in this open file's queue, not lost.
    exec 3<"$dev"
    echo "CORRAL-VM-ACPI: $dev"
    # One input event (24 bytes) is the press.
    ( dd of=/dev/null bs=24 count=1 <&3 2>/dev/null
      echo {VM_POWEROFF_MARKER}; sync; umount /mnt 2>/dev/null; poweroff -f ) &
  fi
fi
"#
    ));
    script.push_str(&format!(
        r#"if [ "$(arg corral.count)" = 1 ]; then
  ( n=0; while true; do echo "{VM_COUNT_PREFIX}$n"; n=$((n+1)); sleep 1; done ) &
fi
"#
    ));
    script.push_str(&format!("echo {VM_READY_MARKER}\n"));
    script.push_str("while true; do setsid cttyhack sh; sleep 1; done\n");
    script
}

fn module_file(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// A short digest of the init script, so a changed script gets a new image.
fn init_digest() -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(init_script().as_bytes());
    hex::encode(&digest[..6])
}

/// The initramfs (cpio `newc`, uncompressed): busybox, `/init`, and the
/// modules from `modules` (a kernel's `lib/modules/RELEASE/kernel`).
pub fn build_initramfs(busybox: &Path, modules: &Path) -> io::Result<Vec<u8>> {
    let mut archive = CpioWriter::default();
    for dir in ["bin", "dev", "proc", "sys", "mnt", "tmp", "www", "modules"] {
        archive.directory(dir)?;
    }
    archive.file("bin/busybox", 0o755, &fs::read(busybox)?)?;
    archive.file("init", 0o755, init_script().as_bytes())?;
    for module in MODULES {
        let bytes = fs::read(modules.join(module))
            .map_err(|e| io::Error::new(e.kind(), format!("module {module}: {e}")))?;
        archive.file(&format!("modules/{}", module_file(module)), 0o644, &bytes)?;
    }
    archive.finish()
}

/// A minimal writer of the cpio `newc` format the kernel unpacks.
#[derive(Debug, Default)]
struct CpioWriter {
    out: Vec<u8>,
    inode: u32,
}

impl CpioWriter {
    fn entry(&mut self, name: &str, mode: u32, data: &[u8]) -> io::Result<()> {
        self.inode += 1;
        let name_size = name.len() + 1;
        write!(
            self.out,
            "070701{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}",
            self.inode,
            mode,
            0,
            0,
            1,
            0,
            data.len(),
            0,
            0,
            0,
            0,
            name_size,
            0
        )?;
        self.out.extend_from_slice(name.as_bytes());
        self.out.push(0);
        self.pad();
        self.out.extend_from_slice(data);
        self.pad();
        Ok(())
    }

    fn pad(&mut self) {
        while !self.out.len().is_multiple_of(4) {
            self.out.push(0);
        }
    }

    fn directory(&mut self, name: &str) -> io::Result<()> {
        self.entry(name, 0o040_755, &[])
    }

    fn file(&mut self, name: &str, permissions: u32, data: &[u8]) -> io::Result<()> {
        self.entry(name, 0o100_000 | permissions, data)
    }

    fn finish(mut self) -> io::Result<Vec<u8>> {
        self.entry("TRAILER!!!", 0, &[])?;
        Ok(self.out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpio_entries_are_aligned_and_end_with_the_trailer() {
        let mut archive = CpioWriter::default();
        archive.directory("bin").unwrap();
        archive.file("init", 0o755, b"#!/bin/sh\n").unwrap();
        let bytes = archive.finish().unwrap();
        assert_eq!(bytes.len() % 4, 0);
        assert!(bytes.starts_with(b"070701"));
        let text = String::from_utf8_lossy(&bytes);
        assert!(text.contains("TRAILER!!!"));
        assert!(text.contains("#!/bin/sh"));
    }

    #[test]
    fn the_init_script_prints_both_markers() {
        let script = init_script();
        assert!(script.contains(VM_MARKER));
        assert!(script.contains(VM_READY_MARKER));
        assert!(script.find(VM_MARKER) < script.find(VM_READY_MARKER));
    }
}

//! The cgroup migration primer against the real cgroup file system (root):
//! its write is a migration of this process to where it already is.

use corral_runtime::cgroup_migration::prime_now;
use corral_testkit::require_root;

#[test]
fn priming_leaves_the_process_in_its_own_cgroups() {
    require_root();
    let before = std::fs::read_to_string("/proc/self/cgroup").expect("read /proc/self/cgroup");
    let file = prime_now().expect("the primer's write succeeds as root");
    assert!(
        file.ends_with("cgroup.procs") && file.starts_with("/sys/fs/cgroup"),
        "{}",
        file.display()
    );
    // Written twice: warm or cold, the process stays where it was.
    prime_now().expect("a second write succeeds too");
    let after = std::fs::read_to_string("/proc/self/cgroup").expect("read /proc/self/cgroup");
    assert_eq!(before, after);
    let members = std::fs::read_to_string(&file).expect("read the cgroup's members");
    let pid = std::process::id().to_string();
    assert!(
        members.lines().any(|line| line == pid),
        "this process ({pid}) is listed in {}",
        file.display()
    );
}

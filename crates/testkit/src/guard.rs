//! Prerequisite checks that fail loudly, unique names, and a drop guard.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Panics unless the test runs as root.
pub fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root (it mounts, creates namespaces or runs containers): run it as root, as CI does"
    );
}

/// Returns the path of executable `name` on `PATH` (or `name` itself if it
/// is a path), panicking with a clear message if it is missing.
pub fn require_tool(name: &str) -> PathBuf {
    let candidate = Path::new(name);
    if candidate.components().count() > 1 {
        assert!(
            candidate.is_file(),
            "this test needs {name}, which is missing"
        );
        return candidate.to_path_buf();
    }
    corral_runtime::find_binary(name).unwrap_or_else(|| {
        panic!("this test needs `{name}` on PATH; install it (the setup script installs it for CI)")
    })
}

/// A name unique to this process and call: `<prefix>-<pid>-<n>`.
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// Runs a closure when dropped — also when a test panics. Guards drop in
/// reverse order of creation, so create them in set-up order.
pub struct Defer(Option<Box<dyn FnOnce()>>);

impl Defer {
    pub fn new(cleanup: impl FnOnce() + 'static) -> Self {
        Self(Some(Box::new(cleanup)))
    }

    /// Drops the guard without running it.
    pub fn cancel(mut self) {
        self.0 = None;
    }
}

impl std::fmt::Debug for Defer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Defer")
            .field("armed", &self.0.is_some())
            .finish()
    }
}

impl Drop for Defer {
    fn drop(&mut self) {
        if let Some(cleanup) = self.0.take() {
            cleanup();
        }
    }
}

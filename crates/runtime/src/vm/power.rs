//! Stopping a guest the way a person at its console would: press the ACPI
//! power button (`system_powerdown`), give the guest its grace period to
//! shut down, then end QEMU (`quit`, which flushes its disks) and, if even
//! that does not end it, SIGKILL. The sequence sees QEMU only through
//! [`Monitor`] and [`Guest`], so it is unit-tested with fakes.

use std::time::{Duration, Instant};

use super::process::{self, VmError};
use super::qmp::Monitor;

/// The QEMU process being stopped.
pub trait Guest {
    /// Whether the process has exited.
    fn exited(&self) -> bool;
    /// Asks QEMU to exit (SIGTERM: it flushes its disks), for when the
    /// monitor cannot.
    fn terminate(&self) -> Result<(), VmError>;
    /// Ends it at once (SIGKILL).
    fn kill(&self) -> Result<(), VmError>;
}

/// How a stop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopOutcome {
    /// QEMU was not running.
    AlreadyGone,
    /// The guest powered itself off after the power button, in this long.
    PoweredOff(Duration),
    /// The grace period ran out (or the guest could not be asked): QEMU
    /// was told to quit (`quit`, or SIGTERM without a monitor).
    Quit,
    /// QEMU did not quit either: it was killed.
    Killed,
}

impl std::fmt::Display for StopOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StopOutcome::AlreadyGone => f.write_str("QEMU was not running"),
            StopOutcome::PoweredOff(after) => write!(
                f,
                "the guest powered off after the ACPI power button in {:.1}s",
                after.as_secs_f64()
            ),
            StopOutcome::Quit => f.write_str(
                "the guest did not power off within its grace period: QEMU was told to quit",
            ),
            StopOutcome::Killed => f.write_str("QEMU did not quit: it was killed"),
        }
    }
}

/// How long QEMU gets to exit after `quit` before SIGKILL.
pub const QUIT_GRACE: Duration = Duration::from_secs(5);

/// How often the process is looked at while waiting.
const POLL: Duration = Duration::from_millis(100);

/// Presses the power button through `monitor` (when there is one), waits
/// up to `grace` for QEMU to exit, then quits it, then kills it.
pub fn stop_cleanly(
    monitor: Option<&mut dyn Monitor>,
    guest: &dyn Guest,
    grace: Duration,
) -> Result<StopOutcome, VmError> {
    if guest.exited() {
        return Ok(StopOutcome::AlreadyGone);
    }
    let began = Instant::now();
    let mut monitor = monitor;
    let pressed = match monitor.as_deref_mut() {
        Some(monitor) => match monitor.system_powerdown() {
            Ok(()) => true,
            Err(error) => {
                tracing::warn!(error = %error, "cannot press the VM's power button");
                false
            }
        },
        None => false,
    };
    if pressed && wait_for_exit(monitor.as_deref_mut(), guest, grace) {
        return Ok(StopOutcome::PoweredOff(began.elapsed()));
    }
    let quit = match monitor {
        Some(monitor) => monitor.quit().map_err(|error| {
            tracing::warn!(error = %error, "cannot tell QEMU to quit; sending SIGTERM");
        }),
        None => Err(()),
    };
    if quit.is_err() {
        guest.terminate()?;
    }
    if wait_for_exit(None, guest, QUIT_GRACE) {
        return Ok(StopOutcome::Quit);
    }
    guest.kill()?;
    while !guest.exited() {
        std::thread::sleep(POLL / 5);
    }
    Ok(StopOutcome::Killed)
}

/// Waits up to `limit` for the process to exit; reading events meanwhile
/// (when the monitor is there) notices a closed connection early.
fn wait_for_exit<'m>(
    mut monitor: Option<&mut (dyn Monitor + 'm)>,
    guest: &dyn Guest,
    limit: Duration,
) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if guest.exited() {
            return true;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        let wait = left.min(POLL);
        match monitor.as_deref_mut().map(|m| m.next_event(wait)) {
            Some(Ok(Some(event))) => {
                tracing::debug!(event = %event.name, "QMP event while stopping");
            }
            Some(Ok(None)) => {}
            // The connection ended (QEMU is exiting): watch the process.
            Some(Err(_)) => {
                monitor = None;
                std::thread::sleep(wait);
            }
            None => std::thread::sleep(wait),
        }
    }
}

/// The QEMU process with `pid`, a child the agent tracks.
#[derive(Debug, Clone, Copy)]
pub struct QemuProcess(pub u32);

impl Guest for QemuProcess {
    fn exited(&self) -> bool {
        process::exit_status(self.0).is_some()
    }

    fn terminate(&self) -> Result<(), VmError> {
        process::signal(self.0, nix::sys::signal::Signal::SIGTERM)
    }

    fn kill(&self) -> Result<(), VmError> {
        process::signal(self.0, nix::sys::signal::Signal::SIGKILL)
    }
}

#[cfg(test)]
mod tests;

use std::sync::{Arc, Mutex};

use super::*;
use crate::vm::qmp::{Event, QmpError, RunState, RunStatus};

/// A machine whose guest powers off `delay` after the button when it has
/// an ACPI handler, and which may ignore `quit`.
#[derive(Clone)]
struct FakeMachine {
    shared: Arc<Mutex<Machine>>,
}

struct Machine {
    handles_acpi: bool,
    delay: Duration,
    obeys_quit: bool,
    pressed_at: Option<Instant>,
    quit: bool,
    killed: bool,
    calls: Vec<&'static str>,
}

impl FakeMachine {
    fn new(handles_acpi: bool, delay: Duration, obeys_quit: bool) -> Self {
        FakeMachine {
            shared: Arc::new(Mutex::new(Machine {
                handles_acpi,
                delay,
                obeys_quit,
                pressed_at: None,
                quit: false,
                killed: false,
                calls: Vec::new(),
            })),
        }
    }

    fn calls(&self) -> Vec<&'static str> {
        self.shared.lock().unwrap().calls.clone()
    }
}

impl Monitor for FakeMachine {
    fn query_status(&mut self) -> Result<RunStatus, QmpError> {
        Ok(RunStatus {
            status: RunState::Running,
            running: true,
        })
    }
    fn system_powerdown(&mut self) -> Result<(), QmpError> {
        let mut machine = self.shared.lock().unwrap();
        machine.calls.push("system_powerdown");
        machine.pressed_at = Some(Instant::now());
        Ok(())
    }
    fn system_reset(&mut self) -> Result<(), QmpError> {
        unreachable!("a stop never resets")
    }
    fn quit(&mut self) -> Result<(), QmpError> {
        let mut machine = self.shared.lock().unwrap();
        machine.calls.push("quit");
        machine.quit = machine.obeys_quit;
        Ok(())
    }
    fn block_resize(&mut self, _: &str, _: u64) -> Result<(), QmpError> {
        unreachable!("a stop resizes nothing")
    }
    fn human(&mut self, _: &str) -> Result<String, QmpError> {
        unreachable!("a stop uses no HMP")
    }
    fn next_event(&mut self, timeout: Duration) -> Result<Option<Event>, QmpError> {
        std::thread::sleep(timeout);
        Ok(None)
    }
}

impl Guest for FakeMachine {
    fn exited(&self) -> bool {
        let machine = self.shared.lock().unwrap();
        let powered_off = machine.handles_acpi
            && machine
                .pressed_at
                .is_some_and(|at| at.elapsed() >= machine.delay);
        powered_off || machine.quit || machine.killed
    }
    fn terminate(&self) -> Result<(), VmError> {
        let mut machine = self.shared.lock().unwrap();
        machine.calls.push("terminate");
        machine.quit = machine.obeys_quit;
        Ok(())
    }
    fn kill(&self) -> Result<(), VmError> {
        let mut machine = self.shared.lock().unwrap();
        machine.calls.push("kill");
        machine.killed = true;
        Ok(())
    }
}

#[test]
fn a_guest_with_an_acpi_handler_powers_off_within_its_grace() {
    let machine = FakeMachine::new(true, Duration::from_millis(150), true);
    let mut monitor = machine.clone();
    let outcome = stop_cleanly(Some(&mut monitor), &machine, Duration::from_secs(5)).unwrap();
    let StopOutcome::PoweredOff(after) = outcome else {
        panic!("expected a power-off, got {outcome:?}");
    };
    assert!(
        after >= Duration::from_millis(150) && after < Duration::from_secs(2),
        "{after:?}"
    );
    assert_eq!(machine.calls(), ["system_powerdown"]);
}

#[test]
fn a_guest_without_one_is_quit_after_its_grace() {
    let machine = FakeMachine::new(false, Duration::ZERO, true);
    let mut monitor = machine.clone();
    let began = Instant::now();
    let outcome = stop_cleanly(Some(&mut monitor), &machine, Duration::from_millis(300)).unwrap();
    assert_eq!(outcome, StopOutcome::Quit);
    assert!(began.elapsed() >= Duration::from_millis(300));
    assert_eq!(machine.calls(), ["system_powerdown", "quit"]);
}

#[test]
fn a_qemu_that_does_not_quit_is_killed() {
    let machine = FakeMachine::new(false, Duration::ZERO, false);
    let mut monitor = machine.clone();
    // QUIT_GRACE is spent waiting for the quit; keep the grace short.
    let outcome = stop_cleanly(Some(&mut monitor), &machine, Duration::from_millis(50)).unwrap();
    assert_eq!(outcome, StopOutcome::Killed);
    assert_eq!(machine.calls(), ["system_powerdown", "quit", "kill"]);
}

#[test]
fn without_a_monitor_qemu_gets_sigterm_at_once_and_a_gone_one_is_left() {
    let machine = FakeMachine::new(true, Duration::ZERO, true);
    let began = Instant::now();
    let outcome = stop_cleanly(None, &machine, Duration::from_secs(60)).unwrap();
    // Nobody could press the button: no grace is spent waiting for it.
    assert_eq!(outcome, StopOutcome::Quit);
    assert!(began.elapsed() < Duration::from_secs(2));
    assert_eq!(machine.calls(), ["terminate"]);
    assert_eq!(
        stop_cleanly(None, &machine, Duration::from_secs(60)).unwrap(),
        StopOutcome::AlreadyGone
    );
}

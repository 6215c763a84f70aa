//! A panicking reactor ends `nvmf-tgt` with status 70 and one line naming the thread, the
//! panic and its location (`nvmf_target::exit_on_panic`), instead of leaving a process that
//! serves nobody.
//!
//! nvmf-tgt has no way to make a reactor panic on purpose (and gets none for this test), so the
//! test re-runs its own binary as the child, with `NVMF_TEST_EXIT_ON_PANIC_CHILD` set: the child
//! installs the hook as `nvmf-tgt`'s `main` does and starts a reactor, named as nvmf-tgt names
//! them, whose poll panics. The parent checks the child's exit status and stderr.

use std::process::Command;
use std::time::Duration;

use nvmf_common::reactor::{IdleMode, Pollable, Reactor};

/// Set in the child's environment only.
const CHILD: &str = "NVMF_TEST_EXIT_ON_PANIC_CHILD";
const TEST_NAME: &str = "a_panicking_reactor_ends_the_process_with_status_70_and_says_why";

struct PanicsOnPoll;

impl Pollable for PanicsOnPoll {
    fn poll(&mut self) -> usize {
        panic!("poll went wrong (test)");
    }
}

/// Runs in the child: never returns to the test harness.
fn child() -> ! {
    nvmf_target::exit_on_panic::install();
    // Named as `nvmf_target::reactor::start_reactors` names reactors.
    let (reactor, ()) = Reactor::spawn(0, "reactor_0".into(), IdleMode::Adaptive, |_| {
        (PanicsOnPoll, ())
    })
    .expect("reactor starts");
    // The hook exits from the reactor thread; if it did not, the process would carry on here
    // with a dead reactor, the zombie this guards against.
    std::thread::sleep(Duration::from_secs(10));
    drop(reactor);
    std::process::exit(0);
}

#[test]
fn a_panicking_reactor_ends_the_process_with_status_70_and_says_why() {
    if std::env::var_os(CHILD).is_some() {
        child();
    }
    let out = Command::new(std::env::current_exe().expect("test binary path"))
        .args(["--exact", TEST_NAME, "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env_remove("RUST_BACKTRACE")
        .output()
        .expect("the child runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(70),
        "the child must exit with EX_SOFTWARE; stderr:\n{stderr}"
    );
    let reports: Vec<&str> = stderr.lines().filter(|l| l.contains("panicked")).collect();
    assert_eq!(reports.len(), 1, "one line per panic; stderr:\n{stderr}");
    let line = reports[0];
    assert!(
        line.starts_with("nvmf-tgt: thread 'reactor_0' panicked at "),
        "{line}"
    );
    assert!(line.contains("tests/exit_on_panic.rs:"), "location: {line}");
    assert!(line.contains("poll went wrong (test)"), "message: {line}");
    assert!(
        line.ends_with("exiting with status 70 so a supervisor restarts nvmf-tgt"),
        "{line}"
    );
}

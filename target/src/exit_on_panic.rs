//! `nvmf-tgt` ends when any of its threads panics, so that no reactor dies alone.
//!
//! A reactor owns its qpairs and their requests; when its thread dies, those hosts are served by
//! nobody, and no other thread can take them over; without the RDMA acceptor thread no connection
//! is accepted at all. A process left like that still answers RPCs: a zombie target. `main` checks
//! for dead reactors only in its idle loop and cannot say why one died; this hook acts on the first
//! panic on any thread (reactor, RDMA acceptor, RPC, main), at any time, start-up and config
//! loading included: it logs one line naming the thread, the panic message and its location, and
//! ends the process with [`EXIT_STATUS`], so systemd (`Restart=on-failure`) or another supervisor
//! restarts nvmf-tgt and the hosts reconnect. That includes a panic in an RPC handler, which the
//! RPC server's async runtime would otherwise catch: the handler may have left the target's shared
//! state half-changed.

use std::io::Write as _;
use std::panic::Location;

/// EX_SOFTWARE from `sysexits.h`: an internal software error.
pub const EXIT_STATUS: i32 = 70;

/// Installs the panic hook that logs the panic in one line on stderr and exits the process
/// with [`EXIT_STATUS`]; `nvmf-tgt` installs it before anything else starts.
///
/// The line names the thread (reactors are `reactor_<core>`), the panic message and its
/// location. It goes to stderr, not through `tracing`: stderr is unbuffered and usable before
/// logging starts and when the panic came from inside the logging machinery; supervisors
/// capture it as they capture Rust's own panic messages. A backtrace follows when
/// `RUST_BACKTRACE` asks for one (this hook replaces the default one that would print it).
///
/// Other threads are not unwound or joined: the process is already broken, and the hosts'
/// connections end with it.
pub fn install() {
    std::panic::set_hook(Box::new(|info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
            .unwrap_or("(a panic payload that is not a string)");
        let line = report_line(std::thread::current().name(), message, info.location());
        let backtrace = std::backtrace::Backtrace::capture();
        // `writeln!` rather than `eprintln!`: a failed write (stderr closed) must not panic
        // inside the panic hook, and the output must bypass a test harness's capture.
        let mut err = std::io::stderr().lock();
        let _ = writeln!(err, "{line}");
        if backtrace.status() == std::backtrace::BacktraceStatus::Captured {
            let _ = writeln!(err, "{backtrace}");
        }
        drop(err);
        std::process::exit(EXIT_STATUS);
    }));
}

/// The one line a panic is reported with.
fn report_line(thread: Option<&str>, message: &str, location: Option<&Location<'_>>) -> String {
    let thread = thread.unwrap_or("<unnamed>");
    let at = location.map_or_else(|| "an unknown location".to_string(), ToString::to_string);
    // A multi-line message would break the one-line report (and log parsers).
    let message = message.replace('\n', " | ");
    format!(
        "nvmf-tgt: thread '{thread}' panicked at {at}: {message}; \
         exiting with status {EXIT_STATUS} so a supervisor restarts nvmf-tgt"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_is_one_line_with_thread_message_and_location() {
        let here = Location::caller();
        let line = report_line(Some("reactor_1"), "index out\nof bounds", Some(here));
        assert!(!line.contains('\n'));
        assert!(line.starts_with("nvmf-tgt: thread 'reactor_1' panicked at "));
        assert!(line.contains(&format!("{}:{}", here.file(), here.line())));
        assert!(line.contains("index out | of bounds"));
        assert!(line.ends_with("exiting with status 70 so a supervisor restarts nvmf-tgt"));
        assert!(report_line(None, "x", None).contains("'<unnamed>' panicked at an unknown"));
    }
}

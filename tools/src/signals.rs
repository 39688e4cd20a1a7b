//! SIGINT and SIGTERM as a request to stop: the waits of a run check it and return an error,
//! so the run ends through its normal exit path, which flushes its pcap, instead of dying
//! in the middle of a record. Each signal also flushes every open pcap at once (a run stuck
//! outside its waits still leaves a readable capture), and a second signal ends the process.

use std::io;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};

static STOP: AtomicBool = AtomicBool::new(false);

/// Installs the handler. Call it once a run has its peer: before that a blocking accept(2)
/// or connect(2) would not notice the flag, and the default action ends the process.
pub fn stop_on_signals() -> io::Result<()> {
    ctrlc::set_handler(|| {
        let stopping = STOP.swap(true, Ordering::Relaxed);
        flush_captures();
        if stopping {
            std::process::exit(130);
        }
    })
    .map_err(|error| io::Error::other(format!("cannot handle SIGINT and SIGTERM: {error}")))
}

/// The exit status of a run that failed with `error`: 130 when a signal stopped it, as a
/// shell reports a process SIGINT ended.
pub fn failure(error: &io::Error) -> ExitCode {
    if error.kind() == io::ErrorKind::Interrupted && STOP.load(Ordering::Relaxed) {
        ExitCode::from(130)
    } else {
        ExitCode::FAILURE
    }
}

/// An error of kind `Interrupted` once a signal asked the run to stop.
pub fn check() -> io::Result<()> {
    if STOP.load(Ordering::Relaxed) {
        return Err(io::Error::new(
            io::ErrorKind::Interrupted,
            "stopped by a signal",
        ));
    }
    Ok(())
}

/// Flushes every open pcap, as a signal handler must before the process may end: a failure
/// is reported, not fatal, since the process is going away either way.
pub fn flush_captures() {
    if let Err(error) = roce_provider::capture::flush_all() {
        eprintln!("roce: cannot flush the pcap: {error}");
    }
}

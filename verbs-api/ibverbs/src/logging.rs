//! `ROCE_LOG`: events of the whole stack (QP state changes, NAKs, retransmissions, RNR
//! waits, dropped frames, why a call failed) on stderr, filtered with `tracing`'s
//! env-filter syntax (`ROCE_LOG=debug`, `ROCE_LOG=roce_transport=trace`). `ROCE_LOG=1` keeps
//! its old meaning: only why calls fail (C programs see nothing but errno).

use core::ffi::c_int;
use std::sync::Once;

use roce_cabi::set_errno;

/// The target of the call-failure events, so `ROCE_LOG=1` can select them alone.
const FAILURES: &str = "libibverbs";

/// Installs the stderr subscriber if `ROCE_LOG` asks for one; at most once per process.
pub(crate) fn init() {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        let Some(filter) = std::env::var_os("ROCE_LOG") else {
            return;
        };
        let filter = filter.to_string_lossy();
        let filter = match filter.trim() {
            "" | "1" => format!("{FAILURES}=debug"),
            directives => directives.to_owned(),
        };
        // A program that brought its own subscriber keeps it.
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .try_init();
    });
}

/// Says why a call failed (at debug level, target `libibverbs`).
pub(crate) fn failure(call: &str, why: &dyn std::fmt::Display) {
    init();
    tracing::debug!(target: FAILURES, "{call}: {why}");
}

/// Fails a call that returns an object: says why, sets errno, returns NULL.
pub(crate) fn fail_null<T>(call: &str, errno: c_int, why: &dyn std::fmt::Display) -> *mut T {
    failure(call, why);
    set_errno(errno);
    core::ptr::null_mut()
}

//! `ROCE_STATS=1`: each device's counters, with rxe's `hw_counters` names, on stderr when
//! the program closes it or exits with it open: a line naming the device, then one
//! `name value` line per counter. Only devices whose engine started have counters.

use std::sync::{Mutex, Once};

use crate::context::Context;

/// Contexts opened and not yet closed, by address, while `ROCE_STATS` is set. A context is
/// freed only after `closing` took it out under this lock, and the exit handler reports
/// under it, so every address here is a live context while the lock is held.
static OPEN: Mutex<Vec<usize>> = Mutex::new(Vec::new());

fn enabled() -> bool {
    static ENABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ENABLED.get_or_init(|| std::env::var_os("ROCE_STATS").is_some_and(|value| value != "0"))
}

/// A context was opened: report it at exit unless it is closed first.
pub(crate) fn opened(context: &Context) {
    if !enabled() {
        return;
    }
    static AT_EXIT: Once = Once::new();
    AT_EXIT.call_once(|| {
        // SAFETY: registers a function that takes no arguments and does not unwind.
        unsafe { libc::atexit(at_exit) };
    });
    if let Ok(mut open) = OPEN.lock() {
        open.push(core::ptr::from_ref(context) as usize);
    }
}

/// A context is being closed: report it now (unless the exit handler did).
pub(crate) fn closing(context: &Context) {
    if !enabled() {
        return;
    }
    let Ok(mut open) = OPEN.lock() else { return };
    let address = core::ptr::from_ref(context) as usize;
    if let Some(at) = open.iter().position(|&open| open == address) {
        open.swap_remove(at);
        report(context);
    }
}

extern "C" fn at_exit() {
    let Ok(mut open) = OPEN.lock() else { return };
    for address in open.drain(..) {
        // SAFETY: an address in `OPEN` is a live context while the lock is held (see there).
        let context = unsafe { &*(address as *const Context) };
        report(context);
    }
}

fn report(context: &Context) {
    let Some(verbs) = context.started() else {
        return;
    };
    let Ok(counters) = verbs.counters() else {
        return;
    };
    let mut text = format!("roce-xdp hw_counters {}\n", context.device().name);
    for (name, value) in counters.iter() {
        text.push_str(&format!("{name} {value}\n"));
    }
    eprint!("{text}");
}

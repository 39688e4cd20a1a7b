//! Each open device's counters, with rxe's `hw_counters` names, where programs read them:
//!
//! - in the device view `roce exec` makes (`/sys/class/infiniband/DEV/ports/1/hw_counters/`,
//!   see `roce_verbs::sysfs`): a thread rewrites the files of each device this process has
//!   open at most every `COUNTERS_LIFESPAN_MS` (100 ms), when they changed, and once more
//!   when the device is closed. As the kernel's, they count for the device, not the
//!   process: each process adds its counts to what the files said when it opened the
//!   device. Only a tmpfs is written, so real sysfs is never touched;
//! - with `ROCE_STATS=1`, on stderr when the program closes the device or exits with it
//!   open: a line naming the device, then one `name value` line per counter; on a device
//!   whose switch this process attached to, a line `roce-xdp switch DEV` and the switch's
//!   counters (steered, dropped per reason, ring full) and this process's there.
//!
//! Only devices whose engine started have counters (the files read 0 until then).

use std::cell::RefCell;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard, Once};
use std::time::Duration;

use std::os::unix::fs::PermissionsExt;

use roce_verbs::sysfs::{hw_counter_text, hw_counters_dir, COUNTERS_LIFESPAN_MS};
use roce_verbs::Counters;

use crate::context::Context;

/// A context opened and not yet closed, while `ROCE_STATS` is set or the device has counter
/// files to keep current.
struct Open {
    /// The context's address.
    context: usize,
    /// Its `hw_counters` directory, if it is ours to write.
    files: Option<String>,
    /// What the files said when it was opened, in `Counters::NAMES` order.
    base: Vec<u64>,
    /// What the files say now.
    written: Vec<u64>,
}

/// The open contexts. A context is freed only after `closing` took it out under this lock,
/// and the exit handler and the writer read them under it, so every address here is a live
/// context while the lock is held.
static OPEN: Mutex<Vec<Open>> = Mutex::new(Vec::new());

fn open_list() -> MutexGuard<'static, Vec<Open>> {
    OPEN.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn report_enabled() -> bool {
    static ENABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ENABLED.get_or_init(|| std::env::var_os("ROCE_STATS").is_some_and(|value| value != "0"))
}

/// The device's `hw_counters` directory if it is in a tmpfs (the device view), not sysfs.
fn counter_files(device: &str) -> Option<String> {
    const TMPFS_MAGIC: u64 = 0x0102_1994;
    let dir = hw_counters_dir(device);
    let fs = rustix::fs::statfs(dir.as_str()).ok()?;
    (fs.f_type as u64 == TMPFS_MAGIC).then_some(dir)
}

/// A context was opened: keep its counter files current, report it at exit.
pub(crate) fn opened(context: &Context) {
    let files = counter_files(&context.device().name);
    if files.is_none() && !report_enabled() {
        return;
    }
    static HANDLERS: Once = Once::new();
    HANDLERS.call_once(|| {
        if report_enabled() {
            // SAFETY: registers a function that takes no arguments and does not unwind.
            unsafe { libc::atexit(at_exit) };
        }
        // SAFETY: registers functions that take no arguments and do not unwind.
        unsafe { libc::pthread_atfork(Some(before_fork), Some(after_fork), Some(in_child)) };
    });
    if files.is_some() {
        start_writer();
    }
    let base: Vec<u64> = Counters::NAMES
        .iter()
        .map(|name| {
            let file = files.as_ref().map(|dir| format!("{dir}/{name}"));
            file.and_then(|file| std::fs::read_to_string(file).ok())
                .and_then(|text| text.trim().parse().ok())
                .unwrap_or(0)
        })
        .collect();
    open_list().push(Open {
        context: core::ptr::from_ref(context) as usize,
        files,
        written: base.clone(),
        base,
    });
}

/// A context is being closed: its files get its last counters, and it is reported now
/// (unless the exit handler did).
pub(crate) fn closing(context: &Context) {
    let mut open = open_list();
    let address = core::ptr::from_ref(context) as usize;
    if let Some(at) = open.iter().position(|open| open.context == address) {
        let mut entry = open.swap_remove(at);
        refresh(context, &mut entry);
        if report_enabled() {
            report(context);
        }
    }
}

extern "C" fn at_exit() {
    for entry in open_list().drain(..) {
        // SAFETY: an address in `OPEN` is a live context while the lock is held (see there).
        let context = unsafe { &*(entry.context as *const Context) };
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
    // On a device its switch shares: the switch's counters, and this process's there.
    if let Some(stats) = verbs.backend_kind().switch().and_then(|link| link.stats()) {
        text.push_str(&format!("roce-xdp switch {}\n", context.device().name));
        for (name, value) in stats.iter() {
            text.push_str(&format!("{name} {value}\n"));
        }
    }
    eprint!("{text}");
}

/// The process whose writer thread is running (a forked child needs its own).
static WRITER: AtomicU32 = AtomicU32::new(0);

fn start_writer() {
    let me = std::process::id();
    let running = WRITER.load(Ordering::Acquire);
    if running == me
        || WRITER
            .compare_exchange(running, me, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
    {
        return;
    }
    let started = std::thread::Builder::new()
        .name("roce-counters".into())
        .spawn(|| loop {
            std::thread::sleep(Duration::from_millis(COUNTERS_LIFESPAN_MS));
            for entry in open_list().iter_mut() {
                // SAFETY: an address in `OPEN` is a live context while the lock is held.
                let context = unsafe { &*(entry.context as *const Context) };
                refresh(context, entry);
            }
        });
    if started.is_err() {
        WRITER.store(0, Ordering::Release);
    }
}

/// Rewrites the context's counter files if its counters moved.
fn refresh(context: &Context, entry: &mut Open) {
    let Some(dir) = &entry.files else { return };
    let Some(Ok(counters)) = context.started().map(roce_verbs::Context::counters) else {
        return;
    };
    let now: Vec<u64> = entry
        .base
        .iter()
        .zip(counters.iter())
        .map(|(base, (_, value))| base.saturating_add(value))
        .collect();
    for ((name, value), old) in Counters::NAMES.iter().zip(&now).zip(&mut entry.written) {
        if value == old {
            continue;
        }
        // Whole values only: a reader sees the old file or the new, never half of one.
        let path = format!("{dir}/{name}");
        let temporary = format!("{dir}/.{name}.new");
        let written = std::fs::write(&temporary, hw_counter_text(*value))
            .and_then(|()| {
                std::fs::set_permissions(&temporary, std::fs::Permissions::from_mode(0o444))
            })
            .and_then(|()| std::fs::rename(&temporary, &path));
        if written.is_err() {
            let _ = std::fs::remove_file(&temporary);
            return;
        }
        *old = *value;
    }
}

thread_local! {
    /// The list's lock, held by the forking thread across fork(2), so the child never
    /// inherits it locked by a thread it does not have (the writer).
    static ACROSS_FORK: RefCell<Option<MutexGuard<'static, Vec<Open>>>> =
        const { RefCell::new(None) };
}

extern "C" fn before_fork() {
    let guard = open_list();
    ACROSS_FORK.with(|held| *held.borrow_mut() = Some(guard));
}

extern "C" fn after_fork() {
    ACROSS_FORK.with(|held| drop(held.borrow_mut().take()));
}

/// The child's copies of its parent's contexts have no engine running here, and the
/// parent keeps their files: the child tracks only what it opens itself.
extern "C" fn in_child() {
    ACROSS_FORK.with(|held| {
        if let Some(mut open) = held.borrow_mut().take() {
            open.clear();
        }
    });
}

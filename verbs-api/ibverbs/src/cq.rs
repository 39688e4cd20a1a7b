//! Completion channels and completion queues.

use core::ffi::{c_int, c_void};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use roce_cabi::set_errno;
use roce_verbs::{CompChannel, Error, WcOpcode, WorkCompletion};
use std::time::Duration;

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::fs::{fcntl_setfl, OFlags};

use crate::abi::*;
use crate::context::{is_nonblocking, Context};

const EINVAL: c_int = 22;
const EBUSY: c_int = 16;
const EAGAIN: c_int = 11;

/// Our `ibv_comp_channel`.
#[repr(C)]
pub(crate) struct Channel {
    raw: ibv_comp_channel,
    channel: CompChannel,
    /// CQs that signal it: while any is left, it cannot go.
    users: AtomicUsize,
    /// Held by the thread in `ibv_get_cq_event`, so that once the fd polls readable the
    /// event is still there when taken (`roce-verbs` reads the counter when its queue
    /// empties, which would block on a blocking fd with nothing to read).
    waiting: Mutex<()>,
    /// No engine thread: waiting must drive the engine (and always blocks).
    caller_drives: bool,
}

/// `ibv_create_comp_channel`: its fd is an eventfd, readable while events wait, blocking
/// until the caller makes it `O_NONBLOCK` (then `ibv_get_cq_event` fails with `EAGAIN`).
pub(crate) unsafe extern "C" fn create_comp_channel(
    context: *mut ibv_context,
) -> *mut ibv_comp_channel {
    // SAFETY: the caller passes an open context.
    let Some(ours) = (unsafe { Context::from_raw(context) }) else {
        set_errno(EINVAL);
        return core::ptr::null_mut();
    };
    let caller_drives = ours.caller_drives();
    let made = ours
        .verbs()
        .and_then(roce_verbs::Context::create_comp_channel)
        .and_then(|channel| {
            // Blocking as rdma-core's is: the caller's O_NONBLOCK is what tells the two apart.
            // Without an engine thread, waiting drives the engine, which needs it non-blocking.
            if !caller_drives {
                fcntl_setfl(channel.as_fd(), OFlags::empty()).map_err(std::io::Error::from)?;
            }
            Ok(channel)
        });
    match made {
        Ok(channel) => Box::into_raw(Box::new(Channel {
            raw: ibv_comp_channel {
                context,
                fd: channel.as_fd().as_raw_fd(),
                refcnt: 0,
            },
            channel,
            users: AtomicUsize::new(0),
            waiting: Mutex::new(()),
            caller_drives,
        }))
        .cast(),
        Err(error) => fail_null("ibv_create_comp_channel", &error),
    }
}

/// `ibv_destroy_comp_channel`: `EBUSY` while a CQ uses it.
pub(crate) unsafe extern "C" fn destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int {
    // SAFETY: the caller passes a channel of ours.
    let Some(ours) = (unsafe { channel.cast::<Channel>().as_ref() }) else {
        return EINVAL;
    };
    if ours.users.load(Ordering::Acquire) > 0 {
        return EBUSY;
    }
    // SAFETY: leaked from a Box in `create_comp_channel`; the caller gives it up.
    drop(unsafe { Box::from_raw(channel.cast::<Channel>()) });
    0
}

/// Our `ibv_cq`.
#[repr(C)]
pub(crate) struct Cq {
    pub(crate) raw: ibv_cq,
    pub(crate) cq: roce_verbs::Cq,
    /// Where `poll_cq` takes completions before converting them (kept, not reallocated).
    polled: Mutex<Vec<WorkCompletion>>,
    /// QPs that complete into it: while any is left, it cannot go.
    pub(crate) users: AtomicUsize,
}

impl Cq {
    /// The CQ behind an `ibv_cq` we handed out.
    ///
    /// # Safety
    /// `cq` is NULL or came from [`create_cq`] and is not destroyed.
    pub(crate) unsafe fn from_raw<'a>(cq: *mut ibv_cq) -> Option<&'a Cq> {
        // SAFETY: `raw` is the first field of our `#[repr(C)]` Cq.
        unsafe { cq.cast::<Cq>().as_ref() }
    }
}

fn fail_null<T>(call: &str, error: &Error) -> *mut T {
    crate::log_failure(call, error);
    set_errno(crate::errno_of(error));
    core::ptr::null_mut()
}

/// `ibv_create_cq`.
pub(crate) unsafe extern "C" fn create_cq(
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    _comp_vector: c_int,
) -> *mut ibv_cq {
    // SAFETY: the caller passes an open context and NULL or a channel of ours.
    let (Some(ours), channel) = (unsafe { Context::from_raw(context) }, unsafe {
        channel.cast::<Channel>().as_ref()
    }) else {
        set_errno(EINVAL);
        return core::ptr::null_mut();
    };
    let Ok(depth) = usize::try_from(cqe) else {
        set_errno(EINVAL);
        return core::ptr::null_mut();
    };
    let made = ours
        .verbs()
        .and_then(|verbs| verbs.create_cq(depth, channel.map(|channel| &channel.channel)));
    let cq = match made {
        Ok(cq) => cq,
        Err(error) => return fail_null("ibv_create_cq", &error),
    };
    let id = cq.id();
    let raw = ibv_cq {
        context,
        channel: channel.map_or(core::ptr::null_mut(), |channel| {
            core::ptr::from_ref(&channel.raw).cast_mut()
        }),
        cq_context,
        handle: 0,
        cqe,
        mutex: [0; 5],
        cond: [0; 6],
        comp_events_completed: 0,
        async_events_completed: 0,
    };
    let ptr = Box::into_raw(Box::new(Cq {
        raw,
        cq,
        polled: Mutex::new(Vec::with_capacity(depth.min(1024))),
        users: AtomicUsize::new(0),
    }));
    if let Some(channel) = channel {
        channel.users.fetch_add(1, Ordering::AcqRel);
    }
    if let Ok(mut cqs) = ours.cqs.lock() {
        cqs.insert(id, ptr as usize);
    }
    ptr.cast()
}

/// `ibv_destroy_cq`: `EBUSY` while a QP uses it.
pub(crate) unsafe extern "C" fn destroy_cq(cq: *mut ibv_cq) -> c_int {
    // SAFETY: the caller passes a CQ of ours.
    let Some(ours) = (unsafe { Cq::from_raw(cq) }) else {
        return EINVAL;
    };
    if ours.users.load(Ordering::Acquire) > 0 {
        return EBUSY;
    }
    // SAFETY: a CQ's context outlives it.
    if let Some(context) = unsafe { Context::from_raw(ours.raw.context) } {
        if let Ok(mut cqs) = context.cqs.lock() {
            cqs.remove(&ours.cq.id());
        }
    }
    // SAFETY: a CQ's channel outlives it (it cannot be destroyed while we use it).
    if let Some(channel) = unsafe { ours.raw.channel.cast::<Channel>().as_ref() } {
        channel.users.fetch_sub(1, Ordering::AcqRel);
    }
    // SAFETY: leaked from a Box in `create_cq`; the caller gives it up.
    drop(unsafe { Box::from_raw(cq.cast::<Cq>()) });
    0
}

/// The `ibv_wc` of a completion.
fn to_wc(completion: &WorkCompletion) -> ibv_wc {
    let mut wc_flags = 0;
    let mut imm_data = 0;
    if let Some(imm) = completion.imm_data {
        wc_flags |= IBV_WC_WITH_IMM;
        // The caller reads it as `__be32`: the bytes as they were on the wire.
        imm_data = imm.to_be();
    }
    if let Some(rkey) = completion.invalidated_rkey {
        wc_flags |= IBV_WC_WITH_INV;
        imm_data = rkey;
    }
    let is_receive = matches!(
        completion.opcode,
        WcOpcode::Recv | WcOpcode::RecvRdmaWithImm
    );
    // Only UD receives name a source QP; their buffer starts with the 40-byte GRH area.
    if is_receive && completion.src_qp != 0 {
        wc_flags |= IBV_WC_GRH;
    }
    ibv_wc {
        wr_id: completion.wr_id,
        status: completion.status as u32,
        opcode: completion.opcode as u32,
        vendor_err: 0,
        byte_len: completion.byte_len,
        imm_data,
        qp_num: completion.qp_num,
        src_qp: completion.src_qp,
        wc_flags,
        pkey_index: 0,
        slid: 0,
        sl: completion.roce_packet_type(),
        dlid_path_bits: 0,
    }
}

/// `ops.poll_cq`: the number of completions written, or -1 (an overflowed CQ, a failed
/// engine).
pub(crate) unsafe extern "C" fn poll_cq(
    cq: *mut ibv_cq,
    num_entries: c_int,
    wc: *mut ibv_wc,
) -> c_int {
    // SAFETY: the caller passes a CQ of ours.
    let Some(ours) = (unsafe { Cq::from_raw(cq) }) else {
        return -1;
    };
    let Ok(max) = usize::try_from(num_entries) else {
        return -1;
    };
    if max == 0 {
        return 0;
    }
    if wc.is_null() {
        return -1;
    }
    let Ok(mut polled) = ours.polled.lock() else {
        return -1;
    };
    polled.clear();
    if let Err(error) = ours.cq.poll_into(max, &mut polled) {
        crate::log_failure("ibv_poll_cq", &error);
        return -1;
    }
    for (index, completion) in polled.iter().enumerate() {
        // SAFETY: the caller passes room for `num_entries` completions; we took at most
        // that many.
        unsafe { wc.add(index).write(to_wc(completion)) };
    }
    polled.len() as c_int
}

/// `ops.req_notify_cq`.
pub(crate) unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    // SAFETY: the caller passes a CQ of ours.
    let Some(ours) = (unsafe { Cq::from_raw(cq) }) else {
        return EINVAL;
    };
    match ours.cq.req_notify(solicited_only != 0) {
        Ok(()) => 0,
        Err(error) => {
            crate::log_failure("ibv_req_notify_cq", &error);
            crate::errno_of(&error)
        }
    }
}

/// `ibv_get_cq_event`: waits for an event of the channel (or, non-blocking, fails with
/// `EAGAIN`) and says which CQ it is for.
pub(crate) unsafe extern "C" fn get_cq_event(
    channel: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    // SAFETY: the caller passes a channel of ours.
    let Some(ours) = (unsafe { channel.cast::<Channel>().as_ref() }) else {
        set_errno(EINVAL);
        return -1;
    };
    let Ok(_one_waiter) = ours.waiting.lock() else {
        set_errno(EINVAL);
        return -1;
    };
    let timeout = if ours.caller_drives {
        None
    } else {
        if !is_nonblocking(ours.channel.as_fd()) {
            wait_readable(&ours.channel);
        }
        Some(Duration::ZERO)
    };
    let id = match ours.channel.get_cq_event(timeout) {
        Ok(id) => id,
        Err(Error::TimedOut) => {
            set_errno(EAGAIN);
            return -1;
        }
        Err(error) => {
            crate::log_failure("ibv_get_cq_event", &error);
            set_errno(crate::errno_of(&error));
            return -1;
        }
    };
    // SAFETY: a channel's context outlives it.
    let context = unsafe { Context::from_raw(ours.raw.context) };
    let found = context
        .and_then(|context| context.cqs.lock().ok()?.get(&id).copied())
        .map(|address| address as *mut Cq);
    // The CQ was destroyed after it signalled: nothing to report it on.
    let Some(found) = found else {
        set_errno(EAGAIN);
        return -1;
    };
    if cq.is_null() || cq_context.is_null() {
        set_errno(EINVAL);
        return -1;
    }
    // SAFETY: `found` is a live CQ of ours (in the map until destroyed); the caller passes
    // writable pointers.
    unsafe {
        *cq = found.cast();
        *cq_context = (*found).raw.cq_context;
    }
    0
}

/// Blocks until the channel's fd polls readable (an event waits).
fn wait_readable(channel: &CompChannel) {
    let slice = Timespec::try_from(Duration::from_millis(100)).ok();
    loop {
        let mut fds = [PollFd::new(channel, PollFlags::IN)];
        if poll(&mut fds, slice.as_ref()).is_ok() && fds[0].revents().contains(PollFlags::IN) {
            return;
        }
    }
}

/// `ibv_ack_cq_events`.
pub(crate) unsafe extern "C" fn ack_cq_events(cq: *mut ibv_cq, count: u32) {
    // SAFETY: the caller passes a CQ of ours, whose counter only the application's
    // acknowledging thread writes, as in rdma-core (there under its mutex).
    if let Some(cq) = unsafe { cq.as_mut() } {
        cq.comp_events_completed = cq.comp_events_completed.wrapping_add(count);
    }
}

//! Completion channels and completion queues, plain and extended (`ibv_cq_ex`).

use core::ffi::{c_int, c_void};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use roce_cabi::{set_errno, EOPNOTSUPP};
use roce_verbs::{CompChannel, Error, TmInfo, WcOpcode, WorkCompletion};
use std::time::Duration;

use rustix::fs::{fcntl_setfl, OFlags};

use crate::abi::*;
use crate::context::{is_nonblocking, Context};
use crate::pd::{Pd, Placement, RES_TYPE_CQ};

const EINVAL: c_int = 22;
const EBUSY: c_int = 16;
const EAGAIN: c_int = 11;
const ENOENT: c_int = 2;

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

/// Our `ibv_cq`, inside an `ibv_cq_ex` whatever call made it (as rdma-core's `verbs_cq`):
/// `ops.poll_cq` polls both, and an extended CQ's `start_poll`, `next_poll`, `end_poll` and
/// `read_*` poll it one completion at a time through the same Rust CQ.
#[repr(C)]
pub(crate) struct Cq {
    pub(crate) raw: ibv_cq_ex,
    pub(crate) cq: roce_verbs::Cq,
    /// QPs that complete into it: while any is left, it cannot go.
    pub(crate) users: AtomicUsize,
    /// The completion `start_poll`/`next_poll` took last, which the `read_*` report.
    current: Mutex<Current>,
    /// Held from a successful `start_poll` to `end_poll` (or the `next_poll` that finds
    /// nothing), as providers hold their CQ lock, unless the CQ is single-threaded.
    polling: AtomicBool,
    single_threaded: bool,
    /// Which timestamps to take.
    stamps: u64,
    /// The parent domain it was made with, or NULL.
    domain: *mut ibv_pd,
    /// Where its memory came from (the parent domain's allocator, or the heap).
    placement: Placement,
}

/// The completion being read through an `ibv_cq_ex`, and when it was taken.
#[derive(Clone, Copy)]
struct Current {
    wc: ibv_wc,
    /// `read_completion_ts`: the device clock (nanoseconds of `CLOCK_MONOTONIC`; see
    /// [`HCA_CORE_CLOCK_KHZ`]).
    ts: u64,
    /// `read_completion_wallclock_ns`: nanoseconds of `CLOCK_REALTIME`.
    wallclock: u64,
    /// `read_tm_info`: a tag-matching completion's tag and `app_ctx`.
    tm: TmInfo,
}

/// The device clock's frequency in kHz (`hca_core_clock`): its ticks are the nanoseconds of
/// `CLOCK_MONOTONIC`, which `ibv_query_rt_values_ex` reads too.
pub(crate) const HCA_CORE_CLOCK_KHZ: u64 = 1_000_000;

/// The nanoseconds of a clock now.
fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we pass; the clocks asked for always exist.
    unsafe { libc::clock_gettime(clock, &mut now) };
    (now.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(now.tv_nsec as u64)
}

/// The device clock now (`CLOCK_MONOTONIC`, in nanoseconds).
pub(crate) fn hca_clock_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

impl Cq {
    /// The CQ behind an `ibv_cq` (or `ibv_cq_ex`) we handed out.
    ///
    /// # Safety
    /// `cq` is NULL or came from [`create_cq`] or [`create_cq_ex`] and is not destroyed.
    pub(crate) unsafe fn from_raw<'a>(cq: *mut ibv_cq) -> Option<&'a Cq> {
        // SAFETY: `raw`, which begins with the `ibv_cq`, is the first field of our
        // `#[repr(C)]` Cq.
        unsafe { cq.cast::<Cq>().as_ref() }
    }

    /// The CQ behind an `ibv_cq_ex` we handed out.
    ///
    /// # Safety
    /// As [`from_raw`](Self::from_raw).
    unsafe fn from_ex<'a>(cq: *mut ibv_cq_ex) -> Option<&'a Cq> {
        // SAFETY: as `from_raw`.
        unsafe { cq.cast::<Cq>().as_ref() }
    }
}

fn fail_null<T>(call: &str, error: &Error) -> *mut T {
    crate::logging::fail_null(call, crate::errno_of(error), error)
}

/// `ibv_create_cq`.
pub(crate) unsafe extern "C" fn create_cq(
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    let (Ok(cqe), Ok(comp_vector)) = (u32::try_from(cqe), u32::try_from(comp_vector)) else {
        return crate::logging::fail_null("ibv_create_cq", EINVAL, &"negative cqe or vector");
    };
    let mut attr = ibv_cq_init_attr_ex {
        cqe,
        cq_context,
        channel,
        comp_vector,
        wc_flags: wc_ex::STANDARD,
        comp_mask: 0,
        flags: 0,
        parent_domain: core::ptr::null_mut(),
    };
    // SAFETY: the caller passes an open context and NULL or a channel of ours.
    unsafe { create(context, &mut attr, "ibv_create_cq") }.cast()
}

/// The `wc_flags` an extended CQ may ask for: the standard fields, both timestamps and tag
/// matching's (the VLAN and flow tag fields have no meaning here).
const SUPPORTED_WC_FLAGS: u64 = wc_ex::STANDARD
    | wc_ex::COMPLETION_TIMESTAMP
    | wc_ex::COMPLETION_TIMESTAMP_WALLCLOCK
    | wc_ex::TM_INFO;

/// `verbs_context.create_cq_ex` (the inline `ibv_create_cq_ex`). Errors as rdma-core's with
/// rxe: `wc_flags` we cannot fill, an unknown `comp_mask` and `IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN`
/// are `EOPNOTSUPP`; a bad size, vector, channel or parent domain `EINVAL`.
pub(crate) unsafe extern "C" fn create_cq_ex(
    context: *mut ibv_context,
    attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex {
    const CALL: &str = "ibv_create_cq_ex";
    // SAFETY: the caller passes its attributes.
    let Some(attr) = (unsafe { attr.as_mut() }) else {
        return crate::logging::fail_null(CALL, EINVAL, &"NULL attributes");
    };
    if attr.wc_flags & !SUPPORTED_WC_FLAGS != 0 {
        let why = format!("wc_flags {:#x}", attr.wc_flags & !SUPPORTED_WC_FLAGS);
        return crate::logging::fail_null(CALL, EOPNOTSUPP, &why);
    }
    if attr.comp_mask & !(IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD) != 0 {
        return crate::logging::fail_null(CALL, EOPNOTSUPP, &"unknown comp_mask bits");
    }
    if attr.comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS != 0
        && attr.flags & !IBV_CREATE_CQ_ATTR_SINGLE_THREADED != 0
    {
        // rxe refuses every flag it is given; the single-threaded one stays in libibverbs.
        let why = format!("flags {:#x} (overrun is always an error here)", attr.flags);
        return crate::logging::fail_null(CALL, EOPNOTSUPP, &why);
    }
    // SAFETY: the caller passes an open context, NULL or a channel of ours, and a parent
    // domain of ours when the mask says so.
    unsafe { create(context, attr, CALL) }
}

/// Creates a CQ as `attr` says (checked by the caller for what only the extended call has).
///
/// # Safety
/// `context` is NULL or open; the channel is NULL or ours; the parent domain, when
/// `comp_mask` names one, is NULL or ours.
unsafe fn create(
    context: *mut ibv_context,
    attr: &mut ibv_cq_init_attr_ex,
    call: &str,
) -> *mut ibv_cq_ex {
    // SAFETY: per this function's contract.
    let (Some(ours), channel) = (unsafe { Context::from_raw(context) }, unsafe {
        attr.channel.cast::<Channel>().as_ref()
    }) else {
        return crate::logging::fail_null(call, EINVAL, &"NULL context");
    };
    if channel.is_some_and(|channel| channel.raw.context != context) {
        return crate::logging::fail_null(call, EINVAL, &"a channel of another context");
    }
    // As the kernel's `create_cq`: the vector must be one the context has.
    if attr.comp_vector >= ours.raw.context.num_comp_vectors as u32 {
        let why = format!("comp_vector {}", attr.comp_vector);
        return crate::logging::fail_null(call, EINVAL, &why);
    }
    let domain = if attr.comp_mask & IBV_CQ_INIT_ATTR_MASK_PD != 0 {
        // SAFETY: per this function's contract.
        match unsafe { Pd::from_raw(attr.parent_domain) } {
            Some(domain) if domain.is_parent_domain() && domain.raw.context == context => {
                Some(domain)
            }
            _ => return crate::logging::fail_null(call, EINVAL, &"not a parent domain"),
        }
    } else {
        None
    };
    let (Ok(depth), Ok(cqe)) = (usize::try_from(attr.cqe), c_int::try_from(attr.cqe)) else {
        return crate::logging::fail_null(call, EINVAL, &"cqe beyond max_cqe");
    };
    let made = ours
        .verbs()
        .and_then(|verbs| verbs.create_cq(depth, channel.map(|channel| &channel.channel)));
    let cq = match made {
        Ok(cq) => cq,
        Err(error) => return fail_null(call, &error),
    };
    let id = cq.id();
    let single_threaded = domain.is_some_and(Pd::single_threaded)
        || attr.comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS != 0
            && attr.flags & IBV_CREATE_CQ_ATTR_SINGLE_THREADED != 0;
    let ours_cq = Cq {
        raw: raw_cq_ex(context, channel, attr, cqe),
        cq,
        users: AtomicUsize::new(0),
        current: Mutex::new(Current {
            wc: ibv_wc::default(),
            ts: 0,
            wallclock: 0,
            tm: TmInfo::NONE,
        }),
        polling: AtomicBool::new(false),
        single_threaded,
        stamps: attr.wc_flags
            & (wc_ex::COMPLETION_TIMESTAMP | wc_ex::COMPLETION_TIMESTAMP_WALLCLOCK),
        domain: domain.map_or(core::ptr::null_mut(), |_| attr.parent_domain),
        placement: Placement::Heap,
    };
    let ptr = match Placement::place(domain, RES_TYPE_CQ, ours_cq) {
        Ok((ptr, placement)) => {
            // SAFETY: just placed, not yet handed out.
            unsafe { (*ptr).placement = placement };
            ptr
        }
        Err(errno) => {
            return crate::logging::fail_null(call, errno, &"the parent domain's allocator")
        }
    };
    if let Some(channel) = channel {
        channel.users.fetch_add(1, Ordering::AcqRel);
    }
    if let Some(domain) = domain {
        domain.users.fetch_add(1, Ordering::AcqRel);
    }
    if let Ok(mut cqs) = ours.cqs.lock() {
        cqs.insert(id, ptr as usize);
    }
    ptr.cast()
}

/// The `ibv_cq_ex` of a new CQ: the readers of the fields `attr.wc_flags` asks for, as rxe
/// sets them (calling another is the caller's error, as with every provider).
fn raw_cq_ex(
    context: *mut ibv_context,
    channel: Option<&Channel>,
    attr: &ibv_cq_init_attr_ex,
    cqe: c_int,
) -> ibv_cq_ex {
    let asked = |flag: u64| attr.wc_flags & flag != 0;
    ibv_cq_ex {
        context,
        channel: channel.map_or(core::ptr::null_mut(), |channel| {
            core::ptr::from_ref(&channel.raw).cast_mut()
        }),
        cq_context: attr.cq_context,
        handle: 0,
        cqe,
        mutex: [0; 5],
        cond: [0; 6],
        comp_events_completed: 0,
        async_events_completed: 0,
        comp_mask: 0,
        status: 0,
        wr_id: 0,
        start_poll: Some(start_poll),
        next_poll: Some(next_poll),
        end_poll: Some(end_poll),
        read_opcode: Some(read_opcode),
        read_vendor_err: Some(read_vendor_err),
        read_byte_len: asked(wc_ex::BYTE_LEN).then_some(read_byte_len as ReadU32),
        read_imm_data: asked(wc_ex::IMM).then_some(read_imm_data as ReadU32),
        read_qp_num: asked(wc_ex::QP_NUM).then_some(read_qp_num as ReadU32),
        read_src_qp: asked(wc_ex::SRC_QP).then_some(read_src_qp as ReadU32),
        read_wc_flags: Some(read_wc_flags),
        read_slid: asked(wc_ex::SLID).then_some(read_slid as ReadU32),
        read_sl: asked(wc_ex::SL).then_some(read_sl as ReadU8),
        read_dlid_path_bits: asked(wc_ex::DLID_PATH_BITS).then_some(read_dlid_path_bits as ReadU8),
        read_completion_ts: asked(wc_ex::COMPLETION_TIMESTAMP)
            .then_some(read_completion_ts as ReadU64),
        read_cvlan: 0,
        read_flow_tag: 0,
        read_tm_info: asked(wc_ex::TM_INFO).then_some(read_tm_info as ReadTmInfo),
        read_completion_wallclock_ns: asked(wc_ex::COMPLETION_TIMESTAMP_WALLCLOCK)
            .then_some(read_completion_wallclock_ns as ReadU64),
    }
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
    // SAFETY: the parent domain it was made with outlives it (it cannot go meanwhile).
    if let Some(domain) = unsafe { Pd::from_raw(ours.domain) } {
        domain.users.fetch_sub(1, Ordering::AcqRel);
    }
    let placement = ours.placement;
    // SAFETY: placed by `create`; the caller gives it up.
    unsafe { placement.release(cq.cast::<Cq>()) };
    0
}

/// `ibv_resize_cq`: 0 or an errno (`EINVAL` for a size beyond `max_cqe` or below the
/// completions that wait).
pub(crate) unsafe extern "C" fn resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
    // SAFETY: the caller passes a CQ of ours, whose `cqe` only it and we write.
    let Some(ours) = (unsafe { cq.cast::<Cq>().as_mut() }) else {
        return EINVAL;
    };
    let Ok(depth) = usize::try_from(cqe) else {
        return EINVAL;
    };
    match ours.cq.resize(depth) {
        Ok(()) => {
            ours.raw.cqe = cqe;
            0
        }
        Err(error) => {
            crate::log_failure("ibv_resize_cq", &error);
            crate::errno_of(&error)
        }
    }
}

/// The `wc_flags` of a completion.
fn wc_flags(completion: &WorkCompletion) -> u32 {
    let mut wc_flags = 0;
    if completion.imm_data.is_some() {
        wc_flags |= IBV_WC_WITH_IMM;
    }
    if completion.invalidated_rkey.is_some() {
        wc_flags |= IBV_WC_WITH_INV;
    }
    let is_receive = matches!(
        completion.opcode,
        WcOpcode::Recv | WcOpcode::RecvRdmaWithImm
    );
    // Only UD receives name a source QP; their buffer starts with the 40-byte GRH area.
    if is_receive && completion.src_qp != 0 {
        wc_flags |= IBV_WC_GRH;
    }
    // Tag matching's bits have verbs.h's values (the layout probe checks).
    wc_flags | u32::from(completion.tm.flags.bits())
}

/// The `ibv_wc` of a completion.
fn to_wc(completion: &WorkCompletion) -> ibv_wc {
    // The caller reads immediate data as `__be32`: the bytes as they were on the wire.
    let imm_data = match (completion.imm_data, completion.invalidated_rkey) {
        (_, Some(rkey)) => rkey,
        (Some(imm), None) => imm.to_be(),
        (None, None) => 0,
    };
    ibv_wc {
        wr_id: completion.wr_id,
        status: completion.status as u32,
        opcode: completion.opcode as u32,
        vendor_err: 0,
        byte_len: completion.byte_len,
        imm_data,
        qp_num: completion.qp_num,
        src_qp: completion.src_qp,
        wc_flags: wc_flags(completion),
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
    // Each completion goes from the CQ's ring straight into the caller's array.
    let mut index = 0;
    let polled = ours.cq.poll_with(max, |completion| {
        // SAFETY: the caller passes room for `num_entries` completions; we are handed at
        // most that many.
        unsafe { wc.add(index).write(to_wc(completion)) };
        index += 1;
    });
    match polled {
        Ok(count) => count as c_int,
        Err(error) => {
            crate::log_failure("ibv_poll_cq", &error);
            -1
        }
    }
}

impl Cq {
    /// Takes the next completion into `current` and the `status`/`wr_id` the caller reads:
    /// 0, `ENOENT` when none waits, or the errno of a CQ that can no longer be polled.
    fn take_next(&self, raw: *mut ibv_cq_ex) -> c_int {
        let mut taken = None;
        match self.cq.poll_with(1, |completion| {
            taken = Some((to_wc(completion), completion.tm))
        }) {
            Ok(_) => {}
            Err(error) => {
                crate::log_failure("ibv_start_poll", &error);
                return crate::errno_of(&error);
            }
        }
        let Some((wc, tm)) = taken else {
            return ENOENT;
        };
        let ts = if self.stamps & wc_ex::COMPLETION_TIMESTAMP != 0 {
            hca_clock_ns()
        } else {
            0
        };
        let wallclock = if self.stamps & wc_ex::COMPLETION_TIMESTAMP_WALLCLOCK != 0 {
            clock_ns(libc::CLOCK_REALTIME)
        } else {
            0
        };
        if let Ok(mut current) = self.current.lock() {
            *current = Current {
                wc,
                ts,
                wallclock,
                tm,
            };
        }
        // SAFETY: `raw` is this CQ's own `ibv_cq_ex`, whose `status` and `wr_id` the poller
        // reads after this call returns (the poll lock, or the caller's single thread,
        // keeps others out meanwhile).
        unsafe {
            (*raw).status = wc.status;
            (*raw).wr_id = wc.wr_id;
        }
        0
    }

    fn lock_polling(&self) {
        if self.single_threaded {
            return;
        }
        while self
            .polling
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            std::thread::yield_now();
        }
    }

    fn unlock_polling(&self) {
        if !self.single_threaded {
            self.polling.store(false, Ordering::Release);
        }
    }

    fn current(&self) -> Current {
        self.current.lock().map_or(
            Current {
                wc: ibv_wc::default(),
                ts: 0,
                wallclock: 0,
                tm: TmInfo::NONE,
            },
            |current| *current,
        )
    }
}

/// `ibv_cq_ex.start_poll`: takes the first completion (0), or finds none (`ENOENT`, and
/// then `end_poll` must not follow, though it is harmless here).
unsafe extern "C" fn start_poll(cq: *mut ibv_cq_ex, attr: *mut ibv_poll_cq_attr) -> c_int {
    // SAFETY: the caller passes an extended CQ of ours and NULL or its attributes.
    let (Some(ours), attr) = (unsafe { Cq::from_ex(cq) }, unsafe { attr.as_ref() }) else {
        return EINVAL;
    };
    if attr.is_some_and(|attr| attr.comp_mask != 0) {
        return EINVAL;
    }
    ours.lock_polling();
    let taken = ours.take_next(cq);
    if taken != 0 {
        ours.unlock_polling();
    }
    taken
}

/// `ibv_cq_ex.next_poll`: takes the next completion (0), or finds none (`ENOENT`).
unsafe extern "C" fn next_poll(cq: *mut ibv_cq_ex) -> c_int {
    // SAFETY: the caller passes an extended CQ of ours.
    let Some(ours) = (unsafe { Cq::from_ex(cq) }) else {
        return EINVAL;
    };
    ours.take_next(cq)
}

/// `ibv_cq_ex.end_poll`: the completions taken are consumed.
unsafe extern "C" fn end_poll(cq: *mut ibv_cq_ex) {
    // SAFETY: the caller passes an extended CQ of ours.
    if let Some(ours) = unsafe { Cq::from_ex(cq) } {
        ours.unlock_polling();
    }
}

/// The completion an `ibv_cq_ex` we handed out is reading.
///
/// # Safety
/// `cq` is an extended CQ of ours.
unsafe fn current(cq: *mut ibv_cq_ex) -> Current {
    // SAFETY: per this function's contract.
    match unsafe { Cq::from_ex(cq) } {
        Some(ours) => ours.current(),
        None => Current {
            wc: ibv_wc::default(),
            ts: 0,
            wallclock: 0,
            tm: TmInfo::NONE,
        },
    }
}

unsafe extern "C" fn read_opcode(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: the caller passes an extended CQ of ours.
    unsafe { current(cq) }.wc.opcode
}

unsafe extern "C" fn read_vendor_err(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: the caller passes an extended CQ of ours.
    unsafe { current(cq) }.wc.vendor_err
}

unsafe extern "C" fn read_byte_len(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: the caller passes an extended CQ of ours.
    unsafe { current(cq) }.wc.byte_len
}

/// Immediate data (big-endian, as on the wire) or the invalidated R_Key.
unsafe extern "C" fn read_imm_data(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: the caller passes an extended CQ of ours.
    unsafe { current(cq) }.wc.imm_data
}

unsafe extern "C" fn read_qp_num(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: the caller passes an extended CQ of ours.
    unsafe { current(cq) }.wc.qp_num
}

unsafe extern "C" fn read_src_qp(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: the caller passes an extended CQ of ours.
    unsafe { current(cq) }.wc.src_qp
}

unsafe extern "C" fn read_wc_flags(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: the caller passes an extended CQ of ours.
    unsafe { current(cq) }.wc.wc_flags
}

/// No LIDs on RoCE: 0, as rxe.
unsafe extern "C" fn read_slid(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: the caller passes an extended CQ of ours.
    u32::from(unsafe { current(cq) }.wc.slid)
}

unsafe extern "C" fn read_sl(cq: *mut ibv_cq_ex) -> u8 {
    // SAFETY: the caller passes an extended CQ of ours.
    unsafe { current(cq) }.wc.sl
}

unsafe extern "C" fn read_dlid_path_bits(cq: *mut ibv_cq_ex) -> u8 {
    // SAFETY: the caller passes an extended CQ of ours.
    unsafe { current(cq) }.wc.dlid_path_bits
}

/// When the completion was taken from the device's queue, in device clock ticks.
unsafe extern "C" fn read_completion_ts(cq: *mut ibv_cq_ex) -> u64 {
    // SAFETY: the caller passes an extended CQ of ours.
    unsafe { current(cq) }.ts
}

/// When the completion was taken from the device's queue, in nanoseconds of real time.
unsafe extern "C" fn read_completion_wallclock_ns(cq: *mut ibv_cq_ex) -> u64 {
    // SAFETY: the caller passes an extended CQ of ours.
    unsafe { current(cq) }.wallclock
}

/// `ibv_wc_read_tm_info`: the tag and `app_ctx` of the TMH a tag-matching completion
/// matched (`IBV_WC_TM_MATCH`); zeroes otherwise, as mlx5 scatters the TMH into the CQE on a
/// match only.
unsafe extern "C" fn read_tm_info(cq: *mut ibv_cq_ex, tm_info: *mut ibv_wc_tm_info) {
    // SAFETY: the caller passes an extended CQ of ours.
    let tm = unsafe { current(cq) }.tm;
    // SAFETY: the caller passes a writable `struct ibv_wc_tm_info` (or NULL).
    if let Some(out) = unsafe { tm_info.as_mut() } {
        *out = ibv_wc_tm_info {
            tag: tm.tag,
            priv_: tm.app_ctx,
        };
    }
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
            if let Err(errno) = wait_readable(&ours.channel) {
                set_errno(errno.raw_os_error());
                return -1;
            }
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

/// Blocks until the channel has an event, as rdma-core's read(2) of the channel's fd does:
/// a signal whose handler was installed without `SA_RESTART` ends the wait with `EINTR`
/// (qperf ends each test so, from an interval timer), one with `SA_RESTART` restarts it,
/// the kernel deciding. The read takes the eventfd's count, which goes straight back: the
/// events stay for `get_cq_event` (the only taker, and it holds the channel's one waiter).
fn wait_readable(channel: &CompChannel) -> Result<(), rustix::io::Errno> {
    let mut count = [0u8; 8];
    rustix::io::read(channel, &mut count)?;
    rustix::io::write(channel, &count)?;
    Ok(())
}

/// `ibv_ack_cq_events`.
pub(crate) unsafe extern "C" fn ack_cq_events(cq: *mut ibv_cq, count: u32) {
    // SAFETY: the caller passes a CQ of ours, whose counter only the application's
    // acknowledging thread writes, as in rdma-core (there under its mutex).
    if let Some(cq) = unsafe { cq.as_mut() } {
        cq.comp_events_completed = cq.comp_events_completed.wrapping_add(count);
    }
}

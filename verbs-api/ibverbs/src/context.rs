//! An opened device (`ibv_open_device`): one `roce-verbs` context per call (the contexts of
//! one device share its engine); the device, port and GID queries; async events.

use core::ffi::c_int;
use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use roce_cabi::set_errno;
use roce_verbs::{
    AsyncEvent, BackendChoice, CmTiming, FrameLoss, OpenOptions, PortState, Progress, XdpMode,
};
use rustix::event::{eventfd, EventfdFlags};
use rustix::fs::{fcntl_getfl, OFlags};

use crate::abi::*;
use crate::device::DeviceSlot;

const EINVAL: c_int = 22;
const EAGAIN: c_int = 11;
const ENODATA: c_int = 61;

/// Our `verbs_context` (whose last field is the `ibv_context` callers hold) and what
/// stands behind it.
#[repr(C)]
pub(crate) struct Context {
    pub(crate) raw: verbs_context,
    device: roce_verbs::Device,
    /// Started by the first call that needs it, so programs that only query
    /// (`ibv_devinfo`) never touch the interface.
    engine: OnceLock<roce_verbs::Context>,
    starting: Mutex<()>,
    /// Each CQ of this context by id, as `ibv_get_cq_event` must name it (a `cq::Cq`).
    pub(crate) cqs: Mutex<HashMap<roce_verbs::CqId, usize>>,
    /// Each QP by number, as async events name it (a `qp::Qp`).
    pub(crate) qps: Mutex<HashMap<u32, usize>>,
    /// Each SRQ by id, as its limit event names it (a `srq::Srq`).
    pub(crate) srqs: Mutex<HashMap<roce_verbs::SrqId, usize>>,
    /// `ibv_context.async_fd`: an eventfd, blocking until the caller makes it
    /// `O_NONBLOCK` (as rdma-core's), that the engine signals while async events wait.
    async_fd: OwnedFd,
    /// `ibv_context.cmd_fd`: what `ibv_import_device` takes (see `handles`); closed with
    /// the context.
    _cmd_fd: OwnedFd,
}

impl Context {
    /// The context behind an `ibv_context` we handed out.
    ///
    /// # Safety
    /// `context` is NULL or came from [`open_device`] and is not closed.
    pub(crate) unsafe fn from_raw<'a>(context: *mut ibv_context) -> Option<&'a Context> {
        if context.is_null() {
            return None;
        }
        let at = core::mem::offset_of!(verbs_context, context);
        // SAFETY: `context` is the `context` field of the `verbs_context` that starts our
        // `#[repr(C)]` Context.
        unsafe { context.byte_sub(at).cast::<Context>().as_ref() }
    }

    pub(crate) fn device(&self) -> &roce_verbs::Device {
        &self.device
    }

    /// Whether the caller's own calls drive the engine (`ROCE_PROGRESS=caller`).
    pub(crate) fn caller_drives(&self) -> bool {
        matches!(
            open_options().map(|options| options.progress),
            Ok(Progress::Caller)
        )
    }

    /// The `roce-verbs` context, if a call has started it.
    pub(crate) fn started(&self) -> Option<&roce_verbs::Context> {
        self.engine.get()
    }

    /// The `roce-verbs` context, started on first use (the device's engine, shared with its
    /// other contexts).
    pub(crate) fn verbs(&self) -> Result<&roce_verbs::Context, roce_verbs::Error> {
        if let Some(engine) = self.engine.get() {
            return Ok(engine);
        }
        let _one_at_a_time = self
            .starting
            .lock()
            .map_err(|_| roce_verbs::Error::Poisoned)?;
        if let Some(engine) = self.engine.get() {
            return Ok(engine);
        }
        let mut options = open_options().map_err(|why| {
            roce_verbs::Error::Io(std::io::Error::new(std::io::ErrorKind::InvalidInput, why))
        })?;
        // The engine signals the fd the caller already holds as `async_fd`.
        options.async_fd = Some(self.async_fd.try_clone()?);
        let engine = roce_verbs::Context::open(&self.device, options)?;
        Ok(self.engine.get_or_init(|| engine))
    }
}

/// `ROCE_LOSS`'s seed unless `ROCE_LOSS_SEED` says: fixed, so that a run can be repeated.
const DEFAULT_LOSS_SEED: u64 = 1;

/// `ibv_context.num_comp_vectors`: one per possible CPU, as rxe has (UCX asks for the vector
/// of the CPU it prefers). Vectors only spread interrupts, which we have none of: a CQ's
/// events go to its channel whatever vector it names.
pub(crate) fn comp_vectors() -> c_int {
    static VECTORS: OnceLock<c_int> = OnceLock::new();
    *VECTORS.get_or_init(|| {
        // "0-3" or "0,2-5": the kernel's list of possible CPUs.
        let possible = std::fs::read_to_string("/sys/devices/system/cpu/possible")
            .ok()
            .and_then(|list| {
                list.trim().split(',').try_fold(0, |count, range| {
                    let (first, last) = range.split_once('-').unwrap_or((range, range));
                    let span = last.parse::<c_int>().ok()? - first.parse::<c_int>().ok()?;
                    Some(count + span + 1)
                })
            });
        let online = || std::thread::available_parallelism().map_or(1, |n| n.get() as c_int);
        possible.filter(|&count| count > 0).unwrap_or_else(online)
    })
}

/// The options of a context, from the environment `roce exec` passes on.
fn open_options() -> Result<OpenOptions, String> {
    let backend = match std::env::var("ROCE_BACKEND").as_deref() {
        Err(_) | Ok("auto") => BackendChoice::Auto,
        Ok("native") => BackendChoice::AfXdp(XdpMode::Native),
        Ok("generic") => BackendChoice::AfXdp(XdpMode::Generic),
        Ok("udp") => BackendChoice::Udp,
        Ok(other) => {
            return Err(format!(
                "ROCE_BACKEND={other}: expected auto, native, generic or udp"
            ))
        }
    };
    let progress = match std::env::var("ROCE_PROGRESS").as_deref() {
        Err(_) | Ok("events") => Progress::Events,
        Ok("busy") => Progress::BusyPoll,
        // No thread: polling a CQ and waiting for a CQ event drive the engine. Only for
        // programs that always do one of those (not for those that spin on memory).
        Ok("caller") => Progress::Caller,
        Ok(other) => {
            return Err(format!(
                "ROCE_PROGRESS={other}: expected events, busy or caller"
            ))
        }
    };
    let defaults = OpenOptions::default();
    // How long the engine thread polls after its last work before it sleeps.
    let spin = match std::env::var("ROCE_SPIN_US") {
        Err(_) => defaults.spin,
        Ok(micros) => micros
            .parse()
            .map(Duration::from_micros)
            .map_err(|_| format!("ROCE_SPIN_US={micros}: expected microseconds"))?,
    };
    // The CM's response time exponent and retries (the kernel's unless set).
    let cm_env = |name: &str, default: u8, max: u8| match std::env::var(name) {
        Err(_) => Ok(default),
        Ok(value) => value
            .parse()
            .ok()
            .filter(|&n| n <= max)
            .ok_or(format!("{name}={value}: expected 0 to {max}")),
    };
    let cm_timing = CmTiming {
        response_timeout: cm_env(
            "ROCE_CM_RESPONSE_TIMEOUT",
            defaults.cm_timing.response_timeout,
            31,
        )?,
        max_retries: cm_env("ROCE_CM_RETRIES", defaults.cm_timing.max_retries, 15)?,
    };
    // Frames we send that are dropped on purpose (tests of retries and retransmissions).
    let loss = match std::env::var("ROCE_LOSS") {
        Err(_) => None,
        Ok(percent) => {
            let percent: f64 = percent
                .parse()
                .ok()
                .filter(|percent| (0.0..=100.0).contains(percent))
                .ok_or(format!(
                    "ROCE_LOSS={percent}: expected a percentage, 0 to 100"
                ))?;
            let seed = match std::env::var("ROCE_LOSS_SEED") {
                Err(_) => DEFAULT_LOSS_SEED,
                Ok(seed) => seed
                    .parse()
                    .map_err(|_| format!("ROCE_LOSS_SEED={seed}: expected 0 to 2^64 - 1"))?,
            };
            Some(FrameLoss {
                probability: percent / 100.0,
                seed,
            })
        }
    };
    // DCQCN's reaction point (on by default, as mlx5's): `ROCE_DCQCN=0` ignores CNPs, to
    // compare a congested network with and without it.
    let mut congestion = defaults.congestion;
    congestion.rp = match std::env::var("ROCE_DCQCN").as_deref() {
        Err(_) | Ok("1" | "on") => true,
        Ok("0" | "off") => false,
        Ok(other) => return Err(format!("ROCE_DCQCN={other}: expected 0 or 1")),
    };
    // DCQCN's knobs by mlx5's names, as `roce sim --dcqcn-param`: `rp_max_rate=1000,...`.
    if let Ok(knobs) = std::env::var("ROCE_DCQCN_PARAMS") {
        for knob in knobs.split(',').filter(|knob| !knob.is_empty()) {
            let (name, value) = knob
                .split_once('=')
                .and_then(|(name, value)| Some((name, value.parse().ok()?)))
                .ok_or(format!("ROCE_DCQCN_PARAMS: {knob:?} is not NAME=NUMBER"))?;
            congestion
                .dcqcn
                .set(name, value)
                .map_err(|why| format!("ROCE_DCQCN_PARAMS: {why}"))?;
        }
    }
    Ok(OpenOptions {
        backend,
        progress,
        congestion,
        spin,
        pcap: std::env::var_os("ROCE_PCAP").map(Into::into),
        loss,
        cm_timing,
        ..defaults
    })
}

/// The function tables of a context being opened, given its device and `async_fd`.
pub(crate) type Table = fn(*mut ibv_device, c_int) -> verbs_context;

/// `ibv_open_device` with the tables `table` gives (NULL and errno on failure).
///
/// # Safety
/// `device` is NULL or from the device list.
pub(crate) unsafe fn open_device(device: *mut ibv_device, table: Table) -> *mut ibv_context {
    match crate::handles::new_cmd_fd(device) {
        // SAFETY: per this function's contract.
        Ok(cmd_fd) => unsafe { open_device_with(device, table, cmd_fd) },
        Err(error) => {
            crate::log_failure("ibv_open_device", &error);
            set_errno(error.raw_os_error().unwrap_or(EINVAL));
            core::ptr::null_mut()
        }
    }
}

/// [`open_device`] with `cmd_fd` as the context's (a new one, or the one
/// `ibv_import_device` was given, whose object space the context then shares).
///
/// # Safety
/// `device` is NULL or from the device list.
pub(crate) unsafe fn open_device_with(
    device: *mut ibv_device,
    table: Table,
    cmd_fd: OwnedFd,
) -> *mut ibv_context {
    // SAFETY: the caller passes a device from the list.
    let Some(slot) = (unsafe { DeviceSlot::from_raw(device) }) else {
        set_errno(EINVAL);
        return core::ptr::null_mut();
    };
    match open(slot, device, table, cmd_fd) {
        Ok(context) => context,
        Err((errno, why)) => {
            crate::log_failure("ibv_open_device", &why);
            set_errno(errno);
            core::ptr::null_mut()
        }
    }
}

fn open(
    slot: &DeviceSlot,
    device: *mut ibv_device,
    table: Table,
    cmd_fd: OwnedFd,
) -> Result<*mut ibv_context, (c_int, String)> {
    let info = slot
        .refresh()
        .map_err(|error| (error.raw_os_error().unwrap_or(19), error.to_string()))?;
    // Bad settings fail here, not at the first object.
    open_options().map_err(|why| (EINVAL, why))?;
    let async_fd = eventfd(0, EventfdFlags::CLOEXEC)
        .map_err(|error| (error.raw_os_error(), error.to_string()))?;
    let mut raw = table(device, async_fd.as_raw_fd());
    raw.context.cmd_fd = cmd_fd.as_raw_fd();
    let context = Box::new(Context {
        raw,
        device: info,
        engine: OnceLock::new(),
        starting: Mutex::new(()),
        cqs: Mutex::new(HashMap::new()),
        qps: Mutex::new(HashMap::new()),
        srqs: Mutex::new(HashMap::new()),
        async_fd,
        _cmd_fd: cmd_fd,
    });
    let context = Box::leak(context);
    Ok(core::ptr::from_mut(&mut context.raw.context))
}

/// `ibv_close_device`: stops the engine. Objects not destroyed first stay allocated.
///
/// # Safety
/// `context` is NULL or open, and the caller never uses it again.
pub(crate) unsafe fn close_device(context: *mut ibv_context) -> c_int {
    // SAFETY: the caller passes an open context and never uses it again.
    let Some(ours) = (unsafe { Context::from_raw(context) }) else {
        return EINVAL;
    };
    let ours = core::ptr::from_ref(ours).cast_mut();
    // SAFETY: it was leaked from a Box in `open`, and the caller gives it up.
    drop(unsafe { Box::from_raw(ours) });
    0
}

/// The device attributes rdma-core reports, true for this transport and shaped as rxe's
/// (vendor 0xFFFFFF, part 0: perftest then takes the plain verbs paths).
pub(crate) fn device_attr(device: &roce_verbs::Device) -> ibv_device_attr {
    let attr = device.query();
    let limits = attr.limits;
    let clamp = |value: u64| value.min(i32::MAX as u64) as c_int;
    let rd_atom = c_int::from(limits.max_qp_rd_atom);
    ibv_device_attr {
        fw_ver: [0; 64],
        node_guid: attr.node_guid.to_be(),
        sys_image_guid: attr.node_guid.to_be(),
        max_mr_size: limits.max_mr_size,
        page_size_cap: 0xFFFF_F000,
        vendor_id: 0xFF_FFFF,
        vendor_part_id: 0,
        hw_ver: 0,
        max_qp: clamp(limits.max_qp.into()),
        max_qp_wr: clamp(limits.max_qp_wr.into()),
        device_cap_flags: DEVICE_CAP_FLAGS,
        max_sge: clamp(limits.max_sge.into()),
        max_sge_rd: clamp(limits.max_sge.into()),
        max_cq: 1 << 16,
        max_cqe: clamp(limits.max_cqe.into()),
        max_mr: 1 << 18,
        max_pd: 1 << 16,
        max_qp_rd_atom: rd_atom,
        max_ee_rd_atom: 0,
        max_res_rd_atom: rd_atom.saturating_mul(1 << 10),
        max_qp_init_rd_atom: rd_atom,
        max_ee_init_rd_atom: 0,
        // IBV_ATOMIC_HCA: atomics are atomic among this device's users.
        atomic_cap: 1,
        max_ee: 0,
        max_rdd: 0,
        max_mw: clamp(limits.max_mw.into()),
        max_raw_ipv6_qp: 0,
        max_raw_ethy_qp: 0,
        max_mcast_grp: clamp(limits.max_mcast_grp.into()),
        max_mcast_qp_attach: clamp(limits.max_mcast_qp_attach.into()),
        max_total_mcast_qp_attach: clamp(limits.max_total_mcast_qp_attach.into()),
        max_ah: 1 << 16,
        max_fmr: 0,
        max_map_per_fmr: 0,
        max_srq: clamp(limits.max_srq.into()),
        max_srq_wr: clamp(limits.max_srq_wr.into()),
        max_srq_sge: clamp(limits.max_srq_sge.into()),
        max_pkeys: 1,
        local_ca_ack_delay: 15,
        phys_port_cnt: 1,
    }
}

/// `enum ibv_device_cap_flags` bits that hold: port events are raised
/// (`IBV_DEVICE_PORT_ACTIVE_EVENT`), the system image GUID is set (`_SYS_IMAGE_GUID`), our
/// responder sends RNR NAKs (`_RC_RNR_NAK_GEN`), SRQs can be resized (`_SRQ_RESIZE`),
/// memory windows of both types exist (`_MEM_WINDOW`, `_MEM_WINDOW_TYPE_2B`, as rxe's) and
/// so does XRC (`_XRC`, which rxe lacks).
const DEVICE_CAP_FLAGS: u32 = 1 << 9 | 1 << 10 | 1 << 12 | 1 << 13 | 1 << 17 | 1 << 20 | 1 << 24;

/// `struct ibv_device_attr_ex`: the device attributes, on-demand paging (every region may
/// page on demand, since we never pin memory; so may the whole address space), the device
/// clock of completion timestamps, tag matching on RC (with mlx5's sizes), and the port
/// count.
pub(crate) fn device_attr_ex(device: &roce_verbs::Device) -> ibv_device_attr_ex {
    let orig_attr = device_attr(device);
    let limits = device.query().limits;
    ibv_device_attr_ex {
        orig_attr,
        comp_mask: 0,
        odp_caps: ibv_odp_caps {
            general_caps: odp::SUPPORT | odp::SUPPORT_IMPLICIT,
            rc_odp_caps: odp::SEND
                | odp::RECV
                | odp::WRITE
                | odp::READ
                | odp::ATOMIC
                | odp::SRQ_RECV,
            uc_odp_caps: odp::SEND | odp::RECV | odp::WRITE | odp::SRQ_RECV,
            ud_odp_caps: odp::SEND | odp::RECV | odp::SRQ_RECV,
        },
        completion_timestamp_mask: u64::MAX,
        hca_core_clock: crate::cq::HCA_CORE_CLOCK_KHZ,
        device_cap_flags_ex: u64::from(orig_attr.device_cap_flags),
        _offloads: [0; 15],
        tm_caps: ibv_tm_caps {
            max_rndv_hdr_size: limits.max_rndv_hdr_size,
            max_num_tags: limits.max_tm_tags,
            flags: IBV_TM_CAP_RC,
            max_ops: limits.max_tm_ops,
            max_sge: limits.max_tm_sge,
        },
        cq_mod_caps: [0; 2],
        max_dm_size: 0,
        pci_atomic_caps: [0; 3],
        // XRC runs as RC does, over the same regions.
        xrc_odp_caps: odp::SEND | odp::RECV | odp::WRITE | odp::READ | odp::ATOMIC | odp::SRQ_RECV,
        phys_port_cnt_ex: u32::from(orig_attr.phys_port_cnt),
    }
}

/// `IB_PORT_CM_SUP`: the port takes connection management MADs (rdma_cm).
const PORT_CAP_CM_SUP: u32 = 1 << 16;

/// `struct ibv_port_attr` of the one port.
pub(crate) fn port_attr(port: roce_verbs::PortAttr) -> ibv_port_attr {
    let active = port.state == PortState::Active;
    ibv_port_attr {
        // IBV_PORT_ACTIVE / IBV_PORT_DOWN.
        state: if active { 4 } else { 1 },
        max_mtu: port.max_mtu as u32,
        active_mtu: port.active_mtu as u32,
        gid_tbl_len: port.gid_tbl_len as c_int,
        port_cap_flags: PORT_CAP_CM_SUP,
        // The transport's largest message.
        max_msg_sz: 1 << 31,
        pkey_tbl_len: 1,
        // IB_WIDTH_1X, IB_SPEED_SDR: what rxe reports when the link speed is unknown.
        active_width: 1,
        active_speed: 1,
        max_vl_num: 1,
        // LinkUp / Disabled.
        phys_state: if active { 5 } else { 3 },
        // IBV_LINK_LAYER_ETHERNET.
        link_layer: 2,
        ..ibv_port_attr::default()
    }
}

/// `ibv_query_device`.
pub(crate) unsafe extern "C" fn query_device(
    context: *mut ibv_context,
    attr: *mut ibv_device_attr,
) -> c_int {
    // SAFETY: the caller passes an open context and a writable attribute struct.
    let (Some(ours), Some(attr)) = (unsafe { Context::from_raw(context) }, unsafe {
        attr.as_mut()
    }) else {
        return EINVAL;
    };
    *attr = device_attr(ours.device());
    0
}

/// `verbs_context.query_device_ex` (the inline `ibv_query_device_ex`): at most `attr_size`
/// bytes of `struct ibv_device_attr_ex`, as the caller's struct may be an older, shorter one.
pub(crate) unsafe extern "C" fn query_device_ex(
    context: *mut ibv_context,
    input: *const ibv_query_device_ex_input,
    attr: *mut ibv_device_attr_ex,
    attr_size: usize,
) -> c_int {
    // SAFETY: the caller passes an open context and NULL or its input.
    let (Some(ours), input) = (unsafe { Context::from_raw(context) }, unsafe {
        input.as_ref()
    }) else {
        return EINVAL;
    };
    if input.is_some_and(|input| input.comp_mask != 0)
        || attr.is_null()
        || attr_size < size_of::<ibv_device_attr>()
    {
        return EINVAL;
    }
    let full = device_attr_ex(ours.device());
    let len = attr_size.min(size_of::<ibv_device_attr_ex>());
    // SAFETY: `full` is a whole struct; the caller passes room for `attr_size` bytes.
    unsafe {
        core::ptr::copy_nonoverlapping(
            core::ptr::from_ref(&full).cast::<u8>(),
            attr.cast::<u8>(),
            len,
        );
    }
    0
}

/// `verbs_context.query_rt_values` (the inline `ibv_query_rt_values_ex`): the device clock
/// (`IBV_VALUES_MASK_RAW_CLOCK`, in `tv_nsec` as mlx5 gives its cycles), whose ticks
/// completion timestamps count.
pub(crate) unsafe extern "C" fn query_rt_values(
    context: *mut ibv_context,
    values: *mut ibv_values_ex,
) -> c_int {
    // SAFETY: the caller passes an open context and its values.
    let (Some(_), Some(values)) = (unsafe { Context::from_raw(context) }, unsafe {
        values.as_mut()
    }) else {
        return EINVAL;
    };
    if values.comp_mask & !IBV_VALUES_MASK_RAW_CLOCK != 0 {
        return EINVAL;
    }
    if values.comp_mask & IBV_VALUES_MASK_RAW_CLOCK != 0 {
        values.raw_clock = timespec {
            tv_sec: 0,
            tv_nsec: crate::cq::hca_clock_ns() as i64,
        };
    }
    0
}

/// Writes the port's attributes, at most `len` bytes of them, as both the old 48-byte and
/// the current layout are in use.
///
/// # Safety
/// `context` is open and `attr` has room for `len` bytes.
unsafe fn write_port_attr(
    context: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
    len: usize,
) -> c_int {
    // SAFETY: per this function's contract.
    let Some(ours) = (unsafe { Context::from_raw(context) }) else {
        return EINVAL;
    };
    if port != 1 || attr.is_null() {
        return EINVAL;
    }
    // An open engine watches the link; before that, the state the device was listed with.
    let port = match ours.engine.get() {
        Some(engine) => engine.query_port(),
        None => ours.device().query_port(),
    };
    let full = port_attr(port);
    let len = len.min(size_of::<ibv_port_attr>());
    // SAFETY: `full` is a whole struct; `attr` has room for `len` bytes.
    unsafe {
        core::ptr::copy_nonoverlapping(
            core::ptr::from_ref(&full).cast::<u8>(),
            attr.cast::<u8>(),
            len,
        );
    }
    0
}

/// The exported `ibv_query_port`: the 48-byte `_compat_ibv_port_attr` (old binaries pass
/// no more).
pub(crate) unsafe extern "C" fn query_port_compat(
    context: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
) -> c_int {
    // SAFETY: the caller passes an open context and at least the compat struct.
    unsafe { write_port_attr(context, port, attr, COMPAT_PORT_ATTR_LEN) }
}

/// `verbs_context.query_port`, what the inline `ibv_query_port` calls with its size.
pub(crate) unsafe extern "C" fn query_port_ex(
    context: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
    len: usize,
) -> c_int {
    // SAFETY: the inline wrapper passes its own struct and its size.
    unsafe { write_port_attr(context, port, attr, len) }
}

/// The GID at `index` of port `port`: `ENODATA` for an empty entry of the table, `EINVAL`
/// past its end, as the kernel answers.
///
/// # Safety
/// `context` is NULL or open.
unsafe fn gid(context: *mut ibv_context, port: u32, index: u32) -> Result<[u8; 16], c_int> {
    // SAFETY: per this function's contract.
    let ours = unsafe { Context::from_raw(context) }.ok_or(EINVAL)?;
    if port != 1 {
        return Err(EINVAL);
    }
    let device = ours.device();
    match device.gid(index as usize) {
        Some(gid) => Ok(gid),
        None if (index as usize) < device.query_port().gid_tbl_len => Err(ENODATA),
        None => Err(EINVAL),
    }
}

/// `ibv_query_gid`: 0, or -1 and errno.
pub(crate) unsafe extern "C" fn query_gid(
    context: *mut ibv_context,
    port: u8,
    index: c_int,
    out: *mut [u8; 16],
) -> c_int {
    // SAFETY: the caller passes an open context.
    let found = match unsafe { gid(context, port.into(), index as u32) } {
        // An empty entry reads as the zero GID, as rdma-core keeps it.
        Err(ENODATA) => Ok([0; 16]),
        found => found,
    };
    match found {
        Ok(gid) if !out.is_null() => {
            // SAFETY: the caller passes a writable `union ibv_gid`.
            unsafe { *out = gid };
            0
        }
        Ok(_) => {
            set_errno(EINVAL);
            -1
        }
        Err(errno) => {
            set_errno(errno);
            -1
        }
    }
}

/// The `ibv_gid_entry` of GID `index`; every GID of ours is RoCEv2, as on rxe.
fn gid_entry(ours: &Context, index: u32, gid: [u8; 16]) -> ibv_gid_entry {
    ibv_gid_entry {
        gid,
        gid_index: index,
        port_num: 1,
        gid_type: IBV_GID_TYPE_ROCE_V2,
        ndev_ifindex: ours.device().ifindex,
    }
}

/// `_ibv_query_gid_ex` (what the inline `ibv_query_gid_ex` calls): 0 or an errno.
pub(crate) unsafe extern "C" fn query_gid_ex(
    context: *mut ibv_context,
    port: u32,
    index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    if flags != 0 || entry.is_null() || entry_size < size_of::<ibv_gid_entry>() {
        return EINVAL;
    }
    // SAFETY: the caller passes an open context.
    let gid = match unsafe { gid(context, port, index) } {
        Ok(gid) => gid,
        Err(errno) => return errno,
    };
    // SAFETY: checked above that it is open.
    let ours = unsafe { Context::from_raw(context) }.expect("checked by gid()");
    // SAFETY: the caller passes room for `entry_size` bytes, at least one entry.
    unsafe { entry.write(gid_entry(ours, index, gid)) };
    0
}

/// `_ibv_query_gid_table`: the number of entries written, or a negative errno.
pub(crate) unsafe extern "C" fn query_gid_table(
    context: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max_entries: usize,
    flags: u32,
    entry_size: usize,
) -> isize {
    // SAFETY: the caller passes an open context.
    let Some(ours) = (unsafe { Context::from_raw(context) }) else {
        return -(EINVAL as isize);
    };
    if flags != 0 || entries.is_null() || entry_size < size_of::<ibv_gid_entry>() {
        return -(EINVAL as isize);
    }
    let gids = &ours.device().gids;
    if gids.len() > max_entries {
        return -(EINVAL as isize);
    }
    for (index, gid) in gids.iter().enumerate() {
        // SAFETY: the caller passes `max_entries` entries of `entry_size` bytes.
        unsafe {
            entries
                .byte_add(index * entry_size)
                .write(gid_entry(ours, index as u32, *gid));
        }
    }
    gids.len() as isize
}

/// `ibv_query_gid_type`: RoCEv2 for every GID.
pub(crate) unsafe extern "C" fn query_gid_type(
    context: *mut ibv_context,
    port: u8,
    index: u32,
    gid_type: *mut u32,
) -> c_int {
    // SAFETY: the caller passes an open context.
    let found = unsafe { gid(context, port.into(), index) };
    let kind = match found {
        Ok(_) => IBV_GID_TYPE_SYSFS_ROCE_V2,
        // As rdma-core answers for an empty entry.
        Err(ENODATA) => IBV_GID_TYPE_SYSFS_IB_ROCE_V1,
        Err(errno) => {
            set_errno(errno);
            return -1;
        }
    };
    if gid_type.is_null() {
        set_errno(EINVAL);
        return -1;
    }
    // SAFETY: the caller passes a writable enum.
    unsafe { *gid_type = kind };
    0
}

/// The one P_Key, the default full-membership one.
const DEFAULT_PKEY: u16 = 0xFFFF;

/// `ibv_query_pkey`.
pub(crate) unsafe extern "C" fn query_pkey(
    context: *mut ibv_context,
    port: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    // SAFETY: the caller passes an open context.
    let open = unsafe { Context::from_raw(context) }.is_some();
    if !open || port != 1 || index != 0 || pkey.is_null() {
        set_errno(EINVAL);
        return -1;
    }
    // SAFETY: the caller passes a writable `__be16`.
    unsafe { *pkey = DEFAULT_PKEY.to_be() };
    0
}

/// `ibv_get_pkey_index`.
pub(crate) extern "C" fn get_pkey_index(_: *mut ibv_context, port: u8, pkey: u16) -> c_int {
    if port == 1 && u16::from_be(pkey) == DEFAULT_PKEY {
        0
    } else {
        set_errno(EINVAL);
        -1
    }
}

/// `enum ibv_event_type` values for the events we raise.
const IBV_EVENT_CQ_ERR: u32 = 0;
const IBV_EVENT_QP_FATAL: u32 = 1;
const IBV_EVENT_QP_REQ_ERR: u32 = 2;
const IBV_EVENT_QP_ACCESS_ERR: u32 = 3;
const IBV_EVENT_PORT_ACTIVE: u32 = 9;
const IBV_EVENT_PORT_ERR: u32 = 10;
/// The one port's number, as a port event's `element` (its `port_num`, little-endian).
const PORT: usize = 1;
const IBV_EVENT_DEVICE_FATAL: u32 = 8;
const IBV_EVENT_SRQ_LIMIT_REACHED: u32 = 15;
const IBV_EVENT_QP_LAST_WQE_REACHED: u32 = 16;

/// The `ibv_event_type` and QP number of a QP's event.
fn event_of(event: &AsyncEvent) -> Option<(u32, u32)> {
    Some(match *event {
        AsyncEvent::QpFatal { qpn, .. } => (IBV_EVENT_QP_FATAL, qpn),
        AsyncEvent::QpRequestError { qpn } => (IBV_EVENT_QP_REQ_ERR, qpn),
        AsyncEvent::QpAccessError { qpn } => (IBV_EVENT_QP_ACCESS_ERR, qpn),
        AsyncEvent::QpLastWqeReached { qpn } => (IBV_EVENT_QP_LAST_WQE_REACHED, qpn),
        _ => return None,
    })
}

impl Context {
    /// The `ibv_event_type` and `element` (our `ibv_cq`, `ibv_qp` or `ibv_srq`) of an async
    /// event; `None` for events of objects C callers do not see.
    fn element_of(&self, event: &AsyncEvent) -> Option<(u32, usize)> {
        match event {
            AsyncEvent::SrqLimitReached { srq } => {
                let srqs = self.srqs.lock().ok()?;
                return Some((IBV_EVENT_SRQ_LIMIT_REACHED, *srqs.get(srq)?));
            }
            // As rxe's `rxe_cq_post`: the CQ's event; the QP's ERR shows in its state and
            // its flushed completions.
            AsyncEvent::CqOverflow { cq, .. } => {
                let cqs = self.cqs.lock().ok()?;
                return Some((IBV_EVENT_CQ_ERR, *cqs.get(cq)?));
            }
            AsyncEvent::PortActive => return Some((IBV_EVENT_PORT_ACTIVE, PORT)),
            AsyncEvent::PortError => return Some((IBV_EVENT_PORT_ERR, PORT)),
            // The device is gone (its switch died); no element.
            AsyncEvent::DeviceFatal => return Some((IBV_EVENT_DEVICE_FATAL, 0)),
            _ => {}
        }
        // Every context of the device hears every event: this one keeps its own objects'.
        let (event_type, qpn) = event_of(event)?;
        let qps = self.qps.lock().ok()?;
        Some((event_type, *qps.get(&qpn)?))
    }
}

/// `ibv_get_async_event`: waits for one, or with `async_fd` non-blocking fails with
/// `EAGAIN` when none waits.
pub(crate) unsafe extern "C" fn get_async_event(
    context: *mut ibv_context,
    event: *mut ibv_async_event,
) -> c_int {
    // SAFETY: the caller passes an open context.
    let Some(ours) = (unsafe { Context::from_raw(context) }) else {
        set_errno(EINVAL);
        return -1;
    };
    if event.is_null() {
        set_errno(EINVAL);
        return -1;
    }
    let nonblocking = is_nonblocking(&ours.async_fd);
    loop {
        let next = ours.verbs().and_then(|verbs| {
            if nonblocking {
                verbs.try_get_async_event()
            } else {
                verbs.get_async_event(None).map(Some)
            }
        });
        match next {
            Ok(Some(happened)) => {
                let Some((event_type, element)) = ours.element_of(&happened) else {
                    continue;
                };
                // SAFETY: the caller passes a writable event (checked not null above).
                unsafe {
                    event.write(ibv_async_event {
                        element,
                        event_type,
                    })
                };
                return 0;
            }
            Ok(None) => {
                set_errno(EAGAIN);
                return -1;
            }
            Err(error) => {
                set_errno(crate::errno_of(&error));
                return -1;
            }
        }
    }
}

/// `ibv_ack_async_event`: nothing is held for an event.
pub(crate) extern "C" fn ack_async_event(_: *mut ibv_async_event) {}

/// `ibv_fork_init`: nothing to do, and it always succeeds, as rdma-core's does when fork
/// support is unneeded: no device DMAs into registered memory (we never pin pages; the
/// engine copies through the process's own mappings), so a child's copy-on-write cannot
/// leave a device writing pages the parent no longer sees.
pub(crate) extern "C" fn fork_init() -> c_int {
    0
}

/// `ibv_is_fork_initialized`: `IBV_FORK_UNNEEDED`, for the same reason.
pub(crate) extern "C" fn is_fork_initialized() -> c_int {
    IBV_FORK_UNNEEDED
}

/// Whether `fd` was made non-blocking by its owner.
pub(crate) fn is_nonblocking(fd: impl AsFd) -> bool {
    fcntl_getfl(fd).is_ok_and(|flags| flags.contains(OFlags::NONBLOCK))
}

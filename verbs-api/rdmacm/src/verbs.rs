//! The verbs side: our `libibverbs.so.1`, found at run time, and the devices ids are bound
//! to. Each device is opened once per process through `ibv_open_device` (one engine, which
//! runs the CM on QP 1, serves the device's QPs and its ids), and stays open, as rdma-core's
//! librdmacm keeps its devices.

use core::ffi::{c_char, c_int, c_void, CStr};
use std::net::{IpAddr, Ipv6Addr};
use std::sync::{Mutex, OnceLock};

use crate::abi::{ibv_qp, ibv_qp_attr, ibv_qp_init_attr};

const ENODEV: c_int = 19;
const ENOSYS: c_int = 38;

type GetDeviceList = unsafe extern "C" fn(*mut c_int) -> *mut *mut c_void;
type FreeDeviceList = unsafe extern "C" fn(*mut *mut c_void);
type GetDeviceName = unsafe extern "C" fn(*mut c_void) -> *const c_char;
type OpenDevice = unsafe extern "C" fn(*mut c_void) -> *mut c_void;
type AllocPd = unsafe extern "C" fn(*mut c_void) -> *mut c_void;
type CreateCompChannel = unsafe extern "C" fn(*mut c_void) -> *mut c_void;
type DestroyCompChannel = unsafe extern "C" fn(*mut c_void) -> c_int;
type CreateCq =
    unsafe extern "C" fn(*mut c_void, c_int, *mut c_void, *mut c_void, c_int) -> *mut c_void;
type DestroyCq = unsafe extern "C" fn(*mut c_void) -> c_int;
type CreateQp = unsafe extern "C" fn(*mut c_void, *mut ibv_qp_init_attr) -> *mut ibv_qp;
type ModifyQp = unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int;
type DestroyQp = unsafe extern "C" fn(*mut ibv_qp) -> c_int;
type McastCall = unsafe extern "C" fn(*mut ibv_qp, *const [u8; 16], u16) -> c_int;
type VerbsContext = unsafe extern "C" fn(*mut c_void, usize) -> *const roce_verbs::Context;

/// The `libibverbs.so.1` calls this library makes. The library is ours (the private
/// `roce_rdmacm_verbs_context` is required), so `rdma_cm_id.verbs`, `.pd` and `.qp` are
/// objects of the same library the program's own `ibv_*` calls reach.
pub(crate) struct Verbs {
    pub(crate) get_device_list: GetDeviceList,
    pub(crate) free_device_list: FreeDeviceList,
    pub(crate) get_device_name: GetDeviceName,
    pub(crate) open_device: OpenDevice,
    pub(crate) alloc_pd: AllocPd,
    pub(crate) create_comp_channel: CreateCompChannel,
    pub(crate) destroy_comp_channel: DestroyCompChannel,
    pub(crate) create_cq: CreateCq,
    pub(crate) destroy_cq: DestroyCq,
    pub(crate) create_qp: CreateQp,
    pub(crate) modify_qp: ModifyQp,
    pub(crate) destroy_qp: DestroyQp,
    pub(crate) attach_mcast: McastCall,
    pub(crate) detach_mcast: McastCall,
    verbs_context: VerbsContext,
}

/// Our libibverbs, loaded once; errno `ENOSYS` when the one on the library path is not ours.
pub(crate) fn verbs() -> Result<&'static Verbs, c_int> {
    static VERBS: OnceLock<Result<Verbs, String>> = OnceLock::new();
    match VERBS.get_or_init(load) {
        Ok(verbs) => Ok(verbs),
        Err(why) => {
            crate::errors::log_failure("libibverbs.so.1", why);
            Err(ENOSYS)
        }
    }
}

fn load() -> Result<Verbs, String> {
    // SAFETY: a NUL-terminated name; the handle is kept for the life of the process.
    let library = unsafe {
        libc::dlopen(
            c"libibverbs.so.1".as_ptr(),
            libc::RTLD_NOW | libc::RTLD_GLOBAL,
        )
    };
    if library.is_null() {
        return Err("cannot load libibverbs.so.1".into());
    }
    let find = |name: &CStr, version: Option<&CStr>| -> Result<*mut c_void, String> {
        // SAFETY: `library` is a live handle and the names are NUL-terminated.
        let found = unsafe {
            match version {
                Some(version) => libc::dlvsym(library, name.as_ptr(), version.as_ptr()),
                None => libc::dlsym(library, name.as_ptr()),
            }
        };
        if found.is_null() {
            Err(format!(
                "libibverbs.so.1 has no {} (not roce-xdp's, or from another build)",
                name.to_string_lossy()
            ))
        } else {
            Ok(found)
        }
    };
    // SAFETY: each symbol is the libibverbs function of that name, whose C signature the
    // field's type spells (verbs.h); the hook is ours (ibverbs/src/rdmacm_hook.rs).
    unsafe {
        Ok(Verbs {
            get_device_list: core::mem::transmute::<*mut c_void, GetDeviceList>(find(
                c"ibv_get_device_list",
                None,
            )?),
            free_device_list: core::mem::transmute::<*mut c_void, FreeDeviceList>(find(
                c"ibv_free_device_list",
                None,
            )?),
            get_device_name: core::mem::transmute::<*mut c_void, GetDeviceName>(find(
                c"ibv_get_device_name",
                None,
            )?),
            open_device: core::mem::transmute::<*mut c_void, OpenDevice>(find(
                c"ibv_open_device",
                None,
            )?),
            alloc_pd: core::mem::transmute::<*mut c_void, AllocPd>(find(c"ibv_alloc_pd", None)?),
            create_comp_channel: core::mem::transmute::<*mut c_void, CreateCompChannel>(find(
                c"ibv_create_comp_channel",
                None,
            )?),
            destroy_comp_channel: core::mem::transmute::<*mut c_void, DestroyCompChannel>(find(
                c"ibv_destroy_comp_channel",
                None,
            )?),
            create_cq: core::mem::transmute::<*mut c_void, CreateCq>(find(c"ibv_create_cq", None)?),
            destroy_cq: core::mem::transmute::<*mut c_void, DestroyCq>(find(
                c"ibv_destroy_cq",
                None,
            )?),
            create_qp: core::mem::transmute::<*mut c_void, CreateQp>(find(c"ibv_create_qp", None)?),
            modify_qp: core::mem::transmute::<*mut c_void, ModifyQp>(find(c"ibv_modify_qp", None)?),
            destroy_qp: core::mem::transmute::<*mut c_void, DestroyQp>(find(
                c"ibv_destroy_qp",
                None,
            )?),
            attach_mcast: core::mem::transmute::<*mut c_void, McastCall>(find(
                c"ibv_attach_mcast",
                None,
            )?),
            detach_mcast: core::mem::transmute::<*mut c_void, McastCall>(find(
                c"ibv_detach_mcast",
                None,
            )?),
            verbs_context: core::mem::transmute::<*mut c_void, VerbsContext>(find(
                c"roce_rdmacm_verbs_context",
                Some(c"ROCE_RDMACM_PRIVATE"),
            )?),
        })
    }
}

/// An opened device: the `ibv_context` the program sees and the `roce-verbs` context
/// behind it.
#[derive(Clone, Copy)]
pub(crate) struct Opened {
    pub(crate) ibv: *mut c_void,
    pub(crate) verbs: &'static roce_verbs::Context,
    /// The device's PD that every id on it shows as `id->pd` (librdmacm's `cma_dev->pd`),
    /// which `rdma_create_qp` takes when the caller gives none.
    pub(crate) pd: *mut c_void,
}

// SAFETY: the `ibv_context` is only passed back to libibverbs, whose calls are thread-safe;
// the roce-verbs context is Sync.
unsafe impl Send for Opened {}

/// Devices opened so far, by name.
static OPENED: Mutex<Vec<(String, Opened)>> = Mutex::new(Vec::new());

/// The device named `name`, opened on first use.
pub(crate) fn open(name: &str) -> Result<Opened, c_int> {
    let mut opened = OPENED.lock().map_err(|_| ENOSYS)?;
    if let Some((_, device)) = opened.iter().find(|(known, _)| known == name) {
        return Ok(*device);
    }
    let verbs = verbs()?;
    let mut count = 0;
    // SAFETY: libibverbs' list call; freed below.
    let list = unsafe { (verbs.get_device_list)(&mut count) };
    if list.is_null() {
        return Err(crate::errors::errno());
    }
    let mut context = core::ptr::null_mut();
    for index in 0..usize::try_from(count).unwrap_or(0) {
        // SAFETY: `list` holds `count` devices.
        let device = unsafe { *list.add(index) };
        // SAFETY: a device of the list; its name is a NUL-terminated string.
        let found = unsafe { CStr::from_ptr((verbs.get_device_name)(device)) };
        if found.to_bytes() == name.as_bytes() {
            // SAFETY: a device of the list.
            context = unsafe { (verbs.open_device)(device) };
            break;
        }
    }
    let errno = crate::errors::errno();
    // SAFETY: the list from above, not used after.
    unsafe { (verbs.free_device_list)(list) };
    if context.is_null() {
        return Err(if errno == 0 { ENODEV } else { errno });
    }
    // SAFETY: an open context of our libibverbs, never closed.
    let engine =
        unsafe { (verbs.verbs_context)(context, core::mem::size_of::<roce_verbs::Context>()) };
    // SAFETY: non-null, it is the context's roce-verbs context, which lives as long as the
    // `ibv_context` (never closed).
    let Some(engine) = (unsafe { engine.as_ref() }) else {
        return Err(crate::errors::errno());
    };
    // SAFETY: an open context of our libibverbs; the PD lives as long as the device.
    let pd = unsafe { (verbs.alloc_pd)(context) };
    if pd.is_null() {
        return Err(crate::errors::errno());
    }
    let device = Opened {
        ibv: context,
        verbs: engine,
        pd,
    };
    opened.push((name.to_owned(), device));
    Ok(device)
}

/// Every device of the namespace, opened (`rdma_get_devices`).
pub(crate) fn open_all() -> Result<Vec<Opened>, c_int> {
    let devices = roce_verbs::devices().map_err(|_| ENODEV)?;
    devices.iter().map(|device| open(&device.name)).collect()
}

/// Whether the namespace has any device (`rdma_create_event_channel` fails with `ENODEV`
/// without one, as rdma-core's does).
pub(crate) fn any_device() -> bool {
    roce_verbs::devices().is_ok_and(|devices| !devices.is_empty())
}

/// The device an id bound to or resolving toward `ip` uses: the one owning `ip` if it is
/// ours, else the first with an address of its family (the namespaces this runs in have
/// one RDMA interface each; there is no routing table lookup).
pub(crate) fn device_for(ip: IpAddr) -> Result<Opened, c_int> {
    let devices = roce_verbs::devices().map_err(|_| ENODEV)?;
    let gid = match ip {
        IpAddr::V4(ip) => ip.to_ipv6_mapped().octets(),
        IpAddr::V6(ip) => ip.octets(),
    };
    let of_family = |device: &&roce_verbs::Device| match ip {
        IpAddr::V4(_) => device.ipv4().is_some(),
        // Every device has a link-local GID (its GID 0).
        IpAddr::V6(ip) if ip.is_unicast_link_local() => true,
        IpAddr::V6(_) => device.gids.iter().any(|gid| {
            let gid = Ipv6Addr::from(*gid);
            gid.to_ipv4_mapped().is_none() && !gid.is_unicast_link_local()
        }),
    };
    let device = devices
        .iter()
        .find(|device| device.gids.contains(&gid))
        .or_else(|| devices.iter().find(of_family))
        .ok_or(ENODEV)?;
    open(&device.name)
}

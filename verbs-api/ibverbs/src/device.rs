//! The device list: one `ibv_device` per up, non-loopback interface, kept for the life of
//! the process (as rdma-core keeps a device while any list or context refers to it), so a
//! pointer handed out once stays valid.

use core::ffi::{c_char, c_int, c_void};
use std::sync::Mutex;

use roce_cabi::set_errno;

use crate::abi::{ibv_device, IBV_NODE_CA, IBV_TRANSPORT_IB};

/// An `ibv_device` and the interface behind it.
#[repr(C)]
pub(crate) struct DeviceSlot {
    pub(crate) raw: ibv_device,
    /// Where rdma-core's `verbs_device` keeps its provider's ops; a real libmlx5 compares
    /// this word with its own to tell its devices, so it must not be theirs.
    _provider_ops: *const c_void,
    /// The interface as last listed (addresses change).
    pub(crate) info: Mutex<roce_verbs::Device>,
}

/// Every slot made so far, never freed.
struct Registry(Vec<&'static DeviceSlot>);

// SAFETY: a slot's raw fields are written only before it is published here, and its
// `info` is behind a mutex.
unsafe impl Send for Registry {}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry(Vec::new()));

/// Copies `text` into a C char array, truncated, NUL-terminated.
fn fill(out: &mut [c_char], text: &str) {
    let len = text.len().min(out.len() - 1);
    for (slot, byte) in out.iter_mut().zip(&text.as_bytes()[..len]) {
        *slot = *byte as c_char;
    }
    out[len] = 0;
}

impl DeviceSlot {
    fn new(info: roce_verbs::Device, index: usize) -> DeviceSlot {
        let mut raw = ibv_device {
            _ops: [0; 2],
            node_type: IBV_NODE_CA,
            transport_type: IBV_TRANSPORT_IB,
            name: [0; 64],
            dev_name: [0; 64],
            dev_path: [0; 256],
            ibdev_path: [0; 256],
        };
        fill(&mut raw.name, &info.name);
        fill(&mut raw.dev_name, &format!("uverbs{index}"));
        fill(
            &mut raw.dev_path,
            &format!("/sys/class/infiniband_verbs/uverbs{index}"),
        );
        fill(
            &mut raw.ibdev_path,
            &format!("/sys/class/infiniband/{}", info.name),
        );
        DeviceSlot {
            raw,
            _provider_ops: core::ptr::null(),
            info: Mutex::new(info),
        }
    }

    /// The slot behind a device pointer we handed out.
    ///
    /// # Safety
    /// `device` is NULL or came from [`get_device_list`].
    pub(crate) unsafe fn from_raw<'a>(device: *mut ibv_device) -> Option<&'a DeviceSlot> {
        // SAFETY: `raw` is the first field of the `#[repr(C)]` slot, which lives for ever.
        unsafe { device.cast::<DeviceSlot>().as_ref() }
    }

    pub(crate) fn name(&self) -> String {
        self.info
            .lock()
            .map(|info| info.name.clone())
            .unwrap_or_default()
    }

    /// The interface as it is now, refreshed (addresses may have come and gone).
    pub(crate) fn refresh(&self) -> std::io::Result<roce_verbs::Device> {
        let fresh = roce_verbs::Device::by_name(&self.name())?;
        if let Ok(mut info) = self.info.lock() {
            *info = fresh.clone();
        }
        Ok(fresh)
    }

    fn node_guid(&self) -> u64 {
        self.info
            .lock()
            .map(|info| info.query().node_guid)
            .unwrap_or(0)
    }
}

/// The slots of every up interface, creating those not seen before.
fn current_devices() -> std::io::Result<Vec<&'static DeviceSlot>> {
    let found = roce_verbs::devices()?;
    let mut registry = REGISTRY
        .lock()
        .map_err(|_| std::io::Error::other("poisoned"))?;
    let mut list = Vec::new();
    for info in found.into_iter().filter(|device| device.up) {
        let known = registry.0.iter().find(|slot| slot.name() == info.name);
        let slot = match known {
            Some(slot) => {
                if let Ok(mut old) = slot.info.lock() {
                    *old = info;
                }
                *slot
            }
            None => {
                let index = registry.0.len();
                let slot: &'static DeviceSlot = Box::leak(Box::new(DeviceSlot::new(info, index)));
                registry.0.push(slot);
                slot
            }
        };
        list.push(slot);
    }
    Ok(list)
}

/// `ibv_get_device_list`: a NULL-terminated array the caller frees with
/// `ibv_free_device_list`.
pub(crate) unsafe extern "C" fn get_device_list(num_devices: *mut c_int) -> *mut *mut ibv_device {
    crate::logging::init();
    let devices = match current_devices() {
        Ok(devices) => devices,
        Err(error) => {
            crate::log_failure("ibv_get_device_list", &error);
            set_errno(error.raw_os_error().unwrap_or(38));
            return core::ptr::null_mut();
        }
    };
    if !num_devices.is_null() {
        // SAFETY: the caller passes NULL or a writable int.
        unsafe { *num_devices = devices.len() as c_int };
    }
    let list: Box<[*mut ibv_device]> = devices
        .iter()
        .map(|slot| core::ptr::from_ref(&slot.raw).cast_mut())
        .chain([core::ptr::null_mut()])
        .collect();
    Box::into_raw(list).cast()
}

/// `ibv_free_device_list`.
pub(crate) unsafe extern "C" fn free_device_list(list: *mut *mut ibv_device) {
    if list.is_null() {
        return;
    }
    let mut len = 0;
    // SAFETY: the list came from `get_device_list`: NULL-terminated, allocated as a boxed
    // slice of exactly `len + 1` pointers.
    unsafe {
        while !(*list.add(len)).is_null() {
            len += 1;
        }
        drop(Box::from_raw(core::ptr::slice_from_raw_parts_mut(
            list,
            len + 1,
        )));
    }
}

/// `ibv_get_device_name`.
pub(crate) unsafe extern "C" fn get_device_name(device: *mut ibv_device) -> *const c_char {
    // SAFETY: the caller passes a device from the list.
    match unsafe { device.as_ref() } {
        Some(device) => device.name.as_ptr(),
        None => core::ptr::null(),
    }
}

/// `ibv_get_device_guid`: the node GUID, big-endian, as rdma-core returns it.
pub(crate) unsafe extern "C" fn get_device_guid(device: *mut ibv_device) -> u64 {
    // SAFETY: the caller passes a device from the list.
    match unsafe { DeviceSlot::from_raw(device) } {
        Some(slot) => slot.node_guid().to_be(),
        None => 0,
    }
}

/// `ibv_get_device_index`: the interface's index, which is unique like rdma-core's.
pub(crate) unsafe extern "C" fn get_device_index(device: *mut ibv_device) -> c_int {
    // SAFETY: the caller passes a device from the list.
    match unsafe { DeviceSlot::from_raw(device) } {
        Some(slot) => slot
            .info
            .lock()
            .map(|info| info.ifindex as c_int)
            .unwrap_or(-1),
        None => -1,
    }
}

/// `ibv_get_sysfs_path`: where rdma-core's sysfs tree would be.
pub(crate) extern "C" fn get_sysfs_path() -> *const c_char {
    c"/sys".as_ptr()
}

/// `ibv_read_sysfs_file`: reads `dir/file` into `buf` (NUL-terminated, without the
/// trailing newline); the byte count, or -1. Under `roce exec` our devices' files are
/// there too (`roce_verbs::sysfs`).
pub(crate) unsafe extern "C" fn read_sysfs_file(
    dir: *const c_char,
    file: *const c_char,
    buf: *mut c_char,
    size: usize,
) -> c_int {
    if dir.is_null() || file.is_null() || buf.is_null() || size == 0 {
        set_errno(22);
        return -1;
    }
    // SAFETY: the caller passes NUL-terminated strings and a buffer of `size` bytes.
    let (dir, file, out) = unsafe {
        (
            std::ffi::CStr::from_ptr(dir).to_string_lossy(),
            std::ffi::CStr::from_ptr(file).to_string_lossy(),
            core::slice::from_raw_parts_mut(buf.cast::<u8>(), size),
        )
    };
    match std::fs::read(format!("{dir}/{file}")) {
        Ok(mut bytes) => {
            bytes.truncate(size - 1);
            if bytes.last() == Some(&b'\n') {
                bytes.pop();
            }
            out[..bytes.len()].copy_from_slice(&bytes);
            out[bytes.len()] = 0;
            bytes.len() as c_int
        }
        Err(error) => {
            set_errno(error.raw_os_error().unwrap_or(2));
            -1
        }
    }
}

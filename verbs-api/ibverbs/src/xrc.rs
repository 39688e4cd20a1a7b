//! XRC domains: the `open_xrcd` and `close_xrcd` ops (the inline `ibv_open_xrcd` and
//! `ibv_close_xrcd`). A domain opened with a file descriptor is the one domain of that file
//! (its inode) on the device: opening it again (`O_CREAT` or not) gives another handle to
//! the same domain, `O_EXCL` refuses it, and opening a file no domain has without `O_CREAT`
//! is `EAGAIN`, as the kernel's `ib_uverbs_open_xrcd` answers. With fd -1 each open is a
//! domain of its own.

use core::ffi::c_int;
use std::collections::HashMap;
use std::sync::Mutex;

use roce_cabi::{set_errno, EOPNOTSUPP};

use crate::abi::*;
use crate::context::Context;
use crate::logging::fail_null;

const EINVAL: c_int = 22;
const EBADF: c_int = 9;
const EAGAIN: c_int = 11;
const EBUSY: c_int = 16;

/// Our `ibv_xrcd`.
#[repr(C)]
pub(crate) struct Xrcd {
    raw: ibv_xrcd,
    /// `None` only while a close is deciding.
    xrcd: Option<roce_verbs::Xrcd>,
    /// The file it was opened by, as a key of [`BY_FILE`].
    file: Option<FileKey>,
}

impl Xrcd {
    /// The domain behind an `ibv_xrcd` we handed out.
    ///
    /// # Safety
    /// `xrcd` is NULL or came from [`open_xrcd`] and is not closed.
    pub(crate) unsafe fn from_raw<'a>(xrcd: *mut ibv_xrcd) -> Option<&'a roce_verbs::Xrcd> {
        // SAFETY: `raw` is the first field of our `#[repr(C)]` Xrcd.
        unsafe { xrcd.cast::<Xrcd>().as_ref() }?.xrcd.as_ref()
    }
}

/// A file's identity on a device: the device's name, the file's `st_dev` and `st_ino`.
type FileKey = (String, u64, u64);

/// The domain of each file that has one, and how many handles of ours have it open.
static BY_FILE: Mutex<Option<HashMap<FileKey, (roce_verbs::Xrcd, usize)>>> = Mutex::new(None);

/// `verbs_context.open_xrcd`: both `IBV_XRCD_INIT_ATTR_FD` and `_OFLAGS` must be given
/// (`EINVAL`), and no other bit (`EOPNOTSUPP`), as libibverbs' `ibv_cmd_open_xrcd` checks.
pub(crate) unsafe extern "C" fn open_xrcd(
    context: *mut ibv_context,
    attr: *mut ibv_xrcd_init_attr,
) -> *mut ibv_xrcd {
    const CALL: &str = "ibv_open_xrcd";
    // SAFETY: the caller passes an open context and the attributes.
    let (Some(ours), Some(attr)) = (unsafe { Context::from_raw(context) }, unsafe {
        attr.as_ref()
    }) else {
        return fail_null(CALL, EINVAL, &"NULL context or attributes");
    };
    if attr.comp_mask >= IBV_XRCD_INIT_ATTR_RESERVED {
        return fail_null(CALL, EOPNOTSUPP, &"unknown attribute mask bits");
    }
    let both = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
    if attr.comp_mask & both != both {
        return fail_null(CALL, EINVAL, &"no fd or oflags");
    }
    let verbs = match ours.verbs() {
        Ok(verbs) => verbs,
        Err(error) => return fail_null(CALL, crate::errno_of(&error), &error),
    };
    let file = if attr.fd == -1 {
        None
    } else {
        match rustix::fs::fstat(
            // SAFETY: the caller's descriptor, borrowed for this call only.
            unsafe { std::os::fd::BorrowedFd::borrow_raw(attr.fd) },
        ) {
            Ok(stat) => Some((ours.device().name.clone(), stat.st_dev, stat.st_ino)),
            Err(_) => return fail_null(CALL, EBADF, &"a file descriptor that is not open"),
        }
    };
    let Ok(mut by_file) = BY_FILE.lock() else {
        return fail_null(CALL, EINVAL, &"poisoned");
    };
    let by_file = by_file.get_or_insert_with(HashMap::new);
    let existing = file.as_ref().and_then(|key| by_file.get_mut(key));
    let xrcd = match existing {
        Some(_) if attr.oflags & libc_o_excl() != 0 => {
            return fail_null(CALL, EINVAL, &"O_EXCL on a file that has a domain");
        }
        Some((xrcd, handles)) => {
            *handles += 1;
            xrcd.clone()
        }
        None if file.is_some() && attr.oflags & libc_o_creat() == 0 => {
            return fail_null(CALL, EAGAIN, &"no domain for this file, and no O_CREAT");
        }
        None => match verbs.open_xrcd() {
            Ok(xrcd) => {
                if let Some(key) = &file {
                    by_file.insert(key.clone(), (xrcd.clone(), 1));
                }
                xrcd
            }
            Err(error) => return fail_null(CALL, crate::errno_of(&error), &error),
        },
    };
    Box::into_raw(Box::new(Xrcd {
        raw: ibv_xrcd { context },
        xrcd: Some(xrcd),
        file,
    }))
    .cast()
}

fn libc_o_creat() -> c_int {
    rustix::fs::OFlags::CREATE.bits() as c_int
}

fn libc_o_excl() -> c_int {
    rustix::fs::OFlags::EXCL.bits() as c_int
}

/// `verbs_context.close_xrcd`: a handle of a file's domain that is not the last just goes;
/// the last (or an anonymous domain's) is `EBUSY` while an XRC SRQ or target QP belongs to
/// the domain, and stays.
pub(crate) unsafe extern "C" fn close_xrcd(xrcd: *mut ibv_xrcd) -> c_int {
    // SAFETY: the caller passes a domain of ours.
    let Some(ours) = (unsafe { xrcd.cast::<Xrcd>().as_mut() }) else {
        return EINVAL;
    };
    let Ok(mut by_file) = BY_FILE.lock() else {
        return EINVAL;
    };
    let by_file = by_file.get_or_insert_with(HashMap::new);
    let mut shared_entry = None;
    if let Some(key) = &ours.file {
        match by_file.get_mut(key) {
            Some((_, handles)) if *handles > 1 => {
                *handles -= 1;
                // SAFETY: leaked from a Box in `open_xrcd`; the caller gives it up.
                drop(unsafe { Box::from_raw(xrcd.cast::<Xrcd>()) });
                return 0;
            }
            _ => shared_entry = by_file.remove(key),
        }
    }
    // The last handle: the file's entry (held above) lets go first, so only SRQs and QPs
    // still hold the domain.
    let Some(handle) = ours.xrcd.take() else {
        return EINVAL;
    };
    drop(shared_entry);
    match handle.close() {
        Ok(()) => {
            // SAFETY: leaked from a Box in `open_xrcd`; the caller gives it up.
            drop(unsafe { Box::from_raw(xrcd.cast::<Xrcd>()) });
            0
        }
        Err((handle, error)) => {
            crate::log_failure("ibv_close_xrcd", &error);
            if let Some(key) = &ours.file {
                by_file.insert(key.clone(), (handle.clone(), 1));
            }
            ours.xrcd = Some(handle);
            set_errno(EBUSY);
            EBUSY
        }
    }
}

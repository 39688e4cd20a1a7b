//! What our `librdmacm.so.1` (`verbs-api/rdmacm`) needs of this library: the `roce-verbs`
//! context behind an `ibv_context`, whose endpoint runs the CM on QP 1. Exported under a
//! private version node, so no other library binds to it by accident.

use core::ffi::c_int;

use roce_cabi::set_errno;

use crate::abi::ibv_context;
use crate::context::Context;

const EINVAL: c_int = 22;
const EPROTO: c_int = 71;

/// The `roce_verbs::Context` behind `context` (its engine started), or NULL with errno
/// set. `size` is the caller's `size_of::<roce_verbs::Context>()`: a library built from
/// another `roce-verbs` is refused (EPROTO) rather than handed a foreign layout.
///
/// # Safety
/// `context` is NULL or an open context of ours.
pub(crate) unsafe extern "C" fn verbs_context(
    context: *mut ibv_context,
    size: usize,
) -> *const roce_verbs::Context {
    if size != core::mem::size_of::<roce_verbs::Context>() {
        set_errno(EPROTO);
        return core::ptr::null();
    }
    // SAFETY: the caller passes NULL or an open context of ours.
    let Some(ours) = (unsafe { Context::from_raw(context) }) else {
        set_errno(EINVAL);
        return core::ptr::null();
    };
    match ours.verbs() {
        Ok(verbs) => verbs,
        Err(error) => {
            crate::log_failure("librdmacm", &error);
            set_errno(crate::errno_of(&error));
            core::ptr::null()
        }
    }
}

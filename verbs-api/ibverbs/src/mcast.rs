//! `ibv_attach_mcast` and `ibv_detach_mcast` on UD QPs: rdma-core returns the errno itself
//! (0 on success), as uverbs and rxe answer (`roce_verbs::Qp::attach_mcast`).

use core::ffi::c_int;

use crate::abi::ibv_qp;
use crate::qp::Qp;

const EINVAL: c_int = 22;

/// Runs `call` on the QP and the GID `gid` points to (`union ibv_gid`, 16 bytes).
///
/// # Safety
/// `qp` is NULL or one of ours; `gid` is NULL or points to 16 readable bytes.
unsafe fn with_group(
    name: &str,
    qp: *mut ibv_qp,
    gid: *const [u8; 16],
    call: impl FnOnce(&roce_verbs::Qp, [u8; 16]) -> Result<(), roce_verbs::Error>,
) -> c_int {
    // SAFETY: the caller passes a QP of ours and a GID.
    let (Some(ours), Some(gid)) = (unsafe { Qp::from_raw(qp) }, unsafe { gid.as_ref() }) else {
        crate::log_failure(name, &"NULL QP or GID");
        return EINVAL;
    };
    match call(ours.verbs_qp(), *gid) {
        Ok(()) => 0,
        Err(error) => {
            crate::log_failure(name, &error);
            crate::errno_of(&error)
        }
    }
}

/// `ibv_attach_mcast`.
pub(crate) unsafe extern "C" fn attach_mcast(
    qp: *mut ibv_qp,
    gid: *const [u8; 16],
    lid: u16,
) -> c_int {
    // SAFETY: the caller's QP and GID, as ibv_attach_mcast takes them.
    unsafe {
        with_group("ibv_attach_mcast", qp, gid, |qp, gid| {
            qp.attach_mcast(gid, lid)
        })
    }
}

/// `ibv_detach_mcast`.
pub(crate) unsafe extern "C" fn detach_mcast(
    qp: *mut ibv_qp,
    gid: *const [u8; 16],
    lid: u16,
) -> c_int {
    // SAFETY: the caller's QP and GID, as ibv_detach_mcast takes them.
    unsafe {
        with_group("ibv_detach_mcast", qp, gid, |qp, gid| {
            qp.detach_mcast(gid, lid)
        })
    }
}

//! Tag matching from C (`roce_verbs`' tag-matching SRQs, done in software as mlx5's
//! hardware does it): `IBV_SRQT_TM` SRQs through the `create_srq_ex` op and the
//! `post_srq_ops` op the inline `ibv_post_srq_ops` calls. The device's `tm_caps` are in
//! `context`'s `ibv_query_device_ex`, and an extended CQ made with `IBV_WC_EX_WITH_TM_INFO`
//! reads a completion's tag with `read_tm_info` (`cq`).

use core::ffi::c_int;
use std::sync::atomic::Ordering;

use roce_verbs::{TmOp, TmOpWr, TmSrqCaps};

use crate::abi::*;
use crate::cq::Cq;
use crate::logging::fail_null;
use crate::pd::Pd;
use crate::post::{post_list, sg_list};
use crate::srq::{create_with, Srq};

const EINVAL: c_int = 22;

/// A tag-matching SRQ (`create_srq_ex` with `IBV_SRQT_TM`): its PD, CQ (where its list
/// operations and messages complete) and `tm_cap` must all be given, of this context
/// (`EINVAL` otherwise, or for caps beyond the device's `tm_caps`). The CQ cannot be
/// destroyed while the SRQ lives.
///
/// # Safety
/// The init struct's PD and CQ are NULL or ours, when its mask names them.
pub(crate) unsafe fn create_srq(
    context: *mut ibv_context,
    init: &mut ibv_srq_init_attr_ex,
) -> *mut ibv_srq {
    const CALL: &str = "ibv_create_srq_ex";
    let needed = IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_CQ | IBV_SRQ_INIT_ATTR_TM;
    if init.comp_mask & needed != needed {
        return fail_null(
            CALL,
            EINVAL,
            &"a tag-matching SRQ without its PD, CQ or tm_cap",
        );
    }
    // SAFETY: per this function's contract.
    let (pd, cq) = unsafe { (Pd::from_raw(init.pd), Cq::from_raw(init.cq)) };
    let (Some(pd), Some(cq)) = (pd, cq) else {
        return fail_null(CALL, EINVAL, &"NULL PD or CQ");
    };
    if pd.raw.context != context || cq.raw.context != context {
        return fail_null(CALL, EINVAL, &"a PD or CQ of another context");
    }
    let caps = TmSrqCaps {
        max_num_tags: init.tm_cap.max_num_tags,
        max_ops: init.tm_cap.max_ops,
    };
    let make = |wanted| pd.pd.create_tm_srq(wanted, caps, &cq.cq);
    // SAFETY: checked above to be a PD of ours.
    let srq = unsafe { create_with(init.pd, init.srq_context, &mut init.attr, make) };
    if !srq.is_null() {
        cq.users.fetch_add(1, Ordering::AcqRel);
        // SAFETY: just created, ours.
        if let Some(ours) = unsafe { srq.cast::<Srq>().as_mut() } {
            ours.held_cq = init.cq as usize;
        }
    }
    srq
}

/// One `struct ibv_ops_wr` as a [`TmOpWr`]: an unknown opcode, or a bad scatter list, is
/// `EINVAL`.
///
/// # Safety
/// `wr` is a valid operation of the caller's.
unsafe fn op_wr(wr: &ibv_ops_wr) -> Result<TmOpWr, c_int> {
    let op = match wr.opcode {
        IBV_WR_TAG_ADD => TmOp::Add {
            tag: wr.tm.add.tag,
            mask: wr.tm.add.mask,
            recv_wr_id: wr.tm.add.recv_wr_id,
            // SAFETY: the caller's list of `num_sge` elements.
            sg_list: unsafe { sg_list(wr.tm.add.sg_list, wr.tm.add.num_sge) }?,
        },
        IBV_WR_TAG_DEL => TmOp::Del {
            handle: wr.tm.handle,
        },
        IBV_WR_TAG_SYNC => TmOp::Sync,
        _ => return Err(EINVAL),
    };
    Ok(TmOpWr {
        wr_id: wr.wr_id,
        op,
        signaled: wr.flags & IBV_OPS_SIGNALED != 0,
        sync: (wr.flags & IBV_OPS_TM_SYNC != 0).then_some(wr.tm.unexpected_cnt),
    })
}

/// `verbs_context.post_srq_ops` (the inline `ibv_post_srq_ops`): runs the caller's list of
/// list operations in order, writing each ADD's handle into its `tm.handle`; stops at the
/// first refused (mlx5's errno: `ENOMEM` for a full list or command queue, `EINVAL` for an
/// SRQ without tag matching, a bad handle, opcode or scatter list) and names it in
/// `bad_wr`.
pub(crate) unsafe extern "C" fn post_srq_ops(
    srq: *mut ibv_srq,
    wr: *mut ibv_ops_wr,
    bad_wr: *mut *mut ibv_ops_wr,
) -> c_int {
    // SAFETY: the caller passes an SRQ of ours.
    let Some(ours) = (unsafe { Srq::from_raw(srq.cast()) }) else {
        return EINVAL;
    };
    // SAFETY: the walk passes only operations of the caller's list, which are valid.
    let convert = |wr: &ibv_ops_wr| unsafe { op_wr(wr) };
    // Each ADD's handle goes back into its own `ibv_ops_wr`, found by walking the list along
    // with the operations run (their indices only grow).
    let (mut at, mut at_index) = (wr, 0);
    let record = |index: usize, handle: Option<u32>| {
        while at_index < index && !at.is_null() {
            // SAFETY: a request of the caller's NULL-terminated list the walk went through.
            at = unsafe { (*at).next };
            at_index += 1;
        }
        if let (Some(handle), false) = (handle, at.is_null()) {
            // SAFETY: as above; the caller's operation, which `ibv_post_srq_ops` fills in.
            unsafe { (*at).tm.handle = handle };
        }
    };
    // SAFETY: the caller passes a NULL-terminated list of valid operations and `bad_wr`.
    unsafe {
        post_list(
            wr,
            bad_wr,
            convert,
            |wr| wr.next,
            |walk| ours.srq.post_ops(walk, record),
        )
    }
}

//! `struct ibv_qp_ex` and its work request builders (`ibv_wr_start`, `ibv_wr_send`, ...,
//! `ibv_wr_complete`), which rdma-core's `verbs.h` calls inline through the pointers in the
//! struct after the application wrote `wr_id` and `wr_flags`; and what
//! `ibv_create_qp_ex`'s extended attributes may ask for.
//!
//! The builders gather the batch in the QP; `wr_complete` posts it as one list, and the
//! first builder error (a NULL address handle, too much inline data, an operation this
//! device lacks) fails it with that errno, posting nothing. An operation the QP's type
//! cannot carry is refused by the transport when the batch is posted.
//!
//! TSO fails the batch with `EOPNOTSUPP`, and its send ops flag is refused at creation (see
//! [`supported_send_ops`]).

use core::ffi::{c_int, c_void};
use std::sync::Mutex;

use roce_cabi::EOPNOTSUPP;
use roce_verbs::{SendFlags, SendOp, SendWr, SgList, Sge};

use crate::abi::*;
use crate::ah::Ah;
use crate::post::{inline_bytes, sg_list};

const EINVAL: c_int = 22;

/// `enum ibv_qp_create_send_ops_flags` (TSO named for what refuses it).
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) mod send_ops {
    pub const RDMA_WRITE: u64 = 1 << 0;
    pub const RDMA_WRITE_WITH_IMM: u64 = 1 << 1;
    pub const SEND: u64 = 1 << 2;
    pub const SEND_WITH_IMM: u64 = 1 << 3;
    pub const RDMA_READ: u64 = 1 << 4;
    pub const ATOMIC_CMP_AND_SWP: u64 = 1 << 5;
    pub const ATOMIC_FETCH_AND_ADD: u64 = 1 << 6;
    pub const LOCAL_INV: u64 = 1 << 7;
    pub const BIND_MW: u64 = 1 << 8;
    pub const SEND_WITH_INV: u64 = 1 << 9;
    pub const TSO: u64 = 1 << 10;
    pub const ATOMIC_WRITE: u64 = 1 << 12;
}

/// The send ops flags a QP of each type may be created with: rxe's sets
/// (`RXE_SUP_*_QP_SEND_OPS_FLAGS`), and for an XRC initiator RC's less ATOMIC WRITE (XRC
/// has no such opcode).
pub(crate) fn supported_send_ops(qp_type: u32) -> Option<u64> {
    use send_ops::*;
    let unreliable = RDMA_WRITE
        | RDMA_WRITE_WITH_IMM
        | SEND
        | SEND_WITH_IMM
        | LOCAL_INV
        | BIND_MW
        | SEND_WITH_INV;
    let reliable = unreliable | RDMA_READ | ATOMIC_CMP_AND_SWP | ATOMIC_FETCH_AND_ADD;
    Some(match qp_type {
        IBV_QPT_RC => reliable | ATOMIC_WRITE,
        IBV_QPT_XRC_SEND => reliable,
        IBV_QPT_UC => unreliable,
        IBV_QPT_UD => SEND | SEND_WITH_IMM,
        _ => return None,
    })
}

/// The `comp_mask` bits of `ibv_qp_init_attr_ex` this device takes, as rxe's
/// `RXE_QP_COMP_MASK_SUP`: a PD, creation flags (none of which it supports, so only 0) and
/// send ops flags. TSO, RSS and indirection tables are refused, as by rxe. An XRC target's
/// `xrcd` is taken where XRC targets are made (`qp::create_xrc_recv`).
pub(crate) const SUPPORTED_COMP_MASK: u32 =
    IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;

/// Whether `ibv_create_qp_ex` may create a QP as `init` asks (beyond what `ibv_create_qp`
/// checks): `Err` with rdma-core's errno (`EOPNOTSUPP` for what rxe refuses, `EINVAL` for
/// a missing PD) and why.
pub(crate) fn check_init_attr(init: &ibv_qp_init_attr_ex) -> Result<(), (c_int, &'static str)> {
    if init.comp_mask & !SUPPORTED_COMP_MASK != 0 {
        return Err((EOPNOTSUPP, "XRC, RSS or TSO attributes"));
    }
    if init.comp_mask & IBV_QP_INIT_ATTR_PD == 0 {
        return Err((EINVAL, "no PD"));
    }
    if init.comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS != 0 && init.create_flags != 0 {
        return Err((EOPNOTSUPP, "creation flags"));
    }
    if init.comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0 {
        let supported = supported_send_ops(init.qp_type).ok_or((EOPNOTSUPP, "QP type"))?;
        if init.send_ops_flags & !supported != 0 {
            return Err((EOPNOTSUPP, "send ops flags this QP type cannot carry"));
        }
    }
    Ok(())
}

/// The `ibv_qp_ex` we hand out (first, so its address is the `ibv_qp`'s) and what its
/// builders need: the QP to post to and the batch being built.
#[repr(C)]
pub(crate) struct QpEx {
    pub(crate) raw: ibv_qp_ex,
    pub(crate) qp: roce_verbs::Qp,
    batch: Mutex<Batch>,
}

impl QpEx {
    /// `qp_base` with our builders, posting to `qp`.
    pub(crate) fn new(qp_base: ibv_qp, qp: roce_verbs::Qp) -> QpEx {
        QpEx {
            raw: builders(qp_base),
            qp,
            batch: Mutex::new(Batch::default()),
        }
    }

    /// The `QpEx` behind an `ibv_qp_ex` (or `ibv_qp`) we handed out.
    ///
    /// # Safety
    /// `qp` is NULL or the first field of a live `QpEx` (of a live `qp::Qp`).
    pub(crate) unsafe fn from_raw<'a>(qp: *mut ibv_qp_ex) -> Option<&'a QpEx> {
        // SAFETY: `raw` is the first field of our `#[repr(C)]` QpEx.
        unsafe { qp.cast::<QpEx>().as_ref() }
    }
}

/// The work requests built since `ibv_wr_start`, and the first error among them (reported
/// by `ibv_wr_complete`, which then posts nothing).
#[derive(Default)]
struct Batch {
    wrs: Vec<SendWr>,
    error: Option<c_int>,
}

/// An `ibv_qp_ex` around `qp_base` with our builders in every slot.
fn builders(qp_base: ibv_qp) -> ibv_qp_ex {
    ibv_qp_ex {
        qp_base,
        comp_mask: 0,
        wr_id: 0,
        wr_flags: 0,
        wr_atomic_cmp_swp: Some(wr_atomic_cmp_swp),
        wr_atomic_fetch_add: Some(wr_atomic_fetch_add),
        wr_bind_mw: Some(wr_bind_mw),
        wr_local_inv: Some(wr_local_inv),
        wr_rdma_read: Some(wr_rdma_read),
        wr_rdma_write: Some(wr_rdma_write),
        wr_rdma_write_imm: Some(wr_rdma_write_imm),
        wr_send: Some(wr_send),
        wr_send_imm: Some(wr_send_imm),
        wr_send_inv: Some(wr_send_inv),
        wr_send_tso: Some(wr_unsupported),
        wr_set_ud_addr: Some(wr_set_ud_addr),
        wr_set_xrc_srqn: Some(wr_set_xrc_srqn),
        wr_set_inline_data: Some(wr_set_inline_data),
        wr_set_inline_data_list: Some(wr_set_inline_data_list),
        wr_set_sge: Some(wr_set_sge),
        wr_set_sge_list: Some(wr_set_sge_list),
        wr_start: Some(wr_start),
        wr_complete: Some(wr_complete),
        wr_abort: Some(wr_abort),
        wr_atomic_write: Some(wr_atomic_write),
    }
}

/// Runs `f` on the QP's batch.
///
/// # Safety
/// `qp` is an `ibv_qp_ex` of ours.
unsafe fn with_batch<T>(qp: *mut ibv_qp_ex, f: impl FnOnce(&QpEx, &mut Batch) -> T) -> Option<T> {
    // SAFETY: per this function's contract.
    let ours = unsafe { QpEx::from_raw(qp) }?;
    let mut batch = ours.batch.lock().ok()?;
    Some(f(ours, &mut batch))
}

/// Starts a new work request with `op`, taking `wr_id` and `wr_flags` from the QP as the
/// application wrote them.
///
/// # Safety
/// `qp` is an `ibv_qp_ex` of ours.
unsafe fn begin(qp: *mut ibv_qp_ex, op: SendOp) {
    // SAFETY: per this function's contract.
    unsafe {
        with_batch(qp, |ours, batch| {
            batch.wrs.push(SendWr {
                wr_id: ours.raw.wr_id,
                op,
                flags: SendFlags::from_bits_truncate(ours.raw.wr_flags),
                ..SendWr::default()
            });
        });
    }
}

/// Changes the work request being built; an error if none is.
///
/// # Safety
/// `qp` is an `ibv_qp_ex` of ours.
unsafe fn amend(qp: *mut ibv_qp_ex, f: impl FnOnce(&mut SendWr) -> Result<(), c_int>) {
    // SAFETY: per this function's contract.
    unsafe {
        with_batch(qp, |_, batch| {
            let result = batch.wrs.last_mut().ok_or(EINVAL).and_then(f);
            if let Err(errno) = result {
                batch.error.get_or_insert(errno);
            }
        });
    }
}

unsafe extern "C" fn wr_start(qp: *mut ibv_qp_ex) {
    // SAFETY: the application passes its `ibv_qp_ex`.
    unsafe { with_batch(qp, |_, batch| *batch = Batch::default()) };
}

unsafe extern "C" fn wr_abort(qp: *mut ibv_qp_ex) {
    // SAFETY: the application passes its `ibv_qp_ex`.
    unsafe { with_batch(qp, |_, batch| *batch = Batch::default()) };
}

/// Posts the batch: 0, or the errno of the first builder error or of the post.
unsafe extern "C" fn wr_complete(qp: *mut ibv_qp_ex) -> c_int {
    // SAFETY: the application passes its `ibv_qp_ex`.
    let done = unsafe {
        with_batch(qp, |ours, batch| {
            let batch = std::mem::take(batch);
            if let Some(errno) = batch.error {
                crate::log_failure("ibv_wr_complete", &"a builder failed");
                return errno;
            }
            match ours.qp.post_send(batch.wrs) {
                Ok(()) => 0,
                Err(failure) => {
                    crate::log_failure("ibv_wr_complete", &failure);
                    crate::errno_of(&failure.error)
                }
            }
        })
    };
    done.unwrap_or(EINVAL)
}

/// TSO: the batch fails with `EOPNOTSUPP` (rdma-core leaves such slots NULL; failing is
/// kinder than a jump to 0). The slot takes more arguments, which the callee may ignore in
/// the C calling convention.
unsafe extern "C" fn wr_unsupported(qp: *mut ibv_qp_ex) {
    // SAFETY: the application passes its `ibv_qp_ex`.
    unsafe {
        with_batch(qp, |_, batch| {
            batch.error.get_or_insert(EOPNOTSUPP);
        });
    }
}

unsafe extern "C" fn wr_send_inv(qp: *mut ibv_qp_ex, invalidate_rkey: u32) {
    // SAFETY: the application passes its `ibv_qp_ex`.
    unsafe { begin(qp, SendOp::SendWithInv(invalidate_rkey)) };
}

/// `ibv_wr_bind_mw`: a type 2 window's bind, with the R_Key the caller chose.
unsafe extern "C" fn wr_bind_mw(
    qp: *mut ibv_qp_ex,
    mw: *mut ibv_mw,
    rkey: u32,
    info: *const ibv_mw_bind_info,
) {
    // SAFETY: the application passes a window of ours and its bind information.
    let op = unsafe { info.as_ref() }.ok_or(EINVAL).and_then(|info| {
        let bind = ibv_bind_mw_wr {
            mw,
            rkey,
            bind_info: *info,
        };
        // SAFETY: as above; the region in it is NULL or the caller's.
        unsafe { crate::mw::bind_op(&bind) }
    });
    // SAFETY: the application passes its `ibv_qp_ex`.
    unsafe {
        match op {
            Ok(op) => begin(qp, op),
            Err(errno) => {
                with_batch(qp, |_, batch| {
                    batch.error.get_or_insert(errno);
                });
            }
        }
    }
}

/// `ibv_wr_local_inv`.
unsafe extern "C" fn wr_local_inv(qp: *mut ibv_qp_ex, invalidate_rkey: u32) {
    // SAFETY: the application passes its `ibv_qp_ex`.
    unsafe { begin(qp, SendOp::LocalInv(invalidate_rkey)) };
}

/// `ibv_wr_set_xrc_srqn`: the XRC SRQ at the destination the request is for.
unsafe extern "C" fn wr_set_xrc_srqn(qp: *mut ibv_qp_ex, remote_srqn: u32) {
    // SAFETY: the application passes its `ibv_qp_ex`.
    unsafe {
        amend(qp, |wr| {
            wr.xrc_srqn = remote_srqn;
            Ok(())
        });
    }
}

unsafe extern "C" fn wr_send(qp: *mut ibv_qp_ex) {
    // SAFETY: the application passes its `ibv_qp_ex`.
    unsafe { begin(qp, SendOp::Send) };
}

unsafe extern "C" fn wr_send_imm(qp: *mut ibv_qp_ex, imm: u32) {
    // SAFETY: the application passes its `ibv_qp_ex`.
    unsafe { begin(qp, SendOp::SendWithImm(u32::from_be(imm))) };
}

unsafe extern "C" fn wr_rdma_write(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    // SAFETY: the application passes its `ibv_qp_ex`.
    unsafe { begin(qp, SendOp::RdmaWrite { remote_addr, rkey }) };
}

unsafe extern "C" fn wr_rdma_write_imm(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64, imm: u32) {
    let imm = u32::from_be(imm);
    let op = SendOp::RdmaWriteWithImm {
        remote_addr,
        rkey,
        imm,
    };
    // SAFETY: the application passes its `ibv_qp_ex`.
    unsafe { begin(qp, op) };
}

unsafe extern "C" fn wr_rdma_read(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    // SAFETY: the application passes its `ibv_qp_ex`.
    unsafe { begin(qp, SendOp::RdmaRead { remote_addr, rkey }) };
}

unsafe extern "C" fn wr_atomic_cmp_swp(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    compare: u64,
    swap: u64,
) {
    let op = SendOp::CompareSwap {
        remote_addr,
        rkey,
        compare,
        swap,
    };
    // SAFETY: the application passes its `ibv_qp_ex`.
    unsafe { begin(qp, op) };
}

unsafe extern "C" fn wr_atomic_fetch_add(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    add: u64,
) {
    let op = SendOp::FetchAdd {
        remote_addr,
        rkey,
        add,
    };
    // SAFETY: the application passes its `ibv_qp_ex`.
    unsafe { begin(qp, op) };
}

/// `ibv_wr_atomic_write`: the 8 bytes at `atomic_wr`, copied now (as rxe copies them into
/// its WQE), to be stored at once at `remote_addr`. No SGE follows.
unsafe extern "C" fn wr_atomic_write(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    atomic_wr: *const c_void,
) {
    if atomic_wr.is_null() {
        // SAFETY: the application passes its `ibv_qp_ex`.
        unsafe {
            with_batch(qp, |_, batch| {
                batch.error.get_or_insert(EINVAL);
            })
        };
        return;
    }
    // SAFETY: the application passes 8 readable bytes, of any alignment.
    let data = unsafe { atomic_wr.cast::<[u8; 8]>().read_unaligned() };
    let op = SendOp::AtomicWrite {
        remote_addr,
        rkey,
        data,
    };
    // SAFETY: the application passes its `ibv_qp_ex`.
    unsafe { begin(qp, op) };
}

unsafe extern "C" fn wr_set_sge(qp: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    // SAFETY: the application passes its `ibv_qp_ex`.
    unsafe {
        amend(qp, |wr| {
            wr.sg_list = [Sge { addr, length, lkey }].into();
            Ok(())
        });
    }
}

unsafe extern "C" fn wr_set_sge_list(qp: *mut ibv_qp_ex, num_sge: usize, sg: *const ibv_sge) {
    let count = c_int::try_from(num_sge).unwrap_or(-1);
    // SAFETY: the application passes its `ibv_qp_ex` and `num_sge` elements.
    unsafe {
        amend(qp, |wr| {
            wr.sg_list = sg_list(sg, count)?;
            Ok(())
        });
    }
}

unsafe extern "C" fn wr_set_inline_data(qp: *mut ibv_qp_ex, addr: *mut c_void, length: usize) {
    let buffer = ibv_data_buf { addr, length };
    // SAFETY: the application passes its `ibv_qp_ex` and one buffer.
    unsafe { wr_set_inline_data_list(qp, 1, &buffer) };
}

unsafe extern "C" fn wr_set_inline_data_list(
    qp: *mut ibv_qp_ex,
    num_buf: usize,
    buffers: *const ibv_data_buf,
) {
    // SAFETY: the application passes its `ibv_qp_ex` and `num_buf` buffers, each of
    // `length` readable bytes, copied before this returns.
    unsafe {
        amend(qp, |wr| {
            if num_buf > 0 && buffers.is_null() {
                return Err(EINVAL);
            }
            let buffers = if num_buf == 0 {
                &[][..]
            } else {
                core::slice::from_raw_parts(buffers, num_buf)
            };
            let sges: SgList = buffers
                .iter()
                .map(|buffer| Sge {
                    addr: buffer.addr as u64,
                    length: u32::try_from(buffer.length).unwrap_or(u32::MAX),
                    lkey: 0,
                })
                .collect();
            wr.inline_data.clear();
            inline_bytes(&sges, &mut wr.inline_data)?;
            wr.flags |= SendFlags::INLINE;
            wr.sg_list.clear();
            Ok(())
        });
    }
}

unsafe extern "C" fn wr_set_ud_addr(
    qp: *mut ibv_qp_ex,
    ah: *mut ibv_ah,
    remote_qpn: u32,
    remote_qkey: u32,
) {
    // SAFETY: the application passes its `ibv_qp_ex` and an address handle of ours.
    unsafe {
        amend(qp, |wr| {
            let ah = Ah::from_raw(ah).ok_or(EINVAL)?;
            wr.ud = Some(ah.handle.dest(remote_qpn, remote_qkey));
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn init(
        comp_mask: u32,
        qp_type: u32,
        create_flags: u32,
        send_ops_flags: u64,
    ) -> ibv_qp_init_attr_ex {
        ibv_qp_init_attr_ex {
            qp_context: core::ptr::null_mut(),
            send_cq: core::ptr::null_mut(),
            recv_cq: core::ptr::null_mut(),
            srq: core::ptr::null_mut(),
            cap: ibv_qp_cap::default(),
            qp_type,
            sq_sig_all: 0,
            comp_mask,
            pd: core::ptr::null_mut(),
            xrcd: core::ptr::null_mut(),
            create_flags,
            max_tso_header: 0,
            rwq_ind_tbl: core::ptr::null_mut(),
            rx_hash_conf: [0; 3],
            source_qpn: 0,
            send_ops_flags,
        }
    }

    /// What rxe takes, and refuses, in `ibv_create_qp_ex`'s extended attributes.
    #[test]
    fn extended_attributes_are_taken_as_rxe_takes_them() {
        use send_ops::*;
        let pd = IBV_QP_INIT_ATTR_PD;
        let flags = IBV_QP_INIT_ATTR_CREATE_FLAGS;
        let ops = IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
        let ok = |i: ibv_qp_init_attr_ex| check_init_attr(&i).is_ok();
        let errno = |i: ibv_qp_init_attr_ex| check_init_attr(&i).err().map(|e| e.0);
        for qp_type in [IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD] {
            assert!(ok(init(pd, qp_type, 0, 0)));
            assert!(
                ok(init(pd | flags, qp_type, 0, 0)),
                "no creation flag asked"
            );
            assert!(ok(init(pd | ops, qp_type, 0, SEND | SEND_WITH_IMM)));
            // IBV_QP_CREATE_BLOCK_SELF_MCAST_LB, which rxe does not take either.
            assert_eq!(errno(init(pd | flags, qp_type, 2, 0)), Some(EOPNOTSUPP));
            // IBV_QP_INIT_ATTR_MAX_TSO_HEADER.
            assert_eq!(errno(init(pd | 1 << 3, qp_type, 0, 0)), Some(EOPNOTSUPP));
            assert_eq!(errno(init(0, qp_type, 0, 0)), Some(EINVAL), "no PD");
            assert_eq!(errno(init(pd | ops, qp_type, 0, TSO)), Some(EOPNOTSUPP));
        }
        let rc_all = RDMA_WRITE
            | RDMA_WRITE_WITH_IMM
            | SEND
            | SEND_WITH_IMM
            | RDMA_READ
            | ATOMIC_CMP_AND_SWP
            | ATOMIC_FETCH_AND_ADD
            | ATOMIC_WRITE;
        assert!(ok(init(pd | ops, IBV_QPT_RC, 0, rc_all)));
        assert!(ok(init(
            pd | ops,
            IBV_QPT_UC,
            0,
            RDMA_WRITE | RDMA_WRITE_WITH_IMM
        )));
        for qp_type in [IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_XRC_SEND] {
            let windows = BIND_MW | LOCAL_INV | SEND_WITH_INV;
            assert!(ok(init(pd | ops, qp_type, 0, windows)), "type {qp_type}");
        }
        for (qp_type, op) in [
            (IBV_QPT_UC, RDMA_READ),
            (IBV_QPT_UC, ATOMIC_WRITE),
            (IBV_QPT_UD, RDMA_WRITE),
            (IBV_QPT_UD, ATOMIC_FETCH_AND_ADD),
            (IBV_QPT_UD, BIND_MW),
            (IBV_QPT_UD, SEND_WITH_INV),
            (IBV_QPT_XRC_SEND, ATOMIC_WRITE),
        ] {
            assert_eq!(
                errno(init(pd | ops, qp_type, 0, op)),
                Some(EOPNOTSUPP),
                "type {qp_type} op {op:#x}"
            );
        }
    }
}

//! An id's multicast joins as librdmacm keeps them (`struct cma_multicast`): the address as
//! the program gave it (what `rdma_leave_multicast` compares), the join flags, the
//! program's context, and the group's GID and LID once its join is reported. On that
//! report (`ucma_process_join`) the id's QP is attached to the group through libibverbs,
//! unless the join is send-only; a failed attach turns the event into
//! `RDMA_CM_EVENT_MULTICAST_ERROR` with status -1 and errno set.

use core::ffi::{c_int, c_void};

use roce_cabi::set_errno;
use roce_verbs::McastJoin;

use crate::abi::*;
use crate::qp_attr;
use crate::verbs;

/// `RDMA_CM_EVENT_MULTICAST_JOIN`, `RDMA_CM_EVENT_MULTICAST_ERROR`.
const MULTICAST_JOIN: c_int = 12;
const MULTICAST_ERROR: c_int = 13;

/// One join of an id.
pub(crate) struct Join {
    /// Which join it is to roce-verbs (`CmId::join_multicast`).
    pub(crate) number: u64,
    /// The group's `sockaddr`, its bytes as given (`ucma_addrlen` of them).
    pub(crate) addr: Vec<u8>,
    /// `RDMA_MC_JOIN_FLAG_*`.
    pub(crate) flags: u32,
    /// The program's context, which the join's event carries as its private data.
    pub(crate) context: *mut c_void,
    /// The group's GID and LID from the join's event (zero before it).
    pub(crate) mgid: [u8; 16],
    pub(crate) mlid: u16,
}

impl Join {
    /// Whether the id's QP is (to be) attached to the group: not for a send-only member.
    pub(crate) fn attaches(&self) -> bool {
        self.flags != RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER
    }
}

/// What a join's event says.
pub(crate) struct Joined {
    pub(crate) event: c_int,
    pub(crate) status: c_int,
    pub(crate) param: rdma_ud_param,
}

/// The event of `join` for an id with `joins` and QP `qp` (NULL: none), attaching the QP.
pub(crate) fn joined(joins: &mut [Join], qp: *mut ibv_qp, join: &McastJoin) -> Joined {
    let mut event = MULTICAST_JOIN;
    let mut status = 0;
    let mut context = core::ptr::null_mut();
    if let Some(ours) = joins.iter_mut().find(|ours| ours.number == join.join) {
        context = ours.context;
        ours.mgid = join.ah.dgid;
        ours.mlid = 0;
        if !qp.is_null() && ours.attaches() {
            let attached = verbs::verbs().and_then(|verbs| {
                // SAFETY: the id's QP, one of our libibverbs' and alive while the id holds
                // it, and a GID that lives across the call.
                match unsafe { (verbs.attach_mcast)(qp, &ours.mgid, ours.mlid) } {
                    0 => Ok(()),
                    errno => Err(errno),
                }
            });
            if let Err(errno) = attached {
                crate::errors::log_failure("ibv_attach_mcast on a join", &errno);
                set_errno(errno);
                (event, status) = (MULTICAST_ERROR, -1);
            }
        }
    }
    Joined {
        event,
        status,
        param: rdma_ud_param {
            private_data: context.cast_const(),
            private_data_len: 0,
            ah_attr: qp_attr::ah_attr(&join.ah),
            qp_num: join.qp_num,
            qkey: join.qkey,
        },
    }
}

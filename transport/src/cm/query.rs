//! The attributes of one QP state for a connection at any point of its exchange, as the
//! kernel's `ib_cm_init_qp_attr` gives them to rdma_cm's `rdma_init_qp_attr` (for
//! programs that move their QP themselves).

use crate::qp_state::{QpAttr, QpState};

use super::attrs;
use super::common::Common;
use super::connection::ConnState;
use super::event::CmError;
use super::ids::ConnId;
use super::passive::{request_negotiated, Grant};

impl Common {
    pub(super) fn qp_attr(
        &mut self,
        conn: ConnId,
        state: QpState,
        sgid_index: u8,
    ) -> Result<QpAttr, CmError> {
        let pick = |attrs: attrs::QpAttrs| match state {
            QpState::Init => Ok(attrs.init),
            QpState::Rtr => Ok(attrs.rtr),
            QpState::Rts => Ok(attrs.rts),
            _ => Err(CmError::UnsupportedQpState(state)),
        };
        let c = self.connection(conn)?;
        if let Some(settled) = c.attrs {
            return pick(settled);
        }
        match (c.state, c.req) {
            (ConnState::ReqSent, Some(request)) if state == QpState::Init => {
                Ok(attrs::init_attr(request.responder_resources))
            }
            (ConnState::ReqReceived | ConnState::MraReqSent, Some(request)) => {
                let max_path_mtu = self.config.max_path_mtu;
                let rq_psn = self.reserved_psn(conn)?;
                // Before the accept the kernel grants what the REQ asked, crosswise.
                let grant = Grant {
                    sgid_index,
                    responder_resources: request.initiator_depth,
                    initiator_depth: request.responder_resources,
                };
                let c = self.connection(conn)?;
                pick(request_negotiated(c, &request, rq_psn, &grant, max_path_mtu)?.qp_attrs())
            }
            (other, _) => Err(CmError::InvalidState(other)),
        }
    }
}

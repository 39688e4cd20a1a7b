//! The QP attributes a connection's CM exchange settles, as the kernel CM derives them
//! (`cm_init_qp_init_attr` / `_rtr_attr` / `_rts_attr` in drivers/infiniband/core/cm.c).

use roce_wire::aeth::RnrTimer;
use roce_wire::cm::req::ServiceType;
use roce_wire::Psn;

use crate::qp_state::{AddressVector, PathMtu, QpAttr, QpState};
use crate::AccessFlags;

/// The `modify_qp` attributes for each step of a connected QP: RESET→INIT, INIT→RTR and
/// RTR→RTS, to apply in that order (the active side before it sends the RTU, the passive
/// side before it sends the REP).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpAttrs {
    /// RESET → INIT: pkey index, port, and the remote access the peer may use.
    pub init: QpAttr,
    /// INIT → RTR: the peer's address, QPN and first PSN, the path MTU, READ/atomic depth.
    pub rtr: QpAttr,
    /// RTR → RTS: our first PSN, the local ACK timeout, the retry counts, READ/atomic depth.
    pub rts: QpAttr,
}

/// What both sides agreed on, seen from one side.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Negotiated {
    pub service_type: ServiceType,
    pub path_mtu: PathMtu,
    pub remote_qpn: u32,
    /// What our responder expects first. Over the kernel CM, each side's REQ or REP carries
    /// the PSN it will receive from: the requester's QP receives from the REQ's starting PSN
    /// and sends from the REP's.
    pub rq_psn: Psn,
    /// What our requester sends first.
    pub sq_psn: Psn,
    /// READs and atomics we accept at once as responder.
    pub responder_resources: u8,
    /// READs and atomics we issue at once.
    pub initiator_depth: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    /// Local ACK timeout exponent.
    pub ack_timeout: u8,
    pub av: AddressVector,
}

impl Negotiated {
    pub(crate) fn qp_attrs(&self) -> QpAttrs {
        let rc = self.service_type == ServiceType::Rc;
        let init = init_attr(self.responder_resources);
        let rtr = QpAttr {
            state: Some(QpState::Rtr),
            av: Some(self.av),
            path_mtu: Some(self.path_mtu),
            dest_qp_num: Some(self.remote_qpn),
            rq_psn: Some(self.rq_psn),
            max_dest_rd_atomic: rc.then_some(self.responder_resources),
            min_rnr_timer: rc.then_some(RnrTimer::new(0)),
            ..QpAttr::default()
        };
        let rts = QpAttr {
            state: Some(QpState::Rts),
            sq_psn: Some(self.sq_psn),
            timeout: rc.then_some(self.ack_timeout),
            retry_cnt: rc.then_some(self.retry_count),
            rnr_retry: rc.then_some(self.rnr_retry_count),
            max_rd_atomic: rc.then_some(self.initiator_depth),
            ..QpAttr::default()
        };
        QpAttrs { init, rtr, rts }
    }
}

/// RESET → INIT once a REQ is out or in (`cm_init_qp_init_attr`): remote writes, and READs
/// and atomics when the responder holds any.
pub(crate) fn init_attr(responder_resources: u8) -> QpAttr {
    let mut access = AccessFlags::REMOTE_WRITE;
    if responder_resources > 0 {
        access |= AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
    }
    QpAttr::init(access)
}

/// The local ACK timeout exponent for a path: 4.096 µs × 2^result ≥ the CA's ACK delay plus
/// a round trip of two packet lifetimes, rounded as the kernel's `cm_ack_timeout` does.
pub(crate) fn ack_timeout(ca_ack_delay: u8, packet_life_time: u8) -> u8 {
    let mut timeout = packet_life_time + 1;
    if timeout >= ca_ack_delay {
        timeout += u8::from(ca_ack_delay >= timeout - 1);
    } else {
        timeout = ca_ack_delay + u8::from(timeout >= ca_ack_delay.saturating_sub(1));
    }
    timeout.min(31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ack_timeout_matches_the_capture() {
        // rxe's CA ACK delay 15 and the RoCE packet lifetime 18 gave 19 in rping_rdmacm.pcap's
        // REQ; the active side recomputes it from the REP's target ACK delay 15 the same way.
        assert_eq!(ack_timeout(15, 18), 19);
        assert_eq!(ack_timeout(15, 19 - 1), 19);
        assert_eq!(ack_timeout(20, 10), 20);
        assert_eq!(ack_timeout(20, 19), 21);
        assert_eq!(ack_timeout(31, 31), 31);
        assert_eq!(ack_timeout(0, 0), 2);
    }
}

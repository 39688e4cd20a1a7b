//! One connection's (or SIDR request's) state, its retransmission and its timer.

use std::time::{Duration, Instant};

use roce_wire::cm::req;
use roce_wire::mad;

use roce_wire::cm::ServiceId;
use roce_wire::Psn;

use super::attrs::QpAttrs;
use super::ids::Gid;

/// Where a connection is in the CM protocol (IBTA Vol 1 ch. 12.9, the kernel's `ib_cm_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnState {
    /// Active: the REQ is out (and resent) until a REP, REJ or the last retry.
    ReqSent,
    /// Active: a REP arrived; waiting for the caller to move its QP and call `establish`.
    RepReceived,
    /// Passive: a REQ arrived; waiting for the caller's `accept` or `reject`.
    ReqReceived,
    /// Passive: a duplicate REQ arrived before the caller decided; an MRA told the peer to wait.
    MraReqSent,
    /// Passive: the REP is out (and resent) until the RTU, or the QP's first packet.
    RepSent,
    /// Both sides may use the QP.
    Established,
    /// The DREQ is out (and resent) until the DREP.
    DreqSent,
    /// Closed; duplicates of the last exchange are still answered until the wait ends.
    TimeWait,
    /// Active SIDR: the SIDR_REQ is out (and resent) until the SIDR_REP.
    SidrReqSent,
    /// Passive SIDR: waiting for the caller's `sidr_reply`.
    SidrReqReceived,
}

/// Who a connection is with, for the peer-identity table: the kernel's timewait and
/// duplicate detection key (remote CA GUID, remote communication ID), or for SIDR, which
/// has no GUID, the sender's GID and request ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum RemoteKey {
    Conn { ca_guid: u64, comm_id: u32 },
    Sidr { gid: Gid, request_id: u32 },
}

/// A MAD that is resent until answered.
#[derive(Debug, Clone)]
pub(crate) struct Outstanding {
    pub mad: [u8; mad::MAD_LEN],
    pub retries_left: u8,
    pub timeout: Duration,
}

#[derive(Debug, Clone)]
pub(crate) struct Connection {
    pub state: ConnState,
    pub local_gid: Gid,
    pub remote_gid: Gid,
    pub service_id: ServiceId,
    pub remote_key: Option<RemoteKey>,
    pub remote_comm_id: u32,
    pub remote_qpn: u32,
    /// Transaction ID of the exchange: the REQ's (both sides), or our DREQ's.
    pub transaction_id: u64,
    /// The REQ, sent (active) or received (passive).
    pub req: Option<req::Repr>,
    /// The MAD that is resent while unanswered.
    pub outstanding: Option<Outstanding>,
    /// The last reply, sent again when the message it answered comes again.
    pub last_reply: Option<[u8; mad::MAD_LEN]>,
    /// Retransmission or time-wait deadline.
    pub deadline: Option<Instant>,
    /// Whether the end of time-wait is reported (connections that were disconnected).
    pub report_timewait_exit: bool,
    /// The local ACK timeout the QP uses, also the time-wait length.
    pub ack_timeout: u8,
    /// Counted against its listener's backlog until accepted or rejected.
    pub pending_on_listener: bool,
    /// Index of `local_gid` in the device's GID table.
    pub sgid_index: u8,
    /// The QP attributes settled by the REP (active) or the accept (passive).
    pub attrs: Option<QpAttrs>,
    /// Passive: the PSN our REP will carry, drawn when the attributes were asked for
    /// before the accept.
    pub reserved_psn: Option<Psn>,
    /// Active: when the peer first rejected our REQ because nobody listened
    /// ([`CmConfig::unlistened_retry`](super::CmConfig::unlistened_retry)).
    pub unlistened_since: Option<Instant>,
}

impl Connection {
    pub(crate) fn new(
        state: ConnState,
        local_gid: Gid,
        remote_gid: Gid,
        service_id: ServiceId,
    ) -> Self {
        Connection {
            state,
            local_gid,
            remote_gid,
            service_id,
            remote_key: None,
            remote_comm_id: 0,
            remote_qpn: 0,
            transaction_id: 0,
            req: None,
            outstanding: None,
            last_reply: None,
            deadline: None,
            report_timewait_exit: false,
            ack_timeout: 0,
            pending_on_listener: false,
            sgid_index: 0,
            attrs: None,
            reserved_psn: None,
            unlistened_since: None,
        }
    }

    /// Starts resending `mad` every `timeout`, `retries` times, after this first send.
    pub(crate) fn send_reliably(
        &mut self,
        now: Instant,
        mad: [u8; mad::MAD_LEN],
        retries: u8,
        timeout: Duration,
    ) {
        self.outstanding = Some(Outstanding {
            mad,
            retries_left: retries,
            timeout,
        });
        self.deadline = Some(now + timeout);
    }

    /// Stops resending.
    pub(crate) fn answered(&mut self) {
        self.outstanding = None;
        self.deadline = None;
    }

    /// Closes the connection until `now + wait`.
    pub(crate) fn enter_timewait(&mut self, now: Instant, wait: Duration, report_exit: bool) {
        self.state = ConnState::TimeWait;
        self.outstanding = None;
        self.deadline = Some(now + wait);
        self.report_timewait_exit = report_exit;
    }
}

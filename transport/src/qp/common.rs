//! What every part of a queue pair shares: its identity and attributes, the packet it
//! hands out, the owner's context it runs in, and the small types of its interface. The
//! roles and the coordinator import this module; it imports none of them.

use std::time::{Duration, Instant};

use roce_wire::aeth::RnrTimer;
use roce_wire::opcode::{Operation, Position, Service, Trailer};
use roce_wire::{bth, ExtRepr, Opcode, Psn};

use crate::counters::Counters;
use crate::cq::{Cq, TmFlags, WcOpcode, WcStatus, WorkCompletion};
use crate::errno;
use crate::mr::{Location, MrTable, PdId};
use crate::qp_state::{AddressVector, PathMtu, QpState, QpType};
use crate::srq::{SrqId, SrqTable};
use crate::wr::UdDest;
use crate::xrc::XrcdId;
use crate::AccessFlags;

/// The CQ slot of a QP that has no such CQ (an XRC target QP's send CQ, and its receive
/// CQ between messages): a completion for it is never made.
pub(crate) const NO_CQ: usize = usize::MAX;

/// Why a post was refused (the call fails; no completion is generated).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PostError {
    /// No QP with that number.
    #[error("no such QP")]
    UnknownQp,
    /// The QP's state does not accept this queue's work yet (RESET, or RESET/INIT for sends).
    #[error("QP state does not allow posting")]
    InvalidState,
    /// The queue already holds `max_send_wr`/`max_recv_wr` requests.
    #[error("work queue full")]
    QueueFull,
    /// More gather/scatter elements than the caps allow.
    #[error("too many scatter/gather elements")]
    TooManySge,
    /// Inline data longer than `max_inline_data`.
    #[error("inline data too long")]
    InlineTooLong,
    /// The QP takes its receives from a shared receive queue (post to the SRQ instead).
    #[error("QP takes its receives from an SRQ")]
    UsesSrq,
    /// An operation this QP type cannot do (READ on UC, WRITE on UD, ...), or a UD send
    /// without a destination.
    #[error("operation not supported on this QP type")]
    UnsupportedOperation,
    /// A message longer than 2^31 bytes, or an atomic whose result buffer is not 8 bytes.
    #[error("invalid length")]
    InvalidLength,
}

impl PostError {
    /// The errno `ibv_post_send`/`ibv_post_recv` fail with (rdma-core's rxe: a full queue
    /// is `ENOMEM`, everything else `EINVAL`).
    pub fn errno(&self) -> i32 {
        match self {
            PostError::QueueFull => errno::ENOMEM,
            _ => errno::EINVAL,
        }
    }
}

/// The attributes a QP has been given through `modify_qp`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct QpConfig {
    pub access: AccessFlags,
    pub qkey: u32,
    pub av: Option<AddressVector>,
    pub mtu: usize,
    pub dest_qpn: u32,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: RnrTimer,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub max_rd_atomic: u8,
}

impl Default for QpConfig {
    fn default() -> Self {
        QpConfig {
            access: AccessFlags::empty(),
            qkey: 0,
            av: None,
            mtu: PathMtu::Mtu1024.bytes(),
            dest_qpn: 0,
            max_dest_rd_atomic: 0,
            min_rnr_timer: RnrTimer::new(0),
            timeout: 0,
            retry_cnt: 0,
            rnr_retry: 0,
            max_rd_atomic: 0,
        }
    }
}

impl QpConfig {
    /// Packets a message of `len` bytes takes, at least one. Every path MTU is a power of
    /// two, so this shifts rather than divides (it runs for every posted request).
    pub fn packets(&self, len: u32) -> u32 {
        debug_assert!(self.mtu.is_power_of_two());
        let len = u64::from(len);
        let mtu = self.mtu as u64;
        ((len + mtu - 1) >> mtu.trailing_zeros()).max(1) as u32
    }

    /// Local ACK timeout: 4.096 µs × 2^timeout; `None` for 0, which means wait forever.
    pub fn ack_timeout(&self) -> Option<Duration> {
        (self.timeout != 0).then(|| Duration::from_nanos(4096 << self.timeout))
    }
}

/// A packet a QP wants sent, before the provider adds Ethernet, IP and UDP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutPacket {
    /// Base transport header.
    pub bth: bth::Repr,
    /// Extension headers.
    pub ext: ExtRepr,
    /// Payload (without pad), when the packet holds its bytes: always from
    /// [`Endpoint::poll_transmit_into`](crate::Endpoint::poll_transmit_into); from
    /// [`Endpoint::poll_transmit_lent`](crate::Endpoint::poll_transmit_lent) only for
    /// what is not in registered memory (CM MADs, and a UC or UD message's last packet).
    pub payload: Vec<u8>,
    /// Where it goes.
    pub av: AddressVector,
    /// Where the payload lies when the packet does not hold it (checked, not copied).
    pub(crate) lent: Option<Lent>,
}

/// Where the payload of a packet lies, for the provider to copy it once, straight into the
/// frame ([`Endpoint::write_payload`](crate::Endpoint::write_payload)). Valid until the
/// endpoint is next changed: the provider writes the packet before anything else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lent {
    /// Bytes `offset..offset + len` of the message of the sending QP's send WQE at `index`
    /// (its inline data, or its gather list, checked).
    Wqe {
        index: usize,
        offset: usize,
        len: usize,
    },
    /// `len` bytes at a checked location (a READ response, or a send's payload that lies
    /// in one region).
    Region { location: Location, len: usize },
}

impl Default for OutPacket {
    /// A blank packet to fill: an ACK for PSN 0 to nowhere, with no payload.
    fn default() -> Self {
        OutPacket {
            bth: bth::Repr::new(Opcode::RcAcknowledge, 0, Psn::new(0)),
            ext: ExtRepr::default(),
            payload: Vec::new(),
            av: NO_ADDRESS,
            lent: None,
        }
    }
}

impl OutPacket {
    /// Becomes `packet`, keeping this packet's payload buffer when `packet` has none, so a
    /// reused packet does not give up its allocation to an ACK.
    pub(crate) fn replace_with(&mut self, packet: OutPacket) {
        if packet.payload.is_empty() {
            let mut buffer = std::mem::take(&mut self.payload);
            buffer.clear();
            *self = OutPacket {
                payload: buffer,
                ..packet
            };
        } else {
            *self = packet;
        }
    }

    /// The payload's length (without pad), whether the packet holds it or it is lent.
    pub fn payload_len(&self) -> usize {
        match self.lent {
            None => self.payload.len(),
            Some(Lent::Wqe { len, .. } | Lent::Region { len, .. }) => len,
        }
    }
}

/// The address of a connected QP that has not been given one yet.
const NO_ADDRESS: AddressVector = AddressVector {
    dgid: [0; 16],
    sgid_index: 0,
    hop_limit: 64,
    traffic_class: 0,
    flow_label: 0,
};

/// Counters of one QP, for tools and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QpStats {
    /// Request packets sent again after a NAK, RNR NAK or timeout.
    pub retransmits: u64,
    /// Local ACK timeouts.
    pub timeouts: u64,
    /// NAKs (sequence, RNR and errors) this QP's responder sent.
    pub naks_sent: u64,
    /// NAKs this QP's completer received.
    pub naks_received: u64,
    /// Incoming packets dropped (wrong state, duplicate responses, ghosts, bad Q_Key...).
    pub dropped: u64,
    /// READ response packets and atomic results this QP's responder sent again, for a
    /// duplicate request (after a response was lost).
    pub responses_resent: u64,
}

/// The requester's retry settings as they are, whoever set them (the program's
/// `ibv_modify_qp` or the CM's moves to RTS): what `ibv_query_qp` reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpRetry {
    /// Local ACK timeout exponent (4.096 µs · 2^timeout; 0 waits forever).
    pub timeout: u8,
    /// Retries after a local ACK timeout or a sequence NAK.
    pub retry_cnt: u8,
    /// Retries after an RNR NAK (7: without end).
    pub rnr_retry: u8,
}

/// Why a QP went to ERR on its own (not through `modify_qp`), for its owner to report as an
/// async event, as an HCA does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// One of its own send work requests failed; its completion carries this status.
    Fatal(WcStatus),
    /// A peer's request broke the protocol; it was NAKed as an invalid request.
    InvalidRequest,
    /// A peer's request broke an access rule; it was NAKed as a remote access error.
    Access,
}

/// What a QP needs from its owner while it runs.
pub(crate) struct Ctx<'a> {
    pub now: Instant,
    pub mrs: &'a mut MrTable,
    pub cqs: &'a mut [Cq],
    pub srqs: &'a mut SrqTable,
    pub counters: &'a mut Counters,
}

/// What every role reads of its QP (who it is, where it completes, its state and what
/// `modify_qp` gave it) and the statistics they all count into. Only the coordinator
/// changes the state and the attributes.
#[derive(Debug)]
pub(crate) struct Common {
    pub qpn: u32,
    pub qp_type: QpType,
    pub pd: PdId,
    pub send_cq: usize,
    pub recv_cq: usize,
    pub state: QpState,
    pub config: QpConfig,
    pub stats: QpStats,
    /// Where its receives come from when not posted to the QP itself (an XRC target QP:
    /// the SRQ of the request being handled).
    pub srq: Option<SrqId>,
    /// The XRC domain of an XRC target QP.
    pub xrcd: Option<XrcdId>,
    /// Which CQs a role's completion found full; the coordinator moves the QP to ERR.
    pub cq_full: FullCqs,
}

/// Which of a QP's CQs a completion found full (when one CQ serves both queues, only `send`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FullCqs {
    pub send: bool,
    pub recv: bool,
}

impl FullCqs {
    pub fn any(self) -> bool {
        self.send || self.recv
    }

    pub fn add(&mut self, other: FullCqs) {
        self.send |= other.send;
        self.recv |= other.recv;
    }
}

impl Common {
    /// The address of a connected QP's peer (UD packets carry their own).
    pub fn connected_av(&self) -> AddressVector {
        self.config.av.unwrap_or(NO_ADDRESS)
    }

    /// Builds a packet to the connected peer.
    pub fn packet(&self, bth: bth::Repr, ext: ExtRepr, payload: Vec<u8>) -> OutPacket {
        OutPacket {
            bth,
            ext,
            payload,
            av: self.connected_av(),
            lent: None,
        }
    }

    /// A BTH to the connected peer with the fields every packet shares.
    pub fn bth(&self, opcode: Opcode, psn: Psn, dest: Option<&UdDest>) -> bth::Repr {
        bth::Repr::new(
            opcode,
            dest.map_or(self.config.dest_qpn, |d| d.remote_qpn),
            psn,
        )
    }

    /// Queues a completion on `cq`; a full CQ is noted in `cq_full`, for the coordinator to
    /// move the QP to ERR once the role returns.
    #[inline(always)]
    pub fn complete(&mut self, ctx: &mut Ctx, cq: usize, completion: WorkCompletion) {
        if !push_completion(ctx, cq, completion) {
            if cq == self.send_cq {
                self.cq_full.send = true;
            } else {
                self.cq_full.recv = true;
            }
        }
    }
}

/// The service of a QP's packets, requests and responses alike.
#[inline]
pub(crate) fn service(qp_type: QpType) -> Service {
    match qp_type {
        QpType::Rc => Service::Rc,
        QpType::Uc => Service::Uc,
        QpType::Ud => Service::Ud,
        QpType::XrcSend | QpType::XrcRecv => Service::Xrc,
    }
}

/// The opcode of a response (or ACK) `operation` at `position` from a responder of
/// `qp_type`: RC's, or XRC's for an XRC target.
#[inline]
pub(crate) fn response_opcode(qp_type: QpType, operation: Operation, position: Position) -> Opcode {
    let rc = Opcode::find(Service::Rc, operation, position, Trailer::None);
    // Both services have every response at every position (the opcode table's tests), so
    // the last fallback is never taken.
    Opcode::find(service(qp_type), operation, position, Trailer::None)
        .or(rc)
        .unwrap_or(Opcode::RcAcknowledge)
}

/// Queues a completion on `cq`, counting received messages as rxe does; `false` when the
/// CQ is full and the completion is lost.
#[inline(always)]
fn push_completion(ctx: &mut Ctx, cq: usize, completion: WorkCompletion) -> bool {
    let received = match completion.opcode {
        WcOpcode::Recv | WcOpcode::RecvRdmaWithImm | WcOpcode::TmNoTag => true,
        // A rendezvous request's match delivers nothing yet: its data's completion counts.
        WcOpcode::TmRecv => completion.tm.flags != TmFlags::MATCH,
        _ => false,
    };
    if received && completion.status == WcStatus::Success {
        ctx.counters.rdma_recvs += 1;
    }
    // NO_CQ is never completed into; if it were, the completion would be lost as on overflow.
    ctx.cqs
        .get_mut(cq)
        .is_some_and(|cq| cq.push(completion).is_ok())
}

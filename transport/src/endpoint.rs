//! One device's worth of verbs objects and the sans-IO interface that drives them.
//!
//! Calling order (the provider's loop, or a simulator's): feed inputs with
//! [`handle_packet`](Endpoint::handle_packet) and [`handle_timeout`](Endpoint::handle_timeout)
//! (and post work whenever), then drain [`poll_transmit`](Endpoint::poll_transmit) until it
//! returns `None`, then sleep until [`poll_timeout`](Endpoint::poll_timeout) or the next
//! packet.
//!
//! QP 1, the GSI, is the endpoint's own once [`enable_cm`](Endpoint::enable_cm) gave it a
//! [`Cm`]: CM MADs it receives (UD SEND_ONLY with Q_Key [`mad::GSI_QKEY`]) go to the CM, the
//! CM's MADs leave from it to the peer's QP 1, and the CM's timers are the endpoint's.

use std::borrow::Borrow;
use std::sync::Arc;
use std::time::Instant;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use roce_wire::frame::{EthernetRepr, IpRepr, Ipv4Repr, Ipv6Repr};
use roce_wire::icrc::Running;
use roce_wire::multicast::{is_multicast_gid, MULTICAST_QPN};
use roce_wire::opcode::Service;
use roce_wire::{bth, cm as wire_cm, deth, mad, ExtRepr, FrameRepr, Opcode, Psn};

use crate::cm::{Cm, CmConfig, MadTransmit};
use crate::congestion::{CongestionConfig, QpRate, RateLimit};

use crate::copy_icrc;
use crate::counters::Counters;
use crate::cq::{Cq, WcStatus};
use crate::errno;
use crate::limits::LIMITS;
use crate::mcast::{McastError, McastTable, Mgid};
use crate::mr::{MrTable, PdId};
use crate::qp::{
    Ctx, Failure, OutPacket, PostError, PostGate, Qp, QpCaps, QpInit, QpRetry, QpStats,
    ResponderBacklog, NO_CQ,
};
use crate::qp_state::{AddressVector, ModifyQpError, PathMtu, QpAttr, QpState, QpType};
use crate::srq::{SrqAttr, SrqError, SrqId, SrqModify, SrqTable, XrcSrq};
use crate::tm::{TagMatching, TmOpError, TmOpWr, TmSrqCaps, TmStats};
use crate::wr::{RecvWr, SendWr};
use crate::xrc::{XrcError, XrcdId, XrcdTable};

/// Identifies a completion queue of an [`Endpoint`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CqId(usize);

/// Why creating a QP failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CreateQpError {
    /// A CQ id that this endpoint did not create.
    #[error("unknown completion queue")]
    UnknownCq,
    /// An SRQ id that names no SRQ of this endpoint.
    #[error("unknown shared receive queue")]
    UnknownSrq,
    /// Every QP number is taken (`max_qp` QPs were created).
    #[error("no QP numbers left")]
    NoQpn,
    /// A queue size or limit beyond the device's (named).
    #[error("{0} beyond the device's limit")]
    InvalidCap(&'static str),
    /// A tag-matching SRQ receives for RC QPs only (`IBV_TM_CAP_RC`).
    #[error("a tag-matching SRQ takes RC QPs only")]
    TagMatchingNeedsRc,
    /// An XRC domain that does not exist.
    #[error("unknown XRC domain")]
    UnknownXrcd,
    /// An XRC QP that would have a receive queue or an SRQ, which XRC QPs have not.
    #[error("an XRC QP with a receive queue or an SRQ")]
    XrcWithReceiveQueue,
}

/// Why destroying a CQ failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DestroyCqError {
    /// No such CQ (or it was destroyed already).
    #[error("unknown completion queue")]
    UnknownCq,
    /// A QP still sends or receives through it.
    #[error("completion queue still used by a QP")]
    InUse,
}

/// Why creating a CQ failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CreateCqError {
    /// A depth of 0 or beyond `max_cqe`.
    #[error("a CQ of {0} entries (1 to max_cqe)")]
    InvalidDepth(usize),
}

impl CreateQpError {
    /// The errno `ibv_create_qp` fails with.
    pub fn errno(&self) -> i32 {
        match self {
            CreateQpError::UnknownCq
            | CreateQpError::UnknownSrq
            | CreateQpError::InvalidCap(_)
            | CreateQpError::TagMatchingNeedsRc
            | CreateQpError::UnknownXrcd
            | CreateQpError::XrcWithReceiveQueue => errno::EINVAL,
            CreateQpError::NoQpn => errno::ENOMEM,
        }
    }
}

impl CreateCqError {
    /// The errno `ibv_create_cq` fails with.
    pub fn errno(&self) -> i32 {
        match self {
            CreateCqError::InvalidDepth(_) => errno::EINVAL,
        }
    }
}

impl DestroyCqError {
    /// The errno `ibv_destroy_cq` fails with.
    pub fn errno(&self) -> i32 {
        match self {
            DestroyCqError::UnknownCq => errno::EINVAL,
            DestroyCqError::InUse => errno::EBUSY,
        }
    }
}

/// Something that happened outside any work request (`ibv_get_async_event`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum AsyncEvent {
    /// A completion found its CQ full; the CQ is unusable and the QP went to ERR
    /// (`IBV_EVENT_CQ_ERR` on the CQ, as rxe raises it).
    CqOverflow {
        /// The CQ that overflowed.
        cq: CqId,
        /// The QP whose completion was lost.
        qpn: u32,
    },
    /// One of the QP's send work requests failed and the QP went to ERR
    /// (`IBV_EVENT_QP_FATAL`); that request's completion carries `status`.
    QpFatal {
        /// The QP.
        qpn: u32,
        /// Why: retries or RNR retries exhausted, a NAK's error, a bad response, a local
        /// protection error.
        status: WcStatus,
    },
    /// A peer's request broke the protocol; the QP NAKed it as an invalid request and went
    /// to ERR (`IBV_EVENT_QP_REQ_ERR`).
    QpRequestError {
        /// The QP.
        qpn: u32,
    },
    /// A peer's request broke an access rule (R_Key, rights, bounds); the QP NAKed it and
    /// went to ERR (`IBV_EVENT_QP_ACCESS_ERR`).
    QpAccessError {
        /// The QP.
        qpn: u32,
    },
    /// A QP on an SRQ entered ERR and takes no more WQEs from it
    /// (`IBV_EVENT_QP_LAST_WQE_REACHED`).
    QpLastWqeReached {
        /// The QP.
        qpn: u32,
    },
    /// Fewer WQEs than the armed limit remain in the SRQ; the limit is disarmed
    /// (`IBV_EVENT_SRQ_LIMIT_REACHED`).
    SrqLimitReached {
        /// The SRQ.
        srq: SrqId,
    },
    /// The port's link came up (`IBV_EVENT_PORT_ACTIVE`). The endpoint has no link: the
    /// device's owner, which watches the interface, raises this and [`PortError`].
    ///
    /// [`PortError`]: AsyncEvent::PortError
    PortActive,
    /// The port's link went down (`IBV_EVENT_PORT_ERR`); raised by the device's owner.
    PortError,
    /// The device is gone for good (its switch died): every QP was moved to ERR, flushing
    /// its work requests (`IBV_EVENT_DEVICE_FATAL`); see [`Endpoint::device_fatal`].
    DeviceFatal,
}

/// A device: its memory regions, CQs and QPs.
#[derive(Debug)]
pub struct Endpoint {
    mrs: MrTable,
    cqs: Vec<Cq>,
    srqs: SrqTable,
    xrcds: XrcdTable,
    qps: QpTable,
    next_qpn: u32,
    /// The last QP number this endpoint may hand out.
    last_qpn: u32,
    /// The block of a shared device's identifiers this endpoint owns, if set.
    id_block: Option<u8>,
    /// Whether [`device_fatal`](Self::device_fatal) happened.
    fatal: bool,
    /// Slot of the QP to look at first in the next `poll_transmit`, so no QP starves the
    /// others.
    transmit_cursor: usize,
    events: Vec<AsyncEvent>,
    /// The port's MTU: the largest UD message, and a connected QP's MTU until RTR sets one.
    port_mtu: PathMtu,
    /// Our addresses (the GID table): a packet to any other destination is dropped. While
    /// empty (until [`set_gids`](Endpoint::set_gids)) every destination is accepted.
    gids: Vec<[u8; 16]>,
    /// The communication manager behind QP 1, once enabled.
    cm: Option<Cm>,
    /// PSN of the next MAD QP 1 sends (UD: only counts, as rxe's does).
    gsi_psn: Psn,
    /// Packets for QPs that do not exist.
    pub unknown_qp_drops: u64,
    /// Packets to QP 1 that are not a CM MAD (wrong opcode, Q_Key, length or class).
    pub gsi_drops: u64,
    /// Packets whose IP destination is not one of our GIDs (another host, broadcast).
    pub misaddressed_drops: u64,
    /// Multicast datagrams to a group no QP of ours is attached to, or not UD.
    pub unknown_group_drops: u64,
    /// The multicast groups and their QPs.
    mcast: McastTable,
    /// rxe's hardware counters.
    counters: Counters,
    /// How QPs take part in congestion control (shared with each QP).
    congestion: Arc<CongestionConfig>,
}

/// The QPs: side by side for the walks of `poll_transmit` and `handle_timeout`, found by
/// number for everything else (a QP's slot changes when another is destroyed).
#[derive(Debug)]
struct QpTable {
    qps: Vec<Qp>,
    /// Indexed by QP number − `base`: the QP's slot + 1, or 0 once it is gone. QP
    /// numbers are handed out in order and never reused, so this is an index rather than a
    /// hash map (a lookup per packet) at 4 bytes per QP ever created.
    slots: Vec<u32>,
    /// The first QP number handed out (`FIRST_QPN`, or the start of the endpoint's block).
    base: u32,
}

impl QpTable {
    fn insert(&mut self, qp: Qp) {
        let index = (qp.common.qpn - self.base) as usize;
        if self.slots.len() <= index {
            self.slots.resize(index + 1, 0);
        }
        self.qps.push(qp);
        self.slots[index] = self.qps.len() as u32;
    }

    fn slot(&self, qpn: u32) -> Option<usize> {
        let index = qpn.checked_sub(self.base)? as usize;
        let slot = *self.slots.get(index)?;
        (slot != 0).then(|| slot as usize - 1)
    }

    fn remove(&mut self, qpn: u32) -> bool {
        let Some(slot) = self.slot(qpn) else {
            return false;
        };
        self.slots[(qpn - self.base) as usize] = 0;
        self.qps.swap_remove(slot);
        if let Some(moved) = self.qps.get(slot) {
            self.slots[(moved.common.qpn - self.base) as usize] = slot as u32 + 1;
        }
        true
    }

    fn get(&self, qpn: u32) -> Option<&Qp> {
        self.slot(qpn).map(|slot| &self.qps[slot])
    }

    fn get_mut(&mut self, qpn: u32) -> Option<&mut Qp> {
        self.slot(qpn).map(|slot| &mut self.qps[slot])
    }
}

/// The first QP number handed out; 0 and 1 are the special QPs.
const FIRST_QPN: u32 = 0x11;
/// QP numbers in one block of a shared device ([`Endpoint::set_id_block`]): the low 16 bits.
pub const QPN_BLOCK_BITS: u32 = 16;

/// Hop limit (IPv4 TTL) of the MADs QP 1 sends, as the kernel's RoCE GSI AHs use.
const GSI_HOP_LIMIT: u8 = 64;

/// A packet to send, from a local QP. The default is a blank one to pass to
/// [`Endpoint::poll_transmit_into`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Transmit {
    /// The sending QP (its UDP source port is derived from it).
    pub src_qpn: u32,
    /// The packet.
    pub packet: OutPacket,
}

impl Transmit {
    /// The IPv4 destination, when the packet's GID is IPv4-mapped (`::ffff:a.b.c.d`).
    pub fn ipv4_destination(&self) -> Option<Ipv4Addr> {
        Ipv6Addr::from(self.packet.av.dgid).to_ipv4_mapped()
    }

    /// The IPv6 destination, when the packet's GID is not IPv4-mapped.
    pub fn ipv6_destination(&self) -> Option<Ipv6Addr> {
        let dgid = Ipv6Addr::from(self.packet.av.dgid);
        dgid.to_ipv4_mapped().is_none().then_some(dgid)
    }

    /// The RoCEv2 frame that carries this packet from `src_mac`/`src_ip` to the MAC
    /// `dst_mac`, over `src_ip`'s IP version; `None` when the packet's GID is of the other
    /// (IPv4-mapped is IPv4). IPv4 as rxe builds it: DF set, identification 0, TTL and
    /// DSCP/ECN from the address vector; IPv6 with traffic class, flow label and hop limit
    /// from it. No UDP checksum (the ICRC covers the packet, and rxe and HCAs send 0), UDP
    /// source port `0xC000 | (qpn & 0x3FFF)` so each QP keeps one ECMP path.
    pub fn frame(
        &self,
        src_mac: [u8; 6],
        src_ip: IpAddr,
        dst_mac: [u8; 6],
    ) -> Option<FrameRepr<'_>> {
        let av = &self.packet.av;
        let ip = match src_ip {
            IpAddr::V4(src) => IpRepr::V4(Ipv4Repr {
                src,
                dst: self.ipv4_destination()?,
                dscp: av.traffic_class >> 2,
                ecn: av.traffic_class & 0x3,
                identification: 0,
                dont_fragment: true,
                ttl: av.hop_limit,
            }),
            IpAddr::V6(src) => IpRepr::V6(Ipv6Repr {
                src,
                dst: self.ipv6_destination()?,
                traffic_class: av.traffic_class,
                flow_label: av.flow_label,
                hop_limit: av.hop_limit,
            }),
        };
        Some(FrameRepr {
            ethernet: EthernetRepr {
                dst: dst_mac,
                src: src_mac,
                vlan: None,
            },
            ip,
            udp_src_port: 0xC000 | (self.src_qpn & 0x3FFF) as u16,
            udp_checksum: false,
            bth: self.packet.bth,
            ext: self.packet.ext,
            payload: &self.packet.payload,
        })
    }
}

impl Endpoint {
    /// An endpoint whose memory keys come from `seed` (use OS entropy outside tests).
    pub fn new(seed: [u8; 32]) -> Self {
        Endpoint {
            mrs: MrTable::new(seed),
            cqs: Vec::new(),
            srqs: SrqTable::default(),
            xrcds: XrcdTable::default(),
            qps: QpTable {
                qps: Vec::new(),
                slots: Vec::new(),
                base: FIRST_QPN,
            },
            next_qpn: FIRST_QPN,
            last_qpn: FIRST_QPN + (LIMITS.max_qp - 1),
            id_block: None,
            fatal: false,
            transmit_cursor: 0,
            events: Vec::new(),
            port_mtu: PathMtu::Mtu1024,
            gids: Vec::new(),
            cm: None,
            gsi_psn: Psn::new(0),
            unknown_qp_drops: 0,
            gsi_drops: 0,
            misaddressed_drops: 0,
            unknown_group_drops: 0,
            mcast: McastTable::default(),
            counters: Counters::default(),
            congestion: Arc::new(CongestionConfig::default()),
        }
    }

    /// How the device takes part in congestion control (ECN, CNPs, DCQCN, selective
    /// repeat).
    pub fn congestion(&self) -> CongestionConfig {
        *self.congestion
    }

    /// Changes at `now` how the device takes part in congestion control, for every QP,
    /// existing or to come.
    pub fn set_congestion(&mut self, now: Instant, config: CongestionConfig) {
        self.congestion = Arc::new(config);
        for qp in &mut self.qps.qps {
            qp.set_congestion(now, self.congestion.clone());
        }
    }

    /// Sets (or, with `None` or a rate of 0, clears) a limit on the rate QP `qpn` sends at,
    /// from `now` (`ibv_modify_qp_rate_limit`, `IBV_QP_RATE_LIMIT`): its pacer lets the
    /// least of the limit and DCQCN's rate through. Refused unless the QP is in RTR, RTS or
    /// SQD.
    pub fn set_rate_limit(
        &mut self,
        now: Instant,
        qpn: u32,
        limit: Option<RateLimit>,
    ) -> Result<(), ModifyQpError> {
        self.qps
            .get_mut(qpn)
            .ok_or(ModifyQpError::OutOfRange("qpn"))?
            .set_rate_limit(now, limit)
    }

    /// The QP's rates (its pacer's, DCQCN's, its limit) as of `now`.
    pub fn qp_rate(&mut self, now: Instant, qpn: u32) -> Option<QpRate> {
        self.qps.get_mut(qpn).map(|qp| qp.rate(now))
    }

    /// The device's counters, with rxe's names and meanings.
    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// Says that the packet [`poll_transmit`](Self::poll_transmit) gave last could not be
    /// sent (no route, or the link refused it): counted in `send_err`, not `sent_pkts`, as
    /// rxe counts a failed transmit.
    pub fn transmit_failed(&mut self) {
        self.counters.sent_pkts = self.counters.sent_pkts.saturating_sub(1);
        self.counters.send_err += 1;
    }

    /// Sets our addresses, the device's GID table (IPv4-mapped GIDs for IPv4): from now on
    /// a packet whose IP destination is none of them is dropped and counted in
    /// [`misaddressed_drops`](Self::misaddressed_drops), as rxe drops a packet not sent to
    /// one of its GIDs. Until then (a bare transport in tests) every destination is ours.
    pub fn set_gids(&mut self, gids: Vec<[u8; 16]>) {
        self.gids = gids;
    }

    /// Whether a frame's IP destination is one of our addresses or a multicast group (which
    /// of our QPs it reaches is the group's business, as rxe's `rxe_chk_dgid` lets every
    /// multicast destination through).
    fn is_for_us(&self, frame: &FrameRepr) -> bool {
        if self.gids.is_empty() {
            return true;
        }
        let destination = destination_gid(frame);
        self.gids.contains(&destination) || is_multicast_gid(&destination)
    }

    /// Gives QP 1 a communication manager (replacing any earlier one and its connections).
    pub fn enable_cm(&mut self, config: CmConfig) {
        let mut cm = Cm::new(config);
        if let Some(block) = self.id_block {
            cm.set_comm_id_block(block);
        }
        self.cm = Some(cm);
    }

    /// Makes this endpoint one of several (processes) on a device, the one that owns
    /// block `block` of its identifiers: QP numbers `block << 16` to `block << 16 | 0xFFFF`
    /// (from 0x11 in block 0), and CM communication IDs whose top byte is `block`. A frame's
    /// destination QPN, or a CM message's ID of ours, then names its endpoint by its top
    /// bits, which is how the device's switch steers it. Only before the first QP; `false`
    /// (and nothing changed) after.
    pub fn set_id_block(&mut self, block: u8) -> bool {
        if self.next_qpn != self.qps.base {
            return false;
        }
        let start = u32::from(block) << QPN_BLOCK_BITS;
        let first = start.max(FIRST_QPN);
        self.qps.base = first;
        self.next_qpn = first;
        self.last_qpn = start | ((1 << QPN_BLOCK_BITS) - 1);
        self.id_block = Some(block);
        if let Some(cm) = &mut self.cm {
            cm.set_comm_id_block(block);
        }
        true
    }

    /// The communication manager behind QP 1, once [enabled](Self::enable_cm): listen,
    /// connect, accept, and take its events. What it sends leaves through
    /// [`poll_transmit`](Self::poll_transmit).
    pub fn cm(&mut self) -> Option<&mut Cm> {
        self.cm.as_mut()
    }

    /// Sets the port's active MTU (1024 until set), as the device reports it: UD QPs created
    /// from now on carry messages up to it.
    pub fn set_port_mtu(&mut self, mtu: PathMtu) {
        self.port_mtu = mtu;
    }

    /// Protection domains and memory regions.
    pub fn mrs(&mut self) -> &mut MrTable {
        &mut self.mrs
    }

    /// Creates a CQ with `depth` slots (1 to `max_cqe`).
    pub fn create_cq(&mut self, depth: usize) -> Result<CqId, CreateCqError> {
        if !LIMITS.allows_cq_depth(depth) {
            return Err(CreateCqError::InvalidDepth(depth));
        }
        self.cqs.push(Cq::new(depth));
        Ok(CqId(self.cqs.len() - 1))
    }

    /// A CQ, to poll or arm. A destroyed CQ's id reaches an empty CQ of depth 0.
    pub fn cq(&mut self, id: CqId) -> &mut Cq {
        &mut self.cqs[id.0]
    }

    /// Whether `id` names a CQ that exists. A destroyed CQ leaves a CQ of depth 0 in its
    /// slot (a depth `create_cq` refuses), so the ids of the others, which QPs hold as
    /// indices, never move, and its id never names another CQ.
    fn cq_exists(&self, id: CqId) -> bool {
        self.cqs.get(id.0).is_some_and(|cq| cq.depth() > 0)
    }

    /// Destroys a CQ that no QP uses (`ibv_destroy_cq`); its completions are dropped.
    pub fn destroy_cq(&mut self, id: CqId) -> Result<(), DestroyCqError> {
        if !self.cq_exists(id) {
            return Err(DestroyCqError::UnknownCq);
        }
        if self.qps.qps.iter().any(|qp| qp.uses_cq(id.0)) || self.srqs.uses_cq(id.0) {
            return Err(DestroyCqError::InUse);
        }
        self.cqs[id.0] = Cq::new(0);
        Ok(())
    }

    /// Creates a QP in RESET and returns its number; its caps must be within the device's
    /// [`LIMITS`].
    pub fn create_qp(
        &mut self,
        init: QpInit,
        send_cq: CqId,
        recv_cq: CqId,
    ) -> Result<u32, CreateQpError> {
        self.create_qp_on(init, send_cq, recv_cq, None)
    }

    /// Creates a QP in RESET that takes its receives from `srq` (`ibv_qp_init_attr.srq`):
    /// its receive caps are not checked, as rxe ignores them, and `post_recv` to it fails.
    pub fn create_qp_with_srq(
        &mut self,
        init: QpInit,
        send_cq: CqId,
        recv_cq: CqId,
        srq: SrqId,
    ) -> Result<u32, CreateQpError> {
        self.create_qp_on(init, send_cq, recv_cq, Some(srq))
    }

    fn create_qp_on(
        &mut self,
        mut init: QpInit,
        send_cq: CqId,
        recv_cq: CqId,
        srq: Option<SrqId>,
    ) -> Result<u32, CreateQpError> {
        if !self.cq_exists(send_cq) || !self.cq_exists(recv_cq) {
            return Err(CreateQpError::UnknownCq);
        }
        if srq.is_some_and(|srq| !self.srqs.exists(srq)) {
            return Err(CreateQpError::UnknownSrq);
        }
        let tagged = srq.is_some_and(|srq| self.srqs.tm(srq).is_some());
        if tagged && init.qp_type != QpType::Rc {
            return Err(CreateQpError::TagMatchingNeedsRc);
        }
        if init.qp_type == QpType::XrcRecv || (init.qp_type == QpType::XrcSend && srq.is_some()) {
            return Err(CreateQpError::XrcWithReceiveQueue);
        }
        if srq.is_some() || init.qp_type == QpType::XrcSend {
            init.caps.max_recv_wr = 0;
            init.caps.max_recv_sge = 0;
        }
        LIMITS
            .check_qp_caps(&init.caps)
            .map_err(CreateQpError::InvalidCap)?;
        if self.next_qpn > self.last_qpn {
            return Err(CreateQpError::NoQpn);
        }
        let qpn = self.next_qpn;
        self.next_qpn += 1;
        let mut qp = Qp::new(qpn, init, send_cq.0, recv_cq.0, self.congestion.clone());
        qp.common.config.mtu = self.port_mtu.bytes();
        qp.common.srq = srq;
        self.qps.insert(qp);
        Ok(qpn)
    }

    /// Creates a shared receive queue (`ibv_create_srq`); `attr.srq_limit` is ignored.
    pub fn create_srq(&mut self, attr: SrqAttr) -> Result<SrqId, SrqError> {
        self.srqs.create(attr)
    }

    /// Creates a tag-matching SRQ (`ibv_create_srq_ex` with `IBV_SRQT_TM`): a shared receive
    /// queue with a list of up to `caps.max_num_tags` tags, changed by
    /// [`post_srq_ops`](Self::post_srq_ops); its list operations and the messages of its QPs
    /// complete in `cq` (see [`tm`](crate::tm)).
    pub fn create_tm_srq(
        &mut self,
        attr: SrqAttr,
        caps: TmSrqCaps,
        cq: CqId,
    ) -> Result<SrqId, SrqError> {
        if !self.cq_exists(cq) {
            return Err(SrqError::InvalidAttr("cq"));
        }
        let tm = TagMatching::new(caps, cq.0).map_err(SrqError::InvalidAttr)?;
        self.srqs.create_tm(attr, tm)
    }

    /// `ibv_post_srq_ops`: runs a list of operations of a tag-matching SRQ in order, now,
    /// telling `each` every one's index and ADD's handle; stops at the first refused and
    /// returns its index with why. A signaled operation's completion is in the SRQ's CQ.
    pub fn post_srq_ops<W: Borrow<TmOpWr>>(
        &mut self,
        srq: SrqId,
        wrs: impl IntoIterator<Item = W>,
        mut each: impl FnMut(usize, Option<u32>),
    ) -> Result<(), (usize, TmOpError)> {
        let tm = (self.srqs.tm_mut(srq)).ok_or((0, TmOpError::NotTagMatching))?;
        tm.begin_list();
        for (index, wr) in wrs.into_iter().enumerate() {
            // The list operations' own QP (mlx5's command QP) has no number here.
            let (handle, completion) = tm.post(wr.borrow(), 0).map_err(|error| (index, error))?;
            if let Some(completion) = completion {
                if self.cqs[tm.cq].push(completion).is_err() {
                    self.events.push(AsyncEvent::CqOverflow {
                        cq: CqId(tm.cq),
                        qpn: 0,
                    });
                }
            }
            each(index, handle);
        }
        Ok(())
    }

    /// What a tag-matching SRQ saw; `None` for any other SRQ.
    pub fn tm_stats(&self, srq: SrqId) -> Option<TmStats> {
        self.srqs.tm(srq).map(|tm| tm.stats)
    }

    /// Opens a new XRC domain (`ibv_open_xrcd`).
    pub fn alloc_xrcd(&mut self) -> XrcdId {
        self.xrcds.alloc()
    }

    /// Closes an XRC domain no XRC SRQ or target QP belongs to (`ibv_close_xrcd`).
    pub fn dealloc_xrcd(&mut self, xrcd: XrcdId) -> Result<(), XrcError> {
        if !self.xrcds.exists(xrcd) {
            return Err(XrcError::UnknownXrcd);
        }
        let has_qp = self.qps.qps.iter().any(|qp| qp.common.xrcd == Some(xrcd));
        if has_qp || self.srqs.uses_xrcd(xrcd) {
            return Err(XrcError::Busy);
        }
        self.xrcds.remove(xrcd)
    }

    /// Creates an XRC SRQ of `xrcd` (`ibv_create_srq_ex` with `IBV_SRQT_XRC`): the receives
    /// of XRC requests naming it, checked in `pd`, completing in `cq`.
    pub fn create_xrc_srq(
        &mut self,
        attr: SrqAttr,
        xrcd: XrcdId,
        cq: CqId,
        pd: PdId,
    ) -> Result<SrqId, SrqError> {
        if !self.xrcds.exists(xrcd) {
            return Err(SrqError::InvalidAttr("xrcd"));
        }
        if !self.cq_exists(cq) {
            return Err(SrqError::InvalidAttr("cq"));
        }
        if !self.mrs.has_pd(pd) {
            return Err(SrqError::InvalidAttr("pd"));
        }
        self.srqs.create_xrc(attr, XrcSrq { xrcd, pd, cq: cq.0 })
    }

    /// The SRQ's number (`ibv_get_srq_num`): what an XRC sender names it by.
    pub fn srq_number(&self, srq: SrqId) -> Result<u32, SrqError> {
        self.srqs.number(srq)
    }

    /// Creates an XRC target QP of `xrcd` in RESET (`ibv_create_qp_ex` with
    /// `IBV_QPT_XRC_RECV`): no PD, CQs or queues of its own, it receives into the XRC SRQs
    /// of its domain that requests name.
    pub fn create_xrc_recv_qp(&mut self, xrcd: XrcdId) -> Result<u32, CreateQpError> {
        if !self.xrcds.exists(xrcd) {
            return Err(CreateQpError::UnknownXrcd);
        }
        if self.next_qpn > self.last_qpn {
            return Err(CreateQpError::NoQpn);
        }
        let qpn = self.next_qpn;
        self.next_qpn += 1;
        let init = QpInit {
            pd: PdId::NONE,
            qp_type: QpType::XrcRecv,
            caps: QpCaps {
                max_send_wr: 0,
                max_recv_wr: 0,
                max_send_sge: 0,
                max_recv_sge: 0,
                max_inline_data: 0,
            },
            sq_sig_all: false,
        };
        let mut qp = Qp::new(qpn, init, NO_CQ, NO_CQ, self.congestion.clone());
        qp.common.config.mtu = self.port_mtu.bytes();
        qp.common.xrcd = Some(xrcd);
        self.qps.insert(qp);
        Ok(qpn)
    }

    /// The XRC domain of an XRC target QP (what `ibv_open_qp` checks); `None` for any other.
    pub fn xrc_recv_xrcd(&self, qpn: u32) -> Option<XrcdId> {
        self.qps.get(qpn).and_then(|qp| qp.common.xrcd)
    }

    /// `ibv_modify_srq`: resizes it or arms its limit.
    pub fn modify_srq(&mut self, srq: SrqId, change: &SrqModify) -> Result<(), SrqError> {
        self.srqs.modify(srq, change)
    }

    /// `ibv_query_srq`.
    pub fn query_srq(&self, srq: SrqId) -> Result<SrqAttr, SrqError> {
        self.srqs.query(srq)
    }

    /// Destroys an SRQ no QP uses (`ibv_destroy_srq`); its WQEs are dropped.
    pub fn destroy_srq(&mut self, srq: SrqId) -> Result<(), SrqError> {
        if self.qps.qps.iter().any(|qp| qp.common.srq == Some(srq)) {
            return Err(SrqError::InUse);
        }
        self.srqs.remove(srq)
    }

    /// `ibv_post_srq_recv` for one work request, copied into the SRQ.
    pub fn post_srq_recv(&mut self, srq: SrqId, wr: &RecvWr) -> Result<(), SrqError> {
        self.srqs.post(srq, wr)
    }

    /// Destroys a QP; packets for it are dropped from now on, and it leaves every multicast
    /// group it was attached to.
    pub fn destroy_qp(&mut self, qpn: u32) -> bool {
        self.mcast.remove_qp(qpn);
        if let Some(qp) = self.qps.get_mut(qpn) {
            qp.abandon_tags(&mut self.srqs);
        }
        self.qps.remove(qpn)
    }

    /// `ibv_attach_mcast`: datagrams to the group `mgid` reach the UD QP `qpn` from now on
    /// (attaching it twice is no change); `true` when this made the group, whose MAC the
    /// interface must now accept.
    pub fn attach_mcast(&mut self, qpn: u32, mgid: Mgid) -> Result<bool, McastError> {
        self.check_mcast(qpn, &mgid)?;
        self.mcast.attach(qpn, mgid)
    }

    /// `ibv_detach_mcast`; `true` when the group is gone with it (its last QP).
    pub fn detach_mcast(&mut self, qpn: u32, mgid: Mgid) -> Result<bool, McastError> {
        self.check_mcast(qpn, &mgid)?;
        self.mcast.detach(qpn, mgid)
    }

    /// ib_core's checks before the driver's (`ib_attach_mcast`): a QP, a multicast GID, UD.
    fn check_mcast(&self, qpn: u32, mgid: &Mgid) -> Result<(), McastError> {
        let qp = self.qps.get(qpn).ok_or(McastError::UnknownQp)?;
        if !is_multicast_gid(mgid) {
            return Err(McastError::NotMulticast);
        }
        if qp.common.qp_type != QpType::Ud {
            return Err(McastError::NotUd);
        }
        Ok(())
    }

    /// The multicast groups a QP of ours is attached to.
    pub fn mcast_groups(&self) -> impl Iterator<Item = &Mgid> {
        self.mcast.groups()
    }

    /// Says whether the host is a member of the group `mgid` at the IP level (it joined it,
    /// as rdma_cm's full-member join does): then a datagram we send to the group also
    /// reaches our own attached QPs, as the kernel loops it back to rxe.
    pub fn set_mcast_loopback(&mut self, mgid: Mgid, member: bool) {
        self.mcast.set_looped(mgid, member);
    }

    /// Whether a datagram we send to `mgid` comes back to our own attached QPs.
    pub fn mcast_loopback(&self, mgid: &Mgid) -> bool {
        self.mcast.is_looped(mgid)
    }

    #[inline]
    fn with_qp<T>(
        &mut self,
        qpn: u32,
        now: Instant,
        f: impl FnOnce(&mut Qp, &mut Ctx) -> T,
    ) -> Option<T> {
        let qp = self.qps.get_mut(qpn)?;
        let mut ctx = Ctx {
            now,
            mrs: &mut self.mrs,
            cqs: &mut self.cqs,
            srqs: &mut self.srqs,
            counters: &mut self.counters,
        };
        let result = f(qp, &mut ctx);
        report_overflow(qp, &mut self.events);
        Some(result)
    }

    /// `ibv_modify_qp`, at time `now` (entering ERR completes work requests).
    pub fn modify_qp(
        &mut self,
        now: Instant,
        qpn: u32,
        attr: &QpAttr,
    ) -> Result<(), ModifyQpError> {
        self.with_qp(qpn, now, |qp, ctx| qp.modify(ctx, attr))
            .unwrap_or(Err(ModifyQpError::OutOfRange("qpn")))
    }

    /// The device is gone for good, as an HCA's fatal error: every QP moves to ERR,
    /// completing its outstanding work requests with flush errors, and
    /// [`AsyncEvent::DeviceFatal`] is raised, once. Nothing will arrive any more.
    pub fn device_fatal(&mut self, now: Instant) {
        if std::mem::replace(&mut self.fatal, true) {
            return;
        }
        let qpns: Vec<u32> = self.qps.qps.iter().map(|qp| qp.common.qpn).collect();
        let error = QpAttr {
            state: Some(QpState::Err),
            ..QpAttr::default()
        };
        for qpn in qpns {
            // Every state may move to ERR.
            let _ = self.modify_qp(now, qpn, &error);
        }
        self.events.push(AsyncEvent::DeviceFatal);
    }

    /// The QP's state, or `None` if it does not exist.
    pub fn qp_state(&self, qpn: u32) -> Option<QpState> {
        self.qps.get(qpn).map(|qp| qp.common.state)
    }

    /// The QP's retry settings, or `None` if it does not exist.
    pub fn qp_retry(&self, qpn: u32) -> Option<QpRetry> {
        self.qps.get(qpn).map(|qp| QpRetry {
            timeout: qp.common.config.timeout,
            retry_cnt: qp.common.config.retry_cnt,
            rnr_retry: qp.common.config.rnr_retry,
        })
    }

    /// What decides whether a post to the QP is accepted now.
    pub fn post_gate(&self, qpn: u32) -> Option<PostGate> {
        self.qps.get(qpn).map(Qp::post_gate)
    }

    /// The QP's counters.
    pub fn qp_stats(&self, qpn: u32) -> Option<QpStats> {
        self.qps.get(qpn).map(|qp| qp.common.stats)
    }

    /// What the QP's responder has queued to send, and its bound.
    pub fn responder_backlog(&self, qpn: u32) -> Option<ResponderBacklog> {
        self.qps.get(qpn).map(Qp::responder_backlog)
    }

    /// `ibv_post_send` for one work request, which is copied into the send queue (as
    /// rdma-core's providers copy a `struct ibv_send_wr` into their ring): the caller keeps
    /// it, to post again or drop.
    #[inline]
    pub fn post_send(&mut self, now: Instant, qpn: u32, wr: &SendWr) -> Result<(), PostError> {
        self.with_qp(qpn, now, |qp, ctx| qp.post_send(ctx, wr))
            .unwrap_or(Err(PostError::UnknownQp))
    }

    /// `ibv_post_recv` for one work request, copied into the receive queue.
    pub fn post_recv(&mut self, now: Instant, qpn: u32, wr: &RecvWr) -> Result<(), PostError> {
        self.with_qp(qpn, now, |qp, ctx| qp.post_recv(ctx, wr))
            .unwrap_or(Err(PostError::UnknownQp))
    }

    /// Feeds one received packet (already parsed and ICRC-checked by the caller).
    pub fn handle_packet(&mut self, now: Instant, frame: &FrameRepr) {
        if !self.is_for_us(frame) {
            tracing::trace!(destination = ?frame.ip, "dropped: not addressed to our GIDs");
            self.misaddressed_drops += 1;
            return;
        }
        if frame.bth.dest_qpn == mad::GSI_QPN {
            self.handle_gsi(now, frame);
            return;
        }
        if frame.bth.dest_qpn == MULTICAST_QPN {
            self.handle_multicast(now, frame);
            return;
        }
        let handled = self.with_qp(frame.bth.dest_qpn, now, |qp, ctx| {
            qp.handle_packet(ctx, frame)
        });
        if handled.is_none() {
            tracing::trace!(qpn = frame.bth.dest_qpn, "dropped: no such QP");
            self.unknown_qp_drops += 1;
        }
    }

    /// A datagram to a multicast group: to each QP attached to it, each checking its own
    /// state and Q_Key, one failing not stopping the others (rxe's `rxe_rcv_mcast_pkt`). The
    /// frame is lent to each in turn: every receive is scattered from the same bytes.
    fn handle_multicast(&mut self, now: Instant, frame: &FrameRepr) {
        let Endpoint {
            qps,
            mrs,
            cqs,
            srqs,
            events,
            counters,
            mcast,
            unknown_group_drops,
            ..
        } = self;
        let members = mcast.members(&destination_gid(frame));
        if members.is_empty() || frame.bth.opcode.service() != Service::Ud {
            tracing::trace!(destination = ?frame.ip, "dropped: multicast to no group of ours");
            *unknown_group_drops += 1;
            return;
        }
        // rxe counts the datagram once, before any QP's Q_Key check; each UD receive
        // counts its own, so the count is put right after.
        let received = counters.rcvd_pkts + 1;
        let mut ctx = Ctx {
            now,
            mrs,
            cqs,
            srqs,
            counters,
        };
        for &qpn in members {
            if let Some(qp) = qps.get_mut(qpn) {
                qp.handle_packet(&mut ctx, frame);
                report_overflow(qp, events);
            }
        }
        ctx.counters.rcvd_pkts = received;
    }

    /// A packet to QP 1: a CM MAD goes to the CM, with the GIDs of its IP header.
    fn handle_gsi(&mut self, now: Instant, frame: &FrameRepr) {
        let Some(cm) = &mut self.cm else {
            self.unknown_qp_drops += 1;
            return;
        };
        let is_cm_mad = frame.bth.opcode == Opcode::UdSendOnly
            && frame.ext.deth.is_some_and(|d| d.qkey == mad::GSI_QKEY)
            && frame.payload.len() >= mad::MAD_LEN
            && frame.payload[1] == wire_cm::MGMT_CLASS;
        if !is_cm_mad {
            tracing::trace!(opcode = ?frame.bth.opcode, "dropped: not a CM MAD on QP 1");
            self.gsi_drops += 1;
            return;
        }
        self.counters.rcvd_pkts += 1;
        let (local_gid, remote_gid) = match frame.ip {
            IpRepr::V4(v4) => (
                v4.dst.to_ipv6_mapped().octets(),
                v4.src.to_ipv6_mapped().octets(),
            ),
            IpRepr::V6(v6) => (v6.dst.octets(), v6.src.octets()),
        };
        cm.handle_mad(now, local_gid, remote_gid, &frame.payload[..mad::MAD_LEN]);
    }

    /// Runs every timer due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        if let Some(cm) = &mut self.cm {
            if cm.poll_timeout().is_some_and(|deadline| deadline <= now) {
                cm.handle_timeout(now);
            }
        }
        let Endpoint {
            qps,
            mrs,
            cqs,
            srqs,
            events,
            counters,
            ..
        } = self;
        let mut ctx = Ctx {
            now,
            mrs,
            cqs,
            srqs,
            counters,
        };
        for qp in &mut qps.qps {
            if qp.next_timeout().is_some_and(|deadline| deadline <= now) {
                qp.handle_timeout(&mut ctx);
                report_overflow(qp, events);
            }
        }
    }

    /// The next packet to send, taking QPs in turn.
    /// [`poll_transmit_into`](Self::poll_transmit_into) is the same without a fresh
    /// allocation per packet.
    pub fn poll_transmit(&mut self, now: Instant) -> Option<Transmit> {
        let mut transmit = Transmit::default();
        self.poll_transmit_into(now, &mut transmit)
            .then_some(transmit)
    }

    /// Writes the next packet to send into `out`, taking QPs in turn; `false` when no QP has
    /// anything to send (`out` is then unspecified). `out`'s payload buffer is reused, so a
    /// caller that keeps one `Transmit` for its sends allocates nothing per packet. The CM's
    /// MADs go first: they are few, and a connection waits on them.
    pub fn poll_transmit_into(&mut self, now: Instant, out: &mut Transmit) -> bool {
        let found = self.poll_transmit_lent(now, out);
        if found {
            self.materialize(out);
        }
        found
    }

    /// [`poll_transmit_into`](Self::poll_transmit_into), except that a payload in
    /// registered memory (a request's data, a READ response) stays where it is, checked:
    /// the caller sizes the frame with [`OutPacket::payload_len`] and copies the payload
    /// once, straight into it, with [`write_payload`](Self::write_payload), before it
    /// changes the endpoint in any other way. A packet it must keep for later (its link
    /// was busy) it first makes hold its bytes ([`materialize`](Self::materialize)).
    pub fn poll_transmit_lent(&mut self, now: Instant, out: &mut Transmit) -> bool {
        if let Some(transmit) = self.cm.as_mut().and_then(Cm::poll_transmit) {
            self.gsi_packet(&transmit, out);
            self.counters.sent_pkts += 1;
            return true;
        }
        // From the cursor to the end, then from the start to the cursor, borrowing the QPs
        // and what they need side by side.
        let start = self.transmit_cursor.min(self.qps.qps.len());
        let Endpoint {
            qps,
            mrs,
            cqs,
            srqs,
            events,
            transmit_cursor,
            counters,
            ..
        } = self;
        let mut ctx = Ctx {
            now,
            mrs,
            cqs,
            srqs,
            counters,
        };
        let (before, after) = qps.qps.split_at_mut(start);
        let mut slot = start;
        let found = after.iter_mut().chain(before).any(|qp| {
            let found = qp.poll_packet(&mut ctx, &mut out.packet);
            report_overflow(qp, events);
            if found {
                out.src_qpn = qp.common.qpn;
            } else {
                slot += 1;
            }
            found
        });
        if found {
            *transmit_cursor = slot % qps.qps.len() + 1;
            ctx.counters.sent_pkts += 1;
        }
        found
    }

    /// Copies the payload of `transmit`, the packet [`poll_transmit_lent`] gave last, into
    /// `out` (of its [`payload_len`](OutPacket::payload_len)) and returns the frame's `icrc`
    /// continued over it: from the sending QP's registered memory when it is lent, else
    /// from the packet. `None` if it cannot be read (never for a packet just given: it was
    /// checked).
    ///
    /// [`poll_transmit_lent`]: Self::poll_transmit_lent
    pub fn write_payload(
        &self,
        transmit: &Transmit,
        out: &mut [u8],
        icrc: Running,
    ) -> Option<Running> {
        let packet = &transmit.packet;
        let Some(lent) = packet.lent else {
            let bytes = packet.payload.get(..out.len())?;
            return Some(copy_icrc::copy_slice(out, bytes, icrc));
        };
        let qp = self.qps.get(transmit.src_qpn)?;
        qp.write_payload(&self.mrs, lent, out, icrc).ok()
    }

    /// Makes `transmit` (the packet [`poll_transmit_lent`](Self::poll_transmit_lent) gave
    /// last) hold its payload's bytes, to be sent later.
    pub fn materialize(&self, transmit: &mut Transmit) {
        if let Some(qp) = self.qps.get(transmit.src_qpn) {
            qp.materialize(&self.mrs, &mut transmit.packet);
        }
    }

    /// A CM MAD as QP 1 sends it: UD SEND_ONLY to the peer's QP 1, P_Key 0xFFFF, DETH with
    /// the GSI Q_Key, from the GID the CM names (index 0 if it is not in our table).
    fn gsi_packet(&mut self, transmit: &MadTransmit, out: &mut Transmit) {
        let psn = self.gsi_psn;
        self.gsi_psn = psn + 1;
        let sgid_index = self
            .gids
            .iter()
            .position(|gid| *gid == transmit.local_gid)
            .unwrap_or(0);
        out.src_qpn = mad::GSI_QPN;
        let packet = &mut out.packet;
        packet.bth = bth::Repr {
            opcode: Opcode::UdSendOnly,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            pkey: mad::DEFAULT_PKEY,
            fecn: false,
            becn: false,
            dest_qpn: mad::GSI_QPN,
            ack_req: false,
            resv7: 0,
            psn,
        };
        packet.ext = ExtRepr {
            deth: Some(deth::Repr {
                qkey: mad::GSI_QKEY,
                src_qpn: mad::GSI_QPN,
            }),
            ..ExtRepr::default()
        };
        packet.payload.clear();
        packet.payload.extend_from_slice(&transmit.mad);
        packet.lent = None;
        packet.av = AddressVector {
            dgid: transmit.remote_gid,
            sgid_index: u8::try_from(sgid_index).unwrap_or(0),
            hop_limit: GSI_HOP_LIMIT,
            traffic_class: 0,
            flow_label: 0,
        };
    }

    /// The earliest timer deadline of any QP or of the CM.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let cm = self.cm.as_ref().and_then(Cm::poll_timeout);
        self.qps
            .qps
            .iter()
            .filter_map(Qp::next_timeout)
            .chain(cm)
            .min()
    }

    /// Takes the async events that happened since the last call.
    pub fn take_events(&mut self) -> Vec<AsyncEvent> {
        let limits = self.srqs.take_limit_events();
        self.events
            .extend(limits.map(|srq| AsyncEvent::SrqLimitReached { srq }));
        std::mem::take(&mut self.events)
    }
}

/// A frame's IP destination as a GID (IPv4-mapped for IPv4).
fn destination_gid(frame: &FrameRepr) -> [u8; 16] {
    match frame.ip {
        IpRepr::V4(v4) => v4.dst.to_ipv6_mapped().octets(),
        IpRepr::V6(v6) => v6.dst.octets(),
    }
}

/// Turns a QP's lost completion, and why it went to ERR, into the async events that report
/// them.
#[inline]
fn report_overflow(qp: &mut Qp, events: &mut Vec<AsyncEvent>) {
    let full = std::mem::take(&mut qp.cq_overflowed);
    for (lost, cq) in [
        (full.send, qp.common.send_cq),
        (full.recv, qp.common.recv_cq),
    ] {
        if lost {
            events.push(AsyncEvent::CqOverflow {
                cq: CqId(cq),
                qpn: qp.common.qpn,
            });
        }
    }
    if let Some(failure) = qp.failure.take() {
        let qpn = qp.common.qpn;
        events.push(match failure {
            Failure::Fatal(status) => AsyncEvent::QpFatal { qpn, status },
            Failure::InvalidRequest => AsyncEvent::QpRequestError { qpn },
            Failure::Access => AsyncEvent::QpAccessError { qpn },
        });
    }
    if std::mem::take(&mut qp.last_wqe_reached) {
        events.push(AsyncEvent::QpLastWqeReached { qpn: qp.common.qpn });
    }
}

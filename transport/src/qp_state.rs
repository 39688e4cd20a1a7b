//! The QP state machine and the attributes each transition takes, as `ibv_modify_qp` (and the
//! kernel's `ib_modify_qp_is_ok` table) define them for RC, UC, UD and both XRC halves.
//!
//! Alternate paths, path migration and SQD async notification are not supported, so the
//! attributes that only they use do not exist here.

use core::fmt;

use roce_wire::aeth::RnrTimer;
use roce_wire::Psn;

use crate::access::AccessFlags;
use crate::errno;
use crate::limits::LIMITS;

/// The transport service of a QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpType {
    /// Reliable connection.
    Rc,
    /// Unreliable connection.
    Uc,
    /// Unreliable datagram.
    Ud,
    /// XRC initiator (`IBV_QPT_XRC_SEND`): the requester half of an XRC connection; each
    /// send names the XRC SRQ it is for.
    XrcSend,
    /// XRC target (`IBV_QPT_XRC_RECV`): the responder half, in an XRC domain; each request
    /// is received into (and checked against the PD of) the XRC SRQ it names.
    XrcRecv,
}

impl QpType {
    /// Whether its connection is reliable (acknowledged, retried): RC and both XRC halves.
    pub const fn is_reliable(self) -> bool {
        !matches!(self, QpType::Uc | QpType::Ud)
    }
}

/// A QP state, as `enum ibv_qp_state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpState {
    /// Just created or reset: nothing may be posted.
    Reset,
    /// Receives may be posted; nothing is processed.
    Init,
    /// Ready to receive.
    Rtr,
    /// Ready to send.
    Rts,
    /// Send queue drained.
    Sqd,
    /// Send queue error (UC and UD only).
    Sqe,
    /// Error: every outstanding work request is flushed.
    Err,
}

/// An IB path MTU, as `enum ibv_mtu`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PathMtu {
    /// 256 bytes.
    Mtu256 = 1,
    /// 512 bytes.
    Mtu512 = 2,
    /// 1024 bytes.
    Mtu1024 = 3,
    /// 2048 bytes.
    Mtu2048 = 4,
    /// 4096 bytes.
    Mtu4096 = 5,
}

impl PathMtu {
    /// The MTU of an IB path MTU code (`enum ibv_mtu`, a CM message's path MTU field), if the
    /// code is one.
    pub const fn from_code(code: u32) -> Option<PathMtu> {
        Some(match code {
            1 => PathMtu::Mtu256,
            2 => PathMtu::Mtu512,
            3 => PathMtu::Mtu1024,
            4 => PathMtu::Mtu2048,
            5 => PathMtu::Mtu4096,
            _ => return None,
        })
    }

    /// Payload bytes per packet.
    pub const fn bytes(self) -> usize {
        128 << self as usize
    }
}

/// Where a connected QP's packets go: the destination GID and the IP header fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddressVector {
    /// Destination GID (an IPv4-mapped GID for RoCEv2 over IPv4).
    pub dgid: [u8; 16],
    /// Index of our GID to send from.
    pub sgid_index: u8,
    /// IP TTL / hop limit.
    pub hop_limit: u8,
    /// IP traffic class (DSCP and ECN).
    pub traffic_class: u8,
    /// IPv6 flow label.
    pub flow_label: u32,
}

/// Attributes for one `modify_qp` call: `Some` fields are the attribute mask.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QpAttr {
    /// The state to move to (`IBV_QP_STATE`); `None` keeps the current state.
    pub state: Option<QpState>,
    /// The state the caller believes the QP is in (`IBV_QP_CUR_STATE`).
    pub cur_state: Option<QpState>,
    /// Partition key index.
    pub pkey_index: Option<u16>,
    /// Port number (1).
    pub port_num: Option<u8>,
    /// Remote access the QP allows.
    pub access_flags: Option<AccessFlags>,
    /// UD queue key.
    pub qkey: Option<u32>,
    /// Destination address (connected QPs).
    pub av: Option<AddressVector>,
    /// Path MTU.
    pub path_mtu: Option<PathMtu>,
    /// Destination QP number (24 bits).
    pub dest_qp_num: Option<u32>,
    /// Expected PSN of the first incoming request.
    pub rq_psn: Option<Psn>,
    /// Incoming RDMA READs and atomics the responder holds at once.
    pub max_dest_rd_atomic: Option<u8>,
    /// RNR NAK timer the responder sends.
    pub min_rnr_timer: Option<RnrTimer>,
    /// PSN of the first request sent.
    pub sq_psn: Option<Psn>,
    /// Local ACK timeout exponent: 4.096 µs × 2^timeout (0 = infinite).
    pub timeout: Option<u8>,
    /// Transport retries (0–7).
    pub retry_cnt: Option<u8>,
    /// RNR retries (0–7; 7 = infinite).
    pub rnr_retry: Option<u8>,
    /// Outgoing RDMA READs and atomics in flight at once.
    pub max_rd_atomic: Option<u8>,
}

/// Why `modify_qp` refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ModifyQpError {
    /// No such transition for this QP type.
    #[error("{qp_type:?} QP cannot go from {from:?} to {to:?}")]
    InvalidTransition {
        /// The QP type.
        qp_type: QpType,
        /// The current state.
        from: QpState,
        /// The requested state.
        to: QpState,
    },
    /// The transition requires attributes the call did not give.
    #[error("{from:?} -> {to:?} requires {missing}")]
    MissingAttributes {
        /// The current state.
        from: QpState,
        /// The requested state.
        to: QpState,
        /// The absent attributes.
        missing: Attrs,
    },
    /// The call gave attributes this transition does not take.
    #[error("{from:?} -> {to:?} does not take {extra}")]
    UnexpectedAttributes {
        /// The current state.
        from: QpState,
        /// The requested state.
        to: QpState,
        /// The attributes not allowed here.
        extra: Attrs,
    },
    /// `cur_state` does not match the QP's state.
    #[error("QP is in {actual:?}, not {claimed:?}")]
    WrongCurrentState {
        /// The state the caller named.
        claimed: QpState,
        /// The QP's state.
        actual: QpState,
    },
    /// An attribute's value is out of range.
    #[error("{0} out of range")]
    OutOfRange(&'static str),
}

impl ModifyQpError {
    /// The errno `ibv_modify_qp` fails with: every refusal is `EINVAL`, as in rxe and the
    /// kernel's `ib_modify_qp_is_ok`.
    pub fn errno(&self) -> i32 {
        errno::EINVAL
    }
}

bitflags::bitflags! {
    /// A set of QP attributes, named as `enum ibv_qp_attr_mask` names them.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct Attrs: u32 {
        /// `IBV_QP_CUR_STATE`.
        const CUR_STATE = 1 << 1;
        /// `IBV_QP_ACCESS_FLAGS`.
        const ACCESS_FLAGS = 1 << 3;
        /// `IBV_QP_PKEY_INDEX`.
        const PKEY_INDEX = 1 << 4;
        /// `IBV_QP_PORT`.
        const PORT = 1 << 5;
        /// `IBV_QP_QKEY`.
        const QKEY = 1 << 6;
        /// `IBV_QP_AV`.
        const AV = 1 << 7;
        /// `IBV_QP_PATH_MTU`.
        const PATH_MTU = 1 << 8;
        /// `IBV_QP_TIMEOUT`.
        const TIMEOUT = 1 << 9;
        /// `IBV_QP_RETRY_CNT`.
        const RETRY_CNT = 1 << 10;
        /// `IBV_QP_RNR_RETRY`.
        const RNR_RETRY = 1 << 11;
        /// `IBV_QP_RQ_PSN`.
        const RQ_PSN = 1 << 12;
        /// `IBV_QP_MAX_QP_RD_ATOMIC`.
        const MAX_QP_RD_ATOMIC = 1 << 13;
        /// `IBV_QP_MIN_RNR_TIMER`.
        const MIN_RNR_TIMER = 1 << 15;
        /// `IBV_QP_SQ_PSN`.
        const SQ_PSN = 1 << 16;
        /// `IBV_QP_MAX_DEST_RD_ATOMIC`.
        const MAX_DEST_RD_ATOMIC = 1 << 17;
        /// `IBV_QP_DEST_QPN`.
        const DEST_QPN = 1 << 20;
    }
}

impl fmt::Display for Attrs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        bitflags::parser::to_writer(self, f)
    }
}

impl QpAttr {
    /// RESET → INIT on P_Key index 0 of port 1 with `access`, as rdma-core's examples and
    /// the kernel's CM make it.
    pub fn init(access: AccessFlags) -> QpAttr {
        QpAttr {
            state: Some(QpState::Init),
            pkey_index: Some(0),
            port_num: Some(1),
            access_flags: Some(access),
            ..QpAttr::default()
        }
    }

    /// The attribute mask these fields amount to (without `state`).
    pub fn mask(&self) -> Attrs {
        let fields = [
            (self.cur_state.is_some(), Attrs::CUR_STATE),
            (self.access_flags.is_some(), Attrs::ACCESS_FLAGS),
            (self.pkey_index.is_some(), Attrs::PKEY_INDEX),
            (self.port_num.is_some(), Attrs::PORT),
            (self.qkey.is_some(), Attrs::QKEY),
            (self.av.is_some(), Attrs::AV),
            (self.path_mtu.is_some(), Attrs::PATH_MTU),
            (self.timeout.is_some(), Attrs::TIMEOUT),
            (self.retry_cnt.is_some(), Attrs::RETRY_CNT),
            (self.rnr_retry.is_some(), Attrs::RNR_RETRY),
            (self.rq_psn.is_some(), Attrs::RQ_PSN),
            (self.max_rd_atomic.is_some(), Attrs::MAX_QP_RD_ATOMIC),
            (self.min_rnr_timer.is_some(), Attrs::MIN_RNR_TIMER),
            (self.sq_psn.is_some(), Attrs::SQ_PSN),
            (self.max_dest_rd_atomic.is_some(), Attrs::MAX_DEST_RD_ATOMIC),
            (self.dest_qp_num.is_some(), Attrs::DEST_QPN),
        ];
        fields
            .iter()
            .filter(|(present, _)| *present)
            .fold(Attrs::empty(), |mask, (_, a)| mask | *a)
    }
}

/// Required and optional attributes of one transition, or `None` when it does not exist.
fn transition_attrs(qp_type: QpType, from: QpState, to: QpState) -> Option<(Attrs, Attrs)> {
    use QpState::*;
    use QpType::*;
    let none = Attrs::empty();
    // Attributes a connected QP's responder and requester may tune while sending.
    let rts_tunable = |qp_type| match qp_type {
        Ud => Attrs::CUR_STATE | Attrs::QKEY,
        Uc | XrcSend => Attrs::CUR_STATE | Attrs::ACCESS_FLAGS,
        Rc | XrcRecv => Attrs::CUR_STATE | Attrs::ACCESS_FLAGS | Attrs::MIN_RNR_TIMER,
    };
    let init_attrs = match qp_type {
        Ud => Attrs::PKEY_INDEX | Attrs::PORT | Attrs::QKEY,
        Uc | Rc | XrcSend | XrcRecv => Attrs::PKEY_INDEX | Attrs::PORT | Attrs::ACCESS_FLAGS,
    };
    Some(match (from, to) {
        (_, Reset) | (_, Err) => (none, none),
        (Reset, Init) => (init_attrs, none),
        (Init, Init) => (none, init_attrs),
        (Init, Rtr) => match qp_type {
            Ud => (none, Attrs::PKEY_INDEX | Attrs::QKEY),
            Uc | XrcSend => (
                Attrs::AV | Attrs::PATH_MTU | Attrs::DEST_QPN | Attrs::RQ_PSN,
                Attrs::ACCESS_FLAGS | Attrs::PKEY_INDEX,
            ),
            Rc | XrcRecv => (
                Attrs::AV
                    | Attrs::PATH_MTU
                    | Attrs::DEST_QPN
                    | Attrs::RQ_PSN
                    | Attrs::MAX_DEST_RD_ATOMIC
                    | Attrs::MIN_RNR_TIMER,
                Attrs::ACCESS_FLAGS | Attrs::PKEY_INDEX,
            ),
        },
        (Rtr, Rts) => match qp_type {
            Ud | Uc => (Attrs::SQ_PSN, rts_tunable(qp_type)),
            XrcRecv => (Attrs::SQ_PSN | Attrs::TIMEOUT, rts_tunable(qp_type)),
            Rc | XrcSend => (
                Attrs::SQ_PSN
                    | Attrs::TIMEOUT
                    | Attrs::RETRY_CNT
                    | Attrs::RNR_RETRY
                    | Attrs::MAX_QP_RD_ATOMIC,
                rts_tunable(qp_type),
            ),
        },
        (Rts, Rts) | (Sqd, Rts) => (none, rts_tunable(qp_type)),
        (Rts, Sqd) => (none, none),
        (Sqd, Sqd) => match qp_type {
            Ud => (none, Attrs::PKEY_INDEX | Attrs::QKEY),
            Uc => (none, Attrs::AV | Attrs::ACCESS_FLAGS | Attrs::PKEY_INDEX),
            Rc => (
                none,
                Attrs::PORT
                    | Attrs::AV
                    | Attrs::TIMEOUT
                    | Attrs::RETRY_CNT
                    | Attrs::RNR_RETRY
                    | Attrs::MAX_QP_RD_ATOMIC
                    | Attrs::MAX_DEST_RD_ATOMIC
                    | Attrs::ACCESS_FLAGS
                    | Attrs::PKEY_INDEX
                    | Attrs::MIN_RNR_TIMER,
            ),
            XrcSend => (
                none,
                Attrs::PORT
                    | Attrs::AV
                    | Attrs::TIMEOUT
                    | Attrs::RETRY_CNT
                    | Attrs::RNR_RETRY
                    | Attrs::MAX_QP_RD_ATOMIC
                    | Attrs::ACCESS_FLAGS
                    | Attrs::PKEY_INDEX,
            ),
            XrcRecv => (
                none,
                Attrs::PORT
                    | Attrs::AV
                    | Attrs::TIMEOUT
                    | Attrs::MAX_DEST_RD_ATOMIC
                    | Attrs::ACCESS_FLAGS
                    | Attrs::PKEY_INDEX
                    | Attrs::MIN_RNR_TIMER,
            ),
        },
        (Sqe, Rts) if matches!(qp_type, Uc | Ud) => (none, rts_tunable(qp_type)),
        _ => return None,
    })
}

/// Checks one `modify_qp` call on a QP of `qp_type` in state `from`, and returns the state it
/// leads to. Nothing changes on error.
pub fn check_modify(
    qp_type: QpType,
    from: QpState,
    attr: &QpAttr,
) -> Result<QpState, ModifyQpError> {
    if let Some(claimed) = attr.cur_state.filter(|&claimed| claimed != from) {
        return Err(ModifyQpError::WrongCurrentState {
            claimed,
            actual: from,
        });
    }
    let to = attr.state.unwrap_or(from);
    let (required, optional) = transition_attrs(qp_type, from, to)
        .ok_or(ModifyQpError::InvalidTransition { qp_type, from, to })?;
    let given = attr.mask();
    let missing = required - given;
    if !missing.is_empty() {
        return Err(ModifyQpError::MissingAttributes { from, to, missing });
    }
    let extra = given - required - optional;
    if !extra.is_empty() {
        return Err(ModifyQpError::UnexpectedAttributes { from, to, extra });
    }
    check_ranges(attr)?;
    Ok(to)
}

fn check_ranges(attr: &QpAttr) -> Result<(), ModifyQpError> {
    let out_of_range = [
        ("port_num", attr.port_num.is_some_and(|port| port != 1)),
        (
            "pkey_index",
            attr.pkey_index
                .is_some_and(|index| index >= LIMITS.max_pkeys),
        ),
        (
            "dest_qp_num",
            attr.dest_qp_num.is_some_and(|qpn| qpn > 0xFF_FFFF),
        ),
        ("timeout", attr.timeout.is_some_and(|t| t > 31)),
        ("retry_cnt", attr.retry_cnt.is_some_and(|n| n > 7)),
        ("rnr_retry", attr.rnr_retry.is_some_and(|n| n > 7)),
        (
            "max_rd_atomic",
            attr.max_rd_atomic
                .is_some_and(|n| n > LIMITS.max_qp_init_rd_atom),
        ),
        (
            "max_dest_rd_atomic",
            attr.max_dest_rd_atomic
                .is_some_and(|n| n > LIMITS.max_qp_rd_atom),
        ),
        (
            "flow_label",
            attr.av.is_some_and(|av| av.flow_label > 0xF_FFFF),
        ),
    ];
    match out_of_range.iter().find(|(_, bad)| *bad) {
        Some((name, _)) => Err(ModifyQpError::OutOfRange(name)),
        None => Ok(()),
    }
}

/// The retry behaviour of a connected QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryConfig {
    /// Local ACK timeout exponent.
    pub timeout: u8,
    /// Transport retries.
    pub retry_cnt: u8,
    /// RNR retries (7 = forever).
    pub rnr_retry: u8,
    /// RNR timer the responder asks for.
    pub min_rnr_timer: RnrTimer,
}

impl RetryConfig {
    /// What `ibv_rc_pingpong` and perftest use: a 67 ms ACK timeout, 7 retries, RNR retries
    /// forever, a 0.64 ms RNR timer.
    pub const RC_PINGPONG: RetryConfig = RetryConfig {
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        min_rnr_timer: RnrTimer::new(12),
    };
}

impl Default for RetryConfig {
    /// rc_pingpong's counts with a 0.5 ms ACK timeout and a 10 µs RNR timer: for fast links
    /// (the simulator, veth).
    fn default() -> Self {
        RetryConfig {
            timeout: 7,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: RnrTimer::new(1),
        }
    }
}

/// The peer a connected QP talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    /// How to reach it.
    pub av: AddressVector,
    /// Its QP number.
    pub qpn: u32,
    /// The PSN of its first request (our `rq_psn`).
    pub psn: Psn,
}

/// Most READs and atomics a connected QP made by [`connect_attrs`] keeps outstanding, either way.
pub const CONNECT_RD_ATOMIC: u8 = 16;

/// The three `modify_qp` calls (to INIT, RTR, RTS) that connect an RC, UC or XRC QP to
/// `peer`, as rc_pingpong makes them (an XRC initiator to a target, or the reverse, with
/// the attributes each half takes); the QP allows every remote access its type can have.
pub fn connect_attrs(
    qp_type: QpType,
    peer: Peer,
    sq_psn: Psn,
    mtu: PathMtu,
    retry: RetryConfig,
) -> [QpAttr; 3] {
    let responds = matches!(qp_type, QpType::Rc | QpType::XrcRecv);
    let requests = matches!(qp_type, QpType::Rc | QpType::XrcSend);
    let access = if qp_type == QpType::Uc {
        AccessFlags::REMOTE_WRITE
    } else {
        AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC
    };
    [
        QpAttr::init(access),
        QpAttr {
            state: Some(QpState::Rtr),
            av: Some(peer.av),
            path_mtu: Some(mtu),
            dest_qp_num: Some(peer.qpn),
            rq_psn: Some(peer.psn),
            max_dest_rd_atomic: responds.then_some(CONNECT_RD_ATOMIC),
            min_rnr_timer: responds.then_some(retry.min_rnr_timer),
            ..QpAttr::default()
        },
        QpAttr {
            state: Some(QpState::Rts),
            sq_psn: Some(sq_psn),
            timeout: qp_type.is_reliable().then_some(retry.timeout),
            retry_cnt: requests.then_some(retry.retry_cnt),
            rnr_retry: requests.then_some(retry.rnr_retry),
            max_rd_atomic: requests.then_some(CONNECT_RD_ATOMIC),
            ..QpAttr::default()
        },
    ]
}

/// The three `modify_qp` calls that bring a UD QP to RTS with `qkey`.
pub fn ud_attrs(qkey: u32, sq_psn: Psn) -> [QpAttr; 3] {
    [
        QpAttr {
            state: Some(QpState::Init),
            pkey_index: Some(0),
            port_num: Some(1),
            qkey: Some(qkey),
            ..QpAttr::default()
        },
        QpAttr {
            state: Some(QpState::Rtr),
            ..QpAttr::default()
        },
        QpAttr {
            state: Some(QpState::Rts),
            sq_psn: Some(sq_psn),
            ..QpAttr::default()
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn to_init(qp_type: QpType) -> QpAttr {
        QpAttr {
            state: Some(QpState::Init),
            pkey_index: Some(0),
            port_num: Some(1),
            access_flags: (qp_type != QpType::Ud).then_some(AccessFlags::REMOTE_WRITE),
            qkey: (qp_type == QpType::Ud).then_some(0x1111_1111),
            ..QpAttr::default()
        }
    }

    fn rc_to_rtr() -> QpAttr {
        QpAttr {
            state: Some(QpState::Rtr),
            av: Some(AddressVector {
                dgid: [0; 16],
                sgid_index: 1,
                hop_limit: 64,
                traffic_class: 0,
                flow_label: 0,
            }),
            path_mtu: Some(PathMtu::Mtu1024),
            dest_qp_num: Some(0x11),
            rq_psn: Some(Psn::new(0x18_d6b8)),
            max_dest_rd_atomic: Some(1),
            min_rnr_timer: Some(RnrTimer::new(12)),
            ..QpAttr::default()
        }
    }

    fn rc_to_rts() -> QpAttr {
        QpAttr {
            state: Some(QpState::Rts),
            sq_psn: Some(Psn::new(0xaba3f6)),
            timeout: Some(14),
            retry_cnt: Some(7),
            rnr_retry: Some(7),
            max_rd_atomic: Some(1),
            ..QpAttr::default()
        }
    }

    /// The sequence rc_pingpong performs, with its defaults.
    #[test]
    fn rc_pingpong_sequence_is_accepted() {
        use QpState::*;
        let mut state = Reset;
        for attr in [to_init(QpType::Rc), rc_to_rtr(), rc_to_rts()] {
            state = check_modify(QpType::Rc, state, &attr).unwrap();
        }
        assert_eq!(state, Rts);
        assert_eq!(
            check_modify(
                QpType::Rc,
                Rts,
                &QpAttr {
                    state: Some(Err),
                    ..QpAttr::default()
                }
            ),
            Ok(Err)
        );
        assert_eq!(
            check_modify(
                QpType::Rc,
                Err,
                &QpAttr {
                    state: Some(Reset),
                    ..QpAttr::default()
                }
            ),
            Ok(Reset)
        );
    }

    #[test]
    fn ud_needs_only_qkey_and_sq_psn() {
        use QpState::*;
        let init = check_modify(QpType::Ud, Reset, &to_init(QpType::Ud)).unwrap();
        let rtr = check_modify(
            QpType::Ud,
            init,
            &QpAttr {
                state: Some(Rtr),
                ..QpAttr::default()
            },
        );
        assert_eq!(rtr, Ok(Rtr));
        let rts = QpAttr {
            state: Some(Rts),
            sq_psn: Some(Psn::new(0)),
            ..QpAttr::default()
        };
        assert_eq!(check_modify(QpType::Ud, Rtr, &rts), Ok(Rts));
    }

    #[test]
    fn each_missing_rc_attribute_is_named() {
        let full = rc_to_rtr();
        type Removal = (Attrs, fn(&mut QpAttr));
        let removals: [Removal; 6] = [
            (Attrs::AV, |a| a.av = None),
            (Attrs::PATH_MTU, |a| a.path_mtu = None),
            (Attrs::DEST_QPN, |a| a.dest_qp_num = None),
            (Attrs::RQ_PSN, |a| a.rq_psn = None),
            (Attrs::MAX_DEST_RD_ATOMIC, |a| a.max_dest_rd_atomic = None),
            (Attrs::MIN_RNR_TIMER, |a| a.min_rnr_timer = None),
        ];
        for (attr, remove) in removals {
            let mut partial = full;
            remove(&mut partial);
            assert_eq!(
                check_modify(QpType::Rc, QpState::Init, &partial),
                Err(ModifyQpError::MissingAttributes {
                    from: QpState::Init,
                    to: QpState::Rtr,
                    missing: attr
                })
            );
        }
        // UC does not need the RC-only ones, and refuses them.
        let uc = QpAttr {
            max_dest_rd_atomic: None,
            min_rnr_timer: None,
            ..full
        };
        assert_eq!(
            check_modify(QpType::Uc, QpState::Init, &uc),
            Ok(QpState::Rtr)
        );
        assert!(matches!(
            check_modify(QpType::Uc, QpState::Init, &full),
            Err(ModifyQpError::UnexpectedAttributes { .. })
        ));
    }

    #[test]
    fn skipping_a_state_is_refused() {
        let attr = QpAttr {
            state: Some(QpState::Rts),
            ..rc_to_rtr()
        };
        assert_eq!(
            check_modify(QpType::Rc, QpState::Init, &attr),
            Err(ModifyQpError::InvalidTransition {
                qp_type: QpType::Rc,
                from: QpState::Init,
                to: QpState::Rts
            })
        );
        let sqe_to_rts = QpAttr {
            state: Some(QpState::Rts),
            ..QpAttr::default()
        };
        assert!(check_modify(QpType::Rc, QpState::Sqe, &sqe_to_rts).is_err());
        assert_eq!(
            check_modify(QpType::Uc, QpState::Sqe, &sqe_to_rts),
            Ok(QpState::Rts)
        );
    }

    #[test]
    fn values_out_of_range_are_refused() {
        let mut attr = rc_to_rts();
        attr.retry_cnt = Some(8);
        assert_eq!(
            check_modify(QpType::Rc, QpState::Rtr, &attr),
            Err(ModifyQpError::OutOfRange("retry_cnt"))
        );
        let mut attr = rc_to_rtr();
        attr.dest_qp_num = Some(1 << 24);
        assert_eq!(
            check_modify(QpType::Rc, QpState::Init, &attr),
            Err(ModifyQpError::OutOfRange("dest_qp_num"))
        );
    }

    #[test]
    fn cur_state_must_be_true() {
        let attr = QpAttr {
            cur_state: Some(QpState::Rtr),
            ..rc_to_rts()
        };
        assert_eq!(
            check_modify(QpType::Rc, QpState::Rtr, &attr),
            Ok(QpState::Rts)
        );
        assert_eq!(
            check_modify(QpType::Rc, QpState::Init, &attr),
            Err(ModifyQpError::WrongCurrentState {
                claimed: QpState::Rtr,
                actual: QpState::Init
            })
        );
    }

    #[test]
    fn path_mtu_bytes() {
        assert_eq!(PathMtu::Mtu256.bytes(), 256);
        assert_eq!(PathMtu::Mtu1024.bytes(), 1024);
        assert_eq!(PathMtu::Mtu4096.bytes(), 4096);
    }

    #[test]
    fn path_mtu_codes() {
        assert_eq!(PathMtu::from_code(3), Some(PathMtu::Mtu1024));
        assert_eq!(PathMtu::from_code(0), None);
        assert_eq!(PathMtu::from_code(6), None);
    }
}

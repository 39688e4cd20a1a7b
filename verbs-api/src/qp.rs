//! Queue pairs, address handles, and the typed handshake that connects two QPs.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use roce_transport::qp::{PostError, PostGate, QpCaps, QpInit, QpStats};
use roce_transport::qp_state::{
    connect_attrs, ud_attrs, AddressVector, PathMtu, Peer, QpAttr, QpState, QpType, RetryConfig,
    CONNECT_RD_ATOMIC,
};
use roce_transport::wr::{RecvWr, SendWr, UdDest};
use roce_transport::Endpoint;
use roce_wire::Psn;

use crate::context::Shared;
use crate::cq::Cq;
use crate::device::Gid;
use crate::mr::{Pd, PdInner};
use crate::Error;

/// What `ibv_create_qp` takes.
pub struct QpInitAttr<'a> {
    /// RC, UC or UD.
    pub qp_type: QpType,
    /// Where send completions go.
    pub send_cq: &'a Cq,
    /// Where receive completions go.
    pub recv_cq: &'a Cq,
    /// Queue sizes and limits.
    pub caps: QpCaps,
    /// Complete every send, not only signaled ones.
    pub sq_sig_all: bool,
}

/// What one side tells the other to connect (rc_pingpong's `LID:QPN:PSN:GID`), as a type:
/// send it with [`to_bytes`](Self::to_bytes) over any channel, connect with what comes back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpEndpoint {
    /// The QP number.
    pub qpn: u32,
    /// The PSN of its first request.
    pub psn: Psn,
    /// Its GID (IPv4-mapped on RoCEv2 over IPv4).
    pub gid: Gid,
}

impl QpEndpoint {
    /// Bytes on the wire of [`to_bytes`](Self::to_bytes).
    pub const LEN: usize = 24;

    /// QPN and PSN as big-endian `u32`s, then the GID.
    pub fn to_bytes(&self) -> [u8; Self::LEN] {
        let mut bytes = [0u8; Self::LEN];
        bytes[0..4].copy_from_slice(&self.qpn.to_be_bytes());
        bytes[4..8].copy_from_slice(&self.psn.value().to_be_bytes());
        bytes[8..24].copy_from_slice(&self.gid);
        bytes
    }

    /// The inverse of [`to_bytes`](Self::to_bytes); checks the QPN and PSN are 24-bit.
    pub fn from_bytes(bytes: &[u8]) -> Result<QpEndpoint, Error> {
        let bytes: &[u8; Self::LEN] = bytes
            .try_into()
            .map_err(|_| Error::InvalidArgument("a QP endpoint is 24 bytes"))?;
        let word = |at: usize| {
            u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
        };
        let (qpn, psn) = (word(0), word(4));
        if qpn > 0xFF_FFFF || psn > 0xFF_FFFF {
            return Err(Error::InvalidArgument("QPN and PSN are 24-bit"));
        }
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&bytes[8..24]);
        Ok(QpEndpoint {
            qpn,
            psn: Psn::new(psn),
            gid,
        })
    }
}

/// How [`Qp::connect`] sets the connection up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectOptions {
    /// Path MTU (both sides must agree).
    pub mtu: PathMtu,
    /// ACK timeout, retries, RNR behaviour.
    pub retry: RetryConfig,
    /// Our GID index, which must name the IPv4-mapped GID of the device's address.
    pub sgid_index: u8,
    /// IPv4 TTL of our packets.
    pub hop_limit: u8,
    /// READs and atomics we keep outstanding towards the peer (at most what it offers).
    pub max_rd_atomic: u8,
    /// READs and atomics of the peer we hold state for.
    pub max_dest_rd_atomic: u8,
}

impl Default for ConnectOptions {
    /// rc_pingpong's: path MTU 1024, its timers, GID index 1, TTL 64.
    fn default() -> Self {
        ConnectOptions {
            mtu: PathMtu::Mtu1024,
            retry: RetryConfig::RC_PINGPONG,
            sgid_index: 1,
            hop_limit: 64,
            max_rd_atomic: CONNECT_RD_ATOMIC,
            max_dest_rd_atomic: CONNECT_RD_ATOMIC,
        }
    }
}

/// An address handle for UD sends (`ibv_ah`): where to, with the neighbour resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddressHandle {
    av: AddressVector,
}

impl AddressHandle {
    /// The destination of a UD send to `remote_qpn` with `remote_qkey`.
    pub fn dest(&self, remote_qpn: u32, remote_qkey: u32) -> UdDest {
        UdDest {
            av: self.av,
            remote_qpn,
            remote_qkey,
        }
    }

    /// The address vector.
    pub fn av(&self) -> AddressVector {
        self.av
    }
}

impl Pd {
    /// Creates an address handle (`ibv_create_ah`), resolving the neighbour's MAC first.
    pub fn create_ah(&self, av: AddressVector) -> Result<AddressHandle, Error> {
        self.inner.shared.check_path(av.sgid_index, av.dgid)?;
        self.inner.shared.resolve(av.dgid)?;
        Ok(AddressHandle { av })
    }

    /// Creates a QP in RESET (`ibv_create_qp`).
    pub fn create_qp(&self, attr: &QpInitAttr) -> Result<Qp, Error> {
        let shared = &self.inner.shared;
        for cq in [attr.send_cq, attr.recv_cq] {
            if !Arc::ptr_eq(&cq.shared, shared) {
                return Err(Error::ForeignObject("CQ"));
            }
        }
        let init = QpInit {
            pd: self.inner.id,
            qp_type: attr.qp_type,
            send_cq: 0,
            recv_cq: 0,
            caps: attr.caps,
            sq_sig_all: attr.sq_sig_all,
        };
        let mut psn = [0u8; 4];
        rustix::rand::getrandom(&mut psn, rustix::rand::GetRandomFlags::empty())
            .map_err(std::io::Error::from)?;
        let mut core = shared.lock()?;
        let qpn = core
            .endpoint()
            .create_qp(init, attr.send_cq.id, attr.recv_cq.id)?;
        let gate = core.endpoint().post_gate(qpn).ok_or(Error::Gone)?;
        let queues = Arc::new(Submission::new(gate));
        core.submissions.insert(qpn, Arc::clone(&queues));
        Ok(Qp {
            pd: Arc::clone(&self.inner),
            qpn,
            qp_type: attr.qp_type,
            first_psn: Psn::new(u32::from_le_bytes(psn) & 0xFF_FFFF),
            queues,
        })
    }
}

/// A queue pair (`ibv_qp`). Destroyed on drop: packets for it are dropped from then on.
pub struct Qp {
    pd: Arc<PdInner>,
    qpn: u32,
    qp_type: QpType,
    /// Our first PSN, chosen at random, as rc_pingpong does.
    first_psn: Psn,
    /// Where posts wait for the engine thread, so that posting never takes the device lock.
    queues: Arc<Submission>,
}

impl Qp {
    fn shared(&self) -> &Arc<Shared> {
        &self.pd.shared
    }

    /// The QP number.
    pub fn qp_num(&self) -> u32 {
        self.qpn
    }

    /// RC, UC or UD.
    pub fn qp_type(&self) -> QpType {
        self.qp_type
    }

    /// The current state (`ibv_query_qp`'s `qp_state`).
    pub fn state(&self) -> Result<QpState, Error> {
        self.shared()
            .lock()?
            .endpoint()
            .qp_state(self.qpn)
            .ok_or(Error::Gone)
    }

    /// Counters: packets, retransmissions, NAKs, ...
    pub fn stats(&self) -> Result<QpStats, Error> {
        self.shared()
            .lock()?
            .endpoint()
            .qp_stats(self.qpn)
            .ok_or(Error::Gone)
    }

    /// What the peer needs to connect to this QP, with our GID at `gid_index`.
    pub fn endpoint(&self, gid_index: u8) -> Result<QpEndpoint, Error> {
        let shared = self.shared();
        let gid = shared
            .device
            .gid(usize::from(gid_index))
            .ok_or(Error::NoGid(gid_index))?;
        Ok(QpEndpoint {
            qpn: self.qpn,
            psn: self.first_psn,
            gid,
        })
    }

    /// `ibv_modify_qp`: the attributes present in `attr` (the mask is which are `Some`).
    /// A destination address is resolved to a MAC first.
    pub fn modify(&self, attr: &QpAttr) -> Result<(), Error> {
        if let Some(av) = &attr.av {
            self.shared().check_path(av.sgid_index, av.dgid)?;
            self.shared().resolve(av.dgid)?;
        }
        let mut core = self.shared().lock()?;
        // Work admitted before the change reaches the QP before it.
        core.submit(Instant::now());
        let result = core.endpoint().modify_qp(Instant::now(), self.qpn, attr);
        core.refresh_gates();
        result?;
        // Entering ERR completes work: let a waiting channel hear of it.
        self.shared().kick(&mut core)
    }

    /// Brings an RC or UC QP from RESET to RTS towards `remote`, as rc_pingpong's three
    /// `ibv_modify_qp` calls do.
    pub fn connect(&self, remote: &QpEndpoint, options: &ConnectOptions) -> Result<(), Error> {
        if self.qp_type == QpType::Ud {
            return Err(Error::InvalidArgument(
                "a UD QP is not connected; use ready_ud",
            ));
        }
        let peer = Peer {
            av: AddressVector {
                dgid: remote.gid,
                sgid_index: options.sgid_index,
                hop_limit: options.hop_limit,
                traffic_class: 0,
                flow_label: 0,
            },
            qpn: remote.qpn,
            psn: remote.psn,
        };
        let mut attrs = connect_attrs(
            self.qp_type,
            peer,
            self.first_psn,
            options.mtu,
            options.retry,
        );
        if self.qp_type == QpType::Rc {
            attrs[1].max_dest_rd_atomic = Some(options.max_dest_rd_atomic);
            attrs[2].max_rd_atomic = Some(options.max_rd_atomic);
        }
        attrs.iter().try_for_each(|attr| self.modify(attr))
    }

    /// Brings a UD QP from RESET to RTS, accepting datagrams with `qkey`.
    pub fn ready_ud(&self, qkey: u32) -> Result<(), Error> {
        if self.qp_type != QpType::Ud {
            return Err(Error::InvalidArgument(
                "only a UD QP takes a Q_Key this way",
            ));
        }
        ud_attrs(qkey, self.first_psn)
            .iter()
            .try_for_each(|attr| self.modify(attr))
    }

    /// `ibv_post_send` for a list of work requests: posts them in order and stops at the
    /// first that fails, returning its index with the error (as `bad_wr`). With an engine
    /// thread, the requests are checked against the QP's state and queue room as of the
    /// engine's last round, queued for it without the device lock, and the thread is woken;
    /// a queue the engine has just drained may still look full for that long.
    pub fn post_send(&self, wrs: impl IntoIterator<Item = SendWr>) -> Result<(), PostFailure> {
        let check = |gate: &PostGate, wr: &SendWr, queued| gate.check_send(wr, queued).map(drop);
        let direct =
            |endpoint: &mut Endpoint, now, qpn, wr: SendWr| endpoint.post_send(now, qpn, &wr);
        self.post(wrs, &self.queues.sends, check, direct, true)
    }

    /// `ibv_post_recv` for a list of work requests, with the same failure rule.
    pub fn post_recv(&self, wrs: impl IntoIterator<Item = RecvWr>) -> Result<(), PostFailure> {
        let check = |gate: &PostGate, wr: &RecvWr, queued| gate.check_recv(wr, queued);
        let direct =
            |endpoint: &mut Endpoint, now, qpn, wr: RecvWr| endpoint.post_recv(now, qpn, &wr);
        self.post(wrs, &self.queues.recvs, check, direct, false)
    }

    /// Both queues' posting: straight into the endpoint when the caller drives the engine
    /// (then, for sends, `transmit` makes them leave at once), else into `queue` after
    /// `check` against its gate. Stops at the first refusal, as `bad_wr`.
    fn post<T>(
        &self,
        wrs: impl IntoIterator<Item = T>,
        queue: &Mutex<Pending<T>>,
        check: impl Fn(&PostGate, &T, usize) -> Result<(), PostError>,
        direct: impl Fn(&mut Endpoint, Instant, u32, T) -> Result<(), PostError>,
        transmit: bool,
    ) -> Result<(), PostFailure> {
        let shared = self.shared();
        let fail = |index, error| PostFailure { index, error };
        let mut result = Ok(());
        if shared.caller_drives() {
            let mut core = shared.lock().map_err(|error| fail(0, error))?;
            let now = Instant::now();
            core.submit(now);
            for (index, wr) in wrs.into_iter().enumerate() {
                if let Err(error) = direct(core.endpoint(), now, self.qpn, wr) {
                    result = Err(fail(index, error.into()));
                    break;
                }
            }
            core.refresh_gates();
            if transmit {
                // Whatever was posted leaves now, even behind a failure.
                shared.kick(&mut core).map_err(|error| fail(0, error))?;
            }
            return result;
        }
        shared.check_running().map_err(|error| fail(0, error))?;
        {
            let mut pending = queue.lock().map_err(|_| fail(0, Error::Poisoned))?;
            for (index, wr) in wrs.into_iter().enumerate() {
                let queued = pending.items.len();
                if let Err(error) = check(&pending.gate, &wr, queued) {
                    result = Err(fail(index, error.into()));
                    break;
                }
                pending.items.push_back(wr);
            }
        }
        // Whatever was admitted leaves now, even behind a failure.
        shared.wake();
        result
    }
}

/// Work requests admitted for a QP and not yet handed to the endpoint, with the view of
/// the QP they were admitted against.
pub(crate) struct Pending<T> {
    pub(crate) items: std::collections::VecDeque<T>,
    pub(crate) gate: PostGate,
}

/// A QP's submission queues: posting threads take only these locks; the engine drains
/// them (and refreshes their gates) under the device lock, at every round.
pub(crate) struct Submission {
    pub(crate) sends: Mutex<Pending<SendWr>>,
    pub(crate) recvs: Mutex<Pending<RecvWr>>,
}

impl Submission {
    fn new(gate: PostGate) -> Submission {
        Submission {
            sends: Mutex::new(Pending {
                items: std::collections::VecDeque::new(),
                gate,
            }),
            recvs: Mutex::new(Pending {
                items: std::collections::VecDeque::new(),
                gate,
            }),
        }
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        if let Ok(mut core) = self.shared().lock() {
            core.submissions.remove(&self.qpn);
            core.endpoint().destroy_qp(self.qpn);
        }
    }
}

/// A post that failed: which work request (`bad_wr`) and why. Those before it were posted.
#[derive(Debug, thiserror::Error)]
#[error("work request {index} not posted: {error}")]
pub struct PostFailure {
    /// Index of the first work request not posted.
    pub index: usize,
    /// Why.
    pub error: Error,
}

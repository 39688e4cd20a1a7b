//! Queue pairs (`ibv_qp`): creation, the state machine, and posting.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use roce_transport::congestion::{QpRate, RateLimit};
use roce_transport::qp::{QpCaps, QpInit, QpRetry, QpStats};
use roce_transport::qp_state::{
    connect_attrs, ud_attrs, AddressVector, Peer, QpAttr, QpState, QpType,
};
use roce_transport::wr::{RecvWr, SendWr};
use roce_wire::Psn;

use crate::cq::{Cq, CqInner};
use crate::error::{Error, PostFailure};
use crate::handshake::{ConnectOptions, QpEndpoint};
use crate::limits;
use crate::mr::{Pd, PdInner};
use crate::queues::{qp_queues, Posting, QpQueues, WorkRequest};
use crate::shared::Shared;
use crate::srq::{Srq, SrqInner};
use crate::xrc::{Xrcd, XrcdInner};

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

impl Pd {
    /// Creates a QP in RESET (`ibv_create_qp`).
    pub fn create_qp(&self, attr: &QpInitAttr) -> Result<Qp, Error> {
        self.create_qp_on(attr, None)
    }

    /// Creates a QP in RESET that takes its receives from `srq` (`ibv_qp_init_attr.srq`):
    /// the receive caps are ignored, [`Qp::post_recv`] fails with `EINVAL`, and the QP
    /// keeps the SRQ alive.
    pub fn create_qp_with_srq(&self, attr: &QpInitAttr, srq: &Srq) -> Result<Qp, Error> {
        self.create_qp_on(attr, Some(srq))
    }

    fn create_qp_on(&self, attr: &QpInitAttr, srq: Option<&Srq>) -> Result<Qp, Error> {
        let shared = &self.inner.shared;
        for cq in [attr.send_cq, attr.recv_cq] {
            if !Arc::ptr_eq(&cq.inner.shared, shared) {
                return Err(Error::ForeignObject("CQ"));
            }
        }
        if srq.is_some_and(|srq| !Arc::ptr_eq(srq.shared(), shared)) {
            return Err(Error::ForeignObject("SRQ"));
        }
        let init = QpInit {
            pd: self.inner.id,
            qp_type: attr.qp_type,
            caps: attr.caps,
            sq_sig_all: attr.sq_sig_all,
        };
        let (send_cq, recv_cq) = (&attr.send_cq.inner, &attr.recv_cq.inner);
        // A shared device's QP numbers come from this process's block.
        crate::backend::claim(shared)?;
        let mut core = shared.lock()?;
        limits::check_qp_count(core.qps.len())?;
        let qpn = match srq {
            Some(srq) => {
                (core.endpoint()).create_qp_with_srq(init, send_cq.id, recv_cq.id, srq.id())
            }
            None => core.endpoint().create_qp(init, send_cq.id, recv_cq.id),
        }?;
        let gate = core.endpoint().post_gate(qpn).ok_or(Error::Gone)?;
        let (queues, slot) = qp_queues(qpn, gate);
        core.qps.insert(qpn, slot);
        Ok(Qp {
            _life: QpLife::new(shared, qpn),
            pd: Arc::clone(&self.inner),
            _cqs: vec![Arc::clone(send_cq), Arc::clone(recv_cq)],
            _srq: srq.map(|srq| Arc::clone(&srq.inner)),
            _xrcd: None,
            qpn,
            qp_type: attr.qp_type,
            first_psn: random_psn()?,
            queues,
        })
    }
}

/// A QP's first PSN, at random, as rc_pingpong picks it.
fn random_psn() -> Result<Psn, Error> {
    let mut psn = [0u8; 4];
    rustix::rand::getrandom(&mut psn, rustix::rand::GetRandomFlags::empty())
        .map_err(std::io::Error::from)?;
    Ok(Psn::new(u32::from_le_bytes(psn) & 0xFF_FFFF))
}

impl Xrcd {
    /// Creates an XRC target QP of this domain in RESET (`ibv_create_qp_ex` with
    /// `IBV_QPT_XRC_RECV`): no PD, CQs or queues of its own; it receives into the XRC SRQs of
    /// the domain that requests name. It keeps the domain alive.
    pub fn create_recv_qp(&self) -> Result<Qp, Error> {
        let shared = &self.inner.shared;
        // A shared device's QP numbers come from this process's block, as any QP's.
        crate::backend::claim(shared)?;
        let mut core = shared.lock()?;
        limits::check_qp_count(core.qps.len())?;
        let qpn = core.endpoint().create_xrc_recv_qp(self.id())?;
        let gate = core.endpoint().post_gate(qpn).ok_or(Error::Gone)?;
        let (queues, slot) = qp_queues(qpn, gate);
        core.qps.insert(qpn, slot);
        Ok(Qp {
            _life: QpLife::new(shared, qpn),
            pd: Arc::clone(&self.inner.holder.inner),
            _cqs: Vec::new(),
            _srq: None,
            _xrcd: Some(Arc::clone(&self.inner)),
            qpn,
            qp_type: QpType::XrcRecv,
            first_psn: random_psn()?,
            queues,
        })
    }
}

/// A queue pair (`ibv_qp`). Destroyed on drop (the last handle of an XRC target opened
/// again, [`Qp::open_xrc_recv`]): packets for it are dropped from then on. It keeps its PD
/// and CQs alive.
pub struct Qp {
    /// Destroys the transport's QP when the last handle goes; first, so that it goes before
    /// the CQs and SRQ it holds.
    _life: Arc<QpLife>,
    pd: Arc<PdInner>,
    /// The send and receive CQs, held so they outlive the QP that completes into them (an
    /// XRC target has none).
    _cqs: Vec<Arc<CqInner>>,
    /// The SRQ it takes its receives from, held so it outlives the QP.
    _srq: Option<Arc<SrqInner>>,
    /// An XRC target's domain, held so it outlives the QP.
    _xrcd: Option<Arc<XrcdInner>>,
    qpn: u32,
    qp_type: QpType,
    /// Our first PSN, chosen at random, as rc_pingpong does.
    first_psn: Psn,
    /// The rings posts write and the engine drains, so that posting never takes the device
    /// lock.
    queues: Arc<QpQueues>,
}

impl Qp {
    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.pd.shared
    }

    /// The QP number.
    pub fn qp_num(&self) -> u32 {
        self.qpn
    }

    /// RC, UC, UD or an XRC half.
    pub fn qp_type(&self) -> QpType {
        self.qp_type
    }

    /// The XRC domain of an XRC target QP.
    pub fn xrcd_id(&self) -> Option<roce_transport::xrc::XrcdId> {
        self._xrcd.as_ref().map(|xrcd| xrcd.id)
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

    /// The requester's retry settings as they are (the CM's, once it moved the QP to RTS).
    pub fn retry(&self) -> Result<QpRetry, Error> {
        self.shared()
            .lock()?
            .endpoint()
            .qp_retry(self.qpn)
            .ok_or(Error::Gone)
    }

    /// `ibv_modify_qp_rate_limit` (and `IBV_QP_RATE_LIMIT`): what this QP sends is paced
    /// to `limit` (a token bucket, the pacer DCQCN's rate goes through too); `None` or a
    /// rate of 0 removes it. Only in RTR, RTS or SQD, where rdma-core sets it.
    pub fn set_rate_limit(&self, limit: Option<RateLimit>) -> Result<(), Error> {
        let mut core = self.shared().lock()?;
        let now = Instant::now();
        core.endpoint().set_rate_limit(now, self.qpn, limit)?;
        // The pacer may hold back what is queued: the engine must hear of its timer.
        self.shared().kick(&mut core)
    }

    /// The QP's rates now: its pacer's, DCQCN's, its limit, and whether it agreed on
    /// selective repeat.
    pub fn rate(&self) -> Result<QpRate, Error> {
        let mut core = self.shared().lock()?;
        let now = Instant::now();
        core.endpoint().qp_rate(now, self.qpn).ok_or(Error::Gone)
    }

    /// What the peer needs to connect to this QP, with our GID at `gid_index`.
    pub fn endpoint(&self, gid_index: u8) -> Result<QpEndpoint, Error> {
        let gid = self
            .shared()
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
        // Work posted before the change reaches the QP before it.
        let now = Instant::now();
        core.hand_over(self.qpn, now);
        let result = core.endpoint().modify_qp(now, self.qpn, attr);
        self.queues.publish_state(core.endpoint());
        result?;
        if attr.state == Some(QpState::Reset) {
            for cq in &self._cqs {
                cq.discard_qp(&mut core, self.qpn)?;
            }
        }
        // Entering ERR completes work: let a waiting channel hear of it.
        self.shared().kick(&mut core)
    }

    /// Brings an RC, UC or XRC QP from RESET to RTS towards `remote`, as rc_pingpong's three
    /// `ibv_modify_qp` calls do (an XRC initiator towards a target, or the reverse).
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
        let responds = matches!(self.qp_type, QpType::Rc | QpType::XrcRecv);
        let requests = matches!(self.qp_type, QpType::Rc | QpType::XrcSend);
        let [to_init, to_rtr, to_rts] = connect_attrs(
            self.qp_type,
            peer,
            self.first_psn,
            options.mtu,
            options.retry,
        );
        self.modify(&to_init)?;
        self.modify(&QpAttr {
            max_dest_rd_atomic: responds.then_some(options.max_dest_rd_atomic),
            ..to_rtr
        })?;
        self.modify(&QpAttr {
            max_rd_atomic: requests.then_some(options.max_rd_atomic),
            ..to_rts
        })
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
    /// first that fails, returning its index with the error (as `bad_wr`). Each is checked
    /// against the QP's state (as published when it last changed) and queue room (as of
    /// the engine's last round), written into the QP's send ring, and the QP's doorbell
    /// rung, without the device lock; a queue the engine has just drained, or a state just
    /// changed by the peer, is looked at again under the lock before a request is refused.
    pub fn post_send(&self, wrs: impl IntoIterator<Item = SendWr>) -> Result<(), PostFailure> {
        self.post(wrs, &self.queues.sends)
    }

    /// `ibv_post_recv` for a list of work requests, with the same failure rule.
    pub fn post_recv(&self, wrs: impl IntoIterator<Item = RecvWr>) -> Result<(), PostFailure> {
        self.post(wrs, &self.queues.recvs)
    }

    /// Both queues' posting: into the ring after the check, in order, stopping at the first
    /// refusal (`bad_wr`); then the doorbell, and the caller's share of progress
    /// ([`Shared::posted`]).
    fn post<T: WorkRequest>(
        &self,
        wrs: impl IntoIterator<Item = T>,
        queue: &Mutex<Posting<T>>,
    ) -> Result<(), PostFailure> {
        let send = T::SEND;
        let shared = self.shared();
        let fail = |index, error| PostFailure { index, error };
        shared.check_running().map_err(|error| fail(0, error))?;
        let mut result = Ok(());
        let (any, was_idle) = {
            let mut posting: MutexGuard<'_, Posting<T>> =
                queue.lock().map_err(|_| fail(0, Error::Poisoned))?;
            let was_idle = posting.outstanding(self.queues.retired(send)) == 0;
            let mut any = false;
            for (index, wr) in wrs.into_iter().enumerate() {
                let mut checked = posting.check(&self.queues, &wr);
                if checked.is_err() {
                    // What was published may be old: look again under the lock first.
                    self.refresh(shared, &mut any)
                        .map_err(|error| fail(index, error))?;
                    checked = posting.check(&self.queues, &wr);
                }
                if let Err(error) = checked.and_then(|()| posting.push(wr)) {
                    result = Err(fail(index, error.into()));
                    break;
                }
                any = true;
            }
            (any, was_idle)
        };
        if any {
            // Whatever was posted leaves, even behind a failure.
            let rang = shared.ring(&self.queues);
            shared.posted(send, rang, was_idle);
        }
        result
    }

    /// Brings what the rings' check uses up to date under the device lock: the requests
    /// already written (`any`, this post's) handed to the endpoint first, then the QP's
    /// state and how many of its requests it retired.
    fn refresh(&self, shared: &Shared, any: &mut bool) -> Result<(), Error> {
        let mut core = shared.lock()?;
        core.hand_over(self.qpn, Instant::now());
        core.publish(self.qpn);
        // Handed over: the next round sends them without a doorbell.
        if std::mem::take(any) {
            shared.wake();
        }
        Ok(())
    }
}

/// A QP's life in the transport, shared by its handles.
struct QpLife {
    shared: Arc<Shared>,
    qpn: u32,
}

impl QpLife {
    fn new(shared: &Arc<Shared>, qpn: u32) -> Arc<QpLife> {
        Arc::new(QpLife {
            shared: Arc::clone(shared),
            qpn,
        })
    }
}

impl Drop for QpLife {
    fn drop(&mut self) {
        if let Ok(mut core) = self.shared.lock() {
            core.qps.remove(&self.qpn);
            core.endpoint().destroy_qp(self.qpn);
            // The MACs of groups that went with it leave the interface's filter.
            let core = &mut *core;
            core.multicast.forget_qp(core.engine.endpoint(), self.qpn);
        }
    }
}

impl Qp {
    /// `ibv_open_qp`: another handle to this XRC target QP, which lives until its last
    /// handle goes, as an opened shareable QP does; any other QP is `EINVAL`.
    pub fn open_xrc_recv(&self) -> Result<Qp, Error> {
        if self.qp_type != QpType::XrcRecv {
            return Err(Error::InvalidArgument("only XRC target QPs are opened"));
        }
        Ok(Qp {
            _life: Arc::clone(&self._life),
            pd: Arc::clone(&self.pd),
            _cqs: self._cqs.clone(),
            _srq: self._srq.clone(),
            _xrcd: self._xrcd.clone(),
            qpn: self.qpn,
            qp_type: self.qp_type,
            first_psn: self.first_psn,
            queues: Arc::clone(&self.queues),
        })
    }
}

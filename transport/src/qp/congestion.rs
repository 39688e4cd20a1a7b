//! One QP's part in congestion control: the notification point (a CNP owed for CE marks,
//! at most one per `np_min_time_between_cnps`), the reaction point (DCQCN, from the first
//! CNP on), the rate limit a user set, and the pacer that applies the least of the two.
//!
//! The QP asks [`Congestion::active`] once per packet it polls: false (no CNP owed, no
//! limit) keeps it on its usual path, so an unlimited QP pays one flag test and nothing
//! else. What a QP needs once it takes part (the CNP timing, DCQCN, the limit, the pacer)
//! is allocated then, so a QP that never does carries a flag and two pointers.

use std::sync::Arc;
use std::time::Instant;

use roce_wire::{bth, cnp, ExtRepr, Opcode, Psn};

use super::dcqcn::ReactionPoint;
use super::pacer::Pacer;
use crate::congestion::{CongestionConfig, QpRate, RateLimit};
use crate::counters::Counters;
use crate::qp_state::AddressVector;

/// Ethernet, IPv4, UDP, BTH and ICRC around every packet's extension headers and payload:
/// what a packet costs the pacer and DCQCN's byte counter besides those (IPv6 adds 20
/// bytes, which they do not count).
pub(crate) const FRAME_OVERHEAD: u64 = 14 + 20 + 8 + 12 + 4;

/// A QP's congestion state.
#[derive(Debug)]
pub(crate) struct Congestion {
    /// `cnp_owed || pacer.is_some()`: whether the QP must leave its usual path.
    active: bool,
    config: Arc<CongestionConfig>,
    /// From the first CE mark, CNP or limit on.
    state: Option<Box<State>>,
}

/// What a QP that took part in congestion control keeps.
#[derive(Debug, Default)]
struct State {
    /// A CNP is owed to the peer.
    cnp_owed: bool,
    /// When the last CNP was owed.
    last_cnp: Option<Instant>,
    /// DCQCN, from the first CNP until the QP is back at the highest rate.
    rp: Option<ReactionPoint>,
    /// The user's limit.
    limit: Option<RateLimit>,
    /// Applies the least of DCQCN's rate and the limit, while either exists.
    pacer: Option<Pacer>,
    /// When the pacer refused a packet last: the instant it allows the next.
    pace_wake: Option<Instant>,
    /// The pacer refused the requester's next packet at the last look, and it has not gone
    /// since: the peer has not been silent, we have (see [`Congestion::holding`]).
    holding: bool,
    /// Cuts of reaction points that have since finished.
    past_cuts: u64,
}

impl State {
    /// Cuts so far, finished reaction points' included.
    fn cuts(&self) -> u64 {
        self.past_cuts + self.rp.as_ref().map_or(0, |rp| rp.cuts)
    }
}

impl Congestion {
    pub fn new(config: Arc<CongestionConfig>) -> Congestion {
        Congestion {
            active: false,
            config,
            state: None,
        }
    }

    /// Whether a CNP is owed or a pacer applies: the QP's slow path.
    #[inline(always)]
    pub fn active(&self) -> bool {
        self.active
    }

    /// Whether a pacer applies.
    pub fn paced(&self) -> bool {
        self.state
            .as_ref()
            .is_some_and(|state| state.pacer.is_some())
    }

    fn state(&mut self) -> &mut State {
        self.state.get_or_insert_with(Box::default)
    }

    /// The device's settings changed (its line rate, DCQCN's knobs...).
    pub fn set_config(&mut self, now: Instant, config: Arc<CongestionConfig>) {
        self.config = config;
        let max = self.config.max_rate();
        if let Some(rp) = self.state.as_mut().and_then(|state| state.rp.as_mut()) {
            rp.clamp(max);
        }
        self.refresh(now);
    }

    /// Back to RESET: no CNP owed, no DCQCN state, no limit.
    pub fn reset(&mut self) {
        self.active = false;
        self.state = None;
    }

    /// The traffic class a connected QP sends with: ECT(0) in its ECN bits, when the device
    /// marks its packets ECN-capable.
    pub fn traffic_class(&self, av: AddressVector) -> AddressVector {
        if self.config.ecn {
            AddressVector {
                traffic_class: (av.traffic_class & !0x3) | crate::congestion::ECT0,
                ..av
            }
        } else {
            av
        }
    }

    /// A packet marked CE arrived for this QP at `now`: the notification point. Only a
    /// request draws a CNP: the peer's pacer slows its requests down, nothing else.
    pub fn on_ce(&mut self, now: Instant, request: bool, counters: &mut Counters) {
        counters.np_ecn_marked_roce_packets += 1;
        if !self.config.np || !request {
            return;
        }
        let interval =
            crate::congestion::DcqcnParams::us(self.config.dcqcn.np_min_time_between_cnps);
        let state = self.state();
        if state.last_cnp.is_some_and(|last| now < last + interval) {
            return;
        }
        state.last_cnp = Some(now);
        state.cnp_owed = true;
        self.active = true;
    }

    /// The CNP owed, if one is (to the peer QP `dest_qpn` at `av`): BECN set, PSN 0,
    /// 16 zero bytes, DSCP `np_cnp_dscp`, not ECN-capable.
    pub fn take_cnp(
        &mut self,
        dest_qpn: u32,
        av: AddressVector,
        counters: &mut Counters,
    ) -> Option<(bth::Repr, ExtRepr, AddressVector)> {
        let state = self.state.as_mut().filter(|state| state.cnp_owed)?;
        state.cnp_owed = false;
        self.active = state.pacer.is_some();
        counters.np_cnp_sent += 1;
        let mut header = bth::Repr::new(Opcode::Cnp, dest_qpn, Psn::new(0));
        header.becn = true;
        let ext = ExtRepr {
            cnp: Some(cnp::Repr),
            ..ExtRepr::default()
        };
        let av = AddressVector {
            traffic_class: self.config.dcqcn.np_cnp_dscp << 2,
            ..av
        };
        Some((header, ext, av))
    }

    /// A CNP for this QP arrived at `now`: the reaction point.
    pub fn on_cnp(&mut self, now: Instant, counters: &mut Counters) {
        if !self.config.rp {
            counters.rp_cnp_ignored += 1;
            return;
        }
        counters.rp_cnp_handled += 1;
        let params = self.config.dcqcn;
        let rate = self.config.max_rate();
        let state = self.state();
        let cuts_before = state.cuts();
        match &mut state.rp {
            Some(rp) => rp.on_cnp(now, &params),
            None => state.rp = Some(ReactionPoint::first_cnp(now, rate, &params)),
        }
        counters.rp_rate_cuts += state.cuts() - cuts_before;
        self.refresh(now);
    }

    /// Sets or clears the user's rate limit.
    pub fn set_limit(&mut self, now: Instant, limit: Option<RateLimit>) {
        self.state().limit = limit.filter(|limit| limit.rate.kbps() > 0);
        self.refresh(now);
    }

    /// `Ok` if the requester may send a packet at `now`; otherwise remembers when it may,
    /// and whether a packet waits for it (`waiting`).
    #[inline]
    pub fn pace(&mut self, now: Instant, waiting: bool) -> Result<(), Instant> {
        let Some(state) = &mut self.state else {
            return Ok(());
        };
        let Some(pacer) = &state.pacer else {
            return Ok(());
        };
        let verdict = pacer.check(now);
        state.holding = verdict.is_err() && waiting;
        verdict.inspect_err(|&at| state.pace_wake = Some(at))
    }

    /// Whether the pacer holds back a packet the requester would send: then the ACK timer
    /// going off says that our engine woke late (the packet could not go at its time), not
    /// that the peer went silent.
    pub fn holding(&self) -> bool {
        self.state.as_ref().is_some_and(|state| state.holding)
    }

    /// The requester sent a packet of `bytes` (headers and payload) at `now`.
    pub fn sent(&mut self, now: Instant, bytes: u64) {
        let params = self.config.dcqcn;
        let max = self.config.max_rate();
        let Some(state) = &mut self.state else {
            return;
        };
        if let Some(pacer) = &mut state.pacer {
            pacer.charge(now, bytes);
        }
        if let Some(rp) = &mut state.rp {
            let before = rp.current();
            rp.on_sent(bytes, &params, max);
            if rp.current() != before {
                self.refresh(now);
            }
        }
    }

    /// When [`on_timeout`](Self::on_timeout) has something to do.
    pub fn next_deadline(&self) -> Option<Instant> {
        let state = self.state.as_ref()?;
        let rp = state
            .rp
            .as_ref()
            .map(|rp| rp.next_deadline(&self.config.dcqcn));
        [rp, state.pace_wake].into_iter().flatten().min()
    }

    /// Runs what is due at `now`: DCQCN's pending cut and increases; the pacer's wake-up
    /// (after which the requester is asked again).
    pub fn on_timeout(&mut self, now: Instant, counters: &mut Counters) {
        let params = self.config.dcqcn;
        let max = self.config.max_rate();
        let Some(state) = &mut self.state else {
            return;
        };
        if state.pace_wake.is_some_and(|at| at <= now) {
            state.pace_wake = None;
        }
        let cuts_before = state.cuts();
        if let Some(rp) = &mut state.rp {
            if rp.next_deadline(&params) <= now {
                rp.on_timeout(now, &params, max);
            }
        }
        counters.rp_rate_cuts += state.cuts() - cuts_before;
        self.refresh(now);
    }

    /// Drops a finished reaction point and makes the pacer apply the least of the limits.
    fn refresh(&mut self, now: Instant) {
        let max = self.config.max_rate();
        let Some(state) = &mut self.state else {
            self.active = false;
            return;
        };
        if state.rp.as_ref().is_some_and(|rp| rp.finished(max)) {
            state.past_cuts += state.rp.take().map_or(0, |rp| rp.cuts);
        }
        let dcqcn = state.rp.as_ref().map(|rp| rp.current());
        let limit = state.limit.map(|limit| limit.rate);
        let rate = [dcqcn, limit].into_iter().flatten().min();
        let burst = state.limit.map_or(0, |limit| u64::from(limit.max_burst));
        match (rate, &mut state.pacer) {
            (None, _) => {
                state.pacer = None;
                state.pace_wake = None;
            }
            (Some(rate), Some(pacer)) => pacer.set(now, rate, burst),
            (Some(rate), None) => state.pacer = Some(Pacer::new(rate, burst)),
        }
        self.active = state.cnp_owed || state.pacer.is_some();
    }

    /// The QP's rates, as of `now`.
    pub fn snapshot(&mut self, now: Instant) -> QpRate {
        let params = self.config.dcqcn;
        let Some(state) = &mut self.state else {
            return QpRate::default();
        };
        let cuts = state.cuts();
        let pacer = state.pacer;
        let limit = state.limit;
        let rp = state.rp.as_mut();
        QpRate {
            current: pacer.map(|pacer| pacer.rate()),
            dcqcn_current: rp.as_ref().map(|rp| rp.current()),
            dcqcn_target: rp.as_ref().map(|rp| rp.target()),
            alpha: rp.map(|rp| rp.alpha(now, &params)),
            limit: limit.map(|limit| limit.rate),
            cuts,
            selective_repeat: false,
        }
    }
}

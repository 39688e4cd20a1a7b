//! One QP's part in congestion control: the notification point (a CNP owed for CE marks,
//! at most one per `np_min_time_between_cnps`), the reaction point (DCQCN, from the first
//! CNP on), the rate limit a user set, and the pacer that applies the least of the two.
//!
//! The QP asks [`Congestion::active`] once per packet it polls: false (no CNP owed, no
//! limit) keeps it on its usual path, so an unlimited QP pays one flag test and nothing
//! else.

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
    config: Arc<CongestionConfig>,
    /// A CNP is owed to the peer.
    cnp_owed: bool,
    /// When the last CNP was owed.
    last_cnp: Option<Instant>,
    /// DCQCN, from the first CNP until the QP is back at the highest rate.
    rp: Option<Box<ReactionPoint>>,
    /// The user's limit.
    limit: Option<RateLimit>,
    /// Applies the least of DCQCN's rate and the limit, while either exists.
    pacer: Option<Pacer>,
    /// When the pacer refused a packet last: the instant it allows the next.
    pace_wake: Option<Instant>,
    /// `cnp_owed || pacer.is_some()`: whether the QP must leave its usual path.
    active: bool,
    /// Cuts of QPs' reaction points that have since finished.
    past_cuts: u64,
}

impl Congestion {
    pub fn new(config: Arc<CongestionConfig>) -> Congestion {
        Congestion {
            config,
            cnp_owed: false,
            last_cnp: None,
            rp: None,
            limit: None,
            pacer: None,
            pace_wake: None,
            active: false,
            past_cuts: 0,
        }
    }

    /// Whether a CNP is owed or a pacer applies: the QP's slow path.
    #[inline(always)]
    pub fn active(&self) -> bool {
        self.active
    }

    /// The device's settings changed (its line rate, DCQCN's knobs...).
    pub fn set_config(&mut self, config: Arc<CongestionConfig>) {
        self.config = config;
        let max = self.config.max_rate();
        if let Some(rp) = &mut self.rp {
            rp.clamp(max);
        }
        self.refresh();
    }

    /// Back to RESET: no CNP owed, no DCQCN state, no limit.
    pub fn reset(&mut self) {
        *self = Congestion::new(self.config.clone());
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

    /// A packet marked CE arrived for this QP at `now`: the notification point.
    pub fn on_ce(&mut self, now: Instant, counters: &mut Counters) {
        counters.np_ecn_marked_roce_packets += 1;
        if !self.config.np {
            return;
        }
        let interval =
            crate::congestion::DcqcnParams::us(self.config.dcqcn.np_min_time_between_cnps);
        if self.last_cnp.is_some_and(|last| now < last + interval) {
            return;
        }
        self.last_cnp = Some(now);
        self.cnp_owed = true;
        self.active = true;
    }

    /// Writes the CNP owed, if one is, into `bth`/`ext`/`av` (to the peer QP `dest_qpn` at
    /// `av`): BECN set, PSN 0, 16 zero bytes, DSCP `np_cnp_dscp`, not ECN-capable.
    pub fn take_cnp(
        &mut self,
        dest_qpn: u32,
        av: AddressVector,
        counters: &mut Counters,
    ) -> Option<(bth::Repr, ExtRepr, AddressVector)> {
        if !self.cnp_owed {
            return None;
        }
        self.cnp_owed = false;
        self.active = self.pacer.is_some();
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
        let cuts_before = self.cuts();
        match &mut self.rp {
            Some(rp) => rp.on_cnp(now, &params),
            None => {
                let rate = self.config.max_rate();
                self.rp = Some(Box::new(ReactionPoint::first_cnp(now, rate, &params)));
            }
        }
        counters.rp_rate_cuts += self.cuts() - cuts_before;
        self.refresh();
    }

    /// Sets or clears the user's rate limit.
    pub fn set_limit(&mut self, limit: Option<RateLimit>) {
        self.limit = limit.filter(|limit| limit.rate.kbps() > 0);
        self.refresh();
    }

    /// `Ok` if the requester may send a packet at `now`; otherwise remembers when it may.
    #[inline]
    pub fn pace(&mut self, now: Instant) -> Result<(), Instant> {
        let Some(pacer) = &self.pacer else {
            return Ok(());
        };
        pacer
            .check(now)
            .inspect_err(|&at| self.pace_wake = Some(at))
    }

    /// The requester sent a packet of `bytes` (headers and payload) at `now`.
    pub fn sent(&mut self, now: Instant, bytes: u64) {
        if let Some(pacer) = &mut self.pacer {
            pacer.charge(now, bytes);
        }
        let params = self.config.dcqcn;
        let max = self.config.max_rate();
        if let Some(rp) = &mut self.rp {
            let before = rp.current();
            rp.on_sent(bytes, &params, max);
            if rp.current() != before {
                self.refresh();
            }
        }
    }

    /// When [`on_timeout`](Self::on_timeout) has something to do.
    pub fn next_deadline(&self) -> Option<Instant> {
        let rp = self
            .rp
            .as_ref()
            .map(|rp| rp.next_deadline(&self.config.dcqcn));
        [rp, self.pace_wake].into_iter().flatten().min()
    }

    /// Runs what is due at `now`: DCQCN's pending cut and increases; the pacer's wake-up
    /// (after which the requester is asked again).
    pub fn on_timeout(&mut self, now: Instant, counters: &mut Counters) {
        if self.pace_wake.is_some_and(|at| at <= now) {
            self.pace_wake = None;
        }
        let params = self.config.dcqcn;
        let max = self.config.max_rate();
        let cuts_before = self.cuts();
        if let Some(rp) = &mut self.rp {
            if rp.next_deadline(&params) <= now {
                rp.on_timeout(now, &params, max);
            }
        }
        counters.rp_rate_cuts += self.cuts() - cuts_before;
        self.refresh();
    }

    /// Cuts so far, finished reaction points' included.
    fn cuts(&self) -> u64 {
        self.past_cuts + self.rp.as_ref().map_or(0, |rp| rp.cuts)
    }

    /// Drops a finished reaction point and makes the pacer apply the least of the limits.
    fn refresh(&mut self) {
        let max = self.config.max_rate();
        if self.rp.as_ref().is_some_and(|rp| rp.finished(max)) {
            self.past_cuts += self.rp.take().map_or(0, |rp| rp.cuts);
        }
        let dcqcn = self.rp.as_ref().map(|rp| rp.current());
        let limit = self.limit.map(|limit| limit.rate);
        let rate = [dcqcn, limit].into_iter().flatten().min();
        let burst = self.limit.map_or(0, |limit| u64::from(limit.max_burst));
        match (rate, &mut self.pacer) {
            (None, _) => {
                self.pacer = None;
                self.pace_wake = None;
            }
            (Some(rate), Some(pacer)) => pacer.set(rate, burst),
            (Some(rate), None) => self.pacer = Some(Pacer::new(rate, burst)),
        }
        self.active = self.cnp_owed || self.pacer.is_some();
    }

    /// The QP's rates, as of `now`.
    pub fn snapshot(&mut self, now: Instant) -> QpRate {
        let params = self.config.dcqcn;
        let cuts = self.cuts();
        let rp = self.rp.as_deref_mut();
        QpRate {
            current: self.pacer.map(|pacer| pacer.rate()),
            dcqcn_current: rp.as_ref().map(|rp| rp.current()),
            dcqcn_target: rp.as_ref().map(|rp| rp.target()),
            alpha: rp.map(|rp| rp.alpha(now, &params)),
            limit: self.limit.map(|limit| limit.rate),
            cuts,
            selective_repeat: false,
        }
    }
}

//! DCQCN's reaction point for one QP (Zhu et al., SIGCOMM 2015, section 3.1), with mlx5's
//! knobs ([`DcqcnParams`]): from its first CNP on, a QP has a current rate RC, a target
//! rate RT and a congestion estimate α (out of 1024).
//!
//! - α: every `rp_dce_tcp_rtt` µs, α ← α·g/1024 + (a CNP came in that period ? 1024 − g : 0)
//!   with g = `rp_dce_tcp_g` (the paper's α ← (1 − g′)·α + g′ with g′ = (1024 − g)/1024).
//!   Updated lazily, period by period, whenever the state is read, so no timer runs for it.
//! - Cut, on a CNP, at most once per `rp_rate_reduce_monitor_period` µs (CNPs within it cut
//!   once, at its end): RT ← RC (when mlx5's clamp rules say so), RC ← RC·(1 − α/2), but
//!   never below `rp_min_dec_fac` % of RC nor below `rp_min_rate`. The stages and the byte
//!   counter restart.
//! - Increase, on each `rp_time_reset` µs without a cut (the timer) and each `rp_byte_reset`
//!   bytes sent (the byte counter), each counting its own stage: while both stages are
//!   below `rp_threshold`, fast recovery (RC ← (RT + RC)/2); when one has reached it,
//!   additive increase (RT += `rp_ai_rate`, then the same averaging); when both are beyond
//!   it, hyper increase (RT += `rp_hai_rate`). RT never exceeds the highest rate.
//!
//! Rates are integers in kb/s, as a NIC's rate registers are; averaging rounds up, so RC
//! reaches RT. Once RC and RT are both the highest rate the QP is unlimited again and the
//! state is dropped (mlx5 releases the QP's rate limiter).

use std::time::{Duration, Instant};

use crate::congestion::{DcqcnParams, Rate};

/// α is kept with this many more bits than mlx5's 10: with 10, the truncation of each
/// per-µs decay outweighs what a CNP every few µs adds, and α sinks to 0 under a steady
/// stream of CNPs.
const ALPHA_SHIFT: u32 = 10;
/// α at its largest: 1023 of 1024.
const ALPHA_MAX: u32 = 1023 << ALPHA_SHIFT;

/// The timer's increases run at most this often in one call (a QP whose timers were not
/// run for a long time catches up at once, but boundedly).
const MAX_CATCH_UP: u32 = 4096;

/// The reaction point of one QP, while DCQCN limits it.
#[derive(Debug, Clone)]
pub(crate) struct ReactionPoint {
    /// Current rate RC.
    rc: u64,
    /// Target rate RT.
    rt: u64,
    /// α, out of 1024 << [`ALPHA_SHIFT`].
    alpha: u32,
    /// Start of the α period under way.
    alpha_period: Instant,
    /// A CNP arrived in the α period under way.
    cnp_in_alpha_period: bool,
    /// When the last cut happened.
    last_cut: Instant,
    /// A CNP arrived within the monitor period after the last cut: cut at its end.
    cut_pending: bool,
    /// Increases by the timer since the last cut.
    timer_stage: u32,
    /// Increases by the byte counter since the last cut.
    byte_stage: u32,
    /// Bytes sent since the byte counter last fired.
    bytes: u64,
    /// When the timer next fires.
    increase_at: Instant,
    /// Cuts so far (the first CNP's included).
    pub cuts: u64,
}

/// Which counter fired an increase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Increase {
    Timer,
    Bytes,
}

impl ReactionPoint {
    /// The state a QP sending at `rate` enters on its first CNP, at `now`, which it also
    /// handles: α starts at `rp_initial_alpha_value`, and the rate drops to
    /// `rp_rate_to_set_on_first_cnp` or is cut as by any CNP.
    pub fn first_cnp(now: Instant, rate: Rate, params: &DcqcnParams) -> ReactionPoint {
        let mut rp = ReactionPoint {
            rc: rate.kbps(),
            rt: rate.kbps(),
            alpha: (params.rp_initial_alpha_value << ALPHA_SHIFT).min(ALPHA_MAX),
            alpha_period: now,
            cnp_in_alpha_period: false,
            last_cut: now,
            cut_pending: false,
            timer_stage: 0,
            byte_stage: 0,
            bytes: 0,
            increase_at: now + DcqcnParams::us(params.rp_time_reset),
            cuts: 0,
        };
        match params.rp_rate_to_set_on_first_cnp {
            0 => rp.cut(now, params),
            mbps => {
                rp.rc = Rate::mbps(u64::from(mbps)).kbps().min(rp.rc);
                rp.cuts = 1;
            }
        }
        rp.cnp_in_alpha_period = true;
        rp
    }

    /// The current rate RC.
    pub fn current(&self) -> Rate {
        Rate(self.rc)
    }

    /// The target rate RT.
    pub fn target(&self) -> Rate {
        Rate(self.rt)
    }

    /// α, out of 1024, as of `now`.
    pub fn alpha(&mut self, now: Instant, params: &DcqcnParams) -> u32 {
        self.advance_alpha(now, params);
        self.alpha >> ALPHA_SHIFT
    }

    /// A CNP for this QP arrived at `now`.
    pub fn on_cnp(&mut self, now: Instant, params: &DcqcnParams) {
        self.advance_alpha(now, params);
        if now >= self.last_cut + monitor_period(params) {
            self.cut(now, params);
        } else {
            self.cut_pending = true;
        }
        self.cnp_in_alpha_period = true;
    }

    /// The QP sent `bytes`: the byte counter may fire.
    pub fn on_sent(&mut self, bytes: u64, params: &DcqcnParams, max: Rate) {
        let reset = u64::from(params.rp_byte_reset);
        if reset == 0 {
            return;
        }
        self.bytes += bytes;
        while self.bytes >= reset {
            self.bytes -= reset;
            self.increase(Increase::Bytes, params, max);
        }
    }

    /// When [`on_timeout`](Self::on_timeout) has something to do: the timer, or a pending
    /// cut.
    pub fn next_deadline(&self, params: &DcqcnParams) -> Instant {
        let cut = self
            .cut_pending
            .then(|| self.last_cut + monitor_period(params));
        cut.map_or(self.increase_at, |cut| cut.min(self.increase_at))
    }

    /// Runs what is due at `now`: a pending cut, then the timer's increases.
    pub fn on_timeout(&mut self, now: Instant, params: &DcqcnParams, max: Rate) {
        if self.cut_pending && now >= self.last_cut + monitor_period(params) {
            self.advance_alpha(now, params);
            self.cut(now, params);
        }
        let period = DcqcnParams::us(params.rp_time_reset);
        let mut rounds = 0;
        while now >= self.increase_at && rounds < MAX_CATCH_UP {
            self.increase_at += period;
            self.increase(Increase::Timer, params, max);
            rounds += 1;
        }
        if now >= self.increase_at {
            self.increase_at = now + period;
        }
    }

    /// Whether the QP is back at the highest rate with nothing left to recover.
    pub fn finished(&self, max: Rate) -> bool {
        self.rc >= max.kbps() && self.rt >= max.kbps() && !self.cut_pending
    }

    /// A new highest rate (the line rate or `rp_max_rate` changed): RC and RT stay below it.
    pub fn clamp(&mut self, max: Rate) {
        self.rc = self.rc.min(max.kbps());
        self.rt = self.rt.min(max.kbps());
    }

    fn cut(&mut self, now: Instant, params: &DcqcnParams) {
        let clamp = params.rp_clamp_tgt_rate != 0
            || self.byte_stage > 0
            || (params.rp_clamp_tgt_rate_ati != 0 && self.timer_stage > 0)
            || self.cuts == 0;
        if clamp {
            self.rt = self.rc;
        }
        // RC·α/2 with α out of 1024 << ALPHA_SHIFT.
        let by_alpha =
            ((u128::from(self.rc) * u128::from(self.alpha)) >> (11 + ALPHA_SHIFT)) as u64;
        let most = self.rc * u64::from(100 - params.rp_min_dec_fac.min(100)) / 100;
        let floor = Rate::mbps(u64::from(params.rp_min_rate)).kbps();
        self.rc = (self.rc - by_alpha.min(most)).max(floor);
        self.cuts += 1;
        self.last_cut = now;
        self.cut_pending = false;
        self.timer_stage = 0;
        self.byte_stage = 0;
        self.bytes = 0;
        self.increase_at = now + DcqcnParams::us(params.rp_time_reset);
    }

    fn increase(&mut self, by: Increase, params: &DcqcnParams, max: Rate) {
        let threshold = params.rp_threshold;
        let (low, high) = (
            self.timer_stage.min(self.byte_stage),
            self.timer_stage.max(self.byte_stage),
        );
        if low > threshold {
            self.rt += Rate::mbps(u64::from(params.rp_hai_rate)).kbps();
        } else if high >= threshold {
            self.rt += Rate::mbps(u64::from(params.rp_ai_rate)).kbps();
        }
        self.rt = self.rt.min(max.kbps());
        self.rc = (self.rc + self.rt).div_ceil(2).min(self.rt.max(self.rc));
        match by {
            Increase::Timer => self.timer_stage = self.timer_stage.saturating_add(1),
            Increase::Bytes => self.byte_stage = self.byte_stage.saturating_add(1),
        }
    }

    /// Brings α up to `now`: the period under way (with or without a CNP), then one decay
    /// per whole period since.
    fn advance_alpha(&mut self, now: Instant, params: &DcqcnParams) {
        let period = DcqcnParams::us(params.rp_dce_tcp_rtt);
        let Some(elapsed) = now.checked_duration_since(self.alpha_period) else {
            return;
        };
        let periods = elapsed.as_nanos() / period.as_nanos();
        if periods == 0 {
            return;
        }
        let g = u64::from(params.rp_dce_tcp_g.min(1024));
        let raised = if self.cnp_in_alpha_period {
            (1024 - g) << ALPHA_SHIFT
        } else {
            0
        };
        let decay = |alpha: u32| (u64::from(alpha) * g / 1024) as u32;
        self.alpha = (u64::from(decay(self.alpha)) + raised).min(u64::from(ALPHA_MAX)) as u32;
        let mut left = periods - 1;
        while left > 0 && self.alpha > 0 {
            self.alpha = decay(self.alpha);
            left -= 1;
        }
        self.alpha_period += period * u32::try_from(periods).unwrap_or(u32::MAX);
        if periods > u128::from(u32::MAX) {
            self.alpha_period = now;
        }
        self.cnp_in_alpha_period = false;
    }
}

fn monitor_period(params: &DcqcnParams) -> Duration {
    DcqcnParams::us(params.rp_rate_reduce_monitor_period)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINE: Rate = Rate::gbps(10);

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    /// The paper's α recurrence in real numbers, for `periods` periods, a CNP in the first
    /// when `cnp`.
    fn paper_alpha(alpha: f64, g: f64, cnp: bool, periods: u32) -> f64 {
        let mut alpha = (1.0 - g) * alpha + if cnp { g } else { 0.0 };
        for _ in 1..periods {
            alpha *= 1.0 - g;
        }
        alpha
    }

    #[test]
    fn first_cnp_halves_the_rate_with_alpha_one() {
        let params = DcqcnParams::default();
        let t0 = Instant::now();
        let mut rp = ReactionPoint::first_cnp(t0, LINE, &params);
        // RC·(1 − α/2) with α = 1023/1024, RT = the rate before the cut.
        let expected = LINE.kbps() - LINE.kbps() * 1023 / 2048;
        assert_eq!(rp.current(), Rate(expected));
        assert_eq!(rp.target(), LINE);
        assert_eq!(rp.cuts, 1);
        assert_eq!(rp.alpha(t0, &params), 1023);
    }

    #[test]
    fn alpha_follows_the_papers_recurrence() {
        let params = DcqcnParams::default();
        let g = f64::from(1024 - params.rp_dce_tcp_g) / 1024.0;
        let t0 = Instant::now();
        let mut rp = ReactionPoint::first_cnp(t0, LINE, &params);
        // The first period held a CNP; then 99 without.
        let alpha = rp.alpha(t0 + us(100), &params);
        let paper = paper_alpha(1023.0 / 1024.0, g, true, 100) * 1024.0;
        // What truncation costs is far below one unit of 1024.
        assert!((f64::from(alpha) - paper).abs() < 1.0, "{alpha} vs {paper}");
        // A CNP in a period raises α by g at its end.
        rp.on_cnp(t0 + us(100), &params);
        let before = f64::from(alpha);
        let after = rp.alpha(t0 + us(101), &params);
        let want = before * f64::from(params.rp_dce_tcp_g) / 1024.0 + 5.0;
        assert!((f64::from(after) - want).abs() < 1.0, "{after} vs {want}");
        // Long silence: α decays to nothing, in bounded work.
        assert_eq!(rp.alpha(t0 + Duration::from_secs(10), &params), 0);
    }

    /// Found in `roce sim --incast 8`: with α in mlx5's 10 bits, each per-µs decay
    /// truncated away more than a CNP every 10 µs added, and α sank to 0 while CNPs kept
    /// coming, so the cuts did nothing.
    #[test]
    fn alpha_settles_at_the_papers_fixed_point_under_steady_cnps() {
        let params = DcqcnParams::default();
        let g = f64::from(1024 - params.rp_dce_tcp_g) / 1024.0;
        let t0 = Instant::now();
        let mut rp = ReactionPoint::first_cnp(t0, LINE, &params);
        let mut paper = 1023.0 / 1024.0;
        for k in 1..=400 {
            rp.on_cnp(t0 + us(10 * k), &params);
            paper = paper_alpha(paper, g, true, 10);
        }
        let alpha = f64::from(rp.alpha(t0 + us(4000), &params)) / 1024.0;
        assert!(
            (alpha - paper).abs() < 0.002,
            "α {alpha}, the paper's {paper}"
        );
        assert!(
            alpha > 0.09,
            "a CNP every 10 µs keeps α near 0.1, not 0: {alpha}"
        );
    }

    #[test]
    fn cuts_at_most_once_per_monitor_period() {
        let params = DcqcnParams::default();
        let t0 = Instant::now();
        let mut rp = ReactionPoint::first_cnp(t0, LINE, &params);
        let after_first = rp.current();
        for k in 1..4 {
            rp.on_cnp(t0 + us(k), &params);
        }
        assert_eq!(rp.cuts, 1, "three CNPs within 4 µs of the cut");
        assert_eq!(rp.current(), after_first);
        assert_eq!(rp.next_deadline(&params), t0 + us(4));
        rp.on_timeout(t0 + us(4), &params, LINE);
        assert_eq!(rp.cuts, 2, "they cut once, at the end of the period");
        // RC·(1 − α/2) with α as the recurrence made it at 4 µs (α is read out of 1024,
        // kept finer).
        let alpha = u64::from(rp.alpha(t0 + us(4), &params));
        let rc = after_first.kbps();
        let expected = rc - rc * alpha / 2048;
        let got = rp.current().kbps();
        assert!(
            got <= expected && expected - got <= rc / 2048,
            "{got} vs {expected}"
        );
        // mlx5's clamp: no increase since the last cut, so RT keeps the rate before it.
        assert_eq!(rp.target(), LINE);
        // With rp_clamp_tgt_rate, every cut sets RT ← RC first (the paper's rule).
        let clamping = DcqcnParams {
            rp_clamp_tgt_rate: 1,
            ..params
        };
        let mut rp = ReactionPoint::first_cnp(t0, LINE, &clamping);
        rp.on_cnp(t0 + us(5), &clamping);
        assert_eq!(rp.target(), after_first);
    }

    #[test]
    fn a_cut_never_takes_more_than_min_dec_fac_nor_goes_below_min_rate() {
        let params = DcqcnParams {
            rp_min_dec_fac: 80,
            rp_min_rate: 2100,
            rp_initial_alpha_value: 1023,
            ..DcqcnParams::default()
        };
        let t0 = Instant::now();
        let rp = ReactionPoint::first_cnp(t0, LINE, &params);
        // α/2 would take half; rp_min_dec_fac 80 leaves 80 %.
        assert_eq!(rp.current(), Rate(LINE.kbps() * 80 / 100));
        let mut rp = ReactionPoint::first_cnp(t0, Rate::mbps(2500), &params);
        assert_eq!(rp.current(), Rate::mbps(2100), "not below rp_min_rate");
        rp.on_cnp(t0 + us(10), &params);
        assert_eq!(rp.current(), Rate::mbps(2100));
    }

    #[test]
    fn fast_recovery_then_additive_then_hyper_increase() {
        // The QP runs at 10 Gb/s on a 100 Gb/s port, so RT has room to rise.
        let max = Rate::gbps(100);
        let params = DcqcnParams {
            rp_threshold: 2,
            rp_byte_reset: 0,
            ..DcqcnParams::default()
        };
        let t0 = Instant::now();
        let mut rp = ReactionPoint::first_cnp(t0, LINE, &params);
        let (rt, mut rc) = (rp.target().kbps(), rp.current().kbps());
        let period = us(u64::from(params.rp_time_reset));
        // Two timer events of fast recovery: RC ← (RT + RC)/2, RT unchanged.
        for k in 1..=2 {
            rp.on_timeout(t0 + period * k, &params, max);
            rc = (rc + rt).div_ceil(2);
            assert_eq!((rp.target().kbps(), rp.current().kbps()), (rt, rc));
        }
        // The timer stage reached the threshold: additive increase, RT += rp_ai_rate.
        rp.on_timeout(t0 + period * 3, &params, max);
        assert_eq!(rp.target().kbps(), rt + 5_000);
        assert_eq!(rp.current().kbps(), (rc + rt + 5_000).div_ceil(2));
        // Hyper increase needs both stages beyond the threshold.
        let params = DcqcnParams {
            rp_threshold: 1,
            rp_byte_reset: 1000,
            ..DcqcnParams::default()
        };
        let mut rp = ReactionPoint::first_cnp(t0, LINE, &params);
        let period = us(u64::from(params.rp_time_reset));
        rp.on_timeout(t0 + period, &params, max); // fast recovery, timer stage 1
        rp.on_timeout(t0 + period * 2, &params, max); // additive, timer stage 2
        let before = rp.target().kbps();
        rp.on_sent(2000, &params, max); // two byte events: additive (byte stage 0, 1)
        assert_eq!(rp.target().kbps(), before + 2 * 5_000);
        rp.on_sent(1000, &params, max); // stages 2 and 2, both beyond 1: hyper
        assert_eq!(rp.target().kbps(), before + 2 * 5_000 + 50_000);
        // RT never passes the highest rate.
        rp.on_sent(1_000_000, &params, Rate::gbps(10));
        assert_eq!(rp.target(), Rate::gbps(10));
    }

    #[test]
    fn recovers_to_line_rate_and_finishes() {
        let params = DcqcnParams::default();
        let t0 = Instant::now();
        let mut rp = ReactionPoint::first_cnp(t0, LINE, &params);
        assert!(!rp.finished(LINE));
        let period = us(u64::from(params.rp_time_reset));
        let mut t = t0;
        for _ in 0..30 {
            t += period;
            rp.on_timeout(t, &params, LINE);
        }
        assert_eq!(rp.current(), LINE);
        assert!(rp.finished(LINE));
    }
}

//! Congestion control and rate limiting, as a device is configured for them: ECN on what we
//! send, the notification point (CNPs answering CE marks), DCQCN's reaction point, and the
//! negotiation of selective repeat. The per-QP machinery lives in `qp/` (`congestion.rs`,
//! `dcqcn.rs`, `pacer.rs`); this module holds the settings and their mlx5 names.
//!
//! DCQCN is Zhu et al., "Congestion Control for Large-Scale RDMA Deployments" (SIGCOMM
//! 2015), with the knobs, units and defaults of mlx5 firmware as `drivers/infiniband/hw/
//! mlx5/cong.c` exposes them (`/sys/kernel/debug/mlx5/<pci>/cc_params/`).

use std::fmt;
use std::time::Duration;

/// A rate in kilobits per second (the unit of `ibv_qp_rate_limit_attr.rate_limit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Rate(pub u64);

impl Rate {
    /// `mbps` megabits per second.
    pub const fn mbps(mbps: u64) -> Rate {
        Rate(mbps * 1000)
    }

    /// `gbps` gigabits per second.
    pub const fn gbps(gbps: u64) -> Rate {
        Rate(gbps * 1_000_000)
    }

    /// Kilobits per second.
    pub const fn kbps(self) -> u64 {
        self.0
    }

    /// How long `bytes` take at this rate (a zero rate never sends: a day).
    pub fn time_for(self, bytes: u64) -> Duration {
        if self.0 == 0 {
            return Duration::from_secs(86_400);
        }
        // bytes·8 / (kbps·1000) seconds, in nanoseconds: bytes·8·10^6 / kbps.
        Duration::from_nanos((u128::from(bytes) * 8_000_000 / u128::from(self.0)) as u64)
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 >= 1_000_000 && self.0.is_multiple_of(1000) {
            write!(f, "{}Mb/s", self.0 / 1000)
        } else {
            write!(f, "{}kb/s", self.0)
        }
    }
}

/// A rate limit on what one QP sends (`ibv_modify_qp_rate_limit`, or `IBV_QP_RATE_LIMIT`
/// of `ibv_modify_qp` with no burst): a token bucket. Set with
/// [`Endpoint::set_rate_limit`](crate::Endpoint::set_rate_limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RateLimit {
    /// The rate; 0 removes the limit.
    pub rate: Rate,
    /// Bytes that may leave back to back after a pause (`max_burst_sz`; 0: one packet).
    pub max_burst: u32,
}

/// ECT(0), the ECN codepoint we send (RFC 3168): "ECN-capable transport".
pub const ECT0: u8 = 0b10;
/// Congestion experienced: what a marking switch writes over ECT.
pub const CE: u8 = 0b11;

macro_rules! dcqcn_params {
    ($($(#[doc = $doc:literal])* $name:ident: $ty:ty = $default:expr,)*) => {
        /// DCQCN's knobs, named, in the units, and with the defaults of mlx5 firmware's
        /// congestion parameters (`rp_*` for the reaction point, `np_*` for the notification
        /// point). Rates are in Mb/s, times in µs, bytes in bytes.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct DcqcnParams {
            $($(#[doc = $doc])* pub $name: $ty,)*
        }

        impl Default for DcqcnParams {
            fn default() -> Self {
                DcqcnParams { $($name: $default,)* }
            }
        }

        impl DcqcnParams {
            /// The knobs' names, as mlx5's debugfs files are named.
            pub const NAMES: &'static [&'static str] = &[$(stringify!($name),)*];

            /// Sets the knob `name` to `value`; `Err` names what is wrong.
            /// Nothing changes on error.
            pub fn set(&mut self, name: &str, value: u64) -> Result<(), String> {
                let mut next = *self;
                match name {
                    $(stringify!($name) => {
                        next.$name = <$ty>::try_from(value)
                            .map_err(|_| format!("{name}: {value} is out of range"))?;
                    })*
                    _ => return Err(format!("no DCQCN parameter {name:?} (known: {})",
                                            Self::NAMES.join(", "))),
                }
                next.check()?;
                *self = next;
                Ok(())
            }

            /// Each knob with its value, in the order of [`NAMES`](Self::NAMES).
            pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> {
                Self::NAMES.iter().copied().zip([$(u64::from(self.$name),)*])
            }
        }
    };
}

dcqcn_params! {
    /// On a rate cut, the target rate always becomes the current rate (1), or only when the
    /// rate rose since the last cut (0).
    rp_clamp_tgt_rate: u8 = 0,
    /// With `rp_clamp_tgt_rate` 0: a rise by the timer alone also counts (1).
    rp_clamp_tgt_rate_ati: u8 = 1,
    /// µs without a CNP between two rate increases by the timer.
    rp_time_reset: u32 = 300,
    /// Bytes sent without a CNP between two rate increases by the byte counter (0: off).
    rp_byte_reset: u32 = 32767,
    /// Increase events (of the timer or the byte counter) of fast recovery before additive
    /// increase; both beyond it: hyper increase.
    rp_threshold: u32 = 1,
    /// Mb/s the target rate rises per additive increase.
    rp_ai_rate: u32 = 5,
    /// Mb/s the target rate rises per hyper increase.
    rp_hai_rate: u32 = 50,
    /// The most a rate may become, Mb/s (0: the line rate).
    rp_max_rate: u32 = 0,
    /// A cut leaves at least this percentage of the rate (50: a cut at most halves it).
    rp_min_dec_fac: u32 = 50,
    /// The least a rate may become, Mb/s.
    rp_min_rate: u32 = 1,
    /// Mb/s a QP drops to on its first CNP (0: the first CNP cuts as every other does).
    rp_rate_to_set_on_first_cnp: u32 = 0,
    /// α's weight, out of 1024, kept per update: α ← α·g/1024 + (CNP seen ? 1024 − g : 0),
    /// so the paper's g is (1024 − rp_dce_tcp_g)/1024.
    rp_dce_tcp_g: u32 = 1019,
    /// µs between α updates.
    rp_dce_tcp_rtt: u32 = 1,
    /// µs between two rate cuts; CNPs in between cut once, at its end.
    rp_rate_reduce_monitor_period: u32 = 4,
    /// α on the first CNP, out of 1023.
    rp_initial_alpha_value: u32 = 1023,
    /// Unused by this reaction point (mlx5's rate-decrease gain for QCN); kept so that
    /// every mlx5 knob can be set.
    rp_gd: u32 = 11,
    /// µs: a QP sends at most one CNP per this interval.
    np_min_time_between_cnps: u32 = 4,
    /// DSCP of the CNPs we send.
    np_cnp_dscp: u8 = 48,
    /// Whether the CNP priority comes from `np_cnp_prio` (0) or the QP (1); kept for
    /// completeness: without VLAN tags there is no priority to set.
    np_cnp_prio_mode: u8 = 1,
    /// 802.1p priority of CNPs (needs a VLAN tag; unused).
    np_cnp_prio: u8 = 6,
}

impl DcqcnParams {
    /// Whether the values make sense together (no zero periods, α within 10 bits...).
    pub fn check(&self) -> Result<(), String> {
        let bad = [
            ("rp_time_reset", self.rp_time_reset == 0),
            ("rp_dce_tcp_rtt", self.rp_dce_tcp_rtt == 0),
            ("rp_dce_tcp_g", self.rp_dce_tcp_g > 1024),
            ("rp_initial_alpha_value", self.rp_initial_alpha_value > 1023),
            ("rp_min_dec_fac", self.rp_min_dec_fac > 100),
            ("rp_clamp_tgt_rate", self.rp_clamp_tgt_rate > 1),
            ("rp_clamp_tgt_rate_ati", self.rp_clamp_tgt_rate_ati > 1),
            ("np_cnp_dscp", self.np_cnp_dscp > 63),
            ("np_cnp_prio", self.np_cnp_prio > 7),
        ];
        match bad.iter().find(|(_, bad)| *bad) {
            Some((name, _)) => Err(format!("{name} is out of range")),
            None => Ok(()),
        }
    }

    /// A duration of `us` microseconds.
    pub(crate) fn us(us: u32) -> Duration {
        Duration::from_micros(u64::from(us))
    }
}

/// How a device takes part in congestion control. The default is mlx5's with DCQCN
/// enabled: ECT(0) on what connected QPs send, CNPs for CE, DCQCN on CNPs; selective repeat
/// is off (see [`selective_repeat`](Self::selective_repeat)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CongestionConfig {
    /// Mark the packets of RC and UC QPs ECN-capable (ECT(0)); otherwise the ECN bits of
    /// the QP's traffic class are sent as given.
    pub ecn: bool,
    /// Notification point: answer CE-marked packets with CNPs.
    pub np: bool,
    /// Reaction point: slow down on CNPs (DCQCN); otherwise they are counted as ignored.
    pub rp: bool,
    /// The port's speed: DCQCN's highest rate unless `rp_max_rate` is set.
    pub line_rate: Rate,
    /// DCQCN's knobs.
    pub dcqcn: DcqcnParams,
    /// Offer selective repeat to peers (only another roce-xdp accepts it; see the QP's
    /// `selective` module and `docs/interop.md`); off, every peer sees go-back-N.
    pub selective_repeat: bool,
}

impl Default for CongestionConfig {
    fn default() -> Self {
        CongestionConfig {
            ecn: true,
            np: true,
            rp: true,
            line_rate: Rate::gbps(100),
            dcqcn: DcqcnParams::default(),
            selective_repeat: false,
        }
    }
}

impl CongestionConfig {
    /// DCQCN's highest rate: `rp_max_rate`, or the line rate.
    pub fn max_rate(&self) -> Rate {
        match self.dcqcn.rp_max_rate {
            0 => self.line_rate,
            mbps => Rate::mbps(u64::from(mbps)).min(self.line_rate),
        }
    }
}

/// One QP's congestion state, for tools and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QpRate {
    /// What the QP's pacer lets it send now, if anything limits it: the least of DCQCN's
    /// current rate and the rate limit.
    pub current: Option<Rate>,
    /// DCQCN's current rate RC, while it runs.
    pub dcqcn_current: Option<Rate>,
    /// DCQCN's target rate RT, while it runs.
    pub dcqcn_target: Option<Rate>,
    /// DCQCN's α, out of 1024, while it runs.
    pub alpha: Option<u32>,
    /// The rate limit set with `ibv_modify_qp_rate_limit` or `IBV_QP_RATE_LIMIT`.
    pub limit: Option<Rate>,
    /// Rate cuts so far.
    pub cuts: u64,
    /// Whether the QP's peer and this QP agreed on selective repeat, as requester.
    pub selective_repeat: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_and_times() {
        assert_eq!(Rate::gbps(10).time_for(1250), Duration::from_nanos(1000));
        assert_eq!(Rate::mbps(1).time_for(125), Duration::from_millis(1));
        assert_eq!(Rate(0).time_for(1), Duration::from_secs(86_400));
        assert_eq!(Rate::gbps(25).to_string(), "25000Mb/s");
        assert_eq!(Rate(1500).to_string(), "1500kb/s");
    }

    #[test]
    fn knobs_by_mlx5_name() {
        let mut params = DcqcnParams::default();
        assert_eq!(params.rp_time_reset, 300);
        params.set("rp_ai_rate", 40).unwrap();
        assert_eq!(params.rp_ai_rate, 40);
        assert!(params.set("rp_min_dec_fac", 101).is_err());
        assert!(params.set("np_cnp_dscp", 300).is_err());
        assert!(params.set("rp_time_reset", 0).is_err());
        assert!(params
            .set("no_such_knob", 1)
            .unwrap_err()
            .contains("rp_ai_rate"));
        assert_eq!(DcqcnParams::NAMES.len(), params.iter().count());
        assert!(DcqcnParams::NAMES.contains(&"np_min_time_between_cnps"));
    }
}

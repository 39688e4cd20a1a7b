//! A QP's pacer: a token bucket that lets `rate` through with bursts of up to `burst`
//! bytes, kept as the generic cell rate algorithm does (one theoretical arrival time rather
//! than a token count), so it costs one comparison per packet and no timer while it lets
//! packets through.
//!
//! A packet may leave when the bucket is not in debt beyond the burst; its bytes are
//! charged when it leaves (its size is known only once it is built), so one packet may
//! overdraw the bucket, which the next ones pay back. Only a QP that has a limit has a
//! pacer; the others never look at one.

use std::time::Instant;

use crate::congestion::Rate;

/// The token bucket of one QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pacer {
    rate: Rate,
    /// Bytes that may leave back to back after a pause.
    burst: u64,
    /// When the bytes charged so far will have drained at `rate` (the bucket is empty of
    /// tokens until then); `None` before the first packet.
    drained_at: Option<Instant>,
}

impl Pacer {
    /// A pacer letting `rate` through, with bursts of `burst` bytes.
    pub fn new(rate: Rate, burst: u64) -> Pacer {
        Pacer {
            rate,
            burst,
            drained_at: None,
        }
    }

    /// The rate it lets through.
    pub fn rate(&self) -> Rate {
        self.rate
    }

    /// Changes the rate (and burst) at `now`: the bytes charged and not yet drained drain
    /// at the new rate from now on, as tokens would refill at it.
    pub fn set(&mut self, now: Instant, rate: Rate, burst: u64) {
        if let Some(drained_at) = self.drained_at.filter(|&at| at > now) {
            let owed = (drained_at - now).as_nanos() * u128::from(self.rate.kbps()) / 8_000_000;
            self.drained_at = Some(now + rate.time_for(owed as u64));
        }
        self.rate = rate;
        self.burst = burst;
    }

    /// `Ok` if a packet may leave at `now`, or the instant from which one may.
    #[inline]
    pub fn check(&self, now: Instant) -> Result<(), Instant> {
        let Some(drained_at) = self.drained_at else {
            return Ok(());
        };
        let tolerance = self.rate.time_for(self.burst);
        match drained_at.checked_sub(tolerance) {
            Some(allowed) if allowed > now => Err(allowed),
            _ => Ok(()),
        }
    }

    /// Charges a packet of `bytes` that left at `now`.
    #[inline]
    pub fn charge(&mut self, now: Instant, bytes: u64) {
        let from = self.drained_at.map_or(now, |at| at.max(now));
        self.drained_at = Some(from + self.rate.time_for(bytes));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn paces_at_the_rate_without_a_burst() {
        // 1 Gb/s: 1250 bytes take 10 µs.
        let mut pacer = Pacer::new(Rate::gbps(1), 0);
        let t0 = Instant::now();
        assert_eq!(pacer.check(t0), Ok(()));
        pacer.charge(t0, 1250);
        let next = t0 + Duration::from_micros(10);
        assert_eq!(pacer.check(t0), Err(next));
        assert_eq!(pacer.check(next - Duration::from_nanos(1)), Err(next));
        assert_eq!(pacer.check(next), Ok(()));
        // Sending as soon as allowed, 100 packets take 100 × 10 µs.
        let mut now = t0;
        let mut sent = 0;
        let mut pacer = Pacer::new(Rate::gbps(1), 0);
        while sent < 100 {
            match pacer.check(now) {
                Ok(()) => {
                    pacer.charge(now, 1250);
                    sent += 1;
                }
                Err(at) => now = at,
            }
        }
        assert_eq!(now - t0, Duration::from_micros(990));
    }

    #[test]
    fn a_burst_leaves_back_to_back_then_the_rate_holds() {
        let mut pacer = Pacer::new(Rate::gbps(1), 5000);
        let t0 = Instant::now();
        let mut back_to_back = 0;
        while pacer.check(t0).is_ok() {
            pacer.charge(t0, 1250);
            back_to_back += 1;
            assert!(back_to_back < 100);
        }
        // 5000 bytes of tolerance: the packet that overdraws it is the fifth.
        assert_eq!(back_to_back, 5);
        // After a long pause the bucket is full again, but never more than full.
        let later = t0 + Duration::from_secs(1);
        let mut again = 0;
        while pacer.check(later).is_ok() {
            pacer.charge(later, 1250);
            again += 1;
        }
        assert_eq!(again, 5);
    }

    #[test]
    fn a_new_rate_applies_to_what_is_left_to_drain() {
        let mut pacer = Pacer::new(Rate::gbps(1), 0);
        let t0 = Instant::now();
        pacer.charge(t0, 1250);
        // Half the packet has drained at 1 Gb/s; the other half drains at 100 Mb/s.
        let half = t0 + Duration::from_micros(5);
        pacer.set(half, Rate::mbps(100), 0);
        assert_eq!(pacer.rate(), Rate::mbps(100));
        let next = half + Duration::from_micros(50);
        assert_eq!(pacer.check(half), Err(next));
        pacer.charge(next, 1250);
        assert_eq!(pacer.check(next), Err(next + Duration::from_micros(100)));
        // A rate rising again shortens what is left to drain.
        pacer.set(next, Rate::gbps(1), 0);
        assert_eq!(pacer.check(next), Err(next + Duration::from_micros(10)));
    }
}

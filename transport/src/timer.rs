//! The timers of one QP, in one table indexed by an enum (as quinn-proto keeps them).

use std::time::Instant;

/// A QP timer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timer {
    /// Local ACK timeout: nothing acknowledged the oldest outstanding request in time.
    Retransmit = 0,
    /// The wait an RNR NAK imposed before the requester may resend.
    RnrWait = 1,
    /// Congestion control: DCQCN's timer or pending cut, or the pacer letting the next
    /// packet go.
    Congestion = 2,
}

impl Timer {
    const ALL: [Timer; 3] = [Timer::Retransmit, Timer::RnrWait, Timer::Congestion];
}

/// Deadlines of every [`Timer`].
#[derive(Debug, Clone, Default)]
pub struct TimerTable {
    deadlines: [Option<Instant>; 3],
}

impl TimerTable {
    /// Arms `timer` for `deadline`, replacing any earlier setting.
    pub fn set(&mut self, timer: Timer, deadline: Instant) {
        self.deadlines[timer as usize] = Some(deadline);
    }

    /// Disarms `timer`.
    pub fn stop(&mut self, timer: Timer) {
        self.deadlines[timer as usize] = None;
    }

    /// Whether `timer` is armed.
    pub fn is_set(&self, timer: Timer) -> bool {
        self.deadlines[timer as usize].is_some()
    }

    /// The earliest deadline of all.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.deadlines.iter().flatten().min().copied()
    }

    /// Disarms and returns the timers whose deadline is at or before `now`.
    pub fn expire(&mut self, now: Instant) -> impl Iterator<Item = Timer> {
        let mut expired = [None; 3];
        for timer in Timer::ALL {
            if self.deadlines[timer as usize].is_some_and(|deadline| deadline <= now) {
                self.deadlines[timer as usize] = None;
                expired[timer as usize] = Some(timer);
            }
        }
        expired.into_iter().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn earliest_deadline_and_expiry() {
        let start = Instant::now();
        let mut timers = TimerTable::default();
        assert_eq!(timers.next_deadline(), None);
        timers.set(Timer::Retransmit, start + Duration::from_millis(5));
        timers.set(Timer::RnrWait, start + Duration::from_millis(2));
        assert_eq!(
            timers.next_deadline(),
            Some(start + Duration::from_millis(2))
        );
        let expired: Vec<Timer> = timers.expire(start + Duration::from_millis(3)).collect();
        assert_eq!(expired, [Timer::RnrWait]);
        assert!(timers.is_set(Timer::Retransmit) && !timers.is_set(Timer::RnrWait));
        timers.stop(Timer::Retransmit);
        assert_eq!(timers.next_deadline(), None);
    }
}

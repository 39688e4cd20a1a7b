//! 24-bit packet sequence numbers.

use core::cmp::Ordering;
use core::fmt;
use core::ops::{Add, Sub};

/// A packet sequence number: 24 bits that wrap.
///
/// Like smoltcp's `SeqNumber`, ordering is defined inside a half window: `a < b` when `b` is
/// between 1 and 2^23 − 1 steps ahead of `a`. Two PSNs exactly 2^23 apart are ordered by the
/// sign of [`Psn::distance`]. The order is consistent inside any window narrower than half
/// the space, which is all the IBTA lets a QP have outstanding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Psn(u32);

impl Psn {
    /// Number of distinct PSNs.
    pub const MODULUS: u32 = 1 << 24;
    /// Largest PSN value.
    pub const MAX: u32 = Self::MODULUS - 1;

    /// Keeps the low 24 bits of `value`.
    pub const fn new(value: u32) -> Self {
        Psn(value & Self::MAX)
    }

    /// The 24-bit value.
    pub const fn value(self) -> u32 {
        self.0
    }

    /// Signed steps from `earlier` to `self`, in −2^23 ..= 2^23 − 1.
    pub const fn distance(self, earlier: Psn) -> i32 {
        let diff = self.0.wrapping_sub(earlier.0) & Self::MAX;
        // Sign-extend the 24-bit difference.
        ((diff << 8) as i32) >> 8
    }
}

impl Add<u32> for Psn {
    type Output = Psn;

    fn add(self, steps: u32) -> Psn {
        Psn::new(self.0.wrapping_add(steps))
    }
}

impl Sub<u32> for Psn {
    type Output = Psn;

    fn sub(self, steps: u32) -> Psn {
        Psn::new(self.0.wrapping_sub(steps))
    }
}

/// Not `Ord`: the wrapping order is not transitive across the whole space, so a `Psn` must
/// not key a sorted map.
impl PartialOrd for Psn {
    fn partial_cmp(&self, other: &Psn) -> Option<Ordering> {
        Some(self.distance(*other).cmp(&0))
    }
}

impl fmt::Display for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#08x}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every pair in a window straddling the wrap orders and subtracts like plain integers.
    #[test]
    fn pairs_around_the_wrap() {
        const HALF_WIDTH: i64 = 300;
        for start in [Psn::MAX as i64 - 20, 0, (1 << 23) - 5] {
            for i in -HALF_WIDTH..HALF_WIDTH {
                for j in -HALF_WIDTH..HALF_WIDTH {
                    let a = Psn::new((start + i).rem_euclid(Psn::MODULUS as i64) as u32);
                    let b = Psn::new((start + j).rem_euclid(Psn::MODULUS as i64) as u32);
                    assert_eq!(a.distance(b) as i64, i - j, "{a} - {b}");
                    assert_eq!(a.partial_cmp(&b), Some(i.cmp(&j)), "{a} vs {b}");
                    assert_eq!(b + (i - j).rem_euclid(Psn::MODULUS as i64) as u32, a);
                }
            }
        }
    }

    #[test]
    fn half_window_edges() {
        let zero = Psn::new(0);
        assert_eq!(Psn::new((1 << 23) - 1).distance(zero), (1 << 23) - 1);
        assert!(Psn::new((1 << 23) - 1) > zero);
        assert_eq!(Psn::new(1 << 23).distance(zero), -(1 << 23));
        assert!(Psn::new(1 << 23) < zero);
        assert_eq!(Psn::new(Psn::MAX) + 1, zero);
        assert_eq!(zero - 1, Psn::new(Psn::MAX));
    }

    #[test]
    fn new_keeps_24_bits() {
        assert_eq!(Psn::new(0x1ab_cdef).value(), 0xab_cdef);
    }
}

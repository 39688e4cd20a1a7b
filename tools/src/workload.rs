//! What the tools move and how they check it: payload patterns, windows of guarded slots,
//! and an oracle for atomics. `roce sim`, `roce demo` and `roce perf --verify` all use it.
//!
//! A pattern is a function of a key and a byte's offset, so either side can fill or check
//! any part of it without the rest; distinct keys give unrelated bytes, so bytes left over
//! from an earlier message never pass for a later one. A window is a row of slots, each
//! followed (and the first preceded) by a guard of [`CANARY`] bytes that no operation
//! addresses: an operation that writes past its slot shows up as a changed guard.

/// What unaddressed memory holds, and must still hold when checked.
pub const CANARY: u8 = 0xA5;

/// SplitMix64's increment.
const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64: one step of a tiny generator that is a bijection of its state.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(GOLDEN);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The bytes of one key: word `i` (bytes `8i..8i+8`, little-endian) is SplitMix64's
/// output `i` from the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pattern(u64);

impl Pattern {
    pub const fn new(key: u64) -> Pattern {
        Pattern(key)
    }

    /// The pattern of message `seq` of lane `lane` in a run seeded `seed`: distinct for
    /// every lane (below 2^16) and message (below 2^48).
    pub fn for_message(seed: u64, lane: usize, seq: u64) -> Pattern {
        let mut state = seed ^ ((lane as u64) << 48) ^ seq;
        Pattern(splitmix64(&mut state))
    }

    /// The key, for operands that must be as unique as the bytes.
    pub const fn key(self) -> u64 {
        self.0
    }

    fn word(self, index: u64) -> [u8; 8] {
        let mut state = self.0.wrapping_add(index.wrapping_mul(GOLDEN));
        splitmix64(&mut state).to_le_bytes()
    }

    /// The byte at `offset`.
    pub fn byte(self, offset: u64) -> u8 {
        self.word(offset / 8)[(offset % 8) as usize]
    }

    /// Fills `out` with the bytes from `start` on.
    pub fn fill(self, start: u64, out: &mut [u8]) {
        let mut offset = start;
        let mut rest = out;
        while !rest.is_empty() {
            let word = self.word(offset / 8);
            let within = (offset % 8) as usize;
            let n = (8 - within).min(rest.len());
            rest[..n].copy_from_slice(&word[within..within + n]);
            rest = &mut rest[n..];
            offset += n as u64;
        }
    }

    /// The first index of `bytes` that differs from the pattern from `start` on.
    pub fn mismatch(self, start: u64, bytes: &[u8]) -> Option<usize> {
        (0..bytes.len()).find(|&i| bytes[i] != self.byte(start + i as u64))
    }
}

/// A window of `count` slots of `size` bytes, each followed by a guard of `guard` bytes,
/// with one more guard in front of the first.
#[derive(Debug, Clone, Copy)]
pub struct Slots {
    pub size: usize,
    pub count: usize,
    pub guard: usize,
}

impl Slots {
    /// Bytes of a slot and the guard after it.
    pub const fn stride(&self) -> usize {
        self.size + self.guard
    }

    /// Bytes of the whole window.
    pub const fn len(&self) -> usize {
        self.guard + self.count * self.stride()
    }

    /// Offset of slot `slot` in the window.
    pub const fn offset(&self, slot: usize) -> usize {
        self.guard + slot * self.stride()
    }

    /// A window that holds nothing but canary.
    pub fn blank(&self) -> Vec<u8> {
        vec![CANARY; self.len()]
    }

    /// Checks slot `slot` of `window`: it starts with `want`, and canary follows up to the
    /// next slot.
    pub fn check(&self, window: &[u8], slot: usize, want: &[u8]) -> Result<(), String> {
        let offset = self.offset(slot);
        check_guarded(&window[offset..offset + self.stride()], want)
    }

    /// Offset of the first guard of `window` that is no longer all canary.
    pub fn damaged_guard(&self, window: &[u8]) -> Option<usize> {
        let mut guards = std::iter::once(0..self.guard).chain(
            (0..self.count).map(|s| self.offset(s) + self.size..self.offset(s) + self.stride()),
        );
        guards
            .find(|g| window[g.clone()].iter().any(|&b| b != CANARY))
            .map(|g| g.start)
    }
}

/// Checks `bytes`: `want`, then canary only. Compares whole slices first (`memcmp`, many
/// GB/s) and looks for the first difference only when there is one: the demo checks every
/// byte READ brings back, on the requester's core, and a byte-at-a-time search there took a
/// third of that core.
pub fn check_guarded(bytes: &[u8], want: &[u8]) -> Result<(), String> {
    let (addressed, guard) = bytes.split_at(want.len());
    if addressed != want {
        let at = addressed
            .iter()
            .zip(want)
            .position(|(got, want)| got != want)
            .unwrap_or_default();
        return Err(format!(
            "byte {at} of {} is {:#04x}, expected {:#04x}",
            want.len(),
            bytes[at],
            want[at]
        ));
    }
    match guard.iter().position(|&b| b != CANARY) {
        Some(at) => Err(format!(
            "byte {at} after the {} addressed bytes was overwritten",
            want.len()
        )),
        None => Ok(()),
    }
}

/// What a remote 8-byte word holds when a QP's atomics on it execute one at a time in the
/// order they were posted (as RC executes them): each call returns the value the atomic must
/// find, which is what it returns to its requester.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counter {
    pub value: u64,
}

impl Counter {
    /// FETCH_ADD: the original, and the word now holds the sum.
    pub fn fetch_add(&mut self, add: u64) -> u64 {
        let original = self.value;
        self.value = original.wrapping_add(add);
        original
    }

    /// CMP_SWAP: the original, and the word now holds `swap` if it held `compare`.
    pub fn compare_swap(&mut self, compare: u64, swap: u64) -> u64 {
        let original = self.value;
        if original == compare {
            self.value = swap;
        }
        original
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_differ() {
        let (mut one, mut two) = ([0u8; 64], [0u8; 64]);
        Pattern::for_message(1, 0, 0).fill(0, &mut one);
        Pattern::for_message(1, 0, 16).fill(0, &mut two);
        assert_ne!(
            one, two,
            "a slot's next message must not look like its last"
        );
    }

    #[test]
    fn any_part_of_a_pattern_is_the_same_bytes() {
        let pattern = Pattern::new(7);
        let mut whole = [0u8; 40];
        pattern.fill(0, &mut whole);
        let mut part = [0u8; 13];
        pattern.fill(11, &mut part);
        assert_eq!(part, whole[11..24]);
        assert_eq!(pattern.byte(19), whole[19]);
        assert_eq!(pattern.mismatch(11, &part), None);
        part[5] ^= 1;
        assert_eq!(pattern.mismatch(11, &part), Some(5));
    }

    #[test]
    fn guarded_check_reports_both_kinds_of_damage() {
        let mut stride = vec![CANARY; 32];
        stride[..4].copy_from_slice(&[1, 2, 3, 4]);
        assert_eq!(check_guarded(&stride, &[1, 2, 3, 4]), Ok(()));
        assert!(check_guarded(&stride, &[1, 2, 9, 4])
            .unwrap_err()
            .starts_with("byte 2 of 4"));
        stride[10] = 0;
        assert!(check_guarded(&stride, &[1, 2, 3, 4])
            .unwrap_err()
            .starts_with("byte 6 after"));
    }

    #[test]
    fn a_written_guard_is_found() {
        let slots = Slots {
            size: 8,
            count: 3,
            guard: 4,
        };
        let mut window = slots.blank();
        assert_eq!(window.len(), 4 + 3 * 12);
        window[slots.offset(1)..slots.offset(1) + 8].fill(0);
        assert_eq!(slots.damaged_guard(&window), None);
        window[slots.offset(1) + 8] = 0;
        assert_eq!(slots.damaged_guard(&window), Some(slots.offset(1) + 8));
    }

    #[test]
    fn counter_follows_one_at_a_time_execution() {
        let mut counter = Counter::default();
        assert_eq!(counter.fetch_add(5), 0);
        assert_eq!(
            counter.compare_swap(4, 9),
            5,
            "a failed compare swaps nothing"
        );
        assert_eq!(counter.compare_swap(5, 9), 5);
        assert_eq!(counter.value, 9);
    }
}

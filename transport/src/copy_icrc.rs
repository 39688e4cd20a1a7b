//! Copying a payload into a frame and continuing the frame's ICRC over it.
//!
//! Why it exists: a sender used to copy the payload out of the region and then run
//! `crc32fast` over the copy in the frame. On the 2-vCPU machine this repository is
//! measured on, those two were the largest user-space share of a sending thread
//! (`docs/performance.md`). Here the CRC reads the *source* right after the copy, from L1,
//! rather than the frame's lines the copy is still writing, with an AVX-512 `VPCLMULQDQ`
//! fold that reads it through the raw pointer (a region may be the caller's memory, which is
//! never made a Rust reference: see `caller_memory`). A 4 KiB payload out of a 1 MiB region,
//! into a rotating set of frames: ~135 ns, against ~170 for a copy then `crc32fast` over the
//! copy, and ~170 for `crc32fast` over the source (medians, same process; folding while
//! storing each vector, in one loop, measured the same as the copy then the fold). Without
//! those instructions, or below [`FOLD_MIN_LEN`], it is a copy and then `crc32fast`.
//!
//! The fold is the standard one for a reflected CRC-32 (Intel, "Fast CRC Computation for
//! Generic Polynomials Using PCLMULQDQ"): 16 lanes of 128 bits, each multiplied forward over
//! the 2048 bits the other lanes take and xored into the next block, then the lanes folded
//! into one by 128 bits at a time. The CRC-32 of that last 128-bit value from a zero register
//! is the register after all the bytes folded, so `crc32fast` finishes from there (no Barrett
//! reduction here).

use core::ptr;

use roce_wire::icrc::Running;

/// Payloads shorter than this are hashed by `crc32fast` over the copy: measured, 512 bytes
/// was the shortest where the fold won (28 against 37 ns), 256 bytes lost (24 against 15).
const FOLD_MIN_LEN: usize = 512;

/// Copies `src` into `dst` (of the same length) and returns `icrc` continued over the bytes.
pub(crate) fn copy_slice(dst: &mut [u8], src: &[u8], icrc: Running) -> Running {
    let src = &src[..dst.len()];
    // SAFETY: `src` is `dst.len()` readable bytes, and a shared slice cannot overlap the
    // exclusive `dst`.
    unsafe { copy_from(dst, src.as_ptr(), icrc) }
}

/// Copies `dst.len()` bytes from `src` into `dst` and returns `icrc` continued over them,
/// reading the source through the raw pointer only.
///
/// # Safety
/// `src..src + dst.len()` is readable for the duration of the call, and does not overlap
/// `dst`.
pub(crate) unsafe fn copy_from(dst: &mut [u8], src: *const u8, icrc: Running) -> Running {
    // SAFETY: the caller's promise: readable, not overlapping `dst`.
    unsafe { ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()) };
    #[cfg(target_arch = "x86_64")]
    if dst.len() >= FOLD_MIN_LEN && x86::available() {
        // SAFETY: the CPU has the instructions (just checked), the length is at least the
        // fold's 256 bytes, and the source is readable by the caller's promise.
        let crc = unsafe { x86::crc32(src, dst.len(), icrc.crc32()) };
        return Running::from_crc32(crc);
    }
    icrc.update(dst)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use core::arch::x86_64::{
        __m128i, __m512i, _mm512_broadcast_i32x4, _mm512_castsi512_si128, _mm512_clmulepi64_epi128,
        _mm512_extracti32x4_epi32, _mm512_loadu_si512, _mm512_xor_si512, _mm512_zextsi128_si512,
        _mm_clmulepi64_si128, _mm_cvtsi32_si128, _mm_loadu_si128, _mm_set_epi64x, _mm_storeu_si128,
        _mm_xor_si128,
    };
    use core::ptr;
    use std::sync::LazyLock;

    /// A fold over `D` bits multiplies a lane's low half by `x^(D+32) mod P` and its high
    /// half by `x^(D-32) mod P`, both bit-reflected and shifted left by one (P the CRC-32
    /// polynomial): over the 2048 bits of 16 lanes, and over one lane's 128.
    const FOLD_2048: (i64, i64) = (0x1_1542_778a, 0x1_322d_1430);
    const FOLD_128: (i64, i64) = (0x1_7519_97d0, 0x0_ccaa_009e);
    /// Bytes one round of the main loop takes: 16 lanes of 16.
    const ROUND: usize = 256;

    /// Whether this CPU runs [`crc32`]: asked once (four questions to std's cache cost a
    /// visible share of a sending thread, asked per frame).
    pub(super) fn available() -> bool {
        static AVAILABLE: LazyLock<bool> = LazyLock::new(|| {
            is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("vpclmulqdq")
                && is_x86_feature_detected!("pclmulqdq")
                && is_x86_feature_detected!("sse4.1")
        });
        *AVAILABLE
    }

    /// `lanes` folded forward over `key`'s distance, xored into `next`.
    #[inline]
    #[target_feature(enable = "avx512f,vpclmulqdq")]
    fn fold512(lanes: __m512i, key: __m512i, next: __m512i) -> __m512i {
        let low = _mm512_clmulepi64_epi128(lanes, key, 0x00);
        let high = _mm512_clmulepi64_epi128(lanes, key, 0x11);
        _mm512_xor_si512(_mm512_xor_si512(low, high), next)
    }

    #[inline]
    #[target_feature(enable = "pclmulqdq,sse4.1")]
    fn fold128(lane: __m128i, key: __m128i, next: __m128i) -> __m128i {
        let low = _mm_clmulepi64_si128(lane, key, 0x00);
        let high = _mm_clmulepi64_si128(lane, key, 0x11);
        _mm_xor_si128(_mm_xor_si128(low, high), next)
    }

    /// The CRC-32 `crc` continued over the `len` (at least [`ROUND`]) bytes from `src`.
    ///
    /// # Safety
    /// The CPU has the features [`available`] checks; `src..src + len` is readable;
    /// `len >= ROUND`.
    #[target_feature(enable = "avx512f,vpclmulqdq,pclmulqdq,sse4.1")]
    pub(super) unsafe fn crc32(src: *const u8, len: usize, crc: u32) -> u32 {
        // SAFETY (both): every offset passed is at most `len - 64` (`len - 16`), from the
        // loop conditions: inside the readable source.
        let load64 = |at: usize| unsafe { _mm512_loadu_si512(src.add(at).cast()) };
        let load16 = |at: usize| unsafe { _mm_loadu_si128(src.add(at).cast()) };

        let mut lanes = [load64(0), load64(64), load64(128), load64(192)];
        // The incoming register (a CRC-32 value is its complement) joins the first bytes.
        let register = _mm512_zextsi128_si512(_mm_cvtsi32_si128(!crc as i32));
        lanes[0] = _mm512_xor_si512(lanes[0], register);
        let far = _mm512_broadcast_i32x4(_mm_set_epi64x(FOLD_2048.1, FOLD_2048.0));
        let mut at = ROUND;
        while len - at >= ROUND {
            for (i, lane) in lanes.iter_mut().enumerate() {
                *lane = fold512(*lane, far, load64(at + 64 * i));
            }
            at += ROUND;
        }

        // The 16 lanes in byte order, each folded into the next.
        let near = _mm_set_epi64x(FOLD_128.1, FOLD_128.0);
        let mut folded = _mm512_castsi512_si128(lanes[0]);
        for (i, &lane) in lanes.iter().enumerate() {
            if i > 0 {
                folded = fold128(folded, near, _mm512_castsi512_si128(lane));
            }
            folded = fold128(folded, near, _mm512_extracti32x4_epi32::<1>(lane));
            folded = fold128(folded, near, _mm512_extracti32x4_epi32::<2>(lane));
            folded = fold128(folded, near, _mm512_extracti32x4_epi32::<3>(lane));
        }
        while len - at >= 16 {
            folded = fold128(folded, near, load16(at));
            at += 16;
        }

        // The folded value, then the last bytes (fewer than 16), hashed in one call.
        let mut last = [0u8; 32];
        // SAFETY: `last` has 16 writable bytes of ours at its start.
        unsafe { _mm_storeu_si128(last.as_mut_ptr().cast(), folded) };
        let tail = len - at;
        // SAFETY: `at..len` is inside the readable source; `last[16..]` has room for the
        // fewer than 16 bytes, and is ours.
        unsafe { ptr::copy_nonoverlapping(src.add(at), last.as_mut_ptr().add(16), tail) };
        // A zero register is the complement of the CRC-32 value `!0`.
        let mut hasher = crc32fast::Hasher::new_with_initial(!0);
        hasher.update(&last[..16 + tail]);
        hasher.finalize()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic bytes that are not a pattern a CRC could be lucky with.
    fn noise(len: usize) -> Vec<u8> {
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 24) as u8
            })
            .collect()
    }

    fn expected(icrc: Running, bytes: &[u8]) -> Running {
        let mut hasher = crc32fast::Hasher::new_with_initial(icrc.crc32());
        hasher.update(bytes);
        Running::from_crc32(hasher.finalize())
    }

    /// Every length around the thresholds and the loop's steps, from unaligned sources,
    /// through the dispatch (folded or not, as this CPU allows).
    #[test]
    fn copies_and_continues_the_crc_like_crc32fast() {
        let source = noise(9000);
        for len in (0..1100).chain([2047, 2048, 4096, 4100, 4111, 8191]) {
            for (skew, start) in [(0, 0x2144_DF1C), (3, 0), (61, 0xDEAD_BEEF)] {
                let src = &source[skew..skew + len];
                let icrc = Running::from_crc32(start);
                let mut dst = vec![0u8; len];
                let got = copy_slice(&mut dst, src, icrc);
                assert_eq!(dst, src, "len {len} skew {skew}: copy");
                assert_eq!(got, expected(icrc, src), "len {len} skew {skew}: crc");
            }
        }
    }

    /// The fold itself from its shortest input on, where the CPU has it.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_fold_matches_crc32fast() {
        if !x86::available() {
            eprintln!("skipped: this CPU has no AVX-512 VPCLMULQDQ (the dispatch test covers it)");
            return;
        }
        let source = noise(5000);
        for len in 256..1400 {
            let src = &source[len % 64..len % 64 + len];
            // SAFETY: the features are there; `src` is `len` readable bytes of ours.
            let crc = unsafe { x86::crc32(src.as_ptr(), len, !len as u32) };
            let want = expected(Running::from_crc32(!len as u32), src);
            assert_eq!(crc, want.crc32(), "len {len}");
        }
    }
}

//! Copying a payload into a frame and continuing the frame's ICRC over it, reading each
//! byte of the source once.
//!
//! Why it exists: a sender used to copy the payload out of the region and then run
//! `crc32fast` over the copy in the frame. On the 2-vCPU machine this repository is
//! measured on, those two were the largest user-space share of a sending thread
//! (`docs/performance.md`). Here each 64-byte vector loaded from the source is both stored
//! into the frame and folded into the CRC (AVX-512 `VPCLMULQDQ`), so the CRC neither waits
//! for the frame's freshly written lines nor reads the source a second time: a 4 KiB payload
//! out of a 1 MiB region, into a rotating set of frames, took ~135 ns against ~170 for a copy
//! then `crc32fast` over the copy (medians, same process). Without those instructions, or
//! below [`FOLD_MIN_LEN`], it is a copy and then `crc32fast` over the copy.
//!
//! The CRC must cover exactly the bytes the frame carries even when the program writes the
//! source meanwhile (a region a peer READs while its owner updates it: on an HCA the peer
//! gets torn data, never a frame its ICRC rejects, time after time). So the stores are
//! `asm!`, opaque to the compiler: left to it, LLVM turns the loop into a `memcpy` and a
//! second read of the source for the fold (measured as fast, but the two reads may differ).
//! The source is read through the raw pointer only (a region may be the caller's memory,
//! which is never made a Rust reference: see `caller_memory`).
//!
//! The fold is the standard one for a reflected CRC-32 (Intel, "Fast CRC Computation for
//! Generic Polynomials Using PCLMULQDQ"): 16 lanes of 128 bits, each multiplied forward over
//! the 2048 bits the other lanes take and xored into the next block, then the lanes folded
//! into one by 128 bits at a time. The CRC-32 of that last 128-bit value from a zero register
//! is the register after all the bytes folded, so `crc32fast` finishes from there.

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

/// Copies `dst.len()` bytes from `src` into `dst` and returns `icrc` continued over the
/// bytes `dst` received, reading the source through the raw pointer only.
///
/// # Safety
/// `src..src + dst.len()` is readable for the duration of the call, and does not overlap
/// `dst`.
pub(crate) unsafe fn copy_from(dst: &mut [u8], src: *const u8, icrc: Running) -> Running {
    #[cfg(target_arch = "x86_64")]
    if dst.len() >= FOLD_MIN_LEN && x86::available() {
        // SAFETY: the CPU has the instructions (just checked), the length is at least the
        // fold's 256 bytes, the source is readable and apart from `dst` by the caller's
        // promise, and `dst` is ours to write.
        let crc = unsafe { x86::copy_crc32(src, dst.as_mut_ptr(), dst.len(), icrc.crc32()) };
        return Running::from_crc32(crc);
    }
    // SAFETY: the caller's promise: readable, not overlapping `dst`.
    unsafe { ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()) };
    icrc.update(dst)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use core::arch::asm;
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

    /// Whether this CPU runs [`copy_crc32`]: asked once (four questions to std's cache cost
    /// a visible share of a sending thread, asked per frame).
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

    /// The CRC-32 `crc` continued over the `len` (at least [`ROUND`]) bytes from `src`,
    /// which are copied to `dst` on the way: each byte read once, and what is hashed is
    /// what is stored.
    ///
    /// # Safety
    /// The CPU has the features [`available`] checks; `src..src + len` is readable,
    /// `dst..dst + len` writable, and the two do not overlap; `len >= ROUND`.
    #[target_feature(enable = "avx512f,vpclmulqdq,pclmulqdq,sse4.1")]
    pub(super) unsafe fn copy_crc32(src: *const u8, dst: *mut u8, len: usize, crc: u32) -> u32 {
        // Every offset passed below is at most `len - 64` (`len - 16` for the narrow one),
        // from the loop conditions: inside both ranges.
        let copy64 = |at: usize| {
            // SAFETY: `at + 64 <= len`: readable source, writable `dst`. The store is a
            // single instruction the compiler cannot merge into a `memcpy` (see the
            // module's docs); it touches only the 64 bytes at `dst + at`.
            unsafe {
                let vector = _mm512_loadu_si512(src.add(at).cast());
                asm!(
                    "vmovdqu64 [{to}], {vector}",
                    to = in(reg) dst.add(at),
                    vector = in(zmm_reg) vector,
                    options(nostack, preserves_flags),
                );
                vector
            }
        };
        let copy16 = |at: usize| {
            // SAFETY: `at + 16 <= len`, as above.
            unsafe {
                let vector = _mm_loadu_si128(src.add(at).cast());
                asm!(
                    "vmovdqu [{to}], {vector}",
                    to = in(reg) dst.add(at),
                    vector = in(xmm_reg) vector,
                    options(nostack, preserves_flags),
                );
                vector
            }
        };

        let mut lanes = [copy64(0), copy64(64), copy64(128), copy64(192)];
        // The incoming register (a CRC-32 value is its complement) joins the first bytes.
        let register = _mm512_zextsi128_si512(_mm_cvtsi32_si128(!crc as i32));
        lanes[0] = _mm512_xor_si512(lanes[0], register);
        let far = _mm512_broadcast_i32x4(_mm_set_epi64x(FOLD_2048.1, FOLD_2048.0));
        let mut at = ROUND;
        while len - at >= ROUND {
            for (i, lane) in lanes.iter_mut().enumerate() {
                *lane = fold512(*lane, far, copy64(at + 64 * i));
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
            folded = fold128(folded, near, copy16(at));
            at += 16;
        }

        // The folded value, then the last bytes (fewer than 16), read once into `last`,
        // copied from there and hashed in one call.
        let mut last = [0u8; 32];
        // SAFETY: `last` has 16 writable bytes of ours at its start.
        unsafe { _mm_storeu_si128(last.as_mut_ptr().cast(), folded) };
        let tail = len - at;
        // SAFETY: `at..len` is inside both ranges; `last[16..]` has room for the fewer than
        // 16 bytes, and is ours.
        unsafe {
            ptr::copy_nonoverlapping(src.add(at), last.as_mut_ptr().add(16), tail);
            ptr::copy_nonoverlapping(last.as_ptr().add(16), dst.add(at), tail);
        }
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

    /// The fold itself from its shortest input on, where the CPU has it: the bytes copied
    /// and their CRC.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_fold_copies_and_matches_crc32fast() {
        if !x86::available() {
            eprintln!("skipped: this CPU has no AVX-512 VPCLMULQDQ (the dispatch test covers it)");
            return;
        }
        let source = noise(5000);
        for len in 256..1400 {
            let src = &source[len % 64..len % 64 + len];
            let mut dst = vec![0u8; len];
            // SAFETY: the features are there; `src` is `len` readable bytes of ours, `dst`
            // `len` writable ones, apart from it.
            let crc = unsafe { x86::copy_crc32(src.as_ptr(), dst.as_mut_ptr(), len, !len as u32) };
            assert_eq!(dst, src, "len {len}");
            let want = expected(Running::from_crc32(!len as u32), src);
            assert_eq!(crc, want.crc32(), "len {len}");
        }
    }

    /// The CRC covers the bytes the frame got even while another thread writes the source
    /// (the race a program makes when it updates a region a peer READs): a copy and a
    /// second read of the source for the CRC would disagree here.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_crc_is_of_the_bytes_copied_while_the_source_changes() {
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        use std::sync::Arc;
        if !x86::available() {
            eprintln!("skipped: this CPU has no AVX-512 VPCLMULQDQ (the dispatch test covers it)");
            return;
        }
        const LEN: usize = 4096;
        let source: Arc<[AtomicU64]> = (0..LEN / 8).map(|_| AtomicU64::new(0)).collect();
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (source, stop) = (source.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut value = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    value = value.wrapping_add(0x0101_0101_0101_0101);
                    for word in source.iter() {
                        word.store(value, Ordering::Relaxed);
                    }
                }
                value
            })
        };
        let start = std::time::Instant::now();
        let limit = std::time::Duration::from_secs(3);
        while source[0].load(Ordering::Relaxed) == 0 && start.elapsed() < limit {
            std::thread::yield_now();
        }
        let mut dst = vec![0u8; LEN];
        let icrc = Running::from_crc32(0x2144_DF1C);
        let mut changed = 0;
        let mut previous = Vec::new();
        for _ in 0..10_000_000 {
            // SAFETY: the words stay alive (`source` is held), `dst` is ours; the writer's
            // stores race with these reads as a program's would with a transfer.
            let got = unsafe { copy_from(&mut dst, source.as_ptr().cast(), icrc) };
            assert_eq!(got, expected(icrc, &dst), "the CRC is not the copy's");
            if dst != previous {
                changed += 1;
                previous.clone_from(&dst);
            }
            if changed > 1_000 || start.elapsed() > limit {
                break;
            }
        }
        stop.store(true, Ordering::Relaxed);
        let writes = writer.join().unwrap();
        assert!(
            writes > 0 && changed > 10,
            "the source never changed under the copy"
        );
    }
}

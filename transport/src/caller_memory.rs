//! Memory the caller owns, registered by address and length (`ibv_reg_mr`): with
//! `copy_icrc` (which hashes a sent payload through the same raw pointers), the crate's
//! `unsafe` code.
//!
//! Invariants, which whoever registers the memory promises ([`CallerMemory::new`]):
//! - The `len` bytes from `base` stay mapped and readable, and writable if the memory was
//!   registered writable, until the `CallerMemory` is dropped (its region deregistered).
//! - Concurrent CPU access to the same bytes is the caller's business, as with a DMA-capable
//!   HCA: a program that touches bytes while a transfer moves them has a race it must avoid
//!   (it orders its accesses through completions). The 8-byte atomics are the exception:
//!   they are real atomic instructions, so they are atomic with respect to each other and
//!   to the CPU's own atomics on the same word.
//!
//! Memory registered for on-demand paging (`IBV_ACCESS_ON_DEMAND`, [`CallerMemory::on_demand`])
//! promises nothing about the mapping, as an ODP region on an HCA: pages may be unmapped or
//! never have been mapped, and the region may be the whole address space (implicit ODP). Its
//! copies go through the kernel (`process_vm_readv`/`process_vm_writev` on our own process),
//! which faults pages in as the CPU would and fails, instead of killing the process, where
//! nothing is mapped; an atomic first faults its page in writable (`MADV_POPULATE_WRITE`).
//!
//! What this module guarantees in return: it never creates a Rust reference into the memory
//! (only raw-pointer copies and atomics, so the caller's own references and pointers stay
//! valid), never touches a byte outside `base..base + len`, and never writes memory that
//! was not registered writable.

use core::fmt;
use core::ptr;
use std::sync::atomic::{AtomicU64, Ordering};

use roce_wire::icrc::Running;

use crate::access::{AtomicOp, MrError};

/// `len` bytes of the caller's memory from `base`.
pub struct CallerMemory {
    base: *mut u8,
    len: usize,
    writable: bool,
    /// Registered for on-demand paging: no promise about the mapping.
    on_demand: bool,
}

// SAFETY: `new`'s contract keeps the memory valid from any thread until drop, and every
// access below is a raw-pointer copy or an atomic, so moving the handle to another thread
// (the engine's) creates no aliasing the compiler relies on.
unsafe impl Send for CallerMemory {}

impl fmt::Debug for CallerMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallerMemory")
            .field("base", &self.base)
            .field("len", &self.len)
            .field("writable", &self.writable)
            .field("on_demand", &self.on_demand)
            .finish()
    }
}

impl CallerMemory {
    /// The caller's `len` bytes at `base`, which the transport may write if `writable`.
    /// Refuses a null `base` and a range that wraps around the address space.
    ///
    /// # Safety
    /// Until the returned value is dropped, the `len` bytes from `base` stay mapped and
    /// readable, and writable too if `writable`; the caller avoids racing non-atomic accesses
    /// with the transfers it asks for (see the module's invariants).
    pub unsafe fn new(base: *mut u8, len: usize, writable: bool) -> Result<Self, MrError> {
        Self::checked(base, len, writable, false)
    }

    /// The caller's `len` bytes at `base` with on-demand paging: nothing needs to be mapped,
    /// now or later, since every access asks the kernel (see the module's docs). `base` 0 with
    /// `len` `usize::MAX` is the implicit region, the whole address space; otherwise a null
    /// `base` and a wrapping range are refused.
    pub fn on_demand(base: *mut u8, len: usize, writable: bool) -> Result<Self, MrError> {
        Self::checked(base, len, writable, true)
    }

    /// Refuses a null `base` (but for the implicit on-demand region) and a range that wraps.
    fn checked(
        base: *mut u8,
        len: usize,
        writable: bool,
        on_demand: bool,
    ) -> Result<Self, MrError> {
        let implicit = on_demand && len == usize::MAX;
        if base.is_null() && !implicit {
            return Err(MrError::NullAddress);
        }
        if (base as usize).checked_add(len).is_none() {
            return Err(MrError::AddressOverflow);
        }
        Ok(CallerMemory {
            base,
            len,
            writable,
            on_demand,
        })
    }

    /// Whether it was registered for on-demand paging.
    pub fn is_on_demand(&self) -> bool {
        self.on_demand
    }

    /// Whether it is the implicit on-demand region: every address of the process.
    pub fn is_implicit(&self) -> bool {
        self.on_demand && self.base.is_null() && self.len == usize::MAX
    }

    /// Bytes covered.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it covers no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the transport may write it.
    pub fn writable(&self) -> bool {
        self.writable
    }

    /// The address of the first byte.
    pub fn base(&self) -> *mut u8 {
        self.base
    }

    /// The address of byte `offset`, if `offset..offset + len` lies inside.
    fn at(&self, offset: usize, len: usize) -> Result<*mut u8, MrError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(self.base.wrapping_add(offset)),
            _ => Err(MrError::OutOfBounds),
        }
    }

    fn writable_at(&self, offset: usize, len: usize) -> Result<*mut u8, MrError> {
        if !self.writable {
            return Err(MrError::AccessDenied);
        }
        self.at(offset, len)
    }

    /// Copies `out.len()` bytes from `offset` into `out`.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), MrError> {
        let source = self.at(offset, out.len())?;
        if self.on_demand {
            return on_demand::read(source, out.as_mut_ptr(), out.len());
        }
        // SAFETY: `source..source + out.len()` lies inside the memory (`at`), readable by
        // `new`'s contract; `out` is a buffer of ours, not the caller's memory, so the two
        // do not overlap.
        unsafe { ptr::copy_nonoverlapping(source, out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// Copies `out.len()` bytes from `offset` into `out` and returns `icrc` continued over
    /// them: a frame's payload.
    pub fn read_icrc(
        &self,
        offset: usize,
        out: &mut [u8],
        icrc: Running,
    ) -> Result<Running, MrError> {
        let source = self.at(offset, out.len())?;
        if self.on_demand {
            on_demand::read(source, out.as_mut_ptr(), out.len())?;
            return Ok(icrc.update(out));
        }
        // SAFETY: as in `read`: the source lies inside the readable memory, and `out` is a
        // buffer of ours; the copy reads it through the pointer only.
        Ok(unsafe { crate::copy_icrc::copy_from(out, source, icrc) })
    }

    /// Appends `len` bytes from `offset` to `out`.
    pub fn append(&self, offset: usize, len: usize, out: &mut Vec<u8>) -> Result<(), MrError> {
        let source = self.at(offset, len)?;
        out.try_reserve(len).map_err(|_| MrError::OutOfMemory)?;
        let filled = out.len();
        if self.on_demand {
            // `try_reserve` made room for `len` bytes after `filled`, in a buffer of ours.
            on_demand::read(source, out.as_mut_ptr().wrapping_add(filled), len)?;
            // SAFETY: the read above initialised those `len` bytes (it fails otherwise).
            unsafe { out.set_len(filled + len) };
            return Ok(());
        }
        // SAFETY: the source lies inside the memory (`at`) and is readable by `new`'s
        // contract; `try_reserve` made room for `len` more bytes after `filled`, in a buffer
        // of ours that the caller's memory cannot overlap. The bytes are initialised by the
        // copy before `set_len` exposes them.
        unsafe {
            ptr::copy_nonoverlapping(source, out.as_mut_ptr().add(filled), len);
            out.set_len(filled + len);
        }
        Ok(())
    }

    /// Copies `data` in at `offset`.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<(), MrError> {
        let target = self.writable_at(offset, data.len())?;
        if self.on_demand {
            return on_demand::write(target, data);
        }
        // SAFETY: the target lies inside the memory (`writable_at`), which `new`'s contract
        // keeps writable since it was registered writable; `data` is ours, so no overlap.
        unsafe { ptr::copy_nonoverlapping(data.as_ptr(), target, data.len()) };
        Ok(())
    }

    /// Performs `op` on the 8-byte word at `offset` with one atomic instruction and returns
    /// the word's value before it. The word's address must be 8-byte aligned.
    pub fn atomic(&self, offset: usize, op: AtomicOp) -> Result<u64, MrError> {
        let target = self.writable_at(offset, 8)?;
        if !(target as usize).is_multiple_of(align_of::<AtomicU64>()) {
            return Err(MrError::Misaligned);
        }
        if self.on_demand {
            // Mapped writable from here on, unless the program unmaps it meanwhile, which a
            // program with an ODP region must no more do under a transfer than with an HCA.
            on_demand::fault_in_writable(target, 8)?;
        }
        // SAFETY: the 8 bytes lie inside the memory (`writable_at`) and stay mapped and
        // writable until drop (`new`'s contract); the address is aligned for `AtomicU64`
        // (checked above); the reference lives only for this call. Non-atomic CPU accesses
        // racing with it are excluded by the same contract.
        let word = unsafe { AtomicU64::from_ptr(target.cast::<u64>()) };
        Ok(match op {
            AtomicOp::CompareSwap { compare, swap } => {
                match word.compare_exchange(compare, swap, Ordering::SeqCst, Ordering::SeqCst) {
                    Ok(original) | Err(original) => original,
                }
            }
            AtomicOp::FetchAdd(add) => word.fetch_add(add, Ordering::SeqCst),
            AtomicOp::Write(value) => word.swap(value, Ordering::SeqCst),
        })
    }
}

impl CallerMemory {
    /// Faults `len` bytes from `offset` in (writable if `write`), as `ibv_advise_mr`'s
    /// prefetch asks; only memory registered for on-demand paging is prefetched.
    pub fn prefetch(&self, offset: usize, len: usize, write: bool) -> Result<(), MrError> {
        let start = if write {
            self.writable_at(offset, len)?
        } else {
            self.at(offset, len)?
        };
        if !self.on_demand || len == 0 {
            return Ok(());
        }
        if write {
            on_demand::fault_in_writable(start, len)
        } else {
            on_demand::fault_in_readable(start, len)
        }
    }
}

/// The kernel-checked accesses of on-demand memory.
mod on_demand {
    use crate::access::MrError;

    fn one(base: *mut u8, len: usize) -> libc::iovec {
        libc::iovec {
            iov_base: base.cast(),
            iov_len: len,
        }
    }

    /// Whether the kernel moved all `len` bytes.
    fn moved_all(moved: isize, len: usize) -> Result<(), MrError> {
        if usize::try_from(moved) == Ok(len) {
            Ok(())
        } else {
            Err(MrError::Unmapped)
        }
    }

    /// Copies `len` bytes from `source` (the caller's, perhaps unmapped) to `target` (ours).
    pub(super) fn read(source: *mut u8, target: *mut u8, len: usize) -> Result<(), MrError> {
        if len == 0 {
            return Ok(());
        }
        let (local, remote) = (one(target, len), one(source, len));
        // SAFETY: `target` is `len` writable bytes of ours; the kernel reads `source` in our
        // own address space on our behalf and fails with EFAULT (or a short count) where
        // nothing is mapped, so no access of ours can fault.
        let moved = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
        moved_all(moved, len)
    }

    /// Copies `data` to `target` (the caller's, perhaps unmapped or read-only).
    pub(super) fn write(target: *mut u8, data: &[u8]) -> Result<(), MrError> {
        if data.is_empty() {
            return Ok(());
        }
        let (local, remote) = (
            one(data.as_ptr().cast_mut(), data.len()),
            one(target, data.len()),
        );
        // SAFETY: the kernel only reads `data` (ours) and writes `target` in our own address
        // space, failing where nothing writable is mapped, so no access of ours can fault.
        let moved = unsafe { libc::process_vm_writev(libc::getpid(), &local, 1, &remote, 1, 0) };
        moved_all(moved, data.len())
    }

    fn page_size() -> usize {
        // SAFETY: sysconf reads a constant of the system.
        let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        usize::try_from(size).unwrap_or(4096)
    }

    /// Populates the page tables of `start..start + len` as a write (or read) would, without
    /// touching the bytes.
    fn populate(start: *mut u8, len: usize, advice: libc::c_int) -> Result<(), MrError> {
        let page = page_size();
        let first = start as usize & !(page - 1);
        let end = (start as usize)
            .checked_add(len)
            .ok_or(MrError::OutOfBounds)?;
        // SAFETY: MADV_POPULATE_* only faults pages in (failing with ENOMEM or EFAULT where
        // nothing, or nothing with those rights, is mapped); it changes no byte and no mapping.
        let done = unsafe { libc::madvise(first as *mut libc::c_void, end - first, advice) };
        if done == 0 {
            return Ok(());
        }
        match std::io::Error::last_os_error().raw_os_error() {
            // A kernel before 5.14, without MADV_POPULATE_*: at least check the mapping.
            Some(libc::EINVAL) => check_readable(start, len),
            _ => Err(MrError::Unmapped),
        }
    }

    /// Whether every byte of `start..start + len` is mapped readable, page by page.
    fn check_readable(start: *mut u8, len: usize) -> Result<(), MrError> {
        let page = page_size();
        let mut byte = [0u8; 1];
        let mut at = start as usize;
        let end = at + len;
        while at < end {
            read(at as *mut u8, byte.as_mut_ptr(), 1)?;
            at = (at & !(page - 1)) + page;
        }
        Ok(())
    }

    /// Faults `len` bytes from `start` in for writing.
    pub(super) fn fault_in_writable(start: *mut u8, len: usize) -> Result<(), MrError> {
        populate(start, len, libc::MADV_POPULATE_WRITE)
    }

    /// Faults `len` bytes from `start` in for reading.
    pub(super) fn fault_in_readable(start: *mut u8, len: usize) -> Result<(), MrError> {
        populate(start, len, libc::MADV_POPULATE_READ)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A heap buffer handed out only as a raw pointer, as C memory is.
    struct Raw {
        base: *mut u64,
        words: usize,
    }

    impl Raw {
        fn new(words: usize) -> Raw {
            let boxed = vec![0u64; words].into_boxed_slice();
            Raw {
                base: Box::into_raw(boxed).cast::<u64>(),
                words,
            }
        }

        fn memory(&self, writable: bool) -> CallerMemory {
            // SAFETY: the buffer outlives every `CallerMemory` of these tests (dropped
            // before `Raw`), and nothing else touches it meanwhile.
            unsafe { CallerMemory::new(self.base.cast(), self.words * 8, writable) }.unwrap()
        }
    }

    impl Drop for Raw {
        fn drop(&mut self) {
            // SAFETY: `base` came from `Box::into_raw` of a slice of `words` words.
            drop(unsafe { Box::from_raw(ptr::slice_from_raw_parts_mut(self.base, self.words)) });
        }
    }

    #[test]
    fn copies_stay_inside_and_respect_writability() {
        let raw = Raw::new(2);
        let memory = raw.memory(true);
        memory.write(3, &[1, 2, 3]).unwrap();
        let mut out = [0u8; 5];
        memory.read(2, &mut out).unwrap();
        assert_eq!(out, [0, 1, 2, 3, 0]);
        let mut appended = vec![9];
        memory.append(4, 2, &mut appended).unwrap();
        assert_eq!(appended, [9, 2, 3]);
        assert_eq!(memory.write(14, &[0; 3]), Err(MrError::OutOfBounds));
        assert_eq!(memory.read(usize::MAX, &mut out), Err(MrError::OutOfBounds));
        assert_eq!(
            memory.append(16, 1, &mut appended),
            Err(MrError::OutOfBounds)
        );
        let read_only = raw.memory(false);
        assert_eq!(read_only.write(0, &[1]), Err(MrError::AccessDenied));
        assert_eq!(
            read_only.atomic(0, AtomicOp::FetchAdd(1)),
            Err(MrError::AccessDenied)
        );
    }

    /// A frame's payload read with its ICRC: the bytes and the CRC the copy-then-hash path
    /// gives, pinned or on demand, and nothing read outside the memory.
    #[test]
    fn a_read_continues_the_icrc_over_the_bytes_read() {
        let raw = Raw::new(256);
        let memory = raw.memory(true);
        let bytes: Vec<u8> = (0..2048u32).map(|i| (i * 7 + i / 256) as u8).collect();
        memory.write(0, &bytes).unwrap();
        // The same buffer, read through the kernel as an on-demand region is.
        let on_demand = CallerMemory::on_demand(raw.base.cast(), 2048, false).unwrap();
        let start = Running::from_crc32(0x2144_DF1C);
        for (offset, len) in [(0, 2048), (5, 1500), (100, 64), (2048, 0)] {
            let want = start.update(&bytes[offset..offset + len]);
            for source in [&memory, &on_demand] {
                let mut out = vec![0u8; len];
                assert_eq!(source.read_icrc(offset, &mut out, start), Ok(want));
                assert_eq!(out, bytes[offset..offset + len]);
            }
        }
        let mut out = [0u8; 600];
        assert_eq!(
            memory.read_icrc(1449, &mut out, start),
            Err(MrError::OutOfBounds)
        );
    }

    #[test]
    fn atomics_return_the_original_and_need_alignment() {
        let raw = Raw::new(2);
        let memory = raw.memory(true);
        assert_eq!(memory.atomic(8, AtomicOp::FetchAdd(5)), Ok(0));
        assert_eq!(memory.atomic(8, AtomicOp::FetchAdd(2)), Ok(5));
        let swap = |compare, swap| AtomicOp::CompareSwap { compare, swap };
        assert_eq!(memory.atomic(8, swap(1, 100)), Ok(7));
        assert_eq!(memory.atomic(8, swap(7, 100)), Ok(7));
        assert_eq!(memory.atomic(8, AtomicOp::FetchAdd(0)), Ok(100));
        assert_eq!(
            memory.atomic(4, AtomicOp::FetchAdd(1)),
            Err(MrError::Misaligned)
        );
        assert_eq!(
            memory.atomic(12, AtomicOp::FetchAdd(1)),
            Err(MrError::OutOfBounds)
        );
    }

    #[test]
    fn null_and_wrapping_ranges_are_refused() {
        // SAFETY: refused before anything could be touched.
        let null = unsafe { CallerMemory::new(ptr::null_mut(), 8, true) };
        assert_eq!(null.unwrap_err(), MrError::NullAddress);
        // SAFETY: as above.
        let wrapping = unsafe { CallerMemory::new(usize::MAX as *mut u8, 2, true) };
        assert_eq!(wrapping.unwrap_err(), MrError::AddressOverflow);
    }
}

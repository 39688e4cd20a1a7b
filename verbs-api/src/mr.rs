//! Protection domains and memory regions.
//!
//! A region covers either bytes it owns or the caller's own memory:
//! - [`Pd::reg_mr`] (zeroed bytes) and [`Pd::reg_mr_buffer`] (a buffer it takes, handed back
//!   by [`Mr::dereg`]) own their bytes: they live in the transport's region table, where the
//!   peer's WRITEs, READs and atomics reach them, and the program reads and writes them
//!   through [`Mr`]'s methods. No buffer can be freed or moved while a peer may still write
//!   it, and none of this needs `unsafe`.
//! - [`Pd::reg_mr_raw`] and [`Pd::reg_mr_iova`] register memory the caller keeps, by address
//!   and length, as `ibv_reg_mr` and `ibv_reg_mr_iova2` do: the peer reaches it directly and
//!   the program uses it through its own pointers (what a C program, or zero-copy use,
//!   needs). They are `unsafe`: the caller keeps the memory mapped until the region is
//!   deregistered, and orders its own accesses against transfers through completions, as
//!   with a DMA-capable HCA. Remote atomics on it are real atomic instructions, so they are
//!   atomic with respect to the program's own atomics on the same word.

use std::sync::Arc;

use roce_transport::mr::{MrError, PdId};
use roce_transport::wr::Sge;
use roce_transport::{AccessFlags, CallerMemory};

use crate::error::Error;
use crate::shared::Shared;

pub(crate) struct PdInner {
    pub(crate) shared: Arc<Shared>,
    pub(crate) id: PdId,
}

impl Drop for PdInner {
    fn drop(&mut self) {
        // Regions and QPs hold the PD, so none is left now.
        if let Ok(mut core) = self.shared.lock() {
            let _ = core.endpoint().mrs().dealloc_pd(self.id);
        }
    }
}

/// A protection domain (`ibv_pd`). Cloning gives another handle to the same PD; it is
/// freed when the last handle, region and QP using it are gone.
#[derive(Clone)]
pub struct Pd {
    pub(crate) inner: Arc<PdInner>,
}

impl Pd {
    pub(crate) fn new(shared: &Arc<Shared>) -> Result<Pd, Error> {
        let id = shared.lock()?.endpoint().mrs().alloc_pd();
        Ok(Pd {
            inner: Arc::new(PdInner {
                shared: Arc::clone(shared),
                id,
            }),
        })
    }

    /// Registers `len` zeroed bytes with `access` (`ibv_reg_mr`) at an address range of its
    /// own, page-aligned and apart from every other region of this context.
    pub fn reg_mr(&self, len: usize, access: AccessFlags) -> Result<Mr, Error> {
        let (iova, key) = (self.inner.shared).reg_mr(self.inner.id, None, len, access)?;
        Ok(self.region(key, iova, len))
    }

    /// Registers `len` zeroed bytes that work requests and peers address from `iova`
    /// (`ibv_reg_mr` with `IBV_ACCESS_ZERO_BASED`-like freedom over the address).
    pub fn reg_mr_at(&self, iova: u64, len: usize, access: AccessFlags) -> Result<Mr, Error> {
        let (iova, key) = (self.inner.shared).reg_mr(self.inner.id, Some(iova), len, access)?;
        Ok(self.region(key, iova, len))
    }

    /// Registers `buffer`, which the region owns (and [`Mr::dereg`] hands back), at its own
    /// address, as `ibv_reg_mr` would. On error the buffer is dropped.
    pub fn reg_mr_buffer(
        &self,
        buffer: impl Into<Box<[u8]>>,
        access: AccessFlags,
    ) -> Result<Mr, Error> {
        let buffer = buffer.into();
        let (iova, len) = (buffer.as_ptr() as u64, buffer.len());
        let key = self.inner.shared.lock()?.endpoint().mrs().reg_mr_owned(
            self.inner.id,
            iova,
            buffer,
            access,
        )?;
        Ok(self.region(key, iova, len))
    }

    /// Registers the caller's `len` bytes at `addr` (`ibv_reg_mr`): work requests and peers
    /// address them at `addr`.
    ///
    /// # Safety
    /// The memory stays mapped (and writable, if `access` has `LOCAL_WRITE`) until the region
    /// is deregistered, and the program does not touch bytes while a transfer it asked for
    /// moves them (atomics on aligned 8-byte words excepted).
    #[allow(unsafe_code)]
    pub unsafe fn reg_mr_raw(
        &self,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<Mr, Error> {
        // SAFETY: the same contract as ours.
        unsafe { self.reg_mr_iova(addr, len, addr as u64, access) }
    }

    /// Registers the caller's `len` bytes at `addr`, which work requests and peers address
    /// from `iova` (`ibv_reg_mr_iova2`).
    ///
    /// # Safety
    /// As [`reg_mr_raw`](Self::reg_mr_raw).
    #[allow(unsafe_code)]
    pub unsafe fn reg_mr_iova(
        &self,
        addr: *mut u8,
        len: usize,
        iova: u64,
        access: AccessFlags,
    ) -> Result<Mr, Error> {
        let writable = access.contains(AccessFlags::LOCAL_WRITE);
        // SAFETY: our caller keeps the memory mapped, and writable when the region may be
        // written, until the region is deregistered (our contract), which is what
        // `CallerMemory::new` asks.
        let memory = unsafe { CallerMemory::new(addr, len, writable) }?;
        let key = self.inner.shared.lock()?.endpoint().mrs().reg_mr_caller(
            self.inner.id,
            iova,
            memory,
            access,
        )?;
        Ok(self.region(key, iova, len))
    }

    fn region(&self, key: u32, iova: u64, len: usize) -> Mr {
        Mr {
            pd: Arc::clone(&self.inner),
            key,
            iova,
            len,
        }
    }
}

/// A registered memory region (`ibv_mr`), over bytes it owns or over the caller's memory.
/// Deregistered on drop (or by [`dereg`](Self::dereg)); its key is never issued again.
pub struct Mr {
    pd: Arc<PdInner>,
    key: u32,
    iova: u64,
    len: usize,
}

impl Mr {
    /// The key local work requests name it by.
    pub fn lkey(&self) -> u32 {
        self.key
    }

    /// The key the peer names it by.
    pub fn rkey(&self) -> u32 {
        self.key
    }

    /// The address of its first byte, as work requests and peers give it.
    pub fn addr(&self) -> u64 {
        self.iova
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A scatter/gather element for `len` bytes from `offset`. Not checked here: a bad one
    /// fails its work request, as on an HCA.
    pub fn sge(&self, offset: usize, len: u32) -> Sge {
        Sge {
            // An offset past the end makes an SGE that fails its work request, not a panic.
            addr: self.iova.saturating_add(offset as u64),
            length: len,
            lkey: self.key,
        }
    }

    /// Runs `f` on the bytes of a region that owns them. The device is locked meanwhile:
    /// keep `f` short and do not call verbs from it (that would deadlock). A region over the
    /// caller's memory is [`Error::Unsupported`] here: the caller has its own pointer.
    pub fn with_bytes<T>(&self, f: impl FnOnce(&[u8]) -> T) -> Result<T, Error> {
        let mut core = self.pd.shared.lock()?;
        let mr = core.endpoint().mrs().get(self.key).ok_or(Error::Gone)?;
        Ok(f(mr.bytes().ok_or(Error::Unsupported(CALLER_MEMORY))?))
    }

    /// Runs `f` on the bytes, mutably; the same rules as [`with_bytes`](Self::with_bytes).
    pub fn with_bytes_mut<T>(&self, f: impl FnOnce(&mut [u8]) -> T) -> Result<T, Error> {
        let mut core = self.pd.shared.lock()?;
        let mr = core.endpoint().mrs().get_mut(self.key).ok_or(Error::Gone)?;
        Ok(f(mr
            .bytes_mut()
            .ok_or(Error::Unsupported(CALLER_MEMORY))?))
    }

    /// Copies `data` in at `offset`.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<(), Error> {
        let mut core = self.pd.shared.lock()?;
        let mr = core.endpoint().mrs().get_mut(self.key).ok_or(Error::Gone)?;
        mr.write(offset, data).map_err(region_error)
    }

    /// Copies `out.len()` bytes out from `offset`.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), Error> {
        let mut core = self.pd.shared.lock()?;
        let mr = core.endpoint().mrs().get(self.key).ok_or(Error::Gone)?;
        mr.read(offset, out).map_err(region_error)
    }

    /// A copy of every byte.
    pub fn to_vec(&self) -> Result<Vec<u8>, Error> {
        let mut core = self.pd.shared.lock()?;
        let mr = core.endpoint().mrs().get(self.key).ok_or(Error::Gone)?;
        mr.to_vec().map_err(region_error)
    }

    /// Deregisters now (`ibv_dereg_mr`) and hands back the bytes of a region that owned them
    /// (`None` over the caller's memory, which the device no longer touches once this
    /// returns).
    pub fn dereg(self) -> Result<Option<Box<[u8]>>, Error> {
        self.try_dereg().map_err(|(_, error)| error)
    }

    /// [`dereg`](Self::dereg), giving the region back with the error when it fails (as
    /// `ibv_dereg_mr` leaves a region registered when it fails): it stays registered and
    /// may be deregistered again.
    pub fn try_dereg(self) -> Result<Option<Box<[u8]>>, (Mr, Error)> {
        let deregistered = self
            .pd
            .shared
            .lock()
            .and_then(|mut core| Ok(core.endpoint().mrs().dereg_mr(self.key)?));
        // On success, dropping `self` finds the key gone, which it ignores.
        deregistered.map_err(|error| (self, error))
    }
}

const CALLER_MEMORY: &str = "the bytes of a region over the caller's memory (use its pointer)";

/// A region's copy error as the verbs layer reports it.
fn region_error(error: MrError) -> Error {
    match error {
        MrError::OutOfBounds => Error::OutOfBounds,
        other => Error::Mr(other),
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        if let Ok(mut core) = self.pd.shared.lock() {
            let _ = core.endpoint().mrs().dereg_mr(self.key);
        }
    }
}

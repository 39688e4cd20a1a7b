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
use crate::limits;
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
        self.reg_caller(memory, addr, iova, access)
    }

    /// Registers the caller's `len` bytes at `addr`, addressed from `iova`, with on-demand
    /// paging (`IBV_ACCESS_ON_DEMAND`): nothing needs to be mapped, then or later, since every
    /// access asks the kernel, which fails it where no page is (the work request then fails, as
    /// an HCA's ODP page fault does). So this needs no `unsafe`.
    pub fn reg_mr_on_demand(
        &self,
        addr: *mut u8,
        len: usize,
        iova: u64,
        access: AccessFlags,
    ) -> Result<Mr, Error> {
        limits::check_mr_len(len)?;
        let writable = access.contains(AccessFlags::LOCAL_WRITE);
        let memory = CallerMemory::on_demand(addr, len, writable)?;
        self.reg_caller(memory, addr, iova, access)
    }

    /// Registers the whole address space with on-demand paging, each address as itself
    /// (implicit ODP: `ibv_reg_mr(pd, NULL, SIZE_MAX, IBV_ACCESS_ON_DEMAND | ...)`).
    pub fn reg_mr_implicit(&self, access: AccessFlags) -> Result<Mr, Error> {
        let writable = access.contains(AccessFlags::LOCAL_WRITE);
        let memory = CallerMemory::on_demand(std::ptr::null_mut(), usize::MAX, writable)?;
        self.reg_caller(memory, std::ptr::null_mut(), 0, access)
    }

    /// Registers the caller's `memory`, which starts at `addr`, addressed from `iova`.
    fn reg_caller(
        &self,
        memory: CallerMemory,
        addr: *mut u8,
        iova: u64,
        access: AccessFlags,
    ) -> Result<Mr, Error> {
        let (len, on_demand) = (memory.len(), memory.is_on_demand());
        let key = self.inner.shared.lock()?.endpoint().mrs().reg_mr_caller(
            self.inner.id,
            iova,
            memory,
            access,
        )?;
        Ok(self.caller_region(key, iova, len, addr, on_demand))
    }

    /// `ibv_advise_mr`'s prefetch of each element of `sg_list` (regions of this PD with
    /// on-demand paging): their pages are faulted in now, for writing if `write`, so the
    /// transfers that follow do not wait for them; with `fault` false nothing is faulted in
    /// and the elements are only checked (`IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT`). Always
    /// done by the time this returns, which `IBV_ADVISE_MR_FLAG_FLUSH` asks and the
    /// asynchronous form allows.
    pub fn prefetch(&self, sg_list: &[Sge], write: bool, fault: bool) -> Result<(), Error> {
        let mut core = self.inner.shared.lock()?;
        let mrs = core.endpoint().mrs();
        for sge in sg_list {
            let len = u64::from(sge.length);
            mrs.prefetch(self.inner.id, sge.lkey, sge.addr, len, write, fault)?;
        }
        Ok(())
    }

    fn region(&self, key: u32, iova: u64, len: usize) -> Mr {
        Mr {
            pd: Arc::clone(&self.inner),
            key,
            iova,
            len,
            caller: None,
        }
    }

    fn caller_region(&self, key: u32, iova: u64, len: usize, addr: *mut u8, on_demand: bool) -> Mr {
        let mut region = self.region(key, iova, len);
        region.caller = Some(CallerRegion {
            addr: addr as usize,
            on_demand,
        });
        region
    }
}

/// What `Mr::rereg` changes, as `ibv_rereg_mr`'s flags say; what is `None` stays.
#[derive(Debug, Default)]
pub struct Rereg<'a> {
    /// `IBV_REREG_MR_CHANGE_PD`: the PD the region moves to (of the same context).
    pub pd: Option<&'a Pd>,
    /// `IBV_REREG_MR_CHANGE_TRANSLATION`: the memory it covers from now on, its address (also
    /// the address peers use) and length.
    pub translation: Option<(*mut u8, usize)>,
    /// `IBV_REREG_MR_CHANGE_ACCESS`: its rights from now on.
    pub access: Option<AccessFlags>,
    /// With `access`: whether it pages on demand from now on.
    pub on_demand: Option<bool>,
}

impl std::fmt::Debug for Pd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pd").field("id", &self.inner.id).finish()
    }
}

/// The caller's memory a region covers: where, and whether it pages on demand.
#[derive(Debug, Clone, Copy)]
struct CallerRegion {
    addr: usize,
    on_demand: bool,
}

/// A registered memory region (`ibv_mr`), over bytes it owns or over the caller's memory.
/// Deregistered on drop (or by [`dereg`](Self::dereg)); its key is never issued again.
pub struct Mr {
    pd: Arc<PdInner>,
    key: u32,
    iova: u64,
    len: usize,
    /// `None` for a region that owns its bytes.
    caller: Option<CallerRegion>,
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

    /// Whether it pages on demand (registered with `IBV_ACCESS_ON_DEMAND`).
    pub fn is_on_demand(&self) -> bool {
        self.caller.is_some_and(|caller| caller.on_demand)
    }

    /// `ibv_rereg_mr`: moves the region to another PD, over other memory, with other rights,
    /// as `change` says, keeping its keys. All or nothing: a refused change leaves the region
    /// as it was. A region that owns its bytes can change PD and rights, not memory.
    ///
    /// # Safety
    /// Unless the region pages on demand afterwards, the memory it covers afterwards (the new
    /// translation, or the old memory given new rights) is as [`Pd::reg_mr_raw`] requires.
    #[allow(unsafe_code)]
    pub unsafe fn rereg(&mut self, change: Rereg<'_>) -> Result<(), Error> {
        let shared = &self.pd.shared;
        if let Some(pd) = change.pd {
            if !Arc::ptr_eq(&pd.inner.shared, shared) {
                return Err(Error::ForeignObject("protection domain"));
            }
        }
        let on_demand = change.on_demand.unwrap_or_else(|| self.is_on_demand());
        let access_changes = change.access.is_some();
        let covered = match (change.translation, self.caller) {
            (Some((addr, len)), _) => Some((addr, len)),
            // New rights (or paging) over the same memory: the same bytes, given anew.
            (None, Some(caller)) if access_changes => Some((caller.addr as *mut u8, self.len)),
            _ => None,
        };
        let mut core = shared.lock()?;
        let access = match change.access {
            Some(access) => access,
            None => core
                .endpoint()
                .mrs()
                .get(self.key)
                .ok_or(Error::Gone)?
                .access(),
        };
        let writable = access.contains(AccessFlags::LOCAL_WRITE);
        let translation = match covered {
            Some((addr, len)) => {
                let iova = if change.translation.is_some() {
                    addr as u64
                } else {
                    self.iova
                };
                let memory = if on_demand {
                    CallerMemory::on_demand(addr, len, writable)?
                } else {
                    limits::check_mr_len(len)?;
                    // SAFETY: our caller's promise for the memory covered afterwards.
                    unsafe { CallerMemory::new(addr, len, writable) }?
                };
                Some((iova, len, addr, memory))
            }
            None => None,
        };
        let new_pd = change.pd.map(|pd| pd.inner.id);
        let mrs = core.endpoint().mrs();
        match translation {
            Some((iova, len, addr, memory)) => {
                mrs.rereg(self.key, new_pd, Some((iova, memory)), change.access)?;
                self.iova = iova;
                self.len = len;
                self.caller = Some(CallerRegion {
                    addr: addr as usize,
                    on_demand,
                });
            }
            None => mrs.rereg(self.key, new_pd, None, change.access)?,
        }
        drop(core);
        if let Some(pd) = change.pd {
            self.pd = Arc::clone(&pd.inner);
        }
        Ok(())
    }

    /// Deregisters now (`ibv_dereg_mr`) and hands back the bytes of a region that owned them
    /// (`None` over the caller's memory, which the device no longer touches once this
    /// returns). Memory windows still bound to it are unbound first (see
    /// [`windows_bound`](Self::windows_bound) for `ibv_dereg_mr`'s refusal).
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
            .and_then(|mut core| Ok(core.endpoint().mrs().dereg_mr_unbinding(self.key)?));
        // On success, dropping `self` finds the key gone, which it ignores.
        deregistered.map_err(|error| (self, error))
    }

    /// How many memory windows are bound to the region now: while any is, `ibv_dereg_mr`
    /// refuses with `EINVAL`, as rxe does.
    pub fn windows_bound(&self) -> Result<u32, Error> {
        let mut core = self.pd.shared.lock()?;
        let mr = core.endpoint().mrs().get(self.key).ok_or(Error::Gone)?;
        Ok(mr.windows_bound())
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
            // Windows bound to it must not outlive the memory they grant.
            let _ = core.endpoint().mrs().dereg_mr_unbinding(self.key);
        }
    }
}

//! Protection domains and memory regions.
//!
//! A region owns its bytes: they live in the transport's region table, where the peer's
//! WRITEs, READs and atomics reach them, and the program reads and writes them through
//! [`Mr`]'s methods. So no buffer can be freed or moved while a peer may still write it,
//! and none of this needs `unsafe`.

use std::sync::Arc;

use roce_transport::mr::PdId;
use roce_transport::wr::Sge;
use roce_transport::AccessFlags;

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

    fn region(&self, key: u32, iova: u64, len: usize) -> Mr {
        Mr {
            pd: Arc::clone(&self.inner),
            key,
            iova,
            len,
        }
    }
}

/// A registered memory region that owns its bytes (`ibv_mr`). Deregistered on drop; its
/// key is never issued again.
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

    /// Runs `f` on the bytes. The device is locked meanwhile: keep `f` short and do not
    /// call verbs from it (that would deadlock).
    pub fn with_bytes<T>(&self, f: impl FnOnce(&[u8]) -> T) -> Result<T, Error> {
        let mut core = self.pd.shared.lock()?;
        let mr = core.endpoint().mrs().get(self.key).ok_or(Error::Gone)?;
        Ok(f(mr.bytes()))
    }

    /// Runs `f` on the bytes, mutably; the same rules as [`with_bytes`](Self::with_bytes).
    pub fn with_bytes_mut<T>(&self, f: impl FnOnce(&mut [u8]) -> T) -> Result<T, Error> {
        let mut core = self.pd.shared.lock()?;
        let mr = core.endpoint().mrs().get_mut(self.key).ok_or(Error::Gone)?;
        Ok(f(mr.bytes_mut()))
    }

    /// Copies `data` in at `offset`.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<(), Error> {
        self.with_bytes_mut(|bytes| {
            let end = offset
                .checked_add(data.len())
                .filter(|&end| end <= bytes.len());
            let end = end.ok_or(Error::OutOfBounds)?;
            bytes[offset..end].copy_from_slice(data);
            Ok(())
        })?
    }

    /// Copies `out.len()` bytes out from `offset`.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), Error> {
        self.with_bytes(|bytes| {
            let end = offset
                .checked_add(out.len())
                .filter(|&end| end <= bytes.len());
            let end = end.ok_or(Error::OutOfBounds)?;
            out.copy_from_slice(&bytes[offset..end]);
            Ok(())
        })?
    }

    /// A copy of every byte.
    pub fn to_vec(&self) -> Result<Vec<u8>, Error> {
        self.with_bytes(<[u8]>::to_vec)
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        if let Ok(mut core) = self.pd.shared.lock() {
            let _ = core.endpoint().mrs().dereg_mr(self.key);
        }
    }
}

//! Memory two processes map: a memfd, sized and mapped shared, whose fd travels to the other
//! process over the switch's socket (`SCM_RIGHTS`).

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::ptr::NonNull;

use rustix::fs::{fstat, ftruncate, memfd_create, MemfdFlags};
use rustix::mm::{mmap, munmap, MapFlags, ProtFlags};

/// A shared mapping of a memfd, unmapped on drop.
pub struct SharedMemory {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory; who may touch which part of it when is the rings'
// protocol (see `ring`), which works through raw pointers and atomics, not references.
#[allow(unsafe_code)]
unsafe impl Send for SharedMemory {}
// SAFETY: as above.
#[allow(unsafe_code)]
unsafe impl Sync for SharedMemory {}

impl SharedMemory {
    /// A new memfd of `len` zeroed bytes, mapped; the fd is for the other process.
    pub fn create(name: &str, len: usize) -> io::Result<(SharedMemory, OwnedFd)> {
        let fd = memfd_create(name, MemfdFlags::CLOEXEC)?;
        ftruncate(&fd, len as u64)?;
        let memory = Self::map_len(&fd, len)?;
        Ok((memory, fd))
    }

    /// Maps the whole of a memfd another process made.
    pub fn map(fd: &OwnedFd) -> io::Result<SharedMemory> {
        let len = usize::try_from(fstat(fd)?.st_size).map_err(io::Error::other)?;
        Self::map_len(fd, len)
    }

    fn map_len(fd: &impl AsFd, len: usize) -> io::Result<SharedMemory> {
        if len == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty mapping"));
        }
        // SAFETY: a new mapping at an address the kernel picks, aliasing nothing of ours.
        #[allow(unsafe_code)]
        let ptr = unsafe {
            mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                fd,
                0,
            )
        }?;
        let ptr = NonNull::new(ptr.cast()).ok_or_else(|| io::Error::other("mmap gave NULL"))?;
        Ok(SharedMemory { ptr, len })
    }

    /// The first byte (page-aligned).
    pub fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    /// Bytes mapped (never 0).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is mapped (never: a mapping has at least one byte).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for SharedMemory {
    fn drop(&mut self) {
        // SAFETY: mapped in `map_len` with this length; the rings that point into it are
        // dropped before it (they hold it in an `Arc`).
        #[allow(unsafe_code)]
        unsafe {
            let _ = munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

//! What makes objects importable (`ibv_import_device`, `ibv_import_pd`, `ibv_import_mr`),
//! within this process: a context's `cmd_fd` and its objects' handles.
//!
//! - A context's `cmd_fd` is a memfd of its own, standing for the kernel's uverbs file: a
//!   `dup` of it is the same file (same inode), so the inode names the context's object
//!   space, which every context imported from that fd shares, and the device it is on.
//! - PDs and MRs get a handle from one counter, unique among live objects; the registry
//!   maps it back to the object and is updated as they come and go.
//! - An imported MR is a copy of the original's `ibv_mr` in its importer's context, owned
//!   here: `ibv_unimport_mr` and `ibv_dereg_mr` free only the copy.

use core::ffi::c_int;
use std::collections::{HashMap, HashSet};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::Mutex;

use crate::abi::*;

const EBADF: c_int = 9;
const EINVAL: c_int = 22;

/// What a handle names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Pd,
    Mr,
}

#[derive(Default)]
struct Registry {
    /// The device of each object space, by the inode of its contexts' `cmd_fd`.
    spaces: HashMap<u64, usize>,
    /// Each live PD and MR by handle: its kind and its `ibv_pd`/`ibv_mr`.
    objects: HashMap<u32, (Kind, usize)>,
    last_handle: u32,
    /// The imported MRs' copies, which only this module frees.
    imported_mrs: HashSet<usize>,
}

static REGISTRY: Mutex<Option<Registry>> = Mutex::new(None);

fn with<T>(f: impl FnOnce(&mut Registry) -> T) -> Option<T> {
    let mut registry = REGISTRY.lock().ok()?;
    Some(f(registry.get_or_insert_with(Registry::default)))
}

/// The inode of the file `fd` refers to.
fn inode(fd: BorrowedFd) -> io::Result<u64> {
    Ok(rustix::fs::fstat(fd)?.st_ino)
}

/// The inode of the file behind a raw fd, or `None` if it is not one.
pub(crate) fn space_of(fd: c_int) -> Option<u64> {
    if fd < 0 {
        return None;
    }
    // SAFETY: only borrowed for the fstat; an fd number that is not open fails there.
    let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
    inode(borrowed).ok()
}

/// A new object space on `device`: the `cmd_fd` of a context opened on it.
pub(crate) fn new_cmd_fd(device: *mut ibv_device) -> io::Result<OwnedFd> {
    let fd = rustix::fs::memfd_create("roce-xdp-uverbs", rustix::fs::MemfdFlags::CLOEXEC)?;
    let space = inode(fd.as_fd())?;
    with(|registry| registry.spaces.insert(space, device as usize));
    Ok(fd)
}

/// The device of the object space `cmd_fd` stands for, taking the fd over (as
/// `ibv_import_device` does); errno `EBADF` if it is not open, `EINVAL` if it is not a
/// context's `cmd_fd` (the fd then stays the caller's).
///
/// # Safety
/// On success the caller owns `cmd_fd` from now on and must not close it.
pub(crate) unsafe fn import_cmd_fd(cmd_fd: c_int) -> Result<(*mut ibv_device, OwnedFd), c_int> {
    let space = space_of(cmd_fd).ok_or(EBADF)?;
    let device = with(|registry| registry.spaces.get(&space).copied())
        .flatten()
        .ok_or(EINVAL)?;
    // SAFETY: the caller hands the open fd over, per this function's contract.
    let fd = unsafe { OwnedFd::from_raw_fd(cmd_fd) };
    Ok((device as *mut ibv_device, fd))
}

/// A fresh handle for `object` (an `ibv_pd` or `ibv_mr` just made), registered under it.
pub(crate) fn register(kind: Kind, object: usize) -> u32 {
    with(|registry| loop {
        registry.last_handle = registry.last_handle.wrapping_add(1);
        let handle = registry.last_handle;
        if handle != 0 && !registry.objects.contains_key(&handle) {
            registry.objects.insert(handle, (kind, object));
            return handle;
        }
    })
    .unwrap_or(0)
}

/// `object` (handle `handle`) is going away.
pub(crate) fn forget(handle: u32, object: usize) {
    with(|registry| {
        if registry.objects.get(&handle).map(|entry| entry.1) == Some(object) {
            registry.objects.remove(&handle);
        }
    });
}

/// The live object of `kind` with `handle`.
pub(crate) fn lookup(kind: Kind, handle: u32) -> Option<usize> {
    with(|registry| {
        registry
            .objects
            .get(&handle)
            .filter(|entry| entry.0 == kind)
            .map(|entry| entry.1)
    })
    .flatten()
}

/// Whether `object` is the registered original of its handle (not an imported copy).
pub(crate) fn is_original(handle: u32, object: usize) -> bool {
    lookup(Kind::Pd, handle).or_else(|| lookup(Kind::Mr, handle)) == Some(object)
}

/// A copy of an MR for an importer, owned here.
pub(crate) fn imported_mr(raw: ibv_mr) -> *mut ibv_mr {
    let copy = Box::into_raw(Box::new(raw));
    with(|registry| registry.imported_mrs.insert(copy as usize));
    copy
}

/// Whether `mr` is an imported copy (an `ibv_mr` alone, not one of our regions).
pub(crate) fn is_imported_mr(mr: *const ibv_mr) -> bool {
    with(|registry| registry.imported_mrs.contains(&(mr as usize))).unwrap_or(false)
}

/// Frees `mr` if it is an imported copy; whether it was.
///
/// # Safety
/// `mr` is NULL or an `ibv_mr` of ours not freed yet; if an imported copy, the caller
/// never uses it again.
pub(crate) unsafe fn free_imported_mr(mr: *mut ibv_mr) -> bool {
    let imported = with(|registry| registry.imported_mrs.remove(&(mr as usize))).unwrap_or(false);
    if imported {
        // SAFETY: made by `imported_mr` from a Box, and given up by the caller.
        drop(unsafe { Box::from_raw(mr) });
    }
    imported
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_unique_among_live_objects_and_name_their_kind() {
        let (a, b) = (0x1000usize, 0x2000usize);
        let pd = register(Kind::Pd, a);
        let mr = register(Kind::Mr, b);
        assert_ne!(pd, mr);
        assert_ne!(pd, 0);
        assert_eq!(lookup(Kind::Pd, pd), Some(a));
        assert_eq!(lookup(Kind::Mr, pd), None, "a PD's handle names no MR");
        assert!(is_original(mr, b) && !is_original(mr, a));
        forget(pd, b);
        assert_eq!(
            lookup(Kind::Pd, pd),
            Some(a),
            "only its own object forgets it"
        );
        forget(pd, a);
        assert_eq!(lookup(Kind::Pd, pd), None);
        forget(mr, b);
    }

    #[test]
    fn a_dup_of_a_cmd_fd_is_the_same_object_space_and_others_are_not() {
        let device = 0x42 as *mut ibv_device;
        let fd = new_cmd_fd(device).unwrap();
        let other = new_cmd_fd(device).unwrap();
        let dup = rustix::io::dup(&fd).unwrap();
        use std::os::fd::{AsRawFd, IntoRawFd};
        assert_eq!(space_of(dup.as_raw_fd()), space_of(fd.as_raw_fd()));
        assert_ne!(space_of(other.as_raw_fd()), space_of(fd.as_raw_fd()));
        // SAFETY: the dup is ours to hand over.
        let (found, taken) = unsafe { import_cmd_fd(dup.into_raw_fd()) }.unwrap();
        assert_eq!(found, device);
        drop(taken);
        let unrelated = rustix::fs::memfd_create("x", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        // SAFETY: refused, so not taken.
        let refused = unsafe { import_cmd_fd(unrelated.as_raw_fd()) };
        assert_eq!(refused.err(), Some(EINVAL));
        // SAFETY: never open.
        assert_eq!(unsafe { import_cmd_fd(-1) }.err(), Some(EBADF));
    }
}

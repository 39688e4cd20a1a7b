//! Protection domains and memory regions: who may touch which bytes.
//!
//! A region's lkey and rkey are the same 32-bit value, as rxe and mlx5 hand out. Keys are
//! drawn from a ChaCha12 stream seeded by the caller (from the OS in production, a constant in
//! tests), so a peer cannot guess one, and a key is never issued twice in a table's lifetime:
//! a peer that still holds an old rkey must hit "unknown key", never someone else's memory.

mod mw;

use std::collections::{HashMap, HashSet};
use std::ops::Range;

use roce_wire::icrc::Running;
use rustc_hash::FxHashMap;

use rand_chacha::ChaCha12Rng;
use rand_core::{Rng, SeedableRng};

pub use crate::access::{AccessFlags, AtomicOp, MrError};
pub use crate::caller_memory::CallerMemory;
use crate::copy_icrc;
use crate::limits::LIMITS;
use crate::wr::Sge;
pub use mw::MwType;

/// A protection domain's identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PdId(u32);

impl PdId {
    /// No PD: an XRC target QP's own (each request is checked against its SRQ's PD).
    pub(crate) const NONE: PdId = PdId(u32::MAX);
}

/// The bytes behind a region: its own, or the caller's.
#[derive(Debug)]
enum Memory {
    Owned(Box<[u8]>),
    Caller(CallerMemory),
}

impl Memory {
    fn len(&self) -> usize {
        match self {
            Memory::Owned(bytes) => bytes.len(),
            Memory::Caller(memory) => memory.len(),
        }
    }

    /// The range `offset..offset + len` of owned bytes, if inside them.
    fn owned_range(bytes: &[u8], offset: usize, len: usize) -> Result<Range<usize>, MrError> {
        match offset.checked_add(len) {
            Some(end) if end <= bytes.len() => Ok(offset..end),
            _ => Err(MrError::OutOfBounds),
        }
    }

    fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), MrError> {
        match self {
            Memory::Owned(bytes) => {
                out.copy_from_slice(&bytes[Self::owned_range(bytes, offset, out.len())?]);
                Ok(())
            }
            Memory::Caller(memory) => memory.read(offset, out),
        }
    }

    fn read_icrc(&self, offset: usize, out: &mut [u8], icrc: Running) -> Result<Running, MrError> {
        match self {
            Memory::Owned(bytes) => {
                let range = Self::owned_range(bytes, offset, out.len())?;
                Ok(copy_icrc::copy_slice(out, &bytes[range], icrc))
            }
            Memory::Caller(memory) => memory.read_icrc(offset, out, icrc),
        }
    }

    fn append(&self, offset: usize, len: usize, out: &mut Vec<u8>) -> Result<(), MrError> {
        match self {
            Memory::Owned(bytes) => {
                out.extend_from_slice(&bytes[Self::owned_range(bytes, offset, len)?]);
                Ok(())
            }
            Memory::Caller(memory) => memory.append(offset, len, out),
        }
    }

    fn write(&mut self, offset: usize, data: &[u8]) -> Result<(), MrError> {
        match self {
            Memory::Owned(bytes) => {
                let range = Self::owned_range(bytes, offset, data.len())?;
                bytes[range].copy_from_slice(data);
                Ok(())
            }
            Memory::Caller(memory) => memory.write(offset, data),
        }
    }

    fn atomic(&mut self, offset: usize, op: AtomicOp) -> Result<u64, MrError> {
        match self {
            Memory::Owned(bytes) => {
                let range = Self::owned_range(bytes, offset, 8)?;
                let word = &mut bytes[range];
                // Memory holds the value in host byte order, as an HCA's atomic unit sees it.
                let original = u64::from_ne_bytes(word.try_into().unwrap_or([0; 8]));
                word.copy_from_slice(&op.apply(original).to_ne_bytes());
                Ok(original)
            }
            Memory::Caller(memory) => memory.atomic(offset, op),
        }
    }
}

/// A registered memory region, over bytes it owns or over the caller's memory.
#[derive(Debug)]
pub struct Mr {
    pd: PdId,
    iova: u64,
    access: AccessFlags,
    memory: Memory,
    /// Memory windows bound to it.
    windows: u32,
}

impl Mr {
    /// The address peers use for the first byte.
    pub fn iova(&self) -> u64 {
        self.iova
    }

    /// The region's access rights.
    pub fn access(&self) -> AccessFlags {
        self.access
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.memory.len()
    }

    /// Whether it covers no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many memory windows are bound to it (while any is, it cannot be deregistered).
    pub fn windows_bound(&self) -> u32 {
        self.windows
    }

    /// The bytes of a region that owns them; `None` over the caller's memory, which the
    /// caller reaches through its own pointer.
    pub fn bytes(&self) -> Option<&[u8]> {
        match &self.memory {
            Memory::Owned(bytes) => Some(bytes),
            Memory::Caller(_) => None,
        }
    }

    /// [`bytes`](Self::bytes), mutably.
    pub fn bytes_mut(&mut self) -> Option<&mut [u8]> {
        match &mut self.memory {
            Memory::Owned(bytes) => Some(bytes),
            Memory::Caller(_) => None,
        }
    }

    /// Copies `out.len()` bytes from `offset` (from the first byte, not the iova), whoever
    /// owns the memory.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), MrError> {
        self.memory.read(offset, out)
    }

    /// Copies `data` in at `offset`, whoever owns the memory (a caller's memory must have
    /// been registered writable).
    pub fn write(&mut self, offset: usize, data: &[u8]) -> Result<(), MrError> {
        self.memory.write(offset, data)
    }

    /// A copy of every byte.
    pub fn to_vec(&self) -> Result<Vec<u8>, MrError> {
        let mut out = Vec::new();
        self.memory.append(0, self.len(), &mut out)?;
        Ok(out)
    }
}

/// Where an access landed: the region's key and the offset inside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Location {
    /// The region's key.
    pub key: u32,
    /// Offset of the first byte from the region's start.
    pub offset: usize,
}

/// All PDs, MRs and memory windows of one device.
#[derive(Debug)]
pub struct MrTable {
    rng: ChaCha12Rng,
    next_pd: u32,
    /// Each PD's regions and windows.
    pds: HashMap<PdId, usize>,
    mrs: Regions,
    issued: HashSet<u32>,
    /// Memory windows by index (their R_Key without the key byte).
    mws: HashMap<u32, mw::Mw>,
    /// Every window index ever issued: no region key starts with one, none is issued twice.
    window_indices: HashSet<u32>,
}

impl Mr {
    /// Whether a QP in `pd` may access `len` (> 0) bytes at `address` with `needed` rights;
    /// the offset of the first byte.
    fn permits(
        &self,
        pd: PdId,
        address: u64,
        len: u64,
        needed: AccessFlags,
    ) -> Result<usize, MrError> {
        if self.pd != pd {
            return Err(MrError::WrongPd);
        }
        if !self.access.contains(needed) {
            return Err(MrError::AccessDenied);
        }
        let offset = address.checked_sub(self.iova).ok_or(MrError::OutOfBounds)?;
        let end = offset.checked_add(len).ok_or(MrError::OutOfBounds)?;
        if end > self.memory.len() as u64 {
            return Err(MrError::OutOfBounds);
        }
        Ok(offset as usize)
    }
}

impl MrTable {
    /// An empty table whose keys come from `seed`.
    pub fn new(seed: [u8; 32]) -> Self {
        MrTable {
            rng: ChaCha12Rng::from_seed(seed),
            next_pd: 0,
            pds: HashMap::new(),
            mrs: Regions::default(),
            issued: HashSet::new(),
            mws: HashMap::new(),
            window_indices: HashSet::new(),
        }
    }

    /// Allocates a protection domain.
    pub fn alloc_pd(&mut self) -> PdId {
        let pd = PdId(self.next_pd);
        self.next_pd += 1;
        self.pds.insert(pd, 0);
        pd
    }

    /// Whether the protection domain exists.
    pub fn has_pd(&self, pd: PdId) -> bool {
        self.pds.contains_key(&pd)
    }

    /// Frees a protection domain that has no regions or windows left.
    pub fn dealloc_pd(&mut self, pd: PdId) -> Result<(), MrError> {
        match self.pds.get(&pd) {
            None => Err(MrError::UnknownPd),
            Some(0) => {
                self.pds.remove(&pd);
                Ok(())
            }
            Some(_) => Err(MrError::PdBusy),
        }
    }

    /// Registers `len` zeroed bytes that peers address from `iova`; returns the key.
    pub fn reg_mr(
        &mut self,
        pd: PdId,
        iova: u64,
        len: usize,
        access: AccessFlags,
    ) -> Result<u32, MrError> {
        self.check_registration(pd, iova, len, access)?;
        // A failed allocation is an error to report, not a reason to abort the process.
        let mut bytes = Vec::new();
        bytes
            .try_reserve_exact(len)
            .map_err(|_| MrError::OutOfMemory)?;
        bytes.resize(len, 0);
        Ok(self.insert(pd, iova, access, Memory::Owned(bytes.into_boxed_slice())))
    }

    /// Registers `bytes`, which the region owns until [`dereg_mr`](Self::dereg_mr) hands
    /// them back, addressed from `iova`. On error they are dropped.
    pub fn reg_mr_owned(
        &mut self,
        pd: PdId,
        iova: u64,
        bytes: Box<[u8]>,
        access: AccessFlags,
    ) -> Result<u32, MrError> {
        self.check_registration(pd, iova, bytes.len(), access)?;
        Ok(self.insert(pd, iova, access, Memory::Owned(bytes)))
    }

    /// Registers the caller's `memory`, addressed from `iova` (its own address for
    /// `ibv_reg_mr`, any other for `ibv_reg_mr_iova2`). Memory that may be written
    /// (`LOCAL_WRITE`) must have been given as writable.
    pub fn reg_mr_caller(
        &mut self,
        pd: PdId,
        iova: u64,
        memory: CallerMemory,
        access: AccessFlags,
    ) -> Result<u32, MrError> {
        if memory.is_implicit() {
            // The whole address space, addressed as itself (implicit ODP): no size limit.
            if iova != 0 {
                return Err(MrError::AddressOverflow);
            }
            check_access(access)?;
            if !self.pds.contains_key(&pd) {
                return Err(MrError::UnknownPd);
            }
        } else {
            self.check_registration(pd, iova, memory.len(), access)?;
        }
        if access.contains(AccessFlags::LOCAL_WRITE) && !memory.writable() {
            return Err(MrError::InvalidAccess);
        }
        Ok(self.insert(pd, iova, access, Memory::Caller(memory)))
    }

    /// `ibv_rereg_mr`: moves region `key` to PD `pd`, over other memory addressed from
    /// another iova (`translation`), with other rights (`access`), keeping its key; each
    /// `None` keeps what was. Checked as a registration is, and all or nothing. A region that
    /// owns its bytes keeps them (only the PD and the rights change).
    pub fn rereg(
        &mut self,
        key: u32,
        pd: Option<PdId>,
        translation: Option<(u64, CallerMemory)>,
        access: Option<AccessFlags>,
    ) -> Result<(), MrError> {
        let mr = self.mrs.get(key).ok_or(MrError::UnknownKey)?;
        let new_pd = pd.unwrap_or(mr.pd);
        let new_access = access.unwrap_or(mr.access);
        if !self.pds.contains_key(&new_pd) {
            return Err(MrError::UnknownPd);
        }
        check_access(new_access)?;
        // Owned bytes are always writable; the caller's memory as it was given.
        let writable = match (&translation, &mr.memory) {
            (Some((_, memory)), _) | (None, Memory::Caller(memory)) => memory.writable(),
            (None, Memory::Owned(_)) => true,
        };
        if new_access.contains(AccessFlags::LOCAL_WRITE) && !writable {
            return Err(MrError::InvalidAccess);
        }
        if let Some((iova, memory)) = &translation {
            if matches!(mr.memory, Memory::Owned(_)) {
                return Err(MrError::InvalidAccess);
            }
            if !memory.is_implicit() {
                self.check_registration(new_pd, *iova, memory.len(), new_access)?;
            }
        }
        let old_pd = mr.pd;
        let mr = self.mrs.get_mut(key).ok_or(MrError::UnknownKey)?;
        mr.pd = new_pd;
        mr.access = new_access;
        if let Some((iova, memory)) = translation {
            mr.iova = iova;
            mr.memory = Memory::Caller(memory);
        }
        if old_pd != new_pd {
            if let Some(regions) = self.pds.get_mut(&old_pd) {
                *regions -= 1;
            }
            if let Some(regions) = self.pds.get_mut(&new_pd) {
                *regions += 1;
            }
        }
        Ok(())
    }

    /// `ibv_advise_mr`'s prefetch: faults the `len` bytes at `address` of on-demand region
    /// `key` of `pd` in, for writing if `write` (which needs `LOCAL_WRITE`), or with `fault`
    /// false only checks them (`IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT`: nothing is mapped
    /// that is not).
    pub fn prefetch(
        &self,
        pd: PdId,
        key: u32,
        address: u64,
        len: u64,
        write: bool,
        fault: bool,
    ) -> Result<(), MrError> {
        let mr = self.mrs.get(key).ok_or(MrError::UnknownKey)?;
        let Memory::Caller(memory) = &mr.memory else {
            return Err(MrError::NotOnDemand);
        };
        if !memory.is_on_demand() {
            return Err(MrError::NotOnDemand);
        }
        let needed = if write {
            AccessFlags::LOCAL_WRITE
        } else {
            AccessFlags::empty()
        };
        let offset = mr.permits(pd, address, len, needed)?;
        if fault {
            memory.prefetch(offset, len as usize, write)?;
        }
        Ok(())
    }

    /// What every registration checks before it takes anything.
    fn check_registration(
        &self,
        pd: PdId,
        iova: u64,
        len: usize,
        access: AccessFlags,
    ) -> Result<(), MrError> {
        check_access(access)?;
        if len as u64 > LIMITS.max_mr_size {
            return Err(MrError::TooLarge);
        }
        if iova.checked_add(len as u64).is_none() {
            return Err(MrError::AddressOverflow);
        }
        if !self.pds.contains_key(&pd) {
            return Err(MrError::UnknownPd);
        }
        Ok(())
    }

    fn insert(&mut self, pd: PdId, iova: u64, access: AccessFlags, memory: Memory) -> u32 {
        if let Some(regions) = self.pds.get_mut(&pd) {
            *regions += 1;
        }
        let key = self.fresh_key();
        let mr = Mr {
            pd,
            iova,
            access,
            memory,
            windows: 0,
        };
        self.mrs.insert(key, mr);
        key
    }

    fn fresh_key(&mut self) -> u32 {
        loop {
            let key = self.rng.next_u32();
            if !self.is_window_index(key) && self.issued.insert(key) {
                return key;
            }
        }
    }

    /// Deregisters a region and gives back the bytes it owned (`None` over the caller's
    /// memory, which the transport no longer touches from now on). Its key is never issued
    /// again. A region with memory windows bound stays ([`MrError::WindowsBound`], as
    /// `ibv_dereg_mr` refuses it).
    pub fn dereg_mr(&mut self, key: u32) -> Result<Option<Box<[u8]>>, MrError> {
        if self.mrs.get(key).is_some_and(|mr| mr.windows > 0) {
            return Err(MrError::WindowsBound);
        }
        self.remove_region(key)
    }

    /// [`dereg_mr`](Self::dereg_mr) that first unbinds the windows bound to the region (they
    /// grant nothing from now on): for a region whose owner is gone.
    pub fn dereg_mr_unbinding(&mut self, key: u32) -> Result<Option<Box<[u8]>>, MrError> {
        self.unbind_all(key);
        self.remove_region(key)
    }

    fn remove_region(&mut self, key: u32) -> Result<Option<Box<[u8]>>, MrError> {
        let mr = self.mrs.remove(key).ok_or(MrError::UnknownKey)?;
        if let Some(regions) = self.pds.get_mut(&mr.pd) {
            *regions -= 1;
        }
        Ok(match mr.memory {
            Memory::Owned(bytes) => Some(bytes),
            Memory::Caller(_) => None,
        })
    }

    /// The region with this key.
    pub fn get(&self, key: u32) -> Option<&Mr> {
        self.mrs.get(key)
    }

    /// The region with this key, mutably.
    pub fn get_mut(&mut self, key: u32) -> Option<&mut Mr> {
        self.mrs.get_mut(key)
    }

    /// Checks an access of `len` bytes at `address` through `key` by a QP in `pd`, needing
    /// `needed` rights: the responder's R_Key check and the requester's L_Key check alike.
    /// A zero-length access names no memory and is always allowed (IBTA 9.4.4: the R_Key of
    /// a zero-length RDMA is not validated).
    pub fn check(
        &self,
        pd: PdId,
        key: u32,
        address: u64,
        len: u64,
        needed: AccessFlags,
    ) -> Result<Location, MrError> {
        if len == 0 {
            return Ok(Location { key, offset: 0 });
        }
        let mr = self.mrs.get(key).ok_or(MrError::UnknownKey)?;
        let offset = mr.permits(pd, address, len, needed)?;
        Ok(Location { key, offset })
    }

    /// [`check`](Self::check), then copies `data` in (one lookup instead of two).
    pub fn write(
        &mut self,
        pd: PdId,
        key: u32,
        address: u64,
        data: &[u8],
        needed: AccessFlags,
    ) -> Result<(), MrError> {
        if data.is_empty() {
            return Ok(());
        }
        let mr = self.mrs.get_mut(key).ok_or(MrError::UnknownKey)?;
        let offset = mr.permits(pd, address, data.len() as u64, needed)?;
        mr.memory.write(offset, data)
    }

    /// [`check`](Self::check), then appends the `len` bytes to `out`.
    fn append_checked(
        &mut self,
        pd: PdId,
        key: u32,
        address: u64,
        len: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), MrError> {
        if len == 0 {
            return Ok(());
        }
        let mr = self.mrs.get_mut(key).ok_or(MrError::UnknownKey)?;
        let offset = mr.permits(pd, address, len as u64, AccessFlags::empty())?;
        mr.memory.append(offset, len, out)
    }

    /// A remote atomic on the 8-byte word at `address`, which must be aligned (in the
    /// region's addresses and, over the caller's memory, in the process's too): checks it as
    /// [`check`](Self::check) does with `REMOTE_ATOMIC` (`REMOTE_WRITE` for an ATOMIC
    /// WRITE), performs it and returns the word's value before it.
    pub fn atomic(
        &mut self,
        pd: PdId,
        key: u32,
        address: u64,
        op: AtomicOp,
    ) -> Result<u64, MrError> {
        if !address.is_multiple_of(8) {
            return Err(MrError::Misaligned);
        }
        let mr = self.mrs.get_mut(key).ok_or(MrError::UnknownKey)?;
        let offset = mr.permits(pd, address, 8, op.needs())?;
        mr.memory.atomic(offset, op)
    }

    /// The responder's R_Key check for QP `qpn` in `pd`: [`check`](Self::check) for a
    /// region's key, and for a memory window's the window's own rules (its PD, its QP for
    /// type 2, its rights and range); the location is in the window's region.
    pub fn check_remote(
        &self,
        pd: PdId,
        qpn: u32,
        rkey: u32,
        address: u64,
        len: u64,
        needed: AccessFlags,
    ) -> Result<Location, MrError> {
        if len == 0 || self.mrs.get(rkey).is_some() {
            return self.check(pd, rkey, address, len, needed);
        }
        self.locate_in_window(pd, qpn, rkey, address, len, needed)
            .unwrap_or(Err(MrError::UnknownKey))
    }

    /// [`check_remote`](Self::check_remote), then copies `data` in; a region's key takes one
    /// lookup, as [`write`](Self::write) does.
    pub fn write_remote(
        &mut self,
        pd: PdId,
        qpn: u32,
        rkey: u32,
        address: u64,
        data: &[u8],
        needed: AccessFlags,
    ) -> Result<(), MrError> {
        if data.is_empty() {
            return Ok(());
        }
        if let Some(mr) = self.mrs.get_mut(rkey) {
            let offset = mr.permits(pd, address, data.len() as u64, needed)?;
            return mr.memory.write(offset, data);
        }
        let location = self
            .locate_in_window(pd, qpn, rkey, address, data.len() as u64, needed)
            .unwrap_or(Err(MrError::UnknownKey))?;
        self.write_at(location, data)
    }

    /// [`atomic`](Self::atomic) through a region's or a memory window's R_Key, for QP `qpn`.
    pub fn atomic_remote(
        &mut self,
        pd: PdId,
        qpn: u32,
        rkey: u32,
        address: u64,
        op: AtomicOp,
    ) -> Result<u64, MrError> {
        if self.mrs.get(rkey).is_some() {
            return self.atomic(pd, rkey, address, op);
        }
        if !address.is_multiple_of(8) {
            return Err(MrError::Misaligned);
        }
        let location = self
            .locate_in_window(pd, qpn, rkey, address, 8, op.needs())
            .unwrap_or(Err(MrError::UnknownKey))?;
        let mr = self.mrs.get_mut(location.key).ok_or(MrError::UnknownKey)?;
        mr.memory.atomic(location.offset, op)
    }
}

/// Remote write or atomic access needs local write, as verbs requires of every region.
fn check_access(access: AccessFlags) -> Result<(), MrError> {
    let remote_mutation = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC;
    if access.intersects(remote_mutation) && !access.contains(AccessFlags::LOCAL_WRITE) {
        return Err(MrError::InvalidAccess);
    }
    Ok(())
}

/// The regions by key, in slots, so the one found last is remembered by its slot and found
/// again without hashing: a program moving data names the same region packet after packet.
/// Keys are random, so a fast non-keyed hash spreads them as well as SipHash, at a fraction
/// of the cost (transport benchmark).
#[derive(Debug, Default)]
struct Regions {
    slots: Vec<Option<(u32, Mr)>>,
    free: Vec<usize>,
    by_key: FxHashMap<u32, usize>,
    /// Slot of the region a mutable lookup found last.
    recent: usize,
}

impl Regions {
    fn insert(&mut self, key: u32, mr: Mr) {
        let slot = self.free.pop().unwrap_or(self.slots.len());
        if slot == self.slots.len() {
            self.slots.push(None);
        }
        self.slots[slot] = Some((key, mr));
        self.by_key.insert(key, slot);
    }

    fn remove(&mut self, key: u32) -> Option<Mr> {
        let slot = self.by_key.remove(&key)?;
        self.free.push(slot);
        self.slots[slot].take().map(|(_, mr)| mr)
    }

    #[inline]
    fn slot(&self, key: u32) -> Option<usize> {
        match self.slots.get(self.recent) {
            Some(Some((recent, _))) if *recent == key => Some(self.recent),
            _ => self.by_key.get(&key).copied(),
        }
    }

    #[inline]
    fn get(&self, key: u32) -> Option<&Mr> {
        let slot = self.slot(key)?;
        self.slots[slot].as_ref().map(|(_, mr)| mr)
    }

    #[inline]
    fn get_mut(&mut self, key: u32) -> Option<&mut Mr> {
        let slot = self.slot(key)?;
        self.recent = slot;
        self.slots[slot].as_mut().map(|(_, mr)| mr)
    }
}

/// The element of a gather/scatter list that holds byte `offset` of the list, and how far
/// into it that byte is.
fn sg_element_at(sg_list: &[Sge], offset: u64) -> Option<(&Sge, u64)> {
    let mut skip = offset;
    for sge in sg_list {
        let sge_len = u64::from(sge.length);
        if skip < sge_len {
            return Some((sge, skip));
        }
        skip -= sge_len;
    }
    None
}

impl MrTable {
    /// The next piece of a gather/scatter list at byte `offset`, at most `len` bytes: its
    /// location (checked against `pd` and `needed`), its length, and the list offset after it.
    fn sg_piece(
        &self,
        pd: PdId,
        sg_list: &[Sge],
        offset: u64,
        len: u64,
        needed: AccessFlags,
    ) -> Result<(Location, usize), MrError> {
        let (sge, skip) = sg_element_at(sg_list, offset).ok_or(MrError::OutOfBounds)?;
        let piece = (u64::from(sge.length) - skip).min(len);
        let location = self.check(pd, sge.lkey, sge.addr + skip, piece, needed)?;
        Ok((location, piece as usize))
    }

    /// Appends bytes `offset..offset + len` of a gather list to `out`.
    pub fn gather(
        &mut self,
        pd: PdId,
        sg_list: &[Sge],
        offset: u64,
        len: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), MrError> {
        let mut done = 0u64;
        let mut skip = offset;
        for sge in sg_list {
            if done == len as u64 {
                break;
            }
            let sge_len = u64::from(sge.length);
            if skip >= sge_len {
                skip -= sge_len;
                continue;
            }
            let piece = (sge_len - skip).min(len as u64 - done);
            self.append_checked(pd, sge.lkey, sge.addr + skip, piece as usize, out)?;
            done += piece;
            skip = 0;
        }
        if done < len as u64 {
            return Err(MrError::OutOfBounds);
        }
        Ok(())
    }

    /// Checks that bytes `offset..offset + len` of a gather list may be read (what
    /// [`gather_into`](Self::gather_into) will copy), copying nothing. When they lie in one
    /// region, says where: the sender then reads them there ([`read`](Self::read)) without
    /// looking the list up again.
    pub fn check_gather(
        &self,
        pd: PdId,
        sg_list: &[Sge],
        offset: u64,
        len: usize,
    ) -> Result<Option<Location>, MrError> {
        let mut checked = 0;
        let mut only = None;
        while checked < len {
            let remaining = (len - checked) as u64;
            let at = offset + checked as u64;
            let (location, piece) =
                self.sg_piece(pd, sg_list, at, remaining, AccessFlags::empty())?;
            only = (checked == 0 && piece == len).then_some(location);
            checked += piece;
        }
        Ok(only)
    }

    /// Copies bytes `offset..offset + out.len()` of a gather list into `out`: straight
    /// from the regions into where the caller sends them from.
    pub fn gather_into(
        &self,
        pd: PdId,
        sg_list: &[Sge],
        offset: u64,
        out: &mut [u8],
    ) -> Result<(), MrError> {
        let mut done = 0;
        while done < out.len() {
            let remaining = (out.len() - done) as u64;
            let at = offset + done as u64;
            let (location, piece) =
                self.sg_piece(pd, sg_list, at, remaining, AccessFlags::empty())?;
            self.read(location, &mut out[done..done + piece])?;
            done += piece;
        }
        Ok(())
    }

    /// Writes `data` at byte `offset` of a scatter list (needs LOCAL_WRITE). Nothing is
    /// written unless all of it fits.
    pub fn scatter(
        &mut self,
        pd: PdId,
        sg_list: &[Sge],
        offset: u64,
        data: &[u8],
    ) -> Result<(), MrError> {
        // Most data lands in one element: check and write it with one lookup.
        if let Some((sge, skip)) = sg_element_at(sg_list, offset) {
            if u64::from(sge.length) - skip >= data.len() as u64 {
                let needed = AccessFlags::LOCAL_WRITE;
                return self.write(pd, sge.lkey, sge.addr + skip, data, needed);
            }
        }
        let mut checked = 0;
        while checked < data.len() {
            let remaining = (data.len() - checked) as u64;
            let at = offset + checked as u64;
            let (_, piece) = self.sg_piece(pd, sg_list, at, remaining, AccessFlags::LOCAL_WRITE)?;
            checked += piece;
        }
        let mut done = 0;
        while done < data.len() {
            let remaining = (data.len() - done) as u64;
            let at = offset + done as u64;
            let (location, piece) =
                self.sg_piece(pd, sg_list, at, remaining, AccessFlags::LOCAL_WRITE)?;
            self.write_at(location, &data[done..done + piece])?;
            done += piece;
        }
        Ok(())
    }

    /// Appends the `len` bytes at a location [`check`](Self::check) returned to `out`.
    pub fn append(&self, location: Location, len: usize, out: &mut Vec<u8>) -> Result<(), MrError> {
        if len == 0 {
            return Ok(());
        }
        let mr = self.mrs.get(location.key).ok_or(MrError::UnknownKey)?;
        mr.memory.append(location.offset, len, out)
    }

    /// Copies `out.len()` bytes at a location [`check`](Self::check) returned into `out`.
    pub fn read(&self, location: Location, out: &mut [u8]) -> Result<(), MrError> {
        if out.is_empty() {
            return Ok(());
        }
        let mr = self.mrs.get(location.key).ok_or(MrError::UnknownKey)?;
        mr.memory.read(location.offset, out)
    }

    /// [`read`](Self::read), returning `icrc` continued over the bytes: a frame's payload
    /// copied into the frame and hashed where it is copied.
    pub fn read_icrc(
        &self,
        location: Location,
        out: &mut [u8],
        icrc: Running,
    ) -> Result<Running, MrError> {
        if out.is_empty() {
            return Ok(icrc);
        }
        let mr = self.mrs.get(location.key).ok_or(MrError::UnknownKey)?;
        mr.memory.read_icrc(location.offset, out, icrc)
    }

    /// Copies `data` to a location [`check`](Self::check) returned.
    fn write_at(&mut self, location: Location, data: &[u8]) -> Result<(), MrError> {
        let mr = self.mrs.get_mut(location.key).ok_or(MrError::UnknownKey)?;
        mr.memory.write(location.offset, data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RW: AccessFlags = AccessFlags::LOCAL_WRITE.union(AccessFlags::REMOTE_WRITE);

    fn table() -> (MrTable, PdId) {
        let mut table = MrTable::new([7; 32]);
        let pd = table.alloc_pd();
        (table, pd)
    }

    #[test]
    fn access_inside_the_region_is_located() {
        let (mut table, pd) = table();
        let key = table.reg_mr(pd, 0x1000, 64, RW).unwrap();
        assert_eq!(
            table.check(pd, key, 0x1010, 16, AccessFlags::REMOTE_WRITE),
            Ok(Location { key, offset: 0x10 })
        );
        assert_eq!(
            table
                .check(pd, key, 0x1000, 64, AccessFlags::REMOTE_WRITE)
                .map(|l| l.offset),
            Ok(0)
        );
    }

    /// The region found last is remembered by its slot; a deregistered region's slot,
    /// reused by a new one, must not answer to the old key.
    #[test]
    fn a_reused_slot_does_not_answer_to_the_old_key() {
        let (mut table, pd) = table();
        let first = table.reg_mr(pd, 0x1000, 64, RW).unwrap();
        let second = table.reg_mr(pd, 0x2000, 64, RW).unwrap();
        let write = AccessFlags::REMOTE_WRITE;
        table.write(pd, first, 0x1000, &[1], write).unwrap();
        let given_back = table.dereg_mr(first).unwrap().unwrap();
        assert_eq!(given_back[0], 1);
        let third = table.reg_mr(pd, 0x1000, 64, RW).unwrap();
        assert_eq!(
            table.write(pd, first, 0x1000, &[2], write),
            Err(MrError::UnknownKey)
        );
        assert_eq!(
            table.check(pd, first, 0x1000, 8, write),
            Err(MrError::UnknownKey)
        );
        assert_eq!(table.get(third).unwrap().bytes().unwrap()[0], 0);
        assert!(table.write(pd, second, 0x2000, &[3], write).is_ok());
        assert!(table.write(pd, third, 0x1000, &[4], write).is_ok());
        assert_eq!(
            table.check(pd, first, 0x1000, 8, write),
            Err(MrError::UnknownKey)
        );
        assert_eq!(table.get(first).map(Mr::iova), None);
        assert_eq!(table.get(third).map(Mr::iova), Some(0x1000));
        assert_eq!(table.get(third).unwrap().bytes().unwrap()[0], 4);
    }

    #[test]
    fn every_violation_has_its_error() {
        let (mut table, pd) = table();
        let other_pd = table.alloc_pd();
        let key = table.reg_mr(pd, 0x1000, 64, RW).unwrap();
        let write = AccessFlags::REMOTE_WRITE;
        assert_eq!(
            table.check(pd, key ^ 1, 0x1000, 8, write),
            Err(MrError::UnknownKey)
        );
        assert_eq!(
            table.check(other_pd, key, 0x1000, 8, write),
            Err(MrError::WrongPd)
        );
        assert_eq!(
            table.check(pd, key, 0x1000, 8, AccessFlags::REMOTE_READ),
            Err(MrError::AccessDenied)
        );
        assert_eq!(
            table.check(pd, key, 0xFFF, 8, write),
            Err(MrError::OutOfBounds)
        );
        assert_eq!(
            table.check(pd, key, 0x1039, 8, write),
            Err(MrError::OutOfBounds)
        );
        assert_eq!(
            table.check(pd, key, u64::MAX, 2, write),
            Err(MrError::OutOfBounds)
        );
        let add = AtomicOp::FetchAdd(1);
        assert_eq!(table.atomic(pd, key, 0x1004, add), Err(MrError::Misaligned));
        assert_eq!(
            table.atomic(pd, key, 0x1008, add),
            Err(MrError::AccessDenied)
        );
    }

    #[test]
    fn zero_length_access_needs_no_key() {
        let (table, pd) = table();
        assert!(table
            .check(pd, 0xdead, 0, 0, AccessFlags::REMOTE_READ)
            .is_ok());
    }

    #[test]
    fn remote_write_without_local_write_is_refused() {
        let (mut table, pd) = table();
        assert_eq!(
            table.reg_mr(pd, 0, 8, AccessFlags::REMOTE_WRITE),
            Err(MrError::InvalidAccess)
        );
        assert_eq!(
            table.reg_mr(pd, 0, 8, AccessFlags::REMOTE_ATOMIC),
            Err(MrError::InvalidAccess)
        );
        assert!(table.reg_mr(pd, 0, 8, AccessFlags::REMOTE_READ).is_ok());
        assert_eq!(
            table.reg_mr(pd, u64::MAX, 8, RW),
            Err(MrError::AddressOverflow)
        );
    }

    #[test]
    fn keys_are_random_and_never_reused() {
        let (mut table, pd) = table();
        let mut seen = HashSet::new();
        for _ in 0..2000 {
            let key = table.reg_mr(pd, 0, 1, RW).unwrap();
            assert!(seen.insert(key), "key {key:#x} issued twice");
            table.dereg_mr(key).unwrap();
            assert_eq!(
                table.check(pd, key, 0, 1, AccessFlags::empty()),
                Err(MrError::UnknownKey)
            );
        }
        // Not a counter: consecutive keys are far apart.
        let keys: Vec<u32> = (0..8)
            .map(|_| table.reg_mr(pd, 0, 1, RW).unwrap())
            .collect();
        assert!(
            keys.windows(2).all(|pair| pair[0].abs_diff(pair[1]) > 16),
            "{keys:x?}"
        );
        // Another seed gives other keys.
        let mut other = MrTable::new([8; 32]);
        let other_pd = other.alloc_pd();
        assert_ne!(other.reg_mr(other_pd, 0, 1, RW).unwrap(), keys[0]);
    }

    #[test]
    fn gather_and_scatter_cross_elements() {
        let (mut table, pd) = table();
        let a = table.reg_mr(pd, 0x1000, 8, RW).unwrap();
        let b = table.reg_mr(pd, 0x9000, 8, RW).unwrap();
        let sg = [
            Sge {
                addr: 0x1004,
                length: 4,
                lkey: a,
            },
            Sge {
                addr: 0x9000,
                length: 8,
                lkey: b,
            },
        ];
        table.scatter(pd, &sg, 2, &[1, 2, 3, 4, 5]).unwrap();
        assert_eq!(
            table.get(a).unwrap().to_vec(),
            Ok(vec![0, 0, 0, 0, 0, 0, 1, 2])
        );
        assert_eq!(
            table.get(b).unwrap().to_vec(),
            Ok(vec![3, 4, 5, 0, 0, 0, 0, 0])
        );
        let mut out = Vec::new();
        table.gather(pd, &sg, 1, 6, &mut out).unwrap();
        assert_eq!(out, [0, 1, 2, 3, 4, 5]);
        assert_eq!(
            table.gather(pd, &sg, 8, 6, &mut Vec::new()),
            Err(MrError::OutOfBounds)
        );
        let read_only = table.reg_mr(pd, 0, 8, AccessFlags::REMOTE_READ).unwrap();
        let sg = [Sge {
            addr: 0,
            length: 8,
            lkey: read_only,
        }];
        assert_eq!(table.scatter(pd, &sg, 0, &[1]), Err(MrError::AccessDenied));
    }

    #[test]
    fn a_region_beyond_max_mr_size_is_refused() {
        let (mut table, pd) = table();
        let too_large = LIMITS.max_mr_size as usize + 1;
        assert_eq!(table.reg_mr(pd, 0, too_large, RW), Err(MrError::TooLarge));
        assert_eq!(
            table.reg_mr(pd, 0, usize::MAX / 2, RW),
            Err(MrError::TooLarge)
        );
        // The failures left nothing behind: the PD is empty.
        assert_eq!(table.dealloc_pd(pd), Ok(()));
    }

    #[test]
    fn pd_with_regions_cannot_be_freed() {
        let (mut table, pd) = table();
        let key = table.reg_mr(pd, 0, 8, RW).unwrap();
        assert_eq!(table.dealloc_pd(pd), Err(MrError::PdBusy));
        table.dereg_mr(key).unwrap();
        assert_eq!(table.dealloc_pd(pd), Ok(()));
        assert_eq!(table.dealloc_pd(pd), Err(MrError::UnknownPd));
        assert_eq!(table.reg_mr(pd, 0, 8, RW), Err(MrError::UnknownPd));
    }
}

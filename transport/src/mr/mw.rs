//! Memory windows (`ibv_alloc_mw`): R_Keys that grant peers a range of a region, bound and
//! unbound by work requests, as rxe implements them (`rxe_mw.c`; IBTA 10.6.7).
//!
//! - **Type 1** windows are bound by `ibv_bind_mw`, which posts a bind; a bind of length 0
//!   unbinds one. Any QP of the window's PD reaches a bound type 1 window.
//! - **Type 2** windows (type 2B: bound to a QP) are bound by an `IBV_WR_BIND_MW` work
//!   request, only while free; only the QP that bound one reaches it, and `LOCAL_INV` or a
//!   peer's SEND with invalidate frees it.
//!
//! A window's R_Key is its index (24 bits, random, never reused, and never the upper 24 bits
//! of a region's key, so one lookup tells windows from regions) and a key byte each bind
//! sets. A region with windows bound cannot be deregistered (`EINVAL`, as rxe refuses it).
//!
//! Where this is stricter than rxe, the spec is followed: an access through a window must
//! lie inside the window (rxe checks only the region's bounds), a bind needs the region, the
//! window and the QP in one PD (rxe compares the QP's PD for type 2 only, the region's
//! never), and only a window bound to the invalidating QP's PD (and, type 2B, to that QP)
//! may be invalidated.

use rand_core::Rng;

use super::{Location, MrError, MrTable, PdId};
use crate::access::AccessFlags;
use crate::limits::LIMITS;
use crate::wr::{MwBind, MwId};

/// A memory window's type (`enum ibv_mw_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MwType {
    /// Bound by `ibv_bind_mw`; reached through any QP of its PD.
    One = 1,
    /// Bound by a work request; reached only through the QP that bound it.
    Two = 2,
}

/// What a window is bound to.
#[derive(Debug, Clone, Copy)]
struct Binding {
    /// The region's key.
    mr: u32,
    /// First byte, in the region's addresses.
    addr: u64,
    length: u64,
    access: AccessFlags,
    zero_based: bool,
    /// Type 2: the QP that bound it, the only one that reaches it.
    qpn: Option<u32>,
}

/// One window: unbound (a type 1 window, or a free type 2) or bound.
#[derive(Debug)]
pub(super) struct Mw {
    pd: PdId,
    kind: MwType,
    rkey: u32,
    binding: Option<Binding>,
}

/// The key byte of an R_Key, the part a bind sets.
const KEY_BYTE: u32 = 0xFF;

impl MrTable {
    /// Allocates a window of `kind` in `pd` (`ibv_alloc_mw`); its first R_Key has a random
    /// key byte. A type 1 window starts bound to nothing, a type 2 free.
    pub fn alloc_mw(&mut self, pd: PdId, kind: MwType) -> Result<MwId, MrError> {
        if !self.pds.contains_key(&pd) {
            return Err(MrError::UnknownPd);
        }
        if self.mws.len() >= LIMITS.max_mw as usize {
            return Err(MrError::TooManyWindows);
        }
        let index = self.fresh_window_index();
        let rkey = (index << 8) | (self.rng.next_u32() & KEY_BYTE);
        self.mws.insert(
            index,
            Mw {
                pd,
                kind,
                rkey,
                binding: None,
            },
        );
        if let Some(users) = self.pds.get_mut(&pd) {
            *users += 1;
        }
        Ok(MwId(index))
    }

    /// A window index never issued before and never the upper 24 bits of a region's key.
    fn fresh_window_index(&mut self) -> u32 {
        loop {
            let index = self.rng.next_u32() >> 8;
            let a_region_has_it =
                (0..=KEY_BYTE).any(|byte| self.issued.contains(&(index << 8 | byte)));
            if !a_region_has_it && self.window_indices.insert(index) {
                return index;
            }
        }
    }

    /// Whether a region key would be taken for a window's R_Key.
    pub(super) fn is_window_index(&self, key: u32) -> bool {
        self.window_indices.contains(&(key >> 8))
    }

    /// Frees a window (`ibv_dealloc_mw`); a bound one lets go of its region first. Its R_Keys
    /// are unknown from now on.
    pub fn dealloc_mw(&mut self, mw: MwId) -> Result<(), MrError> {
        let window = self.mws.remove(&mw.0).ok_or(MrError::UnknownWindow)?;
        if let Some(binding) = window.binding {
            self.release_region(binding.mr);
        }
        if let Some(users) = self.pds.get_mut(&window.pd) {
            *users -= 1;
        }
        Ok(())
    }

    /// The window's current R_Key.
    pub fn mw_rkey(&self, mw: MwId) -> Option<u32> {
        self.mws.get(&mw.0).map(|window| window.rkey)
    }

    /// Whether the window is bound to a region now.
    pub fn mw_is_bound(&self, mw: MwId) -> Option<bool> {
        self.mws.get(&mw.0).map(|window| window.binding.is_some())
    }

    fn release_region(&mut self, key: u32) {
        if let Some(mr) = self.mrs.get_mut(key) {
            mr.windows = mr.windows.saturating_sub(1);
        }
    }

    /// Carries out a bind posted on QP `qpn` of PD `qp_pd` (`rxe_bind_mw`): checks it whole,
    /// then gives the window its new R_Key, range and rights. Returns the new R_Key.
    pub fn bind_mw(&mut self, qp_pd: PdId, qpn: u32, bind: &MwBind) -> Result<u32, MrError> {
        let window = self.mws.get(&bind.mw.0).ok_or(MrError::UnknownWindow)?;
        if window.pd != qp_pd {
            return Err(MrError::Bind("the QP is in another PD than the window"));
        }
        match window.kind {
            MwType::One if bind.zero_based => {
                return Err(MrError::Bind("a zero-based type 1 window"))
            }
            MwType::Two if window.binding.is_some() => {
                return Err(MrError::Bind("a type 2 window that is not free"))
            }
            MwType::Two if bind.length == 0 => {
                return Err(MrError::Bind("a type 2 window of length 0"))
            }
            _ => {}
        }
        let binding = if bind.length == 0 {
            None
        } else {
            let mr = self.mrs.get(bind.mr_lkey).ok_or(MrError::UnknownKey)?;
            if mr.pd != window.pd {
                return Err(MrError::Bind("the region is in another PD than the window"));
            }
            if !mr.access.contains(AccessFlags::MW_BIND) {
                return Err(MrError::Bind("a region registered without MW_BIND"));
            }
            let mutation = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC;
            if bind.access.intersects(mutation) && !mr.access.contains(AccessFlags::LOCAL_WRITE) {
                return Err(MrError::Bind(
                    "a writable window on a region without LOCAL_WRITE",
                ));
            }
            let inside = bind.addr >= mr.iova
                && bind
                    .addr
                    .checked_add(bind.length)
                    .is_some_and(|end| end <= mr.iova + mr.len() as u64);
            if !inside {
                return Err(MrError::Bind("a range outside the region"));
            }
            Some(Binding {
                mr: bind.mr_lkey,
                addr: bind.addr,
                length: bind.length,
                access: bind.access,
                zero_based: bind.zero_based,
                qpn: (window.kind == MwType::Two).then_some(qpn),
            })
        };
        let old = window.binding;
        if let Some(old) = old {
            self.release_region(old.mr);
        }
        if let Some(new) = binding {
            if let Some(mr) = self.mrs.get_mut(new.mr) {
                mr.windows += 1;
            }
        }
        let Some(window) = self.mws.get_mut(&bind.mw.0) else {
            return Err(MrError::UnknownWindow);
        };
        window.rkey = (window.rkey & !KEY_BYTE) | (bind.rkey & KEY_BYTE);
        window.binding = binding;
        Ok(window.rkey)
    }

    /// Invalidates the type 2 window whose R_Key is `rkey`, bound in PD `qp_pd` (and, when
    /// `qpn` is given, bound by that QP): `LOCAL_INV` and a peer's SEND with invalidate. The
    /// window is free again. A region's key cannot be invalidated (no region of ours is a
    /// fast-registration one).
    pub fn invalidate(&mut self, qp_pd: PdId, qpn: Option<u32>, rkey: u32) -> Result<(), MrError> {
        let Some(window) = self.mws.get(&(rkey >> 8)) else {
            return Err(MrError::Invalidate("not a memory window's key"));
        };
        if window.rkey != rkey {
            return Err(MrError::Invalidate("a stale key of the window"));
        }
        if window.kind != MwType::Two {
            return Err(MrError::Invalidate("a type 1 window"));
        }
        if window.pd != qp_pd {
            return Err(MrError::Invalidate("a window of another PD"));
        }
        let Some(binding) = window.binding else {
            return Err(MrError::Invalidate("a window that is not bound"));
        };
        if qpn.is_some() && binding.qpn != qpn {
            return Err(MrError::Invalidate("a window bound by another QP"));
        }
        self.release_region(binding.mr);
        if let Some(window) = self.mws.get_mut(&(rkey >> 8)) {
            window.binding = None;
        }
        Ok(())
    }

    /// Unbinds every window bound to the region `key`, so it can go (a region dropped without
    /// `ibv_dereg_mr`'s check, or a PD's teardown).
    pub(super) fn unbind_all(&mut self, key: u32) {
        for window in self.mws.values_mut() {
            if window.binding.is_some_and(|binding| binding.mr == key) {
                window.binding = None;
            }
        }
        if let Some(mr) = self.mrs.get_mut(key) {
            mr.windows = 0;
        }
    }

    /// Where an access of `len` (> 0) bytes at `address` through window R_Key `rkey` lands,
    /// for a responder QP `qpn` in `pd` needing `needed` (`rxe_lookup_mw`, plus the window's
    /// bounds); `None` when `rkey` is no window's.
    pub(super) fn locate_in_window(
        &self,
        pd: PdId,
        qpn: u32,
        rkey: u32,
        address: u64,
        len: u64,
        needed: AccessFlags,
    ) -> Option<Result<Location, MrError>> {
        let window = self.mws.get(&(rkey >> 8))?;
        Some(self.window_location(window, pd, qpn, rkey, address, len, needed))
    }

    #[allow(clippy::too_many_arguments)]
    fn window_location(
        &self,
        window: &Mw,
        pd: PdId,
        qpn: u32,
        rkey: u32,
        address: u64,
        len: u64,
        needed: AccessFlags,
    ) -> Result<Location, MrError> {
        if window.rkey != rkey {
            return Err(MrError::UnknownKey);
        }
        if window.pd != pd {
            return Err(MrError::WrongPd);
        }
        let binding = window.binding.ok_or(MrError::UnknownKey)?;
        if binding.qpn.is_some_and(|bound| bound != qpn) {
            return Err(MrError::AccessDenied);
        }
        if !binding.access.contains(needed) {
            return Err(MrError::AccessDenied);
        }
        let start = if binding.zero_based { 0 } else { binding.addr };
        let offset = address.checked_sub(start).ok_or(MrError::OutOfBounds)?;
        let end = offset.checked_add(len).ok_or(MrError::OutOfBounds)?;
        if end > binding.length {
            return Err(MrError::OutOfBounds);
        }
        let mr = self.mrs.get(binding.mr).ok_or(MrError::UnknownKey)?;
        let in_region = binding.addr - mr.iova + offset;
        Ok(Location {
            key: binding.mr,
            offset: in_region as usize,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Window and region keys never share their upper 24 bits, however many of each are
    /// issued (random 24-bit prefixes of a few thousand keys would collide without the
    /// rule), so the key alone says which table answers.
    #[test]
    fn window_and_region_keys_never_share_an_index() {
        let mut table = MrTable::new([3; 32]);
        let pd = table.alloc_pd();
        let mut windows = std::collections::HashSet::new();
        let mut regions = std::collections::HashSet::new();
        for _ in 0..3000 {
            let key = table.reg_mr(pd, 0, 1, AccessFlags::MW_BIND).unwrap();
            regions.insert(key >> 8);
            let mw = table.alloc_mw(pd, MwType::One).unwrap();
            assert!(windows.insert(mw.index()), "an index issued twice");
            assert_eq!(table.mw_rkey(mw).map(|rkey| rkey >> 8), Some(mw.index()));
            table.dereg_mr(key).unwrap();
            table.dealloc_mw(mw).unwrap();
        }
        assert!(windows.is_disjoint(&regions));
    }
}

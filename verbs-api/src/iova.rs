//! The addresses regions registered without one get: page-aligned ranges, each followed
//! by an unused guard page so an off-by-one address never lands in the next region, handed
//! out in order and never twice. Placing a region takes nothing until the registration
//! succeeded ([`IovaSpace::advance`]); the space ends, rather than wraps, at 2^64.

const PAGE: u64 = 4096;

/// Where the first region goes: clear of the low addresses programs use as offsets.
const FIRST: u64 = 0x1_0000_0000;

/// The unallocated rest of a context's address space.
#[derive(Debug)]
pub(crate) struct IovaSpace {
    next: u64,
}

/// Where a region goes, and where the space continues once it is registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Placement {
    pub(crate) iova: u64,
    next: u64,
}

impl Default for IovaSpace {
    fn default() -> Self {
        IovaSpace { next: FIRST }
    }
}

impl IovaSpace {
    /// Where a region of `len` bytes would go; `None` when it and its guard page do not fit
    /// below 2^64.
    pub(crate) fn place(&self, len: usize) -> Option<Placement> {
        let pages = u64::try_from(len).ok()?.div_ceil(PAGE);
        let span = pages.checked_mul(PAGE)?.checked_add(PAGE)?;
        let next = self.next.checked_add(span)?;
        Some(Placement {
            iova: self.next,
            next,
        })
    }

    /// Takes the range of `placement` (made by [`place`](Self::place) on this space, and
    /// nothing placed since), once its region is registered.
    pub(crate) fn advance(&mut self, placement: Placement) {
        self.next = placement.next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_get_page_aligned_ranges_apart_from_each_other() {
        let mut space = IovaSpace::default();
        let first = space.place(1).unwrap();
        space.advance(first);
        let second = space.place(4096).unwrap();
        space.advance(second);
        let third = space.place(0).unwrap();
        assert_eq!(first.iova, FIRST);
        // One page for the byte, one guard page.
        assert_eq!(second.iova, FIRST + 2 * PAGE);
        assert_eq!(third.iova, FIRST + 4 * PAGE);
    }

    #[test]
    fn a_placement_not_taken_is_handed_out_again() {
        let mut space = IovaSpace::default();
        let unused = space.place(1 << 20).unwrap();
        let next = space.place(8).unwrap();
        assert_eq!(next.iova, unused.iova);
        space.advance(next);
        assert_eq!(space.place(8).unwrap().iova, next.iova + 2 * PAGE);
    }

    #[test]
    fn the_space_ends_at_two_to_the_64_without_wrapping() {
        let mut space = IovaSpace {
            next: u64::MAX - 2 * PAGE,
        };
        // One page and its guard fit exactly, up to u64::MAX.
        let last = space.place(PAGE as usize).unwrap();
        assert_eq!(last.iova, u64::MAX - 2 * PAGE);
        // One byte more does not.
        assert_eq!(space.place(PAGE as usize + 1), None);
        space.advance(last);
        assert_eq!(space.next, u64::MAX);
        // Nothing fits now, not even an empty region, and nothing wraps to a low address.
        assert_eq!(space.place(0), None);
        assert_eq!(space.place(usize::MAX), None);
        assert_eq!(IovaSpace::default().place(usize::MAX), None);
        assert_eq!(space.next, u64::MAX);
    }
}

//! A queue whose slots are reused, for the work queues and completion queues.

use std::ops::{Index, IndexMut};

/// A FIFO that keeps its slots: [`push_slot`](Ring::push_slot) hands out a slot at the back
/// to be overwritten in place (so a work request is cloned field by field into it, reusing
/// whatever the slot's old value had allocated), and [`pop_front`](Ring::pop_front) leaves
/// the value behind for a later push to overwrite. A send WQE is about 150 bytes: moving one
/// into a `VecDeque` copied it through the stack on every post, and moving it out on every
/// completion.
#[derive(Debug)]
pub(crate) struct Ring<T> {
    slots: Vec<T>,
    /// Slot of the front value.
    head: usize,
    len: usize,
}

impl<T> Default for Ring<T> {
    fn default() -> Self {
        Ring {
            slots: Vec::new(),
            head: 0,
            len: 0,
        }
    }
}

impl<T> Ring<T> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The slot of the value `index` places from the front (`index` ≤ the slot count).
    #[inline]
    fn slot(&self, index: usize) -> usize {
        let at = self.head + index;
        if at >= self.slots.len() {
            at - self.slots.len()
        } else {
            at
        }
    }

    pub fn get(&self, index: usize) -> Option<&T> {
        (index < self.len).then(|| &self.slots[self.slot(index)])
    }

    pub fn get_mut(&mut self, index: usize) -> Option<&mut T> {
        let slot = self.slot(index);
        (index < self.len).then(|| &mut self.slots[slot])
    }

    pub fn front(&self) -> Option<&T> {
        self.get(0)
    }

    /// Removes the front value (it stays in its slot until a push overwrites it).
    pub fn pop_front(&mut self) {
        if self.len > 0 {
            self.head = self.slot(1);
            self.len -= 1;
        }
    }

    /// The values, front first.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        (0..self.len).map(|index| &self.slots[self.slot(index)])
    }

    /// The values, front first, as the slots hold them: a part to the end of the slots and
    /// a part from their start.
    pub fn as_slices(&self) -> (&[T], &[T]) {
        let end = self.head + self.len;
        if end <= self.slots.len() {
            (&self.slots[self.head..end], &[])
        } else {
            let wrapped = end - self.slots.len();
            (&self.slots[self.head..], &self.slots[..wrapped])
        }
    }

    /// Puts `value` at the back, moved there; new slots, when the ring must grow, hold
    /// `blank` until used.
    #[inline]
    pub fn push_with(&mut self, value: T, blank: impl FnMut() -> T) {
        if self.len == self.slots.len() {
            self.grow(blank);
        }
        let slot = self.slot(self.len);
        self.slots[slot] = value;
        self.len += 1;
    }

    /// Doubles the slots, front first (new ones hold `blank`), so growing costs O(1) per
    /// push over time and a ring only ever holds twice what it once held.
    #[cold]
    fn grow(&mut self, blank: impl FnMut() -> T) {
        let size = (self.slots.len() * 2).max(8);
        let mut slots = Vec::with_capacity(size);
        slots.extend(self.slots.drain(self.head..));
        slots.append(&mut self.slots);
        slots.resize_with(size, blank);
        self.slots = slots;
        self.head = 0;
    }

    /// Removes the `count` front values (at most all of them).
    pub fn pop_front_n(&mut self, count: usize) {
        let count = count.min(self.len);
        if count > 0 {
            self.head = self.slot(count);
            self.len -= count;
        }
    }
}

impl<T: Default> Ring<T> {
    /// A new value at the back: a slot holding whatever it held last (or a default), for
    /// the caller to overwrite completely.
    #[inline]
    pub fn push_slot(&mut self) -> &mut T {
        if self.len == self.slots.len() {
            self.grow(T::default);
        }
        let slot = self.slot(self.len);
        self.len += 1;
        &mut self.slots[slot]
    }
}

impl<T> Index<usize> for Ring<T> {
    type Output = T;

    fn index(&self, index: usize) -> &T {
        self.get(index).expect("ring index out of range")
    }
}

impl<T> IndexMut<usize> for Ring<T> {
    fn index_mut(&mut self, index: usize) -> &mut T {
        self.get_mut(index).expect("ring index out of range")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    /// Any mix of pushes and pops keeps the same values, in the same order, as a VecDeque,
    /// across growth while the front is in the middle of the slots.
    #[test]
    fn behaves_as_a_fifo() {
        let mut ring: Ring<u64> = Ring::default();
        let mut model = VecDeque::new();
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        for value in 0..5_000u64 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            if state.is_multiple_of(3) {
                ring.pop_front();
                model.pop_front();
            } else {
                *ring.push_slot() = value;
                model.push_back(value);
            }
            assert_eq!(ring.len(), model.len());
            assert_eq!(ring.front(), model.front());
            assert!(ring.iter().eq(model.iter()));
        }
        assert!(ring.get(ring.len()).is_none());
        let (front, back) = ring.as_slices();
        assert!(front.iter().chain(back).eq(model.iter()));
        if let Some(last) = ring.len().checked_sub(1) {
            ring[last] += 1;
            assert_eq!(ring[last], model[last] + 1);
        }
    }

    #[test]
    fn pushed_values_pop_in_order_across_the_wrap() {
        let mut ring = Ring::default();
        for value in 1..=8u32 {
            ring.push_with(value, || 0);
        }
        ring.pop_front_n(6);
        for value in 9..=12 {
            ring.push_with(value, || 0);
        }
        let (front, back) = ring.as_slices();
        assert_eq!((front, back), (&[7, 8][..], &[9, 10, 11, 12][..]));
        ring.pop_front_n(10);
        assert!(ring.is_empty());
    }
}

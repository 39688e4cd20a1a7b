//! A bounded single-producer/single-consumer ring: what a QP's send and receive queues and
//! a CQ's queue are between the verbs objects and the engine, as rdma-core's rxe provider
//! shares its queues with the kernel. The producer writes at its index and publishes it;
//! the consumer reads at its own and publishes that; neither takes a lock or waits for the
//! other. Each side is a value ([`Producer`], [`Consumer`]) that `&mut` makes the only
//! writer of its index: whoever shares one side among threads puts it behind a lock of its
//! own (posters on one QP, pollers of one CQ), which the other side never takes.
#![allow(unsafe_code)]

use std::cell::UnsafeCell;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// The slots and both indices. Indices count up without bound (wrapping) and are masked
/// into the slots, a power of two of them.
struct Shared<T> {
    slots: Box<[UnsafeCell<MaybeUninit<T>>]>,
    /// The next slot the producer writes: slots `tail..head` hold values.
    head: AtomicUsize,
    /// The next slot the consumer reads.
    tail: AtomicUsize,
}

// SAFETY: a slot is reached by one side at a time (see `Producer::push`, `Consumer::pop`),
// and values move between threads only whole, so `T: Send` suffices.
unsafe impl<T: Send> Sync for Shared<T> {}
// SAFETY: as above; the ring owns its values.
unsafe impl<T: Send> Send for Shared<T> {}

impl<T> Shared<T> {
    fn mask(&self) -> usize {
        self.slots.len() - 1
    }
}

impl<T> Drop for Shared<T> {
    fn drop(&mut self) {
        let (head, mut tail) = (*self.head.get_mut(), *self.tail.get_mut());
        while tail != head {
            let slot = &mut self.slots[tail & (self.slots.len() - 1)];
            // SAFETY: slots `tail..head` hold values written by the producer and not read;
            // both sides are gone (this is the last reference), so nothing else reaches them.
            unsafe { slot.get_mut().assume_init_drop() };
            tail = tail.wrapping_add(1);
        }
    }
}

/// The writing side.
pub(crate) struct Producer<T> {
    ring: Arc<Shared<T>>,
    /// Our own index (the ring's `head`), kept here to skip a load.
    head: usize,
    /// The consumer's index as last seen: the ring is full only if it still is.
    tail: usize,
}

/// The reading side.
pub(crate) struct Consumer<T> {
    ring: Arc<Shared<T>>,
    tail: usize,
    /// The producer's index as last seen.
    head: usize,
}

/// A ring of at least `capacity` slots (a power of two), as its two sides.
pub(crate) fn ring<T>(capacity: usize) -> (Producer<T>, Consumer<T>) {
    let size = capacity.max(1).next_power_of_two();
    let ring = Arc::new(Shared {
        slots: (0..size)
            .map(|_| UnsafeCell::new(MaybeUninit::uninit()))
            .collect(),
        head: AtomicUsize::new(0),
        tail: AtomicUsize::new(0),
    });
    let producer = Producer {
        ring: Arc::clone(&ring),
        head: 0,
        tail: 0,
    };
    (
        producer,
        Consumer {
            ring,
            tail: 0,
            head: 0,
        },
    )
}

impl<T> Producer<T> {
    /// Writes `value` at the head and publishes it; gives it back when the ring is full.
    #[inline]
    pub(crate) fn push(&mut self, value: T) -> Result<(), T> {
        if self.head.wrapping_sub(self.tail) == self.ring.slots.len() {
            self.tail = self.ring.tail.load(Ordering::Acquire);
            if self.head.wrapping_sub(self.tail) == self.ring.slots.len() {
                return Err(value);
            }
        }
        let slot = &self.ring.slots[self.head & self.ring.mask()];
        // SAFETY: the slot is outside `tail..head` (the ring is not full as of the tail just
        // read, and the consumer only moves the tail forward), so the consumer does not read
        // it until the head published below covers it; `&mut self` makes this the only
        // producer. Any value it held was read out (moved) by the consumer.
        unsafe { (*slot.get()).write(value) };
        self.head = self.head.wrapping_add(1);
        self.ring.head.store(self.head, Ordering::Release);
        Ok(())
    }
}

impl<T> Consumer<T> {
    /// Whether a value waits at the tail: the producer's index is read only once those
    /// seen before are all taken.
    #[inline]
    fn any_published(&mut self) -> bool {
        if self.tail == self.head {
            self.head = self.ring.head.load(Ordering::Acquire);
        }
        self.tail != self.head
    }

    /// Reads the value at the tail, if the producer has published one.
    #[inline]
    pub(crate) fn pop(&mut self) -> Option<T> {
        if !self.any_published() {
            return None;
        }
        let slot = &self.ring.slots[self.tail & self.ring.mask()];
        // SAFETY: the slot is inside `tail..head` as published by the producer (the Acquire
        // load in `any_published`, now or earlier: the head only moves forward), so it holds a value
        // the producer no longer touches until the tail published below passes it; `&mut
        // self` makes this the only consumer. The value is moved out, the slot left as
        // uninitialised again.
        let value = unsafe { (*slot.get()).assume_init_read() };
        self.tail = self.tail.wrapping_add(1);
        self.ring.tail.store(self.tail, Ordering::Release);
        Some(value)
    }

    /// Hands the value at the tail, if the producer has published one, to `read` in its
    /// slot and drops it there: a large value (a send request) is not moved out first.
    #[inline]
    pub(crate) fn pop_with<R>(&mut self, read: impl FnOnce(&T) -> R) -> Option<R> {
        if !self.any_published() {
            return None;
        }
        // Drops the value in its slot and moves the tail past it once it is read, even if
        // `read` unwinds: the value is dropped exactly once either way.
        struct Release<'a, T>(&'a mut Consumer<T>);
        impl<T> Release<'_, T> {
            fn slot(&self) -> &UnsafeCell<MaybeUninit<T>> {
                &self.0.ring.slots[self.0.tail & self.0.ring.mask()]
            }
        }
        impl<T> Drop for Release<'_, T> {
            fn drop(&mut self) {
                // SAFETY: as in `pop`: the slot holds an initialised value the producer does
                // not touch until the tail published below passes it; it is dropped here,
                // once, and the slot left uninitialised.
                unsafe { (*self.slot().get()).assume_init_drop() };
                let consumer = &mut *self.0;
                consumer.tail = consumer.tail.wrapping_add(1);
                consumer.ring.tail.store(consumer.tail, Ordering::Release);
            }
        }
        let release = Release(self);
        // SAFETY: as in `pop`; the value is only borrowed here, and dropped by `release`.
        let value = unsafe { (*release.slot().get()).assume_init_ref() };
        Some(read(value))
    }

    /// Values published and not yet read.
    pub(crate) fn len(&self) -> usize {
        self.ring
            .head
            .load(Ordering::Acquire)
            .wrapping_sub(self.tail)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_come_out_in_order_and_a_full_ring_refuses() {
        let (mut producer, mut consumer) = ring::<String>(3);
        for n in 0..4 {
            producer.push(n.to_string()).unwrap();
        }
        assert_eq!(producer.push("5".into()), Err("5".into()), "4 slots");
        assert_eq!(consumer.pop().as_deref(), Some("0"));
        producer.push("4".into()).unwrap();
        let rest: Vec<String> = std::iter::from_fn(|| consumer.pop()).collect();
        assert_eq!(rest, ["1", "2", "3", "4"]);
        assert!(consumer.pop().is_none());
    }

    #[test]
    fn values_left_in_the_ring_are_dropped_with_it() {
        let value = Arc::new(());
        let (mut producer, consumer) = ring(4);
        producer.push(Arc::clone(&value)).unwrap();
        producer.push(Arc::clone(&value)).unwrap();
        drop((producer, consumer));
        assert_eq!(Arc::strong_count(&value), 1);
    }

    #[test]
    fn a_value_read_in_its_slot_is_dropped_once_even_if_the_reader_panics() {
        let value = Arc::new(());
        let (mut producer, mut consumer) = ring(4);
        for _ in 0..3 {
            producer.push(Arc::clone(&value)).unwrap();
        }
        assert_eq!(consumer.pop_with(Arc::strong_count), Some(4));
        assert_eq!(Arc::strong_count(&value), 3, "dropped after the read");
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            consumer.pop_with(|_| panic!("the reader fails"))
        }));
        assert!(panicked.is_err());
        assert_eq!(
            Arc::strong_count(&value),
            2,
            "dropped as the reader unwound"
        );
        // The tail moved past both: their slots take values again.
        for _ in 0..3 {
            producer.push(Arc::clone(&value)).unwrap();
        }
        assert_eq!(consumer.len(), 4);
        while consumer.pop_with(|_| ()).is_some() {}
        assert_eq!(Arc::strong_count(&value), 1);
    }

    #[test]
    fn a_million_values_cross_between_threads_in_order() {
        let (mut producer, mut consumer) = ring::<u64>(64);
        const N: u64 = 1_000_000;
        let writer = std::thread::spawn(move || {
            let mut next = 0;
            while next < N {
                if producer.push(next).is_ok() {
                    next += 1;
                } else {
                    std::thread::yield_now();
                }
            }
        });
        let mut expected = 0;
        while expected < N {
            match consumer.pop() {
                Some(value) => {
                    assert_eq!(value, expected);
                    expected += 1;
                }
                None => std::thread::yield_now(),
            }
        }
        writer.join().unwrap();
    }
}

//! Single-producer, single-consumer rings of whole frames in memory two processes share: the
//! switch and one of its clients, one ring each way.
//!
//! A ring is a header (the producer's index, the consumer's index, the consumer's wish to be
//! woken, each on its own cache line) and a power-of-two data area of records. A record is
//! 8 bytes (the frame's length, a kind) then the frame, padded to 64 bytes; a record never
//! wraps (a pad record fills the end instead), so a frame always lies in one piece and the
//! consumer can parse it where it lies. Indices count bytes and only grow.
//!
//! Neither side trusts the other: every index and record header read from the shared memory
//! is checked (an index that goes backwards or past the other, a length beyond the record or
//! [`MAX_FRAME`]) and a violation is [`Broken`]; the switch then drops that client. The bytes
//! of a frame can still change under a reader if the writer misbehaves, so the switch copies
//! a client's frame out ([`Consumer::copy_current`]) before it looks at it.

use std::io;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use super::shm::SharedMemory;
use crate::backend::MAX_FRAME;

/// Bytes of a ring's header: three cache lines used, one spare.
pub const RING_HEADER: usize = 256;
/// Bytes in front of each frame.
const RECORD_HEADER: usize = 8;
/// Records start on cache lines.
const RECORD_ALIGN: usize = 64;
const KIND_FRAME: u32 = 1;
const KIND_PAD: u32 = 2;
/// Offsets in the header.
const PRODUCER: usize = 0;
const CONSUMER: usize = 64;
const ARMED: usize = 128;

/// The other side broke the ring's protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Broken(pub &'static str);

impl From<Broken> for io::Error {
    fn from(broken: Broken) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, broken.0)
    }
}

/// Bytes a ring of `capacity` data bytes takes in a mapping.
pub const fn ring_len(capacity: usize) -> usize {
    RING_HEADER + capacity
}

/// Bytes a record of a `len`-byte frame takes.
const fn record_len(len: usize) -> usize {
    (RECORD_HEADER + len).next_multiple_of(RECORD_ALIGN)
}

/// Where one ring lies.
struct RingMemory {
    /// Keeps the mapping alive while the ring points into it.
    _memory: Arc<SharedMemory>,
    header: *mut u8,
    data: *mut u8,
    capacity: usize,
}

// SAFETY: the pointers are into the mapping the `Arc` keeps; the ring's protocol, not the
// thread, decides who touches what, and each end is used through `&mut self` only.
#[allow(unsafe_code)]
unsafe impl Send for RingMemory {}

impl RingMemory {
    /// The ring at `offset` of `memory`, of `capacity` data bytes (a power of two, at least
    /// one maximal record).
    fn new(memory: Arc<SharedMemory>, offset: usize, capacity: usize) -> io::Result<RingMemory> {
        let fits = offset
            .checked_add(ring_len(capacity))
            .is_some_and(|end| end <= memory.len());
        if !capacity.is_power_of_two()
            || capacity < 2 * record_len(MAX_FRAME)
            || !offset.is_multiple_of(RECORD_ALIGN)
            || !fits
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "ring does not fit its mapping",
            ));
        }
        // SAFETY: `offset + ring_len(capacity)` lies inside the mapping (checked above).
        #[allow(unsafe_code)]
        let header = unsafe { memory.ptr().as_ptr().add(offset) };
        // SAFETY: as above; the data area follows the header inside the ring.
        #[allow(unsafe_code)]
        let data = unsafe { header.add(RING_HEADER) };
        Ok(RingMemory {
            _memory: memory,
            header,
            data,
            capacity,
        })
    }

    fn index(&self, at: usize) -> &AtomicU64 {
        // SAFETY: `at` is one of the header's 8-byte-aligned slots (the mapping is
        // page-aligned, `offset` a multiple of 64); both processes only ever access it
        // atomically; the mapping outlives `self`.
        #[allow(unsafe_code)]
        unsafe {
            AtomicU64::from_ptr(self.header.add(at).cast())
        }
    }

    fn armed(&self) -> &AtomicU32 {
        // SAFETY: as in `index`.
        #[allow(unsafe_code)]
        unsafe {
            AtomicU32::from_ptr(self.header.add(ARMED).cast())
        }
    }

    /// The record header at data offset `pos` (a multiple of 64, below `capacity`).
    fn read_record(&self, pos: usize) -> (u32, u32) {
        // SAFETY: `pos + 8 <= capacity` (records are 64-aligned, capacity a multiple of
        // 64); volatile as the other process may be writing it out of turn, in which case
        // the values are checked and refused, never trusted.
        #[allow(unsafe_code)]
        unsafe {
            let at = self.data.add(pos).cast::<u32>();
            (at.read_volatile(), at.add(1).read_volatile())
        }
    }

    fn write_record(&self, pos: usize, len: u32, kind: u32) {
        // SAFETY: as in `read_record`; the producer owns the bytes between the indices'
        // free region, which `pos` is in.
        #[allow(unsafe_code)]
        unsafe {
            let at = self.data.add(pos).cast::<u32>();
            at.write_volatile(len);
            at.add(1).write_volatile(kind);
        }
    }
}

/// The producing end of a ring.
pub struct Producer {
    ring: RingMemory,
    /// Our index (published by [`publish`](Self::publish)).
    head: u64,
    /// What we last published.
    published: u64,
    /// The consumer's index as last read.
    tail: u64,
    /// The record [`reserve`](Self::reserve) lent: its data offset and the most it may hold.
    reserved: Option<(usize, usize)>,
}

impl Producer {
    /// The producing end of the ring at `offset` of `memory`, which starts empty.
    pub fn new(memory: Arc<SharedMemory>, offset: usize, capacity: usize) -> io::Result<Producer> {
        let ring = RingMemory::new(memory, offset, capacity)?;
        let head = ring.index(PRODUCER).load(Ordering::Acquire);
        let tail = ring.index(CONSUMER).load(Ordering::Acquire);
        if head != tail {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "ring not empty"));
        }
        Ok(Producer {
            ring,
            head,
            published: head,
            tail,
            reserved: None,
        })
    }

    fn free(&self) -> usize {
        self.ring.capacity - (self.head - self.tail) as usize
    }

    /// Reads the consumer's index, which must lie between the last one read and ours.
    fn refresh(&mut self) -> Result<(), Broken> {
        let tail = self.ring.index(CONSUMER).load(Ordering::Acquire);
        if tail.wrapping_sub(self.tail) > self.head.wrapping_sub(self.tail) {
            return Err(Broken(
                "the consumer's index moved backwards or past the producer's",
            ));
        }
        self.tail = tail;
        Ok(())
    }

    /// Lends room for a frame of up to `len` bytes (at most [`MAX_FRAME`]), in one piece;
    /// `None` when the ring has no room now. [`commit`](Self::commit) says how much was
    /// written.
    pub fn reserve(&mut self, len: usize) -> Result<Option<&mut [u8]>, Broken> {
        if len > MAX_FRAME {
            return Ok(None);
        }
        let record = record_len(len);
        let pos = (self.head as usize) & (self.ring.capacity - 1);
        let to_end = self.ring.capacity - pos;
        let pad = if record > to_end { to_end } else { 0 };
        if self.free() < pad + record {
            self.refresh()?;
            if self.free() < pad + record {
                return Ok(None);
            }
        }
        let pos = if pad > 0 {
            self.ring.write_record(pos, pad as u32, KIND_PAD);
            self.head += pad as u64;
            0
        } else {
            pos
        };
        self.reserved = Some((pos, len));
        // SAFETY: `pos + record <= capacity` and the bytes between our index and the
        // consumer's are ours until published; the borrow of `self` keeps this the only
        // reference of ours to them.
        #[allow(unsafe_code)]
        Ok(Some(unsafe {
            std::slice::from_raw_parts_mut(self.ring.data.add(pos + RECORD_HEADER), len)
        }))
    }

    /// Ends the record [`reserve`](Self::reserve) lent, holding its first `written` bytes
    /// (0: nothing); it reaches the consumer at the next [`publish`](Self::publish).
    pub fn commit(&mut self, written: usize) {
        let Some((pos, len)) = self.reserved.take() else {
            return;
        };
        if written == 0 {
            return;
        }
        let written = written.min(len);
        self.ring.write_record(pos, written as u32, KIND_FRAME);
        self.head += record_len(written) as u64;
    }

    /// Copies one frame in; `false` when the ring has no room now.
    pub fn push(&mut self, frame: &[u8]) -> Result<bool, Broken> {
        match self.reserve(frame.len())? {
            Some(room) => {
                room.copy_from_slice(frame);
                self.commit(frame.len());
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Makes the records committed so far visible to the consumer; `true` when the consumer
    /// had asked to be woken ([`Consumer::arm`]) and should be now.
    pub fn publish(&mut self) -> bool {
        if self.head == self.published {
            return false;
        }
        self.published = self.head;
        // SeqCst, against the consumer's `arm`: either it sees the new index, or we see it
        // armed.
        self.ring.index(PRODUCER).store(self.head, Ordering::SeqCst);
        self.ring.armed().swap(0, Ordering::SeqCst) == 1
    }
}

/// The consuming end of a ring.
pub struct Consumer {
    ring: RingMemory,
    /// Our index (published by [`release`](Self::release)).
    tail: u64,
    released: u64,
    /// The producer's index as last read.
    head: u64,
    /// The record [`peek`](Self::peek) found: its data offset, frame length, record length.
    current: Option<(usize, usize, usize)>,
}

impl Consumer {
    /// The consuming end of the ring at `offset` of `memory`, which starts empty.
    pub fn new(memory: Arc<SharedMemory>, offset: usize, capacity: usize) -> io::Result<Consumer> {
        let ring = RingMemory::new(memory, offset, capacity)?;
        let tail = ring.index(CONSUMER).load(Ordering::Acquire);
        Ok(Consumer {
            ring,
            tail,
            released: tail,
            head: tail,
            current: None,
        })
    }

    /// Reads the producer's index, which must not go backwards nor claim more than the ring.
    fn refresh(&mut self) -> Result<(), Broken> {
        let head = self.ring.index(PRODUCER).load(Ordering::Acquire);
        let ahead = head.wrapping_sub(self.tail);
        if head.wrapping_sub(self.head) > ahead || ahead > self.ring.capacity as u64 {
            return Err(Broken(
                "the producer's index moved backwards or past the ring",
            ));
        }
        self.head = head;
        Ok(())
    }

    /// Finds the next frame: its data offset and length, checked against the ring.
    fn locate(&mut self) -> Result<Option<(usize, usize)>, Broken> {
        if let Some((pos, len, _)) = self.current {
            return Ok(Some((pos, len)));
        }
        // At most one pad record precedes a frame.
        for _ in 0..2 {
            if self.tail == self.head {
                self.refresh()?;
                if self.tail == self.head {
                    return Ok(None);
                }
            }
            let pos = (self.tail as usize) & (self.ring.capacity - 1);
            let to_end = self.ring.capacity - pos;
            let waiting = (self.head - self.tail) as usize;
            let (len, kind) = self.ring.read_record(pos);
            let len = len as usize;
            match kind {
                KIND_PAD if len == to_end && len <= waiting => {
                    self.tail += len as u64;
                }
                KIND_FRAME => {
                    let record = record_len(len);
                    if len == 0 || len > MAX_FRAME || record > to_end || record > waiting {
                        return Err(Broken("a record longer than the ring holds"));
                    }
                    self.current = Some((pos + RECORD_HEADER, len, record));
                    return Ok(Some((pos + RECORD_HEADER, len)));
                }
                _ => return Err(Broken("a record of no known kind")),
            }
        }
        Err(Broken("two pad records in a row"))
    }

    /// The next frame where it lies, if one waits. Only for a ring whose producer is
    /// trusted to leave published records alone (the switch's, read by its client).
    pub fn peek(&mut self) -> Result<Option<&[u8]>, Broken> {
        let Some((pos, len)) = self.locate()? else {
            return Ok(None);
        };
        // SAFETY: `pos + len` lies inside the data area (checked in `locate`), in a record
        // the producer published and leaves alone until we release it.
        #[allow(unsafe_code)]
        Ok(Some(unsafe {
            std::slice::from_raw_parts(self.ring.data.add(pos), len)
        }))
    }

    /// The length of the next frame, if one waits, for [`copy_current`](Self::copy_current).
    pub fn next_len(&mut self) -> Result<Option<usize>, Broken> {
        Ok(self.locate()?.map(|(_, len)| len))
    }

    /// Copies the frame [`next_len`](Self::next_len) found into `buffer` (at least that
    /// long) without ever referencing the shared bytes, which a misbehaving producer may be
    /// writing: the copy is then garbage, which the caller's checks refuse, never more.
    pub fn copy_current(&self, buffer: &mut [u8]) -> usize {
        let Some((pos, len, _)) = self.current else {
            return 0;
        };
        let len = len.min(buffer.len());
        // SAFETY: `pos + len` lies inside the data area (checked in `locate`); `buffer` is
        // ours and does not overlap the mapping.
        #[allow(unsafe_code)]
        unsafe {
            std::ptr::copy_nonoverlapping(self.ring.data.add(pos), buffer.as_mut_ptr(), len);
        }
        len
    }

    /// Moves past the frame last found.
    pub fn advance(&mut self) {
        if let Some((_, _, record)) = self.current.take() {
            self.tail += record as u64;
        }
    }

    /// Gives the producer back the room of every frame moved past.
    pub fn release(&mut self) {
        if self.tail != self.released {
            self.released = self.tail;
            self.ring
                .index(CONSUMER)
                .store(self.tail, Ordering::Release);
        }
    }

    /// Asks the producer to wake us at its next publish; `true` when something is already
    /// waiting (then do not sleep).
    pub fn arm(&mut self) -> Result<bool, Broken> {
        self.ring.armed().store(1, Ordering::SeqCst);
        self.refresh()?;
        Ok(self.tail != self.head)
    }

    /// Whether the producer took up our last [`arm`](Self::arm) (and so signalled us).
    pub fn was_signalled(&self) -> bool {
        self.ring.armed().load(Ordering::Acquire) == 0
    }

    /// Whether our last [`arm`](Self::arm) still stands.
    pub fn is_armed(&self) -> bool {
        !self.was_signalled()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAPACITY: usize = 64 * 1024;

    fn pair() -> (Producer, Consumer, Arc<SharedMemory>) {
        let (memory, _fd) = SharedMemory::create("ring-test", ring_len(CAPACITY)).unwrap();
        let memory = Arc::new(memory);
        let producer = Producer::new(Arc::clone(&memory), 0, CAPACITY).unwrap();
        let consumer = Consumer::new(Arc::clone(&memory), 0, CAPACITY).unwrap();
        (producer, consumer, memory)
    }

    fn frame(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31) ^ seed)
            .collect()
    }

    #[test]
    fn frames_arrive_whole_and_in_order_across_many_wraps() {
        let (mut producer, mut consumer, _memory) = pair();
        let lens = [1, 64, 110, 1500, 4200, MAX_FRAME, 57];
        let mut sent = 0usize;
        let mut received = 0usize;
        for round in 0..2000 {
            // Fill until full, then drain a little: every wrap position is exercised.
            loop {
                let len = lens[sent % lens.len()];
                if !producer.push(&frame(len, sent as u8)).unwrap() {
                    break;
                }
                sent += 1;
            }
            producer.publish();
            for _ in 0..(round % 7 + 1) {
                let len = lens[received % lens.len()];
                let got = consumer.peek().unwrap().expect("published").to_vec();
                assert_eq!(got, frame(len, received as u8), "frame {received}");
                consumer.advance();
                received += 1;
            }
            consumer.release();
        }
        while let Some(got) = consumer.peek().unwrap() {
            let len = lens[received % lens.len()];
            assert_eq!(got, &frame(len, received as u8)[..]);
            consumer.advance();
            received += 1;
        }
        assert_eq!(sent, received);
        assert!(sent > 5_000, "{sent}");
    }

    #[test]
    fn nothing_is_seen_before_it_is_published_and_a_full_ring_refuses() {
        let (mut producer, mut consumer, _memory) = pair();
        assert!(producer.push(&frame(100, 1)).unwrap());
        assert_eq!(consumer.peek().unwrap(), None, "not published yet");
        assert!(!producer.publish(), "nobody asked to be woken");
        assert!(consumer.peek().unwrap().is_some());
        let mut pushed = 1;
        while producer.push(&frame(1000, 2)).unwrap() {
            pushed += 1;
        }
        assert!(pushed > 50 && pushed < 70, "{pushed}");
        assert_eq!(producer.reserve(MAX_FRAME + 1).unwrap(), None, "too long");
    }

    #[test]
    fn an_armed_consumer_is_woken_once() {
        let (mut producer, mut consumer, _memory) = pair();
        assert!(!consumer.arm().unwrap(), "empty");
        assert!(!consumer.was_signalled());
        producer.push(&frame(10, 0)).unwrap();
        assert!(producer.publish(), "the consumer asked");
        assert!(consumer.was_signalled());
        producer.push(&frame(10, 0)).unwrap();
        assert!(!producer.publish(), "once per arm");
        assert!(consumer.arm().unwrap(), "frames wait: do not sleep");
    }

    /// What a hostile peer can write into the shared header and records is refused.
    #[test]
    fn a_peer_that_breaks_the_protocol_is_caught() {
        let (mut producer, mut consumer, memory) = pair();
        let header = memory.ptr().as_ptr();
        let set = |at: usize, value: u64| {
            // SAFETY: a test writing the header as a hostile peer would.
            #[allow(unsafe_code)]
            unsafe {
                AtomicU64::from_ptr(header.add(at).cast()).store(value, Ordering::SeqCst)
            }
        };
        // A producer index beyond the ring.
        set(PRODUCER, CAPACITY as u64 + 64);
        assert!(consumer.peek().is_err());
        // A record longer than what was published.
        let (mut producer2, mut consumer2, memory2) = pair();
        producer2.push(&frame(100, 0)).unwrap();
        producer2.publish();
        // SAFETY: a test writing a record header as a hostile peer would.
        #[allow(unsafe_code)]
        unsafe {
            memory2
                .ptr()
                .as_ptr()
                .add(RING_HEADER)
                .cast::<u32>()
                .write(4000)
        };
        assert!(consumer2.peek().is_err());
        // A consumer index past the producer's.
        set(CONSUMER, 1 << 20);
        let pushed = (0..100)
            .map(|_| producer.push(&frame(4000, 0)))
            .find(Result::is_err);
        assert!(
            pushed.is_some(),
            "the producer reads the index once the ring seems full"
        );
    }

    #[test]
    fn frames_cross_between_threads() {
        let (mut producer, mut consumer, _memory) = pair();
        let count = 20_000usize;
        let writer = std::thread::spawn(move || {
            let mut sent = 0;
            while sent < count {
                if producer.push(&frame(60 + sent % 300, sent as u8)).unwrap() {
                    sent += 1;
                    if sent % 16 == 0 {
                        producer.publish();
                    }
                } else {
                    producer.publish();
                    std::thread::yield_now();
                }
            }
            producer.publish();
        });
        let mut received = 0;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while received < count && std::time::Instant::now() < deadline {
            match consumer.peek().unwrap() {
                Some(got) => {
                    assert_eq!(got, &frame(60 + received % 300, received as u8)[..]);
                    consumer.advance();
                    received += 1;
                }
                None => {
                    consumer.release();
                    std::thread::yield_now();
                }
            }
        }
        writer.join().unwrap();
        assert_eq!(received, count);
    }
}

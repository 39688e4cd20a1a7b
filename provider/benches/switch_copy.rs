//! What the device switch's one copy per frame costs against zero copy, per frame and one
//! way, through the shared-memory ring a switch and a client share
//! (`roce_provider::switch::ring`):
//!
//! * `copy/<size>`: what the switch does (`switch::server`): the producer copies the whole
//!   frame into a record of the ring (the switch, from its UMEM), the consumer parses it
//!   where it lies (the client's engine), reading every byte as the ICRC check does.
//! * `offsets/<size>`: what zero copy would do (every client maps the UMEM): a 16-byte
//!   descriptor of where the frame lies goes through the ring, the consumer reads the frame
//!   where it lies in memory both share, then gives the buffer back through a second ring (a
//!   zero-copy client must return each buffer for the fill ring).
//!
//! Sizes 64 B (a 64-byte message's frame is about 120), 1 KiB and 4 KiB. Each iteration
//! moves [`BATCH`] frames, published once, as the switch's turns do. Run with
//! `cargo bench -p roce-provider --bench switch_copy`.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use roce_provider::switch::ring::{ring_len, Consumer, Producer};
use roce_provider::switch::shm::SharedMemory;

const BATCH: usize = 256;
const CAPACITY: usize = 4 << 20;

/// A ring's two ends over a memfd of its own.
fn ring() -> (Producer, Consumer) {
    let (memory, _fd) = SharedMemory::create("bench", ring_len(CAPACITY)).unwrap();
    let memory = Arc::new(memory);
    let producer = Producer::new(Arc::clone(&memory), 0, CAPACITY).unwrap();
    let consumer = Consumer::new(memory, 0, CAPACITY).unwrap();
    (producer, consumer)
}

/// What a receiver does with a frame: reads every byte (the ICRC covers them all).
fn read_all(frame: &[u8]) -> u64 {
    frame.iter().map(|&byte| u64::from(byte)).sum()
}

fn frames(c: &mut Criterion) {
    for size in [120usize, 1024, 4096] {
        let mut group = c.benchmark_group(format!("{size}B"));
        group.throughput(Throughput::Elements(BATCH as u64));
        // Frames lying in a UMEM-like area (the switch's, or one every client maps).
        let umem: Vec<u8> = (0..size * BATCH).map(|i| i as u8).collect();

        let (mut producer, mut consumer) = ring();
        group.bench_function("copy", |b| {
            b.iter(|| {
                for frame in umem.chunks_exact(size) {
                    assert!(producer.push(frame).unwrap());
                }
                producer.publish();
                let mut sum = 0;
                while let Some(frame) = consumer.peek().unwrap() {
                    sum += read_all(frame);
                    consumer.advance();
                }
                consumer.release();
                black_box(sum)
            })
        });

        let (mut to_client, mut from_switch) = ring();
        let (mut returns, mut returned) = ring();
        group.bench_function("offsets", |b| {
            b.iter(|| {
                for index in 0..BATCH {
                    let descriptor = [(index * size) as u64, size as u64];
                    let bytes: [u8; 16] = descriptor_bytes(descriptor);
                    assert!(to_client.push(&bytes).unwrap());
                }
                to_client.publish();
                let mut sum = 0;
                while let Some(descriptor) = from_switch.peek().unwrap() {
                    let at = u64::from_ne_bytes(descriptor[..8].try_into().unwrap()) as usize;
                    let len = u64::from_ne_bytes(descriptor[8..].try_into().unwrap()) as usize;
                    sum += read_all(&umem[at..at + len]);
                    // The buffer goes back to the switch for its fill ring.
                    assert!(returns.push(&descriptor[..8]).unwrap());
                    from_switch.advance();
                }
                from_switch.release();
                returns.publish();
                while returned.peek().unwrap().is_some() {
                    returned.advance();
                }
                returned.release();
                black_box(sum)
            })
        });
        group.finish();
    }
}

/// A descriptor's bytes.
fn descriptor_bytes([at, len]: [u64; 2]) -> [u8; 16] {
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&at.to_ne_bytes());
    bytes[8..].copy_from_slice(&len.to_ne_bytes());
    bytes
}

criterion_group!(benches, frames);
criterion_main!(benches);

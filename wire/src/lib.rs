//! RoCEv2 packet formats: the Ethernet/IP/UDP framing, every InfiniBand transport header a
//! RoCEv2 RC, UC or UD queue pair sends, the invariant CRC (ICRC), and the tag-matching
//! headers a SEND's payload starts with ([`tmh`], [`rvh`]).
//!
//! Shaped like smoltcp's `wire`: each header has a [`Packet`](bth::Packet)-style view whose
//! `new_checked` guarantees that no accessor panics afterwards, a private `field` module of
//! byte ranges, and a plain `Repr` with `parse`, `emit` and `buffer_len`. Untrusted bytes only
//! enter through `new_checked`; the transport only ever sees `Repr`s.
//! The accessors, and the `Repr` with its `parse` and `emit`, are declared from each
//! header's field table by the crate's macros (`field_accessors!`, `header_repr!`), so a
//! header's file states only its layout, the checks and conversions that are its own, and
//! how it prints.
//!
//! Layers below the BTH (Ethernet II with an optional 802.1Q tag, IPv4, IPv6, UDP) are parsed
//! and written with [etherparse]: it is no_std, allocation-free and well tested, and its header
//! slices cost a few nanoseconds per frame (see the `wire` benchmark), so there was no reason
//! to write them again.
//!
//! # CRC-32 implementation
//! The ICRC uses [crc32fast], chosen by measurement (`cargo bench -p roce-wire --bench wire`:
//! CRC-32 over buffers of each size, every implementation in the same run):
//!
#![doc = include_str!("../CRC_BENCH.md")]
//!
//! With the default `std` feature crc32fast picks its fastest kernel at run time (PCLMULQDQ,
//! or AVX-512 VPCLMULQDQ for long buffers where the CPU has it); without it (true `no_std`) it
//! uses carry-less multiplication only when the target enables it at compile time, and the
//! table-driven code otherwise.
#![no_std]
#![deny(unsafe_code)]
#![warn(missing_docs)]

#[macro_use]
mod macros;

pub mod aeth;
pub mod atomic_ack_eth;
pub mod atomic_eth;
pub mod bth;
pub mod cm;
pub mod cnp;
pub mod deth;
pub mod ext;
pub mod feth;
pub mod frame;
pub mod icrc;
pub mod ieth;
pub mod immdt;
pub mod mad;
pub mod multicast;
pub mod opcode;
pub mod psn;
pub mod reth;
pub mod rvh;
pub mod tmh;
pub mod xrceth;

pub use ext::ExtRepr;
pub use frame::{Frame, FrameError, FrameRepr, LinkHeaders};
pub use opcode::{ExtHeader, Opcode, OpcodeInfo};
pub use psn::Psn;

/// A buffer was too short, or a field held a value the format does not allow.
///
/// Deliberately a unit type, as in smoltcp: callers drop or NAK a bad header, and the reason
/// is only interesting to a human reading a dump, which [`FrameError`] describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Error;

impl core::fmt::Display for Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("malformed header")
    }
}

impl core::error::Error for Error {}

/// The result type of every parse and emit in this crate.
pub type Result<T> = core::result::Result<T, Error>;

/// A byte range inside a header.
type Field = core::ops::Range<usize>;

fn read_u16(bytes: &[u8]) -> u16 {
    u16::from_be_bytes([bytes[0], bytes[1]])
}

fn read_u24(bytes: &[u8]) -> u32 {
    u32::from_be_bytes([0, bytes[0], bytes[1], bytes[2]])
}

fn write_u24(bytes: &mut [u8], value: u32) {
    bytes.copy_from_slice(&value.to_be_bytes()[1..]);
}

fn read_u32(bytes: &[u8]) -> u32 {
    u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
}

fn read_u64(bytes: &[u8]) -> u64 {
    let mut raw = [0; 8];
    raw.copy_from_slice(bytes);
    u64::from_be_bytes(raw)
}

/// Copies a field out at its full length `N` (the field's range is `N` bytes long).
fn read_array<const N: usize>(bytes: &[u8]) -> [u8; N] {
    let mut array = [0; N];
    array.copy_from_slice(bytes);
    array
}

/// `width` bits of `byte` starting `shift` bits from the least significant end.
const fn bits(byte: u8, shift: u32, width: u32) -> u8 {
    (byte >> shift) & ((1 << width) - 1)
}

/// Writes the low `width` bits of `value` into `byte` at `shift`, keeping the other bits.
fn set_bits(byte: &mut u8, shift: u32, width: u32, value: u8) {
    let mask = (((1u16 << width) - 1) as u8) << shift;
    *byte = (*byte & !mask) | ((value << shift) & mask);
}

/// Writes `value` into the only field of `byte`, zeroing the reserved bits around it.
fn set_lone_bits(byte: &mut u8, shift: u32, width: u32, value: u8) {
    *byte = 0;
    set_bits(byte, shift, width, value);
}

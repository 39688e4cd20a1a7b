//! The InfiniBand transport for RoCEv2, as a sans-IO state machine: no sockets, threads or
//! clock reads, and randomness only from a seed the caller gives.
//!
//! An [`Endpoint`] is one device: its memory regions ([`mr`]), completion queues ([`cq`]) and
//! queue pairs. It is driven, quinn-proto style, by `handle_packet(now, ..)`,
//! `handle_timeout(now)` and posted work requests, and gives back `poll_transmit` (packets,
//! before Ethernet/IP/UDP) and `poll_timeout` (its next deadline); completions land in CQs.
//!
//! Each QP ([`qp`]) is a small coordinator over three modules that share nothing but the
//! send- and receive-queue state: the requester (segmentation, PSNs, AckReq, fences, the
//! 128-PSN window), the completer (ACK, NAK, RNR NAK, READ responses, atomic results, implied
//! NAKs, retries and timeouts) and the responder (PSN checks, duplicates, execution, NAKs,
//! ACK coalescing). Its two timers live in one enum-indexed table. [`qp_state`] checks
//! `modify_qp` attributes exactly as `ibv_modify_qp` does.
//!
//! [`sim`] is a deterministic network for tests and `roce sim`: frames cross it as real bytes
//! (Ethernet, IPv4, UDP, ICRC) with seeded loss, reordering, duplication and corruption.
//!
//! Where this follows the spec rather than rxe: `retry_cnt` 7 is seven retries, not
//! infinity (rxe treats it as infinite; only `rnr_retry` 7 is infinite in the IBTA).
//! Not done yet: SEND with invalidate reports the R_Key in the completion but invalidates
//! nothing (there are no memory windows); SQD does not stop new work requests; path
//! migration and alternate paths are not supported.
//!
//! ## Speed
//!
//! `cargo bench -p roce-transport --bench transport` (criterion, one core, no I/O; request
//! packets through requester → responder → completer, with posting, ACKs and completions),
//! on the 2-core development VM: 64 B SEND 5.0 Mpps, 64 B WRITE 6.0 Mpps, 4 KiB WRITE
//! 3.4 Mpps (from 4.2 / 4.7 / 2.8 before the last round of work: fewer moves on the hot path,
//! one region lookup per gathered piece, no zeroing of payloads, completions copied out of a
//! CQ as slices). The target is 10 Mpps.
//! What the profile still shows: a quarter of the time in `memmove` of large values moved
//! by value (an `OutPacket` is 192 bytes, its `ExtRepr` alone 120; a `SendWr` 128, copied
//! into the send queue), a heap payload per packet, and a region lookup per packet on each
//! side. The way there is the smoltcp-phy shape: `poll_transmit` writing headers and
//! payload straight into a buffer the provider lends, `handle_packet` scattering from the
//! received frame, and an `ExtRepr` per opcode shape instead of nine options.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod cq;
pub mod endpoint;
pub mod mr;
pub mod qp;
pub mod qp_state;
pub mod sim;
mod timer;
pub mod wr;

pub use endpoint::{CqId, Endpoint, Transmit};
pub use mr::AccessFlags;

//! The InfiniBand transport for RoCEv2, as a sans-IO state machine: no sockets, threads or
//! clock reads, and randomness only from a seed the caller gives.
//!
//! An [`Endpoint`] is one device: its memory regions ([`mr`]), completion queues ([`cq`]) and
//! queue pairs. A region covers bytes it owns or the caller's own memory ([`CallerMemory`]);
//! the one small module that touches the caller's memory through raw pointers is the crate's
//! only `unsafe` code, with its invariants written at its top. It is driven, quinn-proto style, by `handle_packet(now, ..)`,
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
//! on the 2-core development VM, pinned to one core, several runs: 64 B WRITE 11.2–12.2
//! Mpps, 64 B SEND 9.7–10.4 Mpps (it also posts a receive and completes it for every
//! packet), 4 KiB WRITE 4.2–5.7 Mpps (17–23 GB/s of payload; this one is bimodal from run
//! to run, most likely the alignment of its two 4 KiB copies). The same batches through
//! [`sim`], which adds emitting with ICRC, parsing and checking every frame and the
//! simulator's event queue: 2.3 Mpps; one 1 MiB WRITE through it, 1.75 GiB/s.
//!
//! What got it there (from 5.0 / 6.0 / 3.7 Mpps for SEND / WRITE / 4 KiB, each step
//! measured back to back against the step before): `poll_transmit_into` refills the
//! caller's `Transmit` (no allocation or 200-byte move per packet); work requests are posted
//! by reference and cloned field by field into reused slots of a ring (send queue,
//! receive queue and CQs alike), as rdma-core's providers copy an `ibv_send_wr` into their
//! ring, so no work request or completion is moved through the stack; scatter/gather lists
//! hold one element inline ([`wr::SgList`]); a message's receive stays at the front of the
//! receive queue until the message ends; QPs are found by indexing a table by QP number and
//! walked as a `Vec`; the region a data access found last is found again without hashing,
//! and one lookup serves a WRITE packet or a scatter into one element; `Opcode::info` is a
//! table. Most of these avoid one thing: a large value built on the stack with narrow
//! stores and then copied with wide loads, which stalls on store forwarding.
//! Tried and dropped, as no faster: inlining the requester's and responder's packet
//! builders, a smaller send WQE (boxing the UD destination), moving a completed WQE out
//! instead of dropping it in place, batches of 128 instead of 256 requests (so the working
//! set is not what limits it). What the profile shows now: building each request packet
//! (the nine-option `ExtRepr`, the first touch of its WQE) and the responder's checks.
//! The measurements move by ±5 % between runs on this shared machine; compare runs made
//! back to back.
#![deny(unsafe_code)]
#![warn(missing_docs)]

#[allow(unsafe_code)]
mod caller_memory;
pub mod cq;
pub mod endpoint;
pub mod limits;
pub mod mr;
pub mod qp;
pub mod qp_state;
mod ring;
pub mod sim;
mod timer;
pub mod wr;

pub use endpoint::{CqId, Endpoint, Transmit};
pub use limits::{DeviceLimits, LIMITS};
pub use mr::{AccessFlags, CallerMemory};

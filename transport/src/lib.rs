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
//! on the 2-core development VM, pinned to one core, three runs: 64 B WRITE 10.4 Mpps,
//! 64 B SEND 8.4–8.6 Mpps (it also posts a receive and completes it for every packet),
//! 4 KiB WRITE 5.3–5.4 Mpps (22 GB/s of payload). The same batches through [`sim`], which
//! adds emitting with ICRC, parsing and checking every frame and the simulator's event
//! queue: 2.3 Mpps; one 1 MiB WRITE through it, 1.7 GiB/s.
//!
//! What got it there (from 5.0 / 6.0 / 3.7 Mpps, each step measured): `poll_transmit_into`
//! refills the caller's `Transmit` (no allocation or 200-byte move per packet); work
//! requests are posted by reference and copied once into the queue, as rdma-core's
//! providers copy an `ibv_send_wr` into their ring; scatter/gather lists hold one element
//! inline ([`wr::SgList`]); QPs are found by indexing a table by QP number and walked as a
//! `Vec`; one region lookup per WRITE packet and per scatter that fits one element;
//! `Opcode::info` is a table; completions are written straight into their CQ slot.
//! Tried and dropped, as no faster: inlining the requester's and responder's packet
//! builders, a smaller send WQE (boxing the UD destination), moving a completed WQE out
//! instead of dropping it in place.
//! What the profile still shows: about a third of the time in moving 120–144-byte values
//! (a send WQE, the nine-option `ExtRepr`) and in cache misses on the 256 WQEs a batch keeps
//! in flight, and a hash lookup per region access. The measurements move by ±5 % between
//! runs on this shared machine; compare runs made back to back.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod cq;
pub mod endpoint;
pub mod mr;
pub mod qp;
pub mod qp_state;
mod ring;
pub mod sim;
mod timer;
pub mod wr;

pub use endpoint::{CqId, Endpoint, Transmit};
pub use mr::AccessFlags;

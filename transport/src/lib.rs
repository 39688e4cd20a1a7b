//! The InfiniBand transport for RoCEv2, as a sans-IO state machine: no sockets, threads or
//! clock reads, and randomness only from a seed the caller gives.
//!
//! An [`Endpoint`] is one device: its memory regions ([`mr`]), completion queues ([`cq`]) and
//! queue pairs. A region covers bytes it owns or the caller's own memory ([`CallerMemory`]);
//! the one small module that touches the caller's memory through raw pointers is the crate's
//! `unsafe` code, with its invariants written at its top, beside the one that hashes a sent
//! payload for the ICRC through such a pointer with AVX-512 (`copy_icrc`: measured faster
//! than `crc32fast`, its docs say by how much). It is driven, quinn-proto style, by
//! `handle_packet(now, ..)`, `handle_timeout(now)` and posted work requests, and gives back
//! `poll_transmit` (packets, before Ethernet/IP/UDP) and `poll_timeout` (its next deadline);
//! completions land in CQs.
//!
//! Each QP ([`qp`]) is a small coordinator over single-purpose modules, split by who owns
//! what, as rxe splits them:
//!
//! - the send queue owns the posted send WQEs, the transmit cursor over them, the
//!   acknowledged PSN, and the completions a WQE reports;
//! - the requester turns the WQE under the cursor into the next packet (segmentation, PSNs,
//!   AckReq, fences, read/atomic slots, the 128-PSN window). A packet is rebuilt from its
//!   WQE every time it is sent, so nothing is kept per packet, and going back N is moving
//!   the cursor;
//! - the completer reads ACKs, NAKs, RNR NAKs, READ responses and atomic results (implied
//!   NAKs, retries, timeouts) and returns an outcome: complete N WQEs, then retry from a PSN
//!   or fail with a status. The QP applies it, so only one place moves the cursor;
//! - the responder checks PSNs, answers duplicates, executes SEND/WRITE/READ/atomic and
//!   ATOMIC WRITE (IBTA 1.5: 8 bytes stored at once, answered by an empty READ response, as
//!   rxe does), NAKs and coalesces ACKs. A READ, atomic or ATOMIC WRITE becomes one of at
//!   most `max_dest_rd_atomic`
//!   resources with a cursor: READ responses are built from memory as they are sent, and a
//!   duplicate only moves the cursor back, so what the responder queues is bounded by its
//!   resources, never by the bytes a peer asks for.
//!
//! A QP may take its receives from a shared receive queue ([`srq`]) instead of its own: it
//! takes the SRQ's next WQE when a message needs one and holds it until the message
//! completes, so the responder always reads the front of the QP's own queue. A tag-matching
//! SRQ ([`tm`]) also holds a list of tagged buffers, which the responder matches its RC QPs'
//! SENDs against, as mlx5's hardware does; a rendezvous request's data is read by the
//! receiving QP with a READ of its own, a WQE that reports nothing to the program.
//!
//! A QP that goes to ERR on its own says why: the failing completion carries the precise
//! status and the endpoint raises the matching async event.
//!
//! What a packet is (its operation, its place in the message, its headers) comes from one
//! table in `roce_wire::opcode`, read in both directions; no module re-derives it. A QP's
//! two timers live in one enum-indexed table. [`qp_state`] checks `modify_qp` attributes
//! exactly as `ibv_modify_qp` does.
//!
//! Work requests are copied into reused ring slots (rdma-core's providers copy an
//! `ibv_send_wr` the same way) and packets are written into a caller's reused buffer,
//! because at 10 Mpps moving a 150-byte WQE or allocating per packet is what costs.
//! Measurements and what was tried are in `docs/performance.md`.
//!
//! Congestion control ([`congestion`]) is mlx5's DCQCN: packets of connected QPs carry
//! ECT(0); a QP that receives CE marks owes its peer a CNP (at most one per
//! `np_min_time_between_cnps`); a QP that receives CNPs runs DCQCN's reaction point, whose
//! rate a per-QP pacer applies, together with any rate limit the user set. An unlimited QP
//! never looks at a pacer.
//!
//! [`sim`] is a deterministic network for tests and `roce sim`: frames cross it as real bytes
//! (Ethernet, IPv4, UDP, ICRC) with seeded loss, reordering, duplication and corruption.
//!
//! Where this follows the spec rather than rxe: `retry_cnt` 7 is seven retries, not
//! infinity (rxe treats it as infinite; only `rnr_retry` 7 is infinite in the IBTA).
//! Memory windows ([`mr::MwType`]) live in the region table beside the regions: binds and
//! local invalidations are work requests the requester runs when its cursor reaches them
//! (sending nothing, completing in order), and the responder reaches a region through a
//! window's R_Key under the window's rules, and frees a window a SEND with invalidate names.
//!
//! XRC ([`xrc`]): an XRC initiator QP sends like RC with an XRCETH naming the XRC SRQ each
//! request is for; an XRC target QP of an XRC domain answers like RC, taking each request's
//! receive, PD and CQ from the XRC SRQ of its domain the XRCETH names.
//!
//! Not done yet: SQD does not stop new work requests; path migration and alternate paths
//! are not supported.
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod access;
#[allow(unsafe_code)]
mod caller_memory;
pub mod cm;
pub mod congestion;
#[allow(unsafe_code)]
mod copy_icrc;
pub mod counters;
pub mod cq;
pub mod endpoint;
pub mod errno;
pub mod limits;
pub mod mcast;
pub mod mr;
pub mod qp;
pub mod qp_state;
mod ring;
pub mod sim;
pub mod srq;
mod timer;
pub mod tm;
pub mod wr;
pub mod xrc;

pub use counters::Counters;
pub use endpoint::{CqId, Endpoint, Transmit};
pub use limits::{DeviceLimits, LIMITS};
pub use mr::{AccessFlags, CallerMemory};
pub use srq::SrqId;

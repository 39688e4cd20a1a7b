//! The InfiniBand transport for RoCEv2, as a sans-IO state machine: no sockets, threads or
//! clock reads, and randomness only from a seed the caller gives.
//!
//! Written so far, each a module of small functions with its own tests:
//! - [`mr`]: protection domains and the memory-region table with unguessable, never-reused
//!   keys, access flags, PD and bounds checks;
//! - [`cq`]: completion queues of fixed depth whose overflow is an error, never a silent drop;
//! - [`qp_state`]: the QP state machine RESET → INIT → RTR → RTS (and SQD, SQE, ERR) with the
//!   attributes each transition requires and allows, as `ibv_modify_qp` checks them.
//!
//! Not written yet (issue #3): the requester, responder and completer, the timers, and the
//! deterministic lossy simulator that proves them.
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

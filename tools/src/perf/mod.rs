//! `roce perf TEST [flags] [host]`: perftest's bandwidth and latency tests (`ib_send_bw`,
//! `ib_write_bw`, `ib_read_bw`, `ib_atomic_bw`, `ib_send_lat`, `ib_write_lat`,
//! `ib_read_lat`), speaking perftest 4.5's TCP exchange (port 18515) so that either side can
//! be ours or perftest's, with its main flags and its report tables.
//!
//! The exchange (perftest `src/perftest_communication.c`): the client writes first in every
//! step; a 16-byte version (`6.06`), page size and cache-line size (4-byte big-endian each,
//! both sides keep the larger), the path MTU as an `ibv_mtu` digit (both keep the smaller),
//! then 108-byte `LID:OUT_READS:QPN:PSN:RKEY:VADDR:GID:SRQN:` messages repeated as barriers,
//! for bandwidth tests the client's five 8-byte results, and `done\0`. Size and iterations
//! are not exchanged: start both sides with the same `-s` and `-n`. Every message goes out in
//! one write: perftest reads each with one read(2) and fails on a short one.
//!
//! A run goes: [`params`] (the command line and what follows from it), [`setup`] (the verbs
//! objects and our buffer), [`connection`] (the exchange up to connected QPs), then
//! [`session`] (each test's barriers around its loop in [`runs`], and the [`report`]).

use std::process::ExitCode;

mod connection;
pub(crate) mod exchange;
mod params;
mod report;
mod runs;
mod session;
mod setup;

pub use params::Args;

use crate::signals::failure;

/// Runs `roce perf`.
pub fn run(args: &Args) -> ExitCode {
    match session::perf(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("roce perf: {error}");
            failure(&error)
        }
    }
}

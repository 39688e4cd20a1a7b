//! I/O for roce-xdp: everything that touches files, sockets, clocks and threads.
//!
//! - [`backend::Backend`]: the one trait every way of moving Ethernet frames implements;
//! - [`memory`]: an in-memory wire for tests;
//! - [`fault::FaultInjector`] and [`capture::PcapRecorder`]: wrappers over any backend;
//! - [`capture`]: reading pcap/pcapng files and writing pcap.
//!
//! Not written yet (issue #4): the AF_XDP and kernel-UDP backends, neighbour resolution,
//! the engine threads that drive a `roce_transport::Endpoint` over a backend.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod backend;
pub mod capture;
pub mod fault;
pub mod memory;

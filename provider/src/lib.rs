//! I/O for roce-xdp: everything that touches files, sockets, clocks and threads.
//!
//! So far it reads capture files ([`capture`]). The AF_XDP, kernel-UDP and in-memory
//! backends, fault injection and the pcap writer are not written yet.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod capture;

//! I/O for roce-xdp: everything that touches files, sockets, clocks and threads.
//!
//! - [`backend::Backend`]: the one trait every way of moving Ethernet frames implements; it
//!   lends received frames where they lie and lends a buffer to write a frame to send into;
//! - [`memory`]: an in-memory wire for tests;
//! - [`afxdp`]: the AF_XDP backend (root; a socket per receive queue, or one queue for an
//!   engine of its own; copy mode, multi-buffer frames parsed in place), over a UMEM whose
//!   buffer ownership is in the types (`umem`);
//! - [`udp`]: the kernel UDP-socket backend (no root, no AF_XDP);
//! - [`xdp`]: our XDP program (UDP 4791 to AF_XDP sockets, the rest to the kernel) and its
//!   bpf(2) loader;
//! - [`fault::FaultInjector`] and [`capture::PcapRecorder`]: wrappers over any backend;
//! - [`capture`]: reading pcap/pcapng files and writing pcap;
//! - [`ceiling`]: the raw AF_XDP ceiling of a link, RoCE-sized frames with no transport;
//! - [`link::Link`]: whether an interface is up and running (the port state);
//! - [`multicast`]: an interface's multicast MAC filter and the host's IP membership of
//!   groups (IGMP), as the kernel keeps them for rxe;
//! - [`netns`]: network namespaces and veth pairs for tests and the demo;
//! - [`switch`]: the device switch, which lets several processes share a device (it owns
//!   the AF_XDP sockets; each process's [`switch::SwitchBackend`] reaches it through
//!   shared-memory rings, or holds the sockets itself while it is alone on the device);
//! - [`engine::Engine`]: drives a `roce_transport::Endpoint` over any backend with the real
//!   clock, a packet's payload copied once, from registered memory into the backend's buffer.
//!
//! The engine sees a backend only through the trait's lending calls, so a backend that is
//! a shared-memory ring to another process (a switch owning the AF_XDP sockets of a device
//! for many programs) slots in as any other: `receive` lends frames where they lie in the
//! shared ring, `transmit` lends a slot of it, `submit` rings the switch's doorbell, and
//! `readiness_fd` polls readable when the switch writes its eventfd.
//!
//! Neighbour resolution and the engine's threads live in `roce-verbs`. Not written yet:
//! zero-copy AF_XDP (veth has none to test it on).
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod afxdp;
pub mod backend;
mod bpf;
pub mod capture;
pub mod ceiling;
pub mod ecn_marker;
pub mod engine;
pub mod fault;
#[allow(unsafe_code)]
pub mod link;
pub mod memory;
#[allow(unsafe_code)]
pub mod multicast;
pub mod netns;
pub mod switch;
pub mod udp;
mod umem;
pub mod xdp;

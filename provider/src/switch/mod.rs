//! The device switch: several processes on one device, as every program on a host uses an
//! rxe device at once.
//!
//! An AF_XDP queue has one fill and one completion ring, each single-producer and
//! single-consumer (the kernel's `af_xdp.rst` on `XDP_SHARED_UMEM`), so one process must own
//! them: the switch ([`server::Switch`], `roce switch IFACE`, or started on demand by the
//! first process that needs the device and gone with the last). It owns the AF_XDP sockets,
//! the UMEM and the XDP program; the transport stays in each process, which alone can read
//! and write its registered memory. Each process attaches over a Unix socket (abstract,
//! so per network namespace, as the interface is) and gets, through `SCM_RIGHTS`, a memfd
//! holding two rings of frames (`ring`), one each way, and two eventfds to wake each other.
//!
//! Frames are copied once each way (wire → ring by the switch, ring → UMEM by the
//! switch), so a process sees only its own frames: the switch never maps a client's memory
//! into another's, and checks what each sends (`steer::check_sent`). Steering is by the
//! BTH destination QPN's block and the CM's communication IDs (`steer`); a frame between
//! two processes on the device goes from one ring to the other and never reaches the wire.
//! While one process is alone it holds the device itself, as without a switch (the switch
//! lends it, [`protocol::Mode::Direct`]), and gives it back when a second comes.
//!
//! [`client::SwitchClient`] and [`client::SwitchBackend`] are a process's side.
#![allow(unsafe_code)]

pub mod client;
pub mod protocol;
pub mod ring;
pub mod server;
pub mod shm;
pub mod steer;

pub use client::{switch_program, SwitchBackend, SwitchClient};
pub use protocol::SwitchStats;
pub use server::{Switch, SwitchConfig};
pub use steer::Identity;

//! NVMe over Fabrics with the RDMA transport, on roce-xdp: a target that serves RAM, file
//! or block device namespaces, and a host that connects to any NVMe over RDMA target —
//! both over `roce-verbs` and its rdma_cm, so a machine without an RDMA NIC serves and
//! uses NVMe over RDMA, and talks to Linux's `nvmet_rdma` and `nvme_rdma`.
//!
//! - [`wire`]: the formats (command and response capsules, SGL descriptors, Fabrics
//!   commands, the CM private data, Identify data, log pages): parsers and emitters, no
//!   I/O, tested against the bytes of Linux's host and target on the wire.
//! - [`target`]: subsystems, controllers (Connect, properties, admin commands, keep
//!   alive), the discovery subsystem, I/O commands, and the queues that move data with
//!   RDMA READ and WRITE and answer with SEND (with Invalidate when the host asks). The
//!   rules a controller follows are plain functions of the command and the controller's
//!   state, tested without RDMA.
//! - [`host`]: connecting (admin queue, enabling, Identify, I/O queues), keep alive,
//!   discovery, raw commands for probing a target, and [`host::perf`], a verified
//!   fio-like workload.
//!
//! Where the specifications leave a choice, this does what Linux does
//! (`drivers/nvme/target`, `drivers/nvme/host/rdma.c`): the statuses bad commands get,
//! the in-capsule data size, CAP and Identify fields a Linux host checks, the keep alive
//! counted on any command, a discovery controller's default keep alive.
//!
//! One thread drives each side: the target's polls one CQ shared by all its queues and
//! its rdma_cm event channel, and sleeps in poll(2) on both when idle; the host's does the
//! same for its controller. The verbs context's own engine thread moves the frames.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod host;
pub mod target;
mod wait;
pub mod wire;

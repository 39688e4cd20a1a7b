//! NVMe over Fabrics on the wire, as the RDMA transport carries it: parsers and emitters
//! only, no I/O. A command capsule is a 64-byte [`Sqe`] (its data pointer one SGL
//! descriptor, [`DataPointer`]) followed by in-capsule data; a response capsule is a 16-byte
//! [`Cqe`]. The connection's private data is in [`cm`]; the data structures commands move
//! are in [`fabrics`] (Connect data, properties), [`identify`] and [`log`].

pub mod cm;
pub mod cqe;
pub mod fabrics;
pub mod identify;
pub mod log;
pub mod sgl;
pub mod sqe;
mod status;

pub use cqe::{Cqe, CQE_LEN};
pub use sgl::DataPointer;
pub use sqe::{Sqe, SQE_LEN};
pub use status::Status;

/// Admin command opcodes.
pub mod admin {
    /// Get Log Page.
    pub const GET_LOG_PAGE: u8 = 0x02;
    /// Identify.
    pub const IDENTIFY: u8 = 0x06;
    /// Abort.
    pub const ABORT: u8 = 0x08;
    /// Set Features.
    pub const SET_FEATURES: u8 = 0x09;
    /// Get Features.
    pub const GET_FEATURES: u8 = 0x0A;
    /// Asynchronous Event Request.
    pub const ASYNC_EVENT: u8 = 0x0C;
    /// Keep Alive.
    pub const KEEP_ALIVE: u8 = 0x18;
}

/// NVM command set (I/O) opcodes.
pub mod io {
    /// Flush.
    pub const FLUSH: u8 = 0x00;
    /// Write.
    pub const WRITE: u8 = 0x01;
    /// Read.
    pub const READ: u8 = 0x02;
    /// Write Zeroes.
    pub const WRITE_ZEROES: u8 = 0x08;
    /// Dataset Management.
    pub const DATASET_MANAGEMENT: u8 = 0x09;
    /// Read and Write's Force Unit Access bit (command dword 12).
    pub const FUA: u32 = 1 << 30;
    /// Dataset Management's Deallocate attribute (command dword 11).
    pub const DSM_DEALLOCATE: u32 = 1 << 2;
    /// Bytes of a Dataset Management range.
    pub const DSM_RANGE_LEN: usize = 16;
}

/// Feature identifiers.
pub mod feature {
    /// Volatile Write Cache.
    pub const VOLATILE_WRITE_CACHE: u8 = 0x06;
    /// Number of Queues.
    pub const NUMBER_OF_QUEUES: u8 = 0x07;
    /// Asynchronous Event Configuration.
    pub const ASYNC_EVENT_CONFIG: u8 = 0x0B;
    /// Keep Alive Timer.
    pub const KEEP_ALIVE_TIMER: u8 = 0x0F;
    /// Host Identifier.
    pub const HOST_ID: u8 = 0x81;
    /// Asynchronous event: namespace attribute notices.
    pub const AEN_NAMESPACE_ATTRIBUTE: u32 = 1 << 8;
    /// Asynchronous event: discovery log page change notices.
    pub const AEN_DISCOVERY_CHANGE: u32 = 1 << 31;
}

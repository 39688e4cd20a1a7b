//! NVMe over Fabrics, RDMA transport, on roce-xdp.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod host;
pub mod target;
mod wait;
pub mod wire;

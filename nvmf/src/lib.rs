//! NVMe over Fabrics, RDMA transport, on roce-xdp.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod wire;
pub mod target;

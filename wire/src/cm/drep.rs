//! DREP: the answer to a DREQ (IBTA Table 113), laid out as an [RTU](super::rtu) is.

pub use super::comm_ids::{Packet, Repr, HEADER_LEN, PRIVATE_DATA_LEN};

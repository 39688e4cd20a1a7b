//! RTU: ready to use, the active side's answer to a REP (IBTA Table 111), laid out as a
//! [DREP](super::drep) is.

pub use super::comm_ids::{Packet, Repr, HEADER_LEN, PRIVATE_DATA_LEN};

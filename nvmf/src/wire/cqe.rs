//! The 16-byte completion queue entry a response capsule carries: command specific result
//! (dwords 0–1), submission queue head and identifier, the command identifier it answers,
//! and the status (phase tag 0 on fabrics).

use super::Status;

/// Bytes of a completion queue entry.
pub const CQE_LEN: usize = 16;

/// SQ head pointer of a queue whose flow control is off (Connect's CATTR bit 2).
pub const SQ_HEAD_DISABLED: u16 = 0xFFFF;

/// A completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cqe {
    /// Command specific result (the controller ID of a Connect, a property's value, ...).
    pub result: u64,
    /// Submission queue head pointer.
    pub sq_head: u16,
    /// Submission queue identifier.
    pub sq_id: u16,
    /// The command identifier of the command it completes.
    pub cid: u16,
    /// How the command ended.
    pub status: Status,
}

impl Cqe {
    /// A success for `cid` with `result`.
    pub fn new(cid: u16, status: Status, result: u64) -> Cqe {
        Cqe {
            result,
            sq_head: 0,
            sq_id: 0,
            cid,
            status,
        }
    }

    /// Parses the first 16 bytes; `None` if there are fewer.
    pub fn parse(bytes: &[u8]) -> Option<Cqe> {
        let bytes: &[u8; CQE_LEN] = bytes.get(..CQE_LEN)?.try_into().ok()?;
        let word = |at: usize| u16::from_le_bytes([bytes[at], bytes[at + 1]]);
        Some(Cqe {
            result: u64::from_le_bytes(bytes[..8].try_into().ok()?),
            sq_head: word(8),
            sq_id: word(10),
            cid: word(12),
            status: Status::from_field(word(14)),
        })
    }

    /// The entry's 16 bytes.
    pub fn emit(&self) -> [u8; CQE_LEN] {
        let mut bytes = [0u8; CQE_LEN];
        bytes[..8].copy_from_slice(&self.result.to_le_bytes());
        bytes[8..10].copy_from_slice(&self.sq_head.to_le_bytes());
        bytes[10..12].copy_from_slice(&self.sq_id.to_le_bytes());
        bytes[12..14].copy_from_slice(&self.cid.to_le_bytes());
        bytes[14..16].copy_from_slice(&self.status.to_field().to_le_bytes());
        bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let cqe = Cqe {
            result: 0x0000_0820_0f00_007f,
            sq_head: 2,
            sq_id: 1,
            cid: 0x16,
            status: Status::LBA_RANGE.dnr(),
        };
        assert_eq!(Cqe::parse(&cqe.emit()), Some(cqe));
        assert_eq!(Cqe::parse(&[0; 15]), None);
    }
}

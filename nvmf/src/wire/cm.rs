//! The RDMA binding's connection private data (NVMe over Fabrics, RDMA Transport
//! Specification; Linux's `include/linux/nvme-rdma.h`), carried after rdma_cm's own header:
//! the host's REQ says which queue it opens and how deep its queues are, the controller's
//! REP how many commands it can receive, and a REJ why it refused.

/// Bytes of the REQ and REP private data.
pub const PRIVATE_LEN: usize = 32;
/// Bytes of the REJ private data.
pub const REJECT_LEN: usize = 4;
/// The only record format.
pub const RECFMT: u16 = 0;
/// Depth of an admin queue (`NVME_AQ_DEPTH`): Linux asks for hrqsize 32, hsqsize 31.
pub const ADMIN_QUEUE_DEPTH: u16 = 32;

/// A connect request's private data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmRequest {
    /// Record format (0).
    pub recfmt: u16,
    /// Queue: 0 for the admin queue.
    pub qid: u16,
    /// Host receive queue size: responses the host can take at once.
    pub hrqsize: u16,
    /// Host send queue size, 0's based: commands the host may have outstanding, minus 1.
    pub hsqsize: u16,
    /// Controller ID (newer hosts; 0 from Linux 6.1, whose field is reserved).
    pub cntlid: u16,
}

/// Why a controller refused a connection (`enum nvme_rdma_cm_status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RejectStatus {
    /// Private data too short.
    InvalidLength,
    /// Unknown record format.
    InvalidRecfmt,
    /// Queue ID not allowed.
    InvalidQid,
    /// Host send queue size not allowed.
    InvalidHsqsize,
    /// Host receive queue size not allowed.
    InvalidHrqsize,
    /// No resources for another queue.
    NoResources,
    /// Initiator depth (IRD) not allowed.
    InvalidIrd,
    /// Responder resources (ORD) not allowed.
    InvalidOrd,
    /// Another value.
    Other(u16),
}

impl RejectStatus {
    /// The status value.
    pub fn code(self) -> u16 {
        match self {
            RejectStatus::InvalidLength => 1,
            RejectStatus::InvalidRecfmt => 2,
            RejectStatus::InvalidQid => 3,
            RejectStatus::InvalidHsqsize => 4,
            RejectStatus::InvalidHrqsize => 5,
            RejectStatus::NoResources => 6,
            RejectStatus::InvalidIrd => 7,
            RejectStatus::InvalidOrd => 8,
            RejectStatus::Other(code) => code,
        }
    }

    /// The status of a value.
    pub fn from_code(code: u16) -> RejectStatus {
        match code {
            1 => RejectStatus::InvalidLength,
            2 => RejectStatus::InvalidRecfmt,
            3 => RejectStatus::InvalidQid,
            4 => RejectStatus::InvalidHsqsize,
            5 => RejectStatus::InvalidHrqsize,
            6 => RejectStatus::NoResources,
            7 => RejectStatus::InvalidIrd,
            8 => RejectStatus::InvalidOrd,
            other => RejectStatus::Other(other),
        }
    }

    /// What it means, as Linux's `nvme_rdma_cm_msg` words it.
    pub fn message(self) -> &'static str {
        match self {
            RejectStatus::InvalidLength => "invalid length",
            RejectStatus::InvalidRecfmt => "invalid record format",
            RejectStatus::InvalidQid => "invalid queue ID",
            RejectStatus::InvalidHsqsize => "invalid host SQ size",
            RejectStatus::InvalidHrqsize => "invalid host RQ size",
            RejectStatus::NoResources => "resource not found",
            RejectStatus::InvalidIrd => "invalid IRD",
            RejectStatus::InvalidOrd => "invalid ORD",
            RejectStatus::Other(_) => "unrecognized reason",
        }
    }
}

impl CmRequest {
    /// Parses a REQ's private data (after rdma_cm's header); shorter than the 8 bytes of
    /// its fields is [`RejectStatus::InvalidLength`], as Linux's target rejects it.
    pub fn parse(bytes: &[u8]) -> Result<CmRequest, RejectStatus> {
        if bytes.len() < 8 {
            return Err(RejectStatus::InvalidLength);
        }
        let word = |at: usize| {
            bytes
                .get(at..at + 2)
                .map_or(0, |w| u16::from_le_bytes([w[0], w[1]]))
        };
        Ok(CmRequest {
            recfmt: word(0),
            qid: word(2),
            hrqsize: word(4),
            hsqsize: word(6),
            cntlid: word(8),
        })
    }

    /// The 32 bytes.
    pub fn emit(&self) -> [u8; PRIVATE_LEN] {
        let mut bytes = [0u8; PRIVATE_LEN];
        for (at, value) in [
            (0, self.recfmt),
            (2, self.qid),
            (4, self.hrqsize),
            (6, self.hsqsize),
            (8, self.cntlid),
        ] {
            bytes[at..at + 2].copy_from_slice(&value.to_le_bytes());
        }
        bytes
    }
}

/// A connect reply's private data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmReply {
    /// Record format (0).
    pub recfmt: u16,
    /// Controller receive queue size: commands the controller can receive at once.
    pub crqsize: u16,
}

impl CmReply {
    /// Parses a REP's private data; `None` if shorter than its 4 bytes.
    pub fn parse(bytes: &[u8]) -> Option<CmReply> {
        let bytes = bytes.get(..4)?;
        Some(CmReply {
            recfmt: u16::from_le_bytes([bytes[0], bytes[1]]),
            crqsize: u16::from_le_bytes([bytes[2], bytes[3]]),
        })
    }

    /// The 32 bytes.
    pub fn emit(&self) -> [u8; PRIVATE_LEN] {
        let mut bytes = [0u8; PRIVATE_LEN];
        bytes[..2].copy_from_slice(&self.recfmt.to_le_bytes());
        bytes[2..4].copy_from_slice(&self.crqsize.to_le_bytes());
        bytes
    }
}

/// A connect reject's private data: the record format and why.
pub fn emit_reject(status: RejectStatus) -> [u8; REJECT_LEN] {
    let mut bytes = [0u8; REJECT_LEN];
    bytes[..2].copy_from_slice(&RECFMT.to_le_bytes());
    bytes[2..].copy_from_slice(&status.code().to_le_bytes());
    bytes
}

/// Why a REJ's private data says the controller refused; `None` if it carries none.
pub fn parse_reject(bytes: &[u8]) -> Option<RejectStatus> {
    let bytes = bytes.get(..REJECT_LEN)?;
    Some(RejectStatus::from_code(u16::from_le_bytes([
        bytes[2], bytes[3],
    ])))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_data_round_trips() {
        let req = CmRequest {
            recfmt: RECFMT,
            qid: 4,
            hrqsize: 128,
            hsqsize: 127,
            cntlid: 0,
        };
        assert_eq!(CmRequest::parse(&req.emit()), Ok(req));
        assert_eq!(CmRequest::parse(&[0; 7]), Err(RejectStatus::InvalidLength));
        let rep = CmReply {
            recfmt: RECFMT,
            crqsize: 128,
        };
        assert_eq!(CmReply::parse(&rep.emit()), Some(rep));
        for code in 1..=9 {
            let status = RejectStatus::from_code(code);
            assert_eq!(status.code(), code);
            assert_eq!(parse_reject(&emit_reject(status)), Some(status));
        }
    }
}

//! The command's data pointer (SQE bytes 24–39) as the RDMA transport uses it: one SGL
//! descriptor, either a keyed data block (host memory the controller reaches with RDMA READ
//! and WRITE; subtype 0x0, or 0xF to ask for remote invalidation of the key with the
//! response) or a data block of subtype "offset" (data carried in the command capsule after
//! the SQE). The last byte is the descriptor identifier: type in the high nibble, subtype in
//! the low one.

use super::Status;

/// Bytes of an SGL descriptor.
pub const SGL_LEN: usize = 16;

const TYPE_DATA_BLOCK: u8 = 0x0;
const TYPE_KEYED_DATA_BLOCK: u8 = 0x4;
const SUBTYPE_ADDRESS: u8 = 0x0;
const SUBTYPE_OFFSET: u8 = 0x1;
const SUBTYPE_INVALIDATE: u8 = 0xF;

/// Largest length a keyed descriptor carries (24 bits).
pub const KEYED_MAX_LEN: u32 = 0xFF_FFFF;

/// Where a command's data is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataPointer {
    /// Host memory: `len` bytes at `addr` under `key`; with `invalidate`, the host asks the
    /// controller to invalidate `key` when it responds (SEND with Invalidate).
    Keyed {
        /// Address in the host's registration.
        addr: u64,
        /// Bytes (24 bits).
        len: u32,
        /// The host's R_Key.
        key: u32,
        /// Subtype 0xF: invalidate the key with the response.
        invalidate: bool,
    },
    /// In-capsule data: `len` bytes from `offset` after the 64-byte SQE.
    InCapsule {
        /// Offset into the in-capsule data.
        offset: u64,
        /// Bytes.
        len: u32,
    },
}

impl DataPointer {
    /// No data: a keyed descriptor of length 0 (what Linux sends for data-less commands).
    pub const NONE: DataPointer = DataPointer::Keyed {
        addr: 0,
        len: 0,
        key: 0,
        invalidate: false,
    };

    /// Parses a descriptor; a type or subtype the RDMA transport does not carry is answered
    /// as Linux's target answers it: an unknown subtype is an invalid field, an unknown type
    /// (segments, bit buckets, transport blocks) an invalid SGL descriptor type.
    pub fn parse(bytes: &[u8; SGL_LEN]) -> Result<DataPointer, Status> {
        let addr = u64::from_le_bytes(bytes[0..8].try_into().unwrap_or_default());
        let identifier = bytes[15];
        match (identifier >> 4, identifier & 0xF) {
            (TYPE_KEYED_DATA_BLOCK, subtype @ (SUBTYPE_ADDRESS | SUBTYPE_INVALIDATE)) => {
                Ok(DataPointer::Keyed {
                    addr,
                    len: u32::from_le_bytes([bytes[8], bytes[9], bytes[10], 0]),
                    key: u32::from_le_bytes([bytes[11], bytes[12], bytes[13], bytes[14]]),
                    invalidate: subtype == SUBTYPE_INVALIDATE,
                })
            }
            (TYPE_DATA_BLOCK, SUBTYPE_OFFSET) => Ok(DataPointer::InCapsule {
                offset: addr,
                len: u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]),
            }),
            (TYPE_KEYED_DATA_BLOCK | TYPE_DATA_BLOCK, _) => Err(Status::INVALID_FIELD.dnr()),
            _ => Err(Status::SGL_INVALID_TYPE.dnr()),
        }
    }

    /// The descriptor's 16 bytes (a keyed length is cut to its 24 bits).
    pub fn emit(&self) -> [u8; SGL_LEN] {
        let mut bytes = [0u8; SGL_LEN];
        match *self {
            DataPointer::Keyed {
                addr,
                len,
                key,
                invalidate,
            } => {
                bytes[0..8].copy_from_slice(&addr.to_le_bytes());
                bytes[8..11].copy_from_slice(&len.to_le_bytes()[..3]);
                bytes[11..15].copy_from_slice(&key.to_le_bytes());
                let subtype = if invalidate {
                    SUBTYPE_INVALIDATE
                } else {
                    SUBTYPE_ADDRESS
                };
                bytes[15] = TYPE_KEYED_DATA_BLOCK << 4 | subtype;
            }
            DataPointer::InCapsule { offset, len } => {
                bytes[0..8].copy_from_slice(&offset.to_le_bytes());
                bytes[8..12].copy_from_slice(&len.to_le_bytes());
                bytes[15] = TYPE_DATA_BLOCK << 4 | SUBTYPE_OFFSET;
            }
        }
        bytes
    }

    /// Bytes the descriptor covers.
    pub fn len(&self) -> u32 {
        match *self {
            DataPointer::Keyed { len, .. } | DataPointer::InCapsule { len, .. } => len,
        }
    }

    /// Whether it covers no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyed_and_offset_descriptors_round_trip() {
        for pointer in [
            DataPointer::NONE,
            DataPointer::Keyed {
                addr: 0xffff_8880_2db6_1000,
                len: 1024,
                key: 0xe810,
                invalidate: true,
            },
            DataPointer::InCapsule {
                offset: 0,
                len: 1024,
            },
        ] {
            assert_eq!(DataPointer::parse(&pointer.emit()), Ok(pointer));
        }
        assert_eq!(DataPointer::NONE.emit()[15], 0x40);
    }

    #[test]
    fn other_types_and_subtypes_are_refused_as_linux_refuses_them() {
        let mut bytes = [0u8; SGL_LEN];
        for (identifier, status) in [
            (0x41, Status::INVALID_FIELD.dnr()),    // keyed, offset subtype
            (0x00, Status::INVALID_FIELD.dnr()),    // data block, address subtype
            (0x20, Status::SGL_INVALID_TYPE.dnr()), // segment
            (0x30, Status::SGL_INVALID_TYPE.dnr()), // last segment
            (0x10, Status::SGL_INVALID_TYPE.dnr()), // bit bucket
            (0x5a, Status::SGL_INVALID_TYPE.dnr()), // transport data block
        ] {
            bytes[15] = identifier;
            assert_eq!(DataPointer::parse(&bytes), Err(status), "{identifier:#x}");
        }
    }
}

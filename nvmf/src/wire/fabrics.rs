//! Fabrics commands (opcode 0x7F; NVMe over Fabrics Specification, "Fabrics Command Set"):
//! Connect with its 1024-byte data, Property Get and Set, Disconnect; the controller's
//! properties (CAP, VS, CC, CSTS) and the Connect response's error location.

use super::sqe::{Sqe, FABRICS_OPCODE};
use super::Status;

/// Fabrics command type: Property Set.
pub const PROPERTY_SET: u8 = 0x00;
/// Fabrics command type: Connect.
pub const CONNECT: u8 = 0x01;
/// Fabrics command type: Property Get.
pub const PROPERTY_GET: u8 = 0x04;
/// Fabrics command type: Disconnect (an I/O queue only).
pub const DISCONNECT: u8 = 0x08;

/// Bytes of the Connect command's data.
pub const CONNECT_DATA_LEN: usize = 1024;
/// Bytes of an NQN field (the name is at most 223 bytes and NUL-terminated).
pub const NQN_FIELD_LEN: usize = 256;
/// Longest NQN (NVMe Base Specification, "NVMe Qualified Names").
pub const NQN_MAX_LEN: usize = 223;
/// The well-known NQN of a discovery service.
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";
/// Connect data's controller ID asking for any controller (dynamic model).
pub const CNTLID_DYNAMIC: u16 = 0xFFFF;
/// Connect's CATTR bit: the host turns off submission queue flow control.
pub const CATTR_DISABLE_SQ_FLOW: u8 = 1 << 2;

/// Property offsets.
pub mod property {
    /// Controller Capabilities (8 bytes).
    pub const CAP: u32 = 0x00;
    /// Version.
    pub const VS: u32 = 0x08;
    /// Controller Configuration.
    pub const CC: u32 = 0x14;
    /// Controller Status.
    pub const CSTS: u32 = 0x1C;
}

/// CC bits.
pub mod cc {
    /// Enable.
    pub const EN: u32 = 1;
    /// Shutdown notification (2 bits at 14).
    pub const SHN_SHIFT: u32 = 14;
    /// The I/O command set selected (3 bits at 4).
    pub const CSS_SHIFT: u32 = 4;
    /// Memory page size (4 bits at 7).
    pub const MPS_SHIFT: u32 = 7;
    /// Arbitration mechanism (3 bits at 11).
    pub const AMS_SHIFT: u32 = 11;
    /// I/O submission queue entry size, log2 (4 bits at 16).
    pub const IOSQES_SHIFT: u32 = 16;
    /// I/O completion queue entry size, log2 (4 bits at 20).
    pub const IOCQES_SHIFT: u32 = 20;
}

/// CSTS bits.
pub mod csts {
    /// Ready.
    pub const RDY: u32 = 1;
    /// Controller fatal status.
    pub const CFS: u32 = 1 << 1;
    /// Shutdown status "complete".
    pub const SHST_COMPLETE: u32 = 2 << 2;
}

/// NVMe 1.3.0 in the VS property and Identify's VER: what Linux's target reports.
pub const VERSION_1_3: u32 = 0x0001_0300;

/// A parsed Fabrics command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fabrics {
    /// Connect: opens an admin or I/O queue.
    Connect(Connect),
    /// Property Get: `offset`, 8 bytes wide if `wide` else 4.
    PropertyGet {
        /// Property offset.
        offset: u32,
        /// ATTRIB bit 0: an 8-byte property.
        wide: bool,
    },
    /// Property Set.
    PropertySet {
        /// Property offset.
        offset: u32,
        /// ATTRIB bit 0: an 8-byte property.
        wide: bool,
        /// The value.
        value: u64,
    },
    /// Disconnect: deletes the I/O queue it arrives on.
    Disconnect {
        /// Record format (0).
        recfmt: u16,
    },
    /// A type this target does not know (authentication, vendor types).
    Other(u8),
}

/// The Connect command's own fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Connect {
    /// Record format (0).
    pub recfmt: u16,
    /// Queue ID: 0 for the admin queue.
    pub qid: u16,
    /// Submission queue size, 0's based.
    pub sqsize: u16,
    /// Connect attributes.
    pub cattr: u8,
    /// Keep alive timeout in milliseconds (admin queue), 0 for none.
    pub kato: u32,
}

/// Where a Connect failed: Linux's `IPO_IATTR_CONNECT_SQE`/`_DATA`, the result of a
/// failed Connect's completion (offset of the field, bit 16 set for the data).
pub mod invalid {
    /// The command's QID.
    pub const SQE_QID: u32 = 42;
    /// The command's SQSIZE.
    pub const SQE_SQSIZE: u32 = 44;
    /// The data's controller ID.
    pub const DATA_CNTLID: u32 = 1 << 16 | 16;
    /// The data's subsystem NQN.
    pub const DATA_SUBNQN: u32 = 1 << 16 | 256;
    /// The data's host NQN.
    pub const DATA_HOSTNQN: u32 = 1 << 16 | 512;
}

impl Fabrics {
    /// Parses a Fabrics command (the caller has checked the opcode).
    pub fn parse(sqe: &Sqe) -> Fabrics {
        let bytes = &sqe.0;
        let word = |at: usize| u16::from_le_bytes([bytes[at], bytes[at + 1]]);
        let wide = bytes[40] & 1 == 1;
        match sqe.fctype() {
            CONNECT => Fabrics::Connect(Connect {
                recfmt: word(40),
                qid: word(42),
                sqsize: word(44),
                cattr: bytes[46],
                kato: sqe.dword(12),
            }),
            PROPERTY_GET => Fabrics::PropertyGet {
                offset: sqe.dword(11),
                wide,
            },
            PROPERTY_SET => Fabrics::PropertySet {
                offset: sqe.dword(11),
                wide,
                value: sqe.qword(12),
            },
            DISCONNECT => Fabrics::Disconnect { recfmt: word(40) },
            other => Fabrics::Other(other),
        }
    }

    /// The command, as a capsule's SQE with identifier `cid` (its data pointer left empty).
    pub fn emit(&self, cid: u16) -> Sqe {
        let mut sqe = Sqe::new(FABRICS_OPCODE, cid);
        let bytes = &mut sqe.0;
        match *self {
            Fabrics::Connect(connect) => {
                bytes[4] = CONNECT;
                bytes[40..42].copy_from_slice(&connect.recfmt.to_le_bytes());
                bytes[42..44].copy_from_slice(&connect.qid.to_le_bytes());
                bytes[44..46].copy_from_slice(&connect.sqsize.to_le_bytes());
                bytes[46] = connect.cattr;
                sqe.set_dword(12, connect.kato);
            }
            Fabrics::PropertyGet { offset, wide } => {
                bytes[4] = PROPERTY_GET;
                bytes[40] = u8::from(wide);
                sqe.set_dword(11, offset);
            }
            Fabrics::PropertySet {
                offset,
                wide,
                value,
            } => {
                bytes[4] = PROPERTY_SET;
                bytes[40] = u8::from(wide);
                sqe.set_dword(11, offset);
                sqe.set_qword(12, value);
            }
            Fabrics::Disconnect { recfmt } => {
                bytes[4] = DISCONNECT;
                bytes[40..42].copy_from_slice(&recfmt.to_le_bytes());
            }
            Fabrics::Other(fctype) => bytes[4] = fctype,
        }
        sqe
    }
}

/// The Connect command's 1024 bytes of data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectData {
    /// Host identifier (128-bit).
    pub hostid: [u8; 16],
    /// Controller ID: [`CNTLID_DYNAMIC`] on the admin queue, the admin queue's controller
    /// on an I/O queue.
    pub cntlid: u16,
    /// The subsystem's NQN.
    pub subnqn: String,
    /// The host's NQN.
    pub hostnqn: String,
}

impl ConnectData {
    /// Parses the data; an NQN is read up to its NUL (or its field's end), as the bytes it
    /// holds, and must be UTF-8 and at most 223 bytes, else the Connect's invalid
    /// parameter is that field.
    pub fn parse(bytes: &[u8]) -> Result<ConnectData, (Status, u32)> {
        let invalid = |field| (Status::CONNECT_INVALID_PARAMETERS.dnr(), field);
        if bytes.len() < CONNECT_DATA_LEN {
            return Err((Status::SGL_INVALID_DATA.dnr(), 0));
        }
        let mut hostid = [0u8; 16];
        hostid.copy_from_slice(&bytes[..16]);
        Ok(ConnectData {
            hostid,
            cntlid: u16::from_le_bytes([bytes[16], bytes[17]]),
            subnqn: parse_nqn(&bytes[256..512]).ok_or(invalid(invalid::DATA_SUBNQN))?,
            hostnqn: parse_nqn(&bytes[512..768]).ok_or(invalid(invalid::DATA_HOSTNQN))?,
        })
    }

    /// The 1024 bytes (NQNs longer than their field are cut).
    pub fn emit(&self) -> [u8; CONNECT_DATA_LEN] {
        let mut bytes = [0u8; CONNECT_DATA_LEN];
        bytes[..16].copy_from_slice(&self.hostid);
        bytes[16..18].copy_from_slice(&self.cntlid.to_le_bytes());
        put_str(&mut bytes[256..256 + NQN_FIELD_LEN - 1], &self.subnqn);
        put_str(&mut bytes[512..512 + NQN_FIELD_LEN - 1], &self.hostnqn);
        bytes
    }
}

/// An NQN field's name: up to the first NUL, UTF-8, 1 to 223 bytes.
pub fn parse_nqn(field: &[u8]) -> Option<String> {
    let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    let name = std::str::from_utf8(&field[..end]).ok()?;
    (!name.is_empty() && name.len() <= NQN_MAX_LEN).then(|| name.to_string())
}

/// Copies `text` into `field`, cut to fit; the rest of the field stays as it is.
pub fn put_str(field: &mut [u8], text: &str) {
    let len = text.len().min(field.len());
    field[..len].copy_from_slice(&text.as_bytes()[..len]);
}

/// Whether `name` is a well-formed NQN for this target's configuration: 1–223 bytes,
/// starting `nqn.`, without NUL.
pub fn valid_nqn(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= NQN_MAX_LEN
        && name.starts_with("nqn.")
        && !name.contains('\0')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fabrics_commands_round_trip() {
        for command in [
            Fabrics::Connect(Connect {
                recfmt: 0,
                qid: 3,
                sqsize: 127,
                cattr: CATTR_DISABLE_SQ_FLOW,
                kato: 5000,
            }),
            Fabrics::PropertyGet {
                offset: property::CAP,
                wide: true,
            },
            Fabrics::PropertySet {
                offset: property::CC,
                wide: false,
                value: 0x0046_0061,
            },
            Fabrics::Disconnect { recfmt: 0 },
            Fabrics::Other(0x05),
        ] {
            let sqe = command.emit(9);
            assert!(sqe.is_fabrics());
            assert_eq!(Fabrics::parse(&sqe), command);
        }
    }

    #[test]
    fn connect_data_round_trips_and_refuses_bad_names() {
        let data = ConnectData {
            hostid: [7; 16],
            cntlid: CNTLID_DYNAMIC,
            subnqn: "nqn.2026-12.io.roce-xdp:ram0".into(),
            hostnqn: "nqn.2014-08.org.nvmexpress:uuid:1".into(),
        };
        let mut bytes = data.emit();
        assert_eq!(ConnectData::parse(&bytes), Ok(data));
        bytes[256] = 0;
        assert_eq!(
            ConnectData::parse(&bytes),
            Err((
                Status::CONNECT_INVALID_PARAMETERS.dnr(),
                invalid::DATA_SUBNQN
            ))
        );
        bytes[512..768].fill(b'a');
        assert!(ConnectData::parse(&bytes).is_err());
        assert!(ConnectData::parse(&bytes[..1000]).is_err());
        assert!(valid_nqn("nqn.x") && !valid_nqn("x") && !valid_nqn(&"nqn.".repeat(60)));
    }
}

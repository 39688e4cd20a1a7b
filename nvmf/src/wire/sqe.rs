//! The 64-byte submission queue entry, as every command capsule begins: opcode, flags
//! (FUSE in bits 0–1, PSDT in bits 6–7), command identifier, namespace, the data pointer
//! (one SGL descriptor on fabrics) and command dwords 10–15. Fabrics commands (opcode 0x7F)
//! keep their type in byte 4 and their fields from byte 40 (see [`super::fabrics`]).

use super::sgl::{DataPointer, SGL_LEN};
use super::Status;

/// Bytes of a submission queue entry.
pub const SQE_LEN: usize = 64;

/// Opcode of every Fabrics command.
pub const FABRICS_OPCODE: u8 = 0x7F;

/// PSDT "SGL for data, MPTR a single buffer": what every fabrics command carries.
pub const FLAGS_SGL: u8 = 0x40;
const FLAGS_FUSE: u8 = 0x03;
const FLAGS_PSDT: u8 = 0xC0;

/// A submission queue entry; the accessors read and write its little-endian fields in place.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Sqe(pub [u8; SQE_LEN]);

impl std::fmt::Debug for Sqe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sqe")
            .field("opcode", &format_args!("{:#04x}", self.opcode()))
            .field("cid", &self.cid())
            .field("nsid", &self.nsid())
            .finish_non_exhaustive()
    }
}

/// Fewer than 64 bytes where a command was expected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a command capsule of {0} bytes (at least 64)")]
pub struct ShortCapsule(pub usize);

impl Sqe {
    /// A zeroed entry with `opcode`, `cid` and the SGL flag set.
    pub fn new(opcode: u8, cid: u16) -> Sqe {
        let mut sqe = Sqe([0; SQE_LEN]);
        sqe.0[0] = opcode;
        sqe.0[1] = FLAGS_SGL;
        sqe.set_cid(cid);
        sqe.set_data(&DataPointer::NONE);
        sqe
    }

    /// The first 64 bytes of a capsule.
    pub fn parse(capsule: &[u8]) -> Result<Sqe, ShortCapsule> {
        capsule
            .get(..SQE_LEN)
            .and_then(|bytes| bytes.try_into().ok())
            .map(Sqe)
            .ok_or(ShortCapsule(capsule.len()))
    }

    /// The opcode.
    pub fn opcode(&self) -> u8 {
        self.0[0]
    }

    /// The flags byte.
    pub fn flags(&self) -> u8 {
        self.0[1]
    }

    /// The command identifier the completion echoes.
    pub fn cid(&self) -> u16 {
        u16::from_le_bytes([self.0[2], self.0[3]])
    }

    /// Sets the command identifier.
    pub fn set_cid(&mut self, cid: u16) {
        self.0[2..4].copy_from_slice(&cid.to_le_bytes());
    }

    /// The namespace identifier.
    pub fn nsid(&self) -> u32 {
        self.dword(1)
    }

    /// Sets the namespace identifier.
    pub fn set_nsid(&mut self, nsid: u32) {
        self.set_dword(1, nsid);
    }

    /// Command dword `index` (0–15).
    pub fn dword(&self, index: usize) -> u32 {
        let at = index * 4;
        u32::from_le_bytes([self.0[at], self.0[at + 1], self.0[at + 2], self.0[at + 3]])
    }

    /// Sets command dword `index` (0–15).
    pub fn set_dword(&mut self, index: usize, value: u32) {
        self.0[index * 4..index * 4 + 4].copy_from_slice(&value.to_le_bytes());
    }

    /// Dwords 10 and 11 as one 64-bit value (a starting LBA, a log page offset at 12–13).
    pub fn qword(&self, index: usize) -> u64 {
        u64::from(self.dword(index)) | u64::from(self.dword(index + 1)) << 32
    }

    /// Sets dwords `index` and `index + 1` as one 64-bit value.
    pub fn set_qword(&mut self, index: usize, value: u64) {
        self.set_dword(index, value as u32);
        self.set_dword(index + 1, (value >> 32) as u32);
    }

    /// The Fabrics command type (byte 4), meaningful when the opcode is 0x7F.
    pub fn fctype(&self) -> u8 {
        self.0[4]
    }

    /// Whether this is a Fabrics command.
    pub fn is_fabrics(&self) -> bool {
        self.opcode() == FABRICS_OPCODE
    }

    /// Whether data moves from host to controller (opcode bit 0, or for Fabrics commands
    /// bit 0 of the type), as the specification's data transfer direction says.
    pub fn is_host_to_controller(&self) -> bool {
        if self.is_fabrics() {
            self.fctype() & 1 == 1
        } else {
            self.opcode() & 1 == 1
        }
    }

    /// The flags checks every controller on fabrics makes, as Linux's target makes them:
    /// no fused operations, and PSDT must say "SGL, metadata a single buffer".
    pub fn check_flags(&self) -> Result<(), Status> {
        if self.flags() & FLAGS_FUSE != 0 || self.flags() & FLAGS_PSDT != FLAGS_SGL {
            return Err(Status::INVALID_FIELD.dnr());
        }
        Ok(())
    }

    /// The raw data pointer.
    pub fn data_bytes(&self) -> [u8; SGL_LEN] {
        let mut bytes = [0u8; SGL_LEN];
        bytes.copy_from_slice(&self.0[24..40]);
        bytes
    }

    /// The data pointer, parsed.
    pub fn data(&self) -> Result<DataPointer, Status> {
        DataPointer::parse(&self.data_bytes())
    }

    /// Sets the data pointer.
    pub fn set_data(&mut self, data: &DataPointer) {
        self.0[24..40].copy_from_slice(&data.emit());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_sit_where_the_specification_puts_them() {
        let mut sqe = Sqe::new(0x02, 0x1234);
        sqe.set_nsid(1);
        sqe.set_qword(10, 0x1_0000_0002);
        sqe.set_dword(12, 7);
        assert_eq!(&sqe.0[..8], &[0x02, 0x40, 0x34, 0x12, 1, 0, 0, 0]);
        assert_eq!(&sqe.0[40..52], &[2, 0, 0, 0, 1, 0, 0, 0, 7, 0, 0, 0]);
        assert_eq!(sqe.data(), Ok(DataPointer::NONE));
        assert!(!sqe.is_host_to_controller());
        assert_eq!(sqe.check_flags(), Ok(()));
        assert_eq!(Sqe::parse(&[0; 63]), Err(ShortCapsule(63)));
    }

    #[test]
    fn fused_or_prp_commands_are_refused() {
        for flags in [0x41, 0x42, 0x00, 0x80, 0xC0] {
            let mut sqe = Sqe::new(0x02, 1);
            sqe.0[1] = flags;
            assert_eq!(
                sqe.check_flags(),
                Err(Status::INVALID_FIELD.dnr()),
                "{flags:#x}"
            );
        }
    }
}

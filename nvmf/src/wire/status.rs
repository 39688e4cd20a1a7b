//! Completion status: the 15-bit Status Field of a completion queue entry (NVMe Base
//! Specification, "Status Field"), as the Linux kernel's `NVME_SC_*` spells it: the status
//! code in bits 0–7, its type in bits 8–10, More in bit 13, Do Not Retry in bit 14.

use std::fmt;

/// A command's status.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Status(u16);

impl Status {
    /// Generic: success.
    pub const SUCCESS: Status = Status(0x000);
    /// Generic: invalid command opcode.
    pub const INVALID_OPCODE: Status = Status(0x001);
    /// Generic: invalid field in command.
    pub const INVALID_FIELD: Status = Status(0x002);
    /// Generic: data transfer error.
    pub const DATA_TRANSFER_ERROR: Status = Status(0x004);
    /// Generic: internal error.
    pub const INTERNAL: Status = Status(0x006);
    /// Generic: invalid namespace or format.
    pub const INVALID_NS: Status = Status(0x00b);
    /// Generic: command sequence error.
    pub const COMMAND_SEQUENCE: Status = Status(0x00c);
    /// Generic: data SGL length invalid.
    pub const SGL_INVALID_DATA: Status = Status(0x00f);
    /// Generic: SGL descriptor type invalid.
    pub const SGL_INVALID_TYPE: Status = Status(0x011);
    /// Generic: SGL offset invalid.
    pub const SGL_INVALID_OFFSET: Status = Status(0x016);
    /// Generic: keep alive timer expired.
    pub const KEEP_ALIVE_EXPIRED: Status = Status(0x019);
    /// Generic: keep alive timeout invalid.
    pub const KEEP_ALIVE_INVALID: Status = Status(0x01a);
    /// Generic (NVM): LBA out of range.
    pub const LBA_RANGE: Status = Status(0x080);
    /// Command specific: asynchronous event request limit exceeded.
    pub const ASYNC_LIMIT: Status = Status(0x105);
    /// Command specific: invalid log page.
    pub const INVALID_LOG_PAGE: Status = Status(0x109);
    /// Command specific: invalid queue type (a Disconnect on the admin queue).
    pub const INVALID_QUEUE_TYPE: Status = Status(0x10c);
    /// Fabrics Connect: incompatible format.
    pub const CONNECT_FORMAT: Status = Status(0x180);
    /// Fabrics Connect: controller busy.
    pub const CONNECT_CONTROLLER_BUSY: Status = Status(0x181);
    /// Fabrics Connect: invalid parameters.
    pub const CONNECT_INVALID_PARAMETERS: Status = Status(0x182);
    /// Fabrics Connect: invalid host.
    pub const CONNECT_INVALID_HOST: Status = Status(0x184);

    const MORE: u16 = 0x2000;
    const DNR: u16 = 0x4000;

    /// The status with Do Not Retry set: the same command would fail again.
    pub const fn dnr(self) -> Status {
        Status(self.0 | Self::DNR)
    }

    /// Whether Do Not Retry is set.
    pub const fn is_dnr(self) -> bool {
        self.0 & Self::DNR != 0
    }

    /// The status with More set: the error log has an entry for it.
    pub const fn more(self) -> Status {
        Status(self.0 | Self::MORE)
    }

    /// Whether the command succeeded.
    pub const fn is_success(self) -> bool {
        self.code_and_type() == 0
    }

    /// The status code (bits 0–7).
    pub const fn code(self) -> u8 {
        self.0 as u8
    }

    /// The status code type (0 generic, 1 command specific, 2 media, 3 path, 7 vendor).
    pub const fn code_type(self) -> u8 {
        ((self.0 >> 8) & 7) as u8
    }

    /// Code and type, without the flags.
    pub const fn code_and_type(self) -> u16 {
        self.0 & 0x7ff
    }

    /// The completion's Status Field (bits 1–15 of its last word; bit 0, the phase tag,
    /// is 0 on fabrics).
    pub const fn to_field(self) -> u16 {
        self.0 << 1
    }

    /// The status a completion's last word carries.
    pub const fn from_field(field: u16) -> Status {
        Status(field >> 1)
    }

    /// The kernel's 15-bit value (`NVME_SC_*` with `NVME_STATUS_DNR`).
    pub const fn raw(self) -> u16 {
        self.0
    }

    /// A status from the kernel's 15-bit value.
    pub const fn from_raw(raw: u16) -> Status {
        Status(raw & 0x7fff)
    }

    /// What the status means, in the specification's words.
    pub fn name(self) -> &'static str {
        match self.code_and_type() {
            0x000 => "success",
            0x001 => "invalid command opcode",
            0x002 => "invalid field in command",
            0x004 => "data transfer error",
            0x006 => "internal error",
            0x00b => "invalid namespace or format",
            0x00c => "command sequence error",
            0x00f => "data SGL length invalid",
            0x011 => "SGL descriptor type invalid",
            0x016 => "SGL offset invalid",
            0x019 => "keep alive timer expired",
            0x01a => "keep alive timeout invalid",
            0x080 => "LBA out of range",
            0x105 => "asynchronous event request limit exceeded",
            0x109 => "invalid log page",
            0x10c => "invalid queue type",
            0x180 => "connect: incompatible format",
            0x181 => "connect: controller busy",
            0x182 => "connect: invalid parameters",
            0x184 => "connect: invalid host",
            _ => "status",
        }
    }
}

impl fmt::Debug for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:#05x} ({}{})",
            self.code_and_type(),
            self.name(),
            if self.is_dnr() { ", do not retry" } else { "" }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_is_the_status_shifted_past_the_phase_bit() {
        let status = Status::SGL_INVALID_DATA.dnr();
        assert_eq!(status.to_field(), 0x801e);
        assert_eq!(Status::from_field(0x801e), status);
        assert_eq!(status.code(), 0x0f);
        assert_eq!(status.code_type(), 0);
        assert!(status.is_dnr() && !status.is_success());
        assert_eq!(Status::CONNECT_INVALID_HOST.code_type(), 1);
        assert!(Status::SUCCESS.is_success());
    }
}

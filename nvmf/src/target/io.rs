//! I/O commands: what a Read, Write, Flush, Write Zeroes or Dataset Management asks for,
//! checked against the namespace and the command's SGL before anything moves. No I/O here.

use super::controller::MAX_TRANSFER;
use super::subsystem::{Subsystem, BLOCK_SHIFT};
use crate::wire::{io, Sqe, Status};

/// What an I/O command does, in bytes of its namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// Read `len` bytes at `offset` to the host.
    Read {
        /// Namespace.
        nsid: u32,
        /// Byte offset.
        offset: u64,
        /// Bytes.
        len: u32,
    },
    /// Write `len` bytes from the host at `offset`; `durable` (FUA) before completing.
    Write {
        /// Namespace.
        nsid: u32,
        /// Byte offset.
        offset: u64,
        /// Bytes.
        len: u32,
        /// Force unit access.
        durable: bool,
    },
    /// Make written data durable.
    Flush {
        /// Namespace.
        nsid: u32,
    },
    /// Zero `len` bytes at `offset`.
    WriteZeroes {
        /// Namespace.
        nsid: u32,
        /// Byte offset.
        offset: u64,
        /// Bytes.
        len: u64,
    },
    /// Dataset Management: `ranges` range descriptors come from the host.
    DatasetManagement {
        /// Namespace.
        nsid: u32,
        /// Number of ranges.
        ranges: u32,
        /// Whether the ranges are to be deallocated.
        deallocate: bool,
    },
}

impl Plan {
    /// Bytes the host sends with the command.
    pub fn data_in(&self) -> u32 {
        match *self {
            Plan::Write { len, .. } => len,
            Plan::DatasetManagement { ranges, .. } => ranges * io::DSM_RANGE_LEN as u32,
            _ => 0,
        }
    }
}

/// Checks an I/O command against `subsystem` and its SGL's `transfer_len`, in the order
/// Linux's target checks: the namespace, then the opcode, the transfer length, the range.
pub fn plan(sqe: &Sqe, subsystem: &Subsystem, transfer_len: u32) -> Result<Plan, Status> {
    let nsid = sqe.nsid();
    let ns = subsystem.namespace(nsid).ok_or(Status::INVALID_NS.dnr())?;
    let blocks = |count: u64| count << BLOCK_SHIFT;
    let range = |slba: u64, nlb: u64| -> Result<u64, Status> {
        match slba.checked_add(nlb) {
            Some(end) if end <= ns.blocks => Ok(blocks(slba)),
            _ => Err(Status::LBA_RANGE.dnr()),
        }
    };
    let expect = |len: u64| {
        if u64::from(transfer_len) != len {
            Err(Status::SGL_INVALID_DATA.dnr())
        } else {
            Ok(())
        }
    };
    let slba = sqe.qword(10);
    let nlb = u64::from(sqe.dword(12) & 0xFFFF) + 1;
    match sqe.opcode() {
        io::READ | io::WRITE => {
            let len = blocks(nlb);
            expect(len)?;
            if len > u64::from(MAX_TRANSFER) {
                return Err(Status::INVALID_FIELD.dnr());
            }
            let offset = range(slba, nlb)?;
            let len = len as u32;
            Ok(if sqe.opcode() == io::READ {
                Plan::Read { nsid, offset, len }
            } else {
                Plan::Write {
                    nsid,
                    offset,
                    len,
                    durable: sqe.dword(12) & io::FUA != 0,
                }
            })
        }
        io::FLUSH => {
            expect(0)?;
            Ok(Plan::Flush { nsid })
        }
        io::WRITE_ZEROES => {
            expect(0)?;
            let offset = range(slba, nlb)?;
            Ok(Plan::WriteZeroes {
                nsid,
                offset,
                len: blocks(nlb),
            })
        }
        io::DATASET_MANAGEMENT => {
            let ranges = (sqe.dword(10) & 0xFF) + 1;
            expect(u64::from(ranges) * io::DSM_RANGE_LEN as u64)?;
            Ok(Plan::DatasetManagement {
                nsid,
                ranges,
                deallocate: sqe.dword(11) & io::DSM_DEALLOCATE != 0,
            })
        }
        _ => Err(Status::INVALID_OPCODE.dnr()),
    }
}

/// The byte ranges of Dataset Management's range descriptors (context attributes, block
/// count, starting LBA), each checked against a namespace of `blocks` blocks.
pub fn dsm_ranges(data: &[u8], blocks: u64) -> Result<Vec<(u64, u64)>, Status> {
    data.chunks_exact(io::DSM_RANGE_LEN)
        .map(|range| {
            let nlb = u64::from(u32::from_le_bytes([range[4], range[5], range[6], range[7]]));
            let slba = u64::from_le_bytes(range[8..16].try_into().unwrap_or_default());
            match slba.checked_add(nlb) {
                Some(end) if end <= blocks => Ok((slba << BLOCK_SHIFT, nlb << BLOCK_SHIFT)),
                _ => Err(Status::LBA_RANGE.dnr()),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::storage::Storage;
    use crate::target::subsystem::{Counters, HostAccess, Namespace};

    fn subsystem() -> Subsystem {
        let file = tempfile_like();
        Subsystem {
            nqn: "nqn.x".into(),
            serial: "1".into(),
            hosts: HostAccess::Any,
            namespaces: vec![Namespace {
                nsid: 1,
                storage: Storage::File(file),
                blocks: 1000,
                nguid: [0; 16],
                uuid: [0; 16],
                counters: Counters::default(),
            }],
        }
    }

    /// A file nobody else sees, for a namespace these checks never touch.
    fn tempfile_like() -> std::fs::File {
        std::fs::File::open("/dev/null").expect("/dev/null")
    }

    fn rw(opcode: u8, nsid: u32, slba: u64, nlb: u16) -> Sqe {
        let mut sqe = Sqe::new(opcode, 1);
        sqe.set_nsid(nsid);
        sqe.set_qword(10, slba);
        sqe.set_dword(12, u32::from(nlb - 1));
        sqe
    }

    #[test]
    fn reads_and_writes_are_checked() {
        let s = subsystem();
        assert_eq!(
            plan(&rw(io::READ, 1, 10, 8), &s, 4096),
            Ok(Plan::Read {
                nsid: 1,
                offset: 5120,
                len: 4096
            })
        );
        let mut fua = rw(io::WRITE, 1, 992, 8);
        fua.set_dword(12, fua.dword(12) | io::FUA);
        assert_eq!(
            plan(&fua, &s, 4096),
            Ok(Plan::Write {
                nsid: 1,
                offset: 992 * 512,
                len: 4096,
                durable: true
            })
        );
        for (sqe, len, status) in [
            (rw(io::READ, 2, 0, 1), 512, Status::INVALID_NS.dnr()),
            (
                rw(io::READ, 0xFFFF_FFFF, 0, 1),
                512,
                Status::INVALID_NS.dnr(),
            ),
            (rw(io::READ, 1, 0, 8), 512, Status::SGL_INVALID_DATA.dnr()),
            (rw(io::WRITE, 1, 993, 8), 4096, Status::LBA_RANGE.dnr()),
            (rw(io::READ, 1, u64::MAX, 1), 512, Status::LBA_RANGE.dnr()),
            (
                rw(io::READ, 1, 0, 512),
                256 << 10,
                Status::INVALID_FIELD.dnr(),
            ),
            (rw(0x7D, 1, 0, 1), 0, Status::INVALID_OPCODE.dnr()),
        ] {
            assert_eq!(plan(&sqe, &s, len), Err(status), "{sqe:?}");
        }
    }

    #[test]
    fn other_commands() {
        let s = subsystem();
        assert_eq!(
            plan(&rw(io::FLUSH, 1, 0, 1), &s, 0),
            Ok(Plan::Flush { nsid: 1 })
        );
        assert_eq!(
            plan(&rw(io::WRITE_ZEROES, 1, 999, 1), &s, 0),
            Ok(Plan::WriteZeroes {
                nsid: 1,
                offset: 999 * 512,
                len: 512
            })
        );
        let mut dsm = Sqe::new(io::DATASET_MANAGEMENT, 1);
        dsm.set_nsid(1);
        dsm.set_dword(10, 1);
        dsm.set_dword(11, io::DSM_DEALLOCATE);
        let planned = plan(&dsm, &s, 32).unwrap();
        assert_eq!(planned.data_in(), 32);
        assert_eq!(plan(&dsm, &s, 16), Err(Status::SGL_INVALID_DATA.dnr()));
        let mut ranges = vec![0u8; 32];
        ranges[4..8].copy_from_slice(&8u32.to_le_bytes());
        ranges[8..16].copy_from_slice(&16u64.to_le_bytes());
        ranges[20..24].copy_from_slice(&1u32.to_le_bytes());
        ranges[24..32].copy_from_slice(&999u64.to_le_bytes());
        assert_eq!(
            dsm_ranges(&ranges, 1000),
            Ok(vec![(16 * 512, 8 * 512), (999 * 512, 512)])
        );
        assert_eq!(dsm_ranges(&ranges, 999), Err(Status::LBA_RANGE.dnr()));
    }
}

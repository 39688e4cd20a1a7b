//! Log pages (NVMe Base Specification, "Get Log Page"; NVMe over Fabrics, "Discovery Log
//! Page"): the Get Log Page command's fields, and the pages this target serves — error
//! information, SMART / health, commands supported and effects, and discovery.

use super::fabrics::put_str;
use super::sqe::Sqe;

/// Log identifier: error information.
pub const LID_ERROR: u8 = 0x01;
/// Log identifier: SMART / health information.
pub const LID_SMART: u8 = 0x02;
/// Log identifier: firmware slot information.
pub const LID_FIRMWARE_SLOT: u8 = 0x03;
/// Log identifier: changed namespace list.
pub const LID_CHANGED_NAMESPACES: u8 = 0x04;
/// Log identifier: commands supported and effects.
pub const LID_EFFECTS: u8 = 0x05;
/// Log identifier: discovery.
pub const LID_DISCOVERY: u8 = 0x70;

/// Bytes of an error information entry.
pub const ERROR_ENTRY_LEN: usize = 64;
/// Bytes of the SMART / health log.
pub const SMART_LEN: usize = 512;
/// Bytes of the firmware slot log.
pub const FIRMWARE_SLOT_LEN: usize = 512;
/// Bytes of the changed namespace list.
pub const CHANGED_NAMESPACES_LEN: usize = 4096;
/// Bytes of the commands supported and effects log.
pub const EFFECTS_LEN: usize = 4096;
/// Bytes of the discovery log's header, and of each of its entries.
pub const DISCOVERY_RECORD_LEN: usize = 1024;

/// The fields of a Get Log Page command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GetLogPage {
    /// Log identifier.
    pub lid: u8,
    /// Log specific field.
    pub lsp: u8,
    /// Retain asynchronous event.
    pub rae: bool,
    /// Bytes asked for: (NUMD + 1) dwords.
    pub len: u64,
    /// Byte offset into the page.
    pub offset: u64,
}

impl GetLogPage {
    /// Reads the fields of a Get Log Page command.
    pub fn parse(sqe: &Sqe) -> GetLogPage {
        let cdw10 = sqe.dword(10);
        let numd = u64::from(cdw10 >> 16) | u64::from(sqe.dword(11) & 0xFFFF) << 16;
        GetLogPage {
            lid: cdw10 as u8,
            lsp: (cdw10 >> 8) as u8 & 0x7F,
            rae: cdw10 & 1 << 15 != 0,
            len: (numd + 1) * 4,
            offset: sqe.qword(12),
        }
    }

    /// Writes the fields into `sqe` (a length not a multiple of 4 is rounded up).
    pub fn emit(&self, sqe: &mut Sqe) {
        let numd = self.len.div_ceil(4).saturating_sub(1);
        sqe.set_dword(
            10,
            u32::from(self.lid)
                | u32::from(self.lsp & 0x7F) << 8
                | u32::from(self.rae) << 15
                | (numd as u32) << 16,
        );
        sqe.set_dword(11, (numd >> 16) as u32 & 0xFFFF);
        sqe.set_qword(12, self.offset);
    }
}

/// One error information entry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ErrorEntry {
    /// Error count: a unique, incrementing number.
    pub count: u64,
    /// Submission queue.
    pub sqid: u16,
    /// Command identifier.
    pub cid: u16,
    /// Status field (as in the completion).
    pub status_field: u16,
    /// Parameter error location (byte offset in the command), 0xFFFF if none.
    pub location: u16,
    /// LBA.
    pub lba: u64,
    /// Namespace.
    pub nsid: u32,
}

impl ErrorEntry {
    /// The 64 bytes.
    pub fn emit(&self) -> [u8; ERROR_ENTRY_LEN] {
        let mut b = [0u8; ERROR_ENTRY_LEN];
        b[0..8].copy_from_slice(&self.count.to_le_bytes());
        b[8..10].copy_from_slice(&self.sqid.to_le_bytes());
        b[10..12].copy_from_slice(&self.cid.to_le_bytes());
        b[12..14].copy_from_slice(&self.status_field.to_le_bytes());
        b[14..16].copy_from_slice(&self.location.to_le_bytes());
        b[16..24].copy_from_slice(&self.lba.to_le_bytes());
        b[24..28].copy_from_slice(&self.nsid.to_le_bytes());
        b
    }

    /// Parses an entry; `None` if shorter than 64 bytes.
    pub fn parse(b: &[u8]) -> Option<ErrorEntry> {
        let b = b.get(..ERROR_ENTRY_LEN)?;
        let word = |at: usize| u16::from_le_bytes([b[at], b[at + 1]]);
        Some(ErrorEntry {
            count: u64::from_le_bytes(b[0..8].try_into().ok()?),
            sqid: word(8),
            cid: word(10),
            status_field: word(12),
            location: word(14),
            lba: u64::from_le_bytes(b[16..24].try_into().ok()?),
            nsid: u32::from_le_bytes(b[24..28].try_into().ok()?),
        })
    }
}

/// The counters of the SMART / health log this target keeps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Smart {
    /// Composite temperature in kelvin.
    pub temperature: u16,
    /// Available spare, percent.
    pub available_spare: u8,
    /// Thousands of 512-byte units read (rounded up).
    pub data_units_read: u64,
    /// Thousands of 512-byte units written (rounded up).
    pub data_units_written: u64,
    /// Read commands completed.
    pub host_reads: u64,
    /// Write commands completed.
    pub host_writes: u64,
    /// Error log entries over the controller's life.
    pub error_entries: u64,
}

impl Smart {
    /// The 512 bytes (128-bit counters, their upper halves zero).
    pub fn emit(&self) -> Vec<u8> {
        let mut b = vec![0u8; SMART_LEN];
        b[1..3].copy_from_slice(&self.temperature.to_le_bytes());
        b[3] = self.available_spare;
        for (at, value) in [
            (32, self.data_units_read),
            (48, self.data_units_written),
            (64, self.host_reads),
            (80, self.host_writes),
            (176, self.error_entries),
        ] {
            b[at..at + 8].copy_from_slice(&value.to_le_bytes());
        }
        b
    }

    /// Parses the log; `None` if shorter than 512 bytes.
    pub fn parse(b: &[u8]) -> Option<Smart> {
        let b = b.get(..SMART_LEN)?;
        let q = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or_default());
        Some(Smart {
            temperature: u16::from_le_bytes([b[1], b[2]]),
            available_spare: b[3],
            data_units_read: q(32),
            data_units_written: q(48),
            host_reads: q(64),
            host_writes: q(80),
            error_entries: q(176),
        })
    }
}

/// The commands supported and effects log: each of `admin` and `io` opcodes marked
/// "command supported" (CSUPP).
pub fn emit_effects(admin: &[u8], io: &[u8]) -> Vec<u8> {
    let mut b = vec![0u8; EFFECTS_LEN];
    for (base, opcodes) in [(0, admin), (1024, io)] {
        for &opcode in opcodes {
            let at = base + 4 * usize::from(opcode);
            b[at..at + 4].copy_from_slice(&1u32.to_le_bytes());
        }
    }
    b
}

/// Transport type: RDMA.
pub const TRTYPE_RDMA: u8 = 1;
/// Address family: IPv4.
pub const ADRFAM_IPV4: u8 = 1;
/// Address family: IPv6.
pub const ADRFAM_IPV6: u8 = 2;
/// Subsystem type: a referral to another discovery service.
pub const SUBTYPE_DISCOVERY: u8 = 1;
/// Subsystem type: an NVM subsystem.
pub const SUBTYPE_NVME: u8 = 2;
/// RDMA QP service type: reliable connected.
pub const RDMA_QPTYPE_CONNECTED: u8 = 1;
/// RDMA provider type: not specified.
pub const RDMA_PRTYPE_NOT_SPECIFIED: u8 = 1;
/// RDMA connection management service: rdma_cm.
pub const RDMA_CMS_RDMA_CM: u8 = 1;

/// A discovery log entry: where a subsystem is and how to reach it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveryEntry {
    /// Transport type.
    pub trtype: u8,
    /// Address family.
    pub adrfam: u8,
    /// Subsystem type.
    pub subtype: u8,
    /// Transport requirements.
    pub treq: u8,
    /// Port ID.
    pub portid: u16,
    /// Controller ID (0xFFFF: dynamic).
    pub cntlid: u16,
    /// Admin max submission queue size.
    pub asqsz: u16,
    /// Transport service identifier (the port, for RDMA).
    pub trsvcid: String,
    /// The subsystem's NQN.
    pub subnqn: String,
    /// Transport address.
    pub traddr: String,
    /// RDMA: QP service type, provider type, connection management service.
    pub rdma: [u8; 3],
}

impl DiscoveryEntry {
    /// The 1024 bytes.
    pub fn emit(&self) -> [u8; DISCOVERY_RECORD_LEN] {
        let mut b = [0u8; DISCOVERY_RECORD_LEN];
        b[0] = self.trtype;
        b[1] = self.adrfam;
        b[2] = self.subtype;
        b[3] = self.treq;
        b[4..6].copy_from_slice(&self.portid.to_le_bytes());
        b[6..8].copy_from_slice(&self.cntlid.to_le_bytes());
        b[8..10].copy_from_slice(&self.asqsz.to_le_bytes());
        put_str(&mut b[32..63], &self.trsvcid);
        put_str(&mut b[256..511], &self.subnqn);
        put_str(&mut b[512..767], &self.traddr);
        b[768..771].copy_from_slice(&self.rdma);
        b
    }

    /// Parses an entry; `None` if shorter than 1024 bytes.
    pub fn parse(b: &[u8]) -> Option<DiscoveryEntry> {
        let b = b.get(..DISCOVERY_RECORD_LEN)?;
        let text = |field: &[u8]| {
            let end = field.iter().position(|&c| c == 0).unwrap_or(field.len());
            String::from_utf8_lossy(&field[..end])
                .trim_end()
                .to_string()
        };
        Some(DiscoveryEntry {
            trtype: b[0],
            adrfam: b[1],
            subtype: b[2],
            treq: b[3],
            portid: u16::from_le_bytes([b[4], b[5]]),
            cntlid: u16::from_le_bytes([b[6], b[7]]),
            asqsz: u16::from_le_bytes([b[8], b[9]]),
            trsvcid: text(&b[32..64]),
            subnqn: text(&b[256..512]),
            traddr: text(&b[512..768]),
            rdma: [b[768], b[769], b[770]],
        })
    }
}

/// The whole discovery log: header (generation counter, number of records, format 0),
/// then the entries.
pub fn emit_discovery(generation: u64, entries: &[DiscoveryEntry]) -> Vec<u8> {
    let mut b = vec![0u8; DISCOVERY_RECORD_LEN * (1 + entries.len())];
    b[0..8].copy_from_slice(&generation.to_le_bytes());
    b[8..16].copy_from_slice(&(entries.len() as u64).to_le_bytes());
    for (slot, entry) in b[DISCOVERY_RECORD_LEN..]
        .chunks_exact_mut(DISCOVERY_RECORD_LEN)
        .zip(entries)
    {
        slot.copy_from_slice(&entry.emit());
    }
    b
}

/// The discovery log header's generation counter and number of records.
pub fn parse_discovery_header(b: &[u8]) -> Option<(u64, u64)> {
    let b = b.get(..16)?;
    Some((
        u64::from_le_bytes(b[0..8].try_into().ok()?),
        u64::from_le_bytes(b[8..16].try_into().ok()?),
    ))
}

/// Bytes `offset..offset + len` of `page`, zeros past its end, as a controller returns a
/// log page read partly beyond it; `None` if `offset` is past the end.
pub fn window(page: &[u8], offset: u64, len: usize) -> Option<Vec<u8>> {
    let start = usize::try_from(offset)
        .ok()
        .filter(|&at| at <= page.len())?;
    let mut out = vec![0u8; len];
    let have = (page.len() - start).min(len);
    out[..have].copy_from_slice(&page[start..start + have]);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn get_log_page_fields_round_trip() {
        let command = GetLogPage {
            lid: LID_DISCOVERY,
            lsp: 0,
            rae: true,
            len: 4 << 20,
            offset: 1024,
        };
        let mut sqe = Sqe::new(0x02, 1);
        command.emit(&mut sqe);
        assert_eq!(GetLogPage::parse(&sqe), command);
    }

    #[test]
    fn pages_round_trip() {
        let entry = DiscoveryEntry {
            trtype: TRTYPE_RDMA,
            adrfam: ADRFAM_IPV4,
            subtype: SUBTYPE_NVME,
            treq: 0,
            portid: 1,
            cntlid: 0xFFFF,
            asqsz: 32,
            trsvcid: "4420".into(),
            subnqn: "nqn.2026-12.io.roce-xdp:ram0".into(),
            traddr: "10.88.0.1".into(),
            rdma: [
                RDMA_QPTYPE_CONNECTED,
                RDMA_PRTYPE_NOT_SPECIFIED,
                RDMA_CMS_RDMA_CM,
            ],
        };
        let log = emit_discovery(7, std::slice::from_ref(&entry));
        assert_eq!(parse_discovery_header(&log), Some((7, 1)));
        assert_eq!(DiscoveryEntry::parse(&log[1024..]), Some(entry));
        let error = ErrorEntry {
            count: 3,
            sqid: 1,
            cid: 9,
            status_field: 0x8100,
            location: 40,
            lba: 5,
            nsid: 1,
        };
        assert_eq!(ErrorEntry::parse(&error.emit()), Some(error));
        let smart = Smart {
            host_reads: 10,
            data_units_read: 1,
            ..Smart::default()
        };
        assert_eq!(Smart::parse(&smart.emit()), Some(smart));
        assert_eq!(window(&[1, 2, 3], 1, 4), Some(vec![2, 3, 0, 0]));
        assert_eq!(window(&[1, 2, 3], 4, 1), None);
    }
}

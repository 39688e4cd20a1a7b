//! Identify data (NVMe Base Specification, "Identify"): the controller (CNS 01h), a
//! namespace (CNS 00h), the active namespace list (CNS 02h) and a namespace's
//! identification descriptors (CNS 03h). 4096 bytes each; the fields a host and a target
//! of the RDMA transport use, at the offsets Linux's `struct nvme_id_ctrl` and
//! `struct nvme_id_ns` give them.

use super::fabrics::put_str;

/// Bytes of every Identify data structure.
pub const IDENTIFY_LEN: usize = 4096;

/// CNS: Identify Namespace.
pub const CNS_NAMESPACE: u8 = 0x00;
/// CNS: Identify Controller.
pub const CNS_CONTROLLER: u8 = 0x01;
/// CNS: Active Namespace ID list.
pub const CNS_ACTIVE_NAMESPACES: u8 = 0x02;
/// CNS: Namespace Identification Descriptor list.
pub const CNS_NAMESPACE_DESCRIPTORS: u8 = 0x03;
/// CNS: I/O Command Set specific Identify Controller (for the NVM command set: all zeros).
pub const CNS_CONTROLLER_NVM: u8 = 0x06;

/// Controller type: an I/O controller.
pub const CONTROLLER_IO: u8 = 1;
/// Controller type: a discovery controller.
pub const CONTROLLER_DISCOVERY: u8 = 2;

/// SGLS bits: SGLs supported (byte aligned).
pub const SGLS_SUPPORTED: u32 = 1;
/// SGLS bit: keyed SGL data block descriptors.
pub const SGLS_KEYED: u32 = 1 << 2;
/// SGLS bit: offsets in data block descriptors (in-capsule data).
pub const SGLS_OFFSETS: u32 = 1 << 20;

/// ONCS bit: Dataset Management.
pub const ONCS_DSM: u16 = 1 << 2;
/// ONCS bit: Write Zeroes.
pub const ONCS_WRITE_ZEROES: u16 = 1 << 3;

/// Namespace identifier type: NGUID (16 bytes).
pub const NIDT_NGUID: u8 = 0x02;
/// Namespace identifier type: UUID (16 bytes).
pub const NIDT_UUID: u8 = 0x03;
/// Namespace identifier type: command set identifier (1 byte).
pub const NIDT_CSI: u8 = 0x04;

/// Identify Controller data.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IdentifyController {
    /// PCI vendor ID.
    pub vid: u16,
    /// Serial number (20 ASCII characters).
    pub serial: String,
    /// Model number (40).
    pub model: String,
    /// Firmware revision (8).
    pub firmware: String,
    /// Recommended arbitration burst.
    pub rab: u8,
    /// Multi-path I/O and namespace sharing capabilities.
    pub cmic: u8,
    /// Maximum data transfer size: 2^mdts pages of 4 KiB (0: no limit).
    pub mdts: u8,
    /// Controller ID.
    pub cntlid: u16,
    /// Version (as the VS property).
    pub ver: u32,
    /// Optional asynchronous events supported.
    pub oaes: u32,
    /// Controller attributes.
    pub ctratt: u32,
    /// Controller type (1 I/O, 2 discovery).
    pub cntrltype: u8,
    /// Optional admin command support.
    pub oacs: u16,
    /// Abort command limit, 0's based.
    pub acl: u8,
    /// Asynchronous event request limit, 0's based.
    pub aerl: u8,
    /// Firmware updates.
    pub frmw: u8,
    /// Log page attributes.
    pub lpa: u8,
    /// Error log page entries, 0's based.
    pub elpe: u8,
    /// Keep alive support: granularity in 100 ms units (0: none).
    pub kas: u16,
    /// Submission queue entry size (required and maximum, log2 in each nibble).
    pub sqes: u8,
    /// Completion queue entry size.
    pub cqes: u8,
    /// Maximum outstanding commands.
    pub maxcmd: u16,
    /// Number of namespaces (the largest NSID).
    pub nn: u32,
    /// Optional NVM command support.
    pub oncs: u16,
    /// Volatile write cache.
    pub vwc: u8,
    /// SGL support.
    pub sgls: u32,
    /// Maximum number of allowed namespaces.
    pub mnan: u32,
    /// The subsystem's NQN.
    pub subnqn: String,
    /// I/O queue command capsule supported size, in 16-byte units.
    pub ioccsz: u32,
    /// I/O queue response capsule supported size, in 16-byte units.
    pub iorcsz: u32,
    /// In-capsule data offset, in 16-byte units.
    pub icdoff: u16,
    /// Maximum SGL data block descriptors.
    pub msdbd: u8,
}

fn le16(bytes: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([bytes[at], bytes[at + 1]])
}

fn le32(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

fn le64(bytes: &[u8], at: usize) -> u64 {
    u64::from(le32(bytes, at)) | u64::from(le32(bytes, at + 4)) << 32
}

/// A space-padded ASCII field's text, padding and NULs trimmed.
fn ascii(field: &[u8]) -> String {
    String::from_utf8_lossy(field)
        .trim_end_matches([' ', '\0'])
        .to_string()
}

/// `text` space-padded into `field`.
fn put_padded(field: &mut [u8], text: &str) {
    field.fill(b' ');
    put_str(field, text);
}

impl IdentifyController {
    /// The 4096 bytes.
    pub fn emit(&self) -> Vec<u8> {
        let mut b = vec![0u8; IDENTIFY_LEN];
        b[0..2].copy_from_slice(&self.vid.to_le_bytes());
        put_padded(&mut b[4..24], &self.serial);
        put_padded(&mut b[24..64], &self.model);
        put_padded(&mut b[64..72], &self.firmware);
        b[72] = self.rab;
        b[76] = self.cmic;
        b[77] = self.mdts;
        b[78..80].copy_from_slice(&self.cntlid.to_le_bytes());
        b[80..84].copy_from_slice(&self.ver.to_le_bytes());
        b[92..96].copy_from_slice(&self.oaes.to_le_bytes());
        b[96..100].copy_from_slice(&self.ctratt.to_le_bytes());
        b[111] = self.cntrltype;
        b[256..258].copy_from_slice(&self.oacs.to_le_bytes());
        b[258] = self.acl;
        b[259] = self.aerl;
        b[260] = self.frmw;
        b[261] = self.lpa;
        b[262] = self.elpe;
        b[320..322].copy_from_slice(&self.kas.to_le_bytes());
        b[512] = self.sqes;
        b[513] = self.cqes;
        b[514..516].copy_from_slice(&self.maxcmd.to_le_bytes());
        b[516..520].copy_from_slice(&self.nn.to_le_bytes());
        b[520..522].copy_from_slice(&self.oncs.to_le_bytes());
        b[525] = self.vwc;
        b[536..540].copy_from_slice(&self.sgls.to_le_bytes());
        b[540..544].copy_from_slice(&self.mnan.to_le_bytes());
        put_str(&mut b[768..1023], &self.subnqn);
        b[1792..1796].copy_from_slice(&self.ioccsz.to_le_bytes());
        b[1796..1800].copy_from_slice(&self.iorcsz.to_le_bytes());
        b[1800..1802].copy_from_slice(&self.icdoff.to_le_bytes());
        b[1803] = self.msdbd;
        b
    }

    /// Parses the data; `None` if shorter than 4096 bytes.
    pub fn parse(b: &[u8]) -> Option<IdentifyController> {
        if b.len() < IDENTIFY_LEN {
            return None;
        }
        Some(IdentifyController {
            vid: le16(b, 0),
            serial: ascii(&b[4..24]),
            model: ascii(&b[24..64]),
            firmware: ascii(&b[64..72]),
            rab: b[72],
            cmic: b[76],
            mdts: b[77],
            cntlid: le16(b, 78),
            ver: le32(b, 80),
            oaes: le32(b, 92),
            ctratt: le32(b, 96),
            cntrltype: b[111],
            oacs: le16(b, 256),
            acl: b[258],
            aerl: b[259],
            frmw: b[260],
            lpa: b[261],
            elpe: b[262],
            kas: le16(b, 320),
            sqes: b[512],
            cqes: b[513],
            maxcmd: le16(b, 514),
            nn: le32(b, 516),
            oncs: le16(b, 520),
            vwc: b[525],
            sgls: le32(b, 536),
            mnan: le32(b, 540),
            subnqn: ascii(&b[768..1024]),
            ioccsz: le32(b, 1792),
            iorcsz: le32(b, 1796),
            icdoff: le16(b, 1800),
            msdbd: b[1803],
        })
    }

    /// Largest transfer in bytes (`None`: no limit).
    pub fn max_transfer(&self) -> Option<u64> {
        (self.mdts != 0).then(|| 4096u64 << self.mdts.min(40))
    }

    /// In-capsule data an I/O command may carry, in bytes.
    pub fn in_capsule_len(&self) -> u32 {
        (self.ioccsz.saturating_mul(16)).saturating_sub(super::sqe::SQE_LEN as u32)
    }
}

/// Identify Namespace data.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IdentifyNamespace {
    /// Size in logical blocks.
    pub nsze: u64,
    /// Capacity in logical blocks.
    pub ncap: u64,
    /// Blocks in use.
    pub nuse: u64,
    /// Features.
    pub nsfeat: u8,
    /// Number of LBA formats, 0's based.
    pub nlbaf: u8,
    /// Formatted LBA size: the LBA format in use.
    pub flbas: u8,
    /// Multi-path I/O and sharing.
    pub nmic: u8,
    /// Deallocate logical block features.
    pub dlfeat: u8,
    /// Attributes (bit 0: write protected).
    pub nsattr: u8,
    /// Namespace globally unique identifier.
    pub nguid: [u8; 16],
    /// IEEE extended unique identifier.
    pub eui64: [u8; 8],
    /// log2 of the block size of LBA format 0.
    pub lba_shift: u8,
}

impl IdentifyNamespace {
    /// The 4096 bytes (one LBA format, without metadata).
    pub fn emit(&self) -> Vec<u8> {
        let mut b = vec![0u8; IDENTIFY_LEN];
        b[0..8].copy_from_slice(&self.nsze.to_le_bytes());
        b[8..16].copy_from_slice(&self.ncap.to_le_bytes());
        b[16..24].copy_from_slice(&self.nuse.to_le_bytes());
        b[24] = self.nsfeat;
        b[25] = self.nlbaf;
        b[26] = self.flbas;
        b[30] = self.nmic;
        b[33] = self.dlfeat;
        b[99] = self.nsattr;
        b[104..120].copy_from_slice(&self.nguid);
        b[120..128].copy_from_slice(&self.eui64);
        b[130] = self.lba_shift;
        b
    }

    /// Parses the data; `None` if shorter than 4096 bytes. The block size is that of the
    /// LBA format FLBAS selects.
    pub fn parse(b: &[u8]) -> Option<IdentifyNamespace> {
        if b.len() < IDENTIFY_LEN {
            return None;
        }
        let format = usize::from(b[26] & 0x0F | (b[26] & 0x60) >> 1);
        let mut nguid = [0u8; 16];
        nguid.copy_from_slice(&b[104..120]);
        let mut eui64 = [0u8; 8];
        eui64.copy_from_slice(&b[120..128]);
        Some(IdentifyNamespace {
            nsze: le64(b, 0),
            ncap: le64(b, 8),
            nuse: le64(b, 16),
            nsfeat: b[24],
            nlbaf: b[25],
            flbas: b[26],
            nmic: b[30],
            dlfeat: b[33],
            nsattr: b[99],
            nguid,
            eui64,
            lba_shift: b[128 + 4 * format + 2],
        })
    }
}

/// The active namespace list: the NSIDs of `active` above `after`, ascending, at most 1024.
pub fn emit_namespace_list(active: impl IntoIterator<Item = u32>, after: u32) -> Vec<u8> {
    let mut b = vec![0u8; IDENTIFY_LEN];
    let mut ids: Vec<u32> = active.into_iter().filter(|&id| id > after).collect();
    ids.sort_unstable();
    for (slot, id) in b.chunks_exact_mut(4).zip(ids) {
        slot.copy_from_slice(&id.to_le_bytes());
    }
    b
}

/// The NSIDs of an active namespace list.
pub fn parse_namespace_list(b: &[u8]) -> Vec<u32> {
    b.chunks_exact(4)
        .map(|id| u32::from_le_bytes([id[0], id[1], id[2], id[3]]))
        .take_while(|&id| id != 0)
        .collect()
}

/// A namespace's identification descriptors: (type, identifier) pairs.
pub fn emit_descriptors(descriptors: &[(u8, &[u8])]) -> Vec<u8> {
    let mut b = vec![0u8; IDENTIFY_LEN];
    let mut at = 0;
    for &(kind, id) in descriptors {
        if at + 4 + id.len() > IDENTIFY_LEN {
            break;
        }
        b[at] = kind;
        b[at + 1] = id.len() as u8;
        b[at + 4..at + 4 + id.len()].copy_from_slice(id);
        at += 4 + id.len();
    }
    b
}

/// The (type, identifier) pairs of a descriptor list, up to the first of type 0 or one
/// that runs past the end.
pub fn parse_descriptors(b: &[u8]) -> Vec<(u8, Vec<u8>)> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + 4 <= b.len() && b[at] != 0 {
        let len = usize::from(b[at + 1]);
        let Some(id) = b.get(at + 4..at + 4 + len) else {
            break;
        };
        out.push((b[at], id.to_vec()));
        at += 4 + len;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controller_and_namespace_round_trip() {
        let controller = IdentifyController {
            serial: "0123456789abcdef".into(),
            model: "roce-xdp".into(),
            firmware: "0.1.0".into(),
            mdts: 5,
            cntlid: 3,
            ver: 0x10300,
            kas: 10,
            sqes: 0x66,
            cqes: 0x44,
            maxcmd: 128,
            nn: 1,
            sgls: SGLS_SUPPORTED | SGLS_KEYED | SGLS_OFFSETS,
            subnqn: "nqn.2026-12.io.roce-xdp:ram0".into(),
            ioccsz: (64 + 8192) / 16,
            iorcsz: 1,
            ..IdentifyController::default()
        };
        assert_eq!(
            IdentifyController::parse(&controller.emit()),
            Some(controller.clone())
        );
        assert_eq!(controller.max_transfer(), Some(128 << 10));
        assert_eq!(controller.in_capsule_len(), 8192);
        let namespace = IdentifyNamespace {
            nsze: 131072,
            ncap: 131072,
            nuse: 131072,
            nmic: 1,
            nguid: [9; 16],
            lba_shift: 9,
            ..IdentifyNamespace::default()
        };
        assert_eq!(IdentifyNamespace::parse(&namespace.emit()), Some(namespace));
    }

    #[test]
    fn lists_round_trip() {
        assert_eq!(
            parse_namespace_list(&emit_namespace_list([3, 1, 2], 1)),
            [2, 3]
        );
        let uuid = [5u8; 16];
        let list = emit_descriptors(&[(NIDT_UUID, &uuid), (NIDT_CSI, &[0])]);
        assert_eq!(
            parse_descriptors(&list),
            [(NIDT_UUID, uuid.to_vec()), (NIDT_CSI, vec![0])]
        );
    }
}

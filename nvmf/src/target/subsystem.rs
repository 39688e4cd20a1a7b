//! Subsystems: an NQN, its namespaces, and which hosts may connect to it.

use std::io;

use roce_verbs::Pd;

use super::storage::{Backing, Storage};
use crate::wire::fabrics::valid_nqn;
use crate::wire::identify::{IdentifyNamespace, NIDT_CSI, NIDT_NGUID, NIDT_UUID};

/// Which hosts may connect to a subsystem, by host NQN.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostAccess {
    /// Any host.
    Any,
    /// Only these hosts.
    Only(Vec<String>),
}

impl HostAccess {
    /// Whether the host `hostnqn` may connect.
    pub fn allows(&self, hostnqn: &str) -> bool {
        match self {
            HostAccess::Any => true,
            HostAccess::Only(hosts) => hosts.iter().any(|host| host == hostnqn),
        }
    }
}

/// A subsystem as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubsystemConfig {
    /// Its NQN.
    pub nqn: String,
    /// Its namespaces, NSID 1 first.
    pub namespaces: Vec<Backing>,
    /// Who may connect.
    pub hosts: HostAccess,
}

/// Block size of every namespace: 512 bytes, as Linux's RAM disks and most devices have.
pub const BLOCK_SHIFT: u8 = 9;

/// One namespace: its storage and what a host is told about it.
pub(crate) struct Namespace {
    pub(crate) nsid: u32,
    pub(crate) storage: Storage,
    /// Size in blocks.
    pub(crate) blocks: u64,
    pub(crate) nguid: [u8; 16],
    pub(crate) uuid: [u8; 16],
    pub(crate) counters: Counters,
}

/// What the SMART log reports of a namespace.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Counters {
    pub(crate) reads: u64,
    pub(crate) writes: u64,
    pub(crate) blocks_read: u64,
    pub(crate) blocks_written: u64,
}

/// A subsystem, opened.
pub(crate) struct Subsystem {
    pub(crate) nqn: String,
    pub(crate) serial: String,
    pub(crate) hosts: HostAccess,
    pub(crate) namespaces: Vec<Namespace>,
}

impl Subsystem {
    /// Opens the namespaces' storage (RAM is registered on `pd`).
    pub(crate) fn open(config: &SubsystemConfig, pd: &Pd) -> io::Result<Subsystem> {
        if !valid_nqn(&config.nqn) {
            return Err(io::Error::other(format!(
                "`{}` is not an NQN (nqn.YYYY-MM.reverse.domain:name, at most 223 bytes)",
                config.nqn
            )));
        }
        let mut namespaces = Vec::new();
        for (index, backing) in config.namespaces.iter().enumerate() {
            let (storage, bytes) = Storage::open(backing, pd)?;
            let blocks = bytes >> BLOCK_SHIFT;
            if blocks == 0 {
                return Err(io::Error::other(format!(
                    "namespace {} of {} holds no whole {}-byte block",
                    index + 1,
                    config.nqn,
                    1 << BLOCK_SHIFT
                )));
            }
            let nsid = index as u32 + 1;
            namespaces.push(Namespace {
                nsid,
                storage,
                blocks,
                nguid: identifier(&config.nqn, nsid, 0x6e67),
                uuid: uuid(identifier(&config.nqn, nsid, 0x7575)),
                counters: Counters::default(),
            });
        }
        let serial = identifier(&config.nqn, 0, 0x736e);
        Ok(Subsystem {
            nqn: config.nqn.clone(),
            serial: serial[..10].iter().map(|b| format!("{b:02x}")).collect(),
            hosts: config.hosts.clone(),
            namespaces,
        })
    }

    /// The namespace `nsid`.
    pub(crate) fn namespace(&self, nsid: u32) -> Option<&Namespace> {
        self.namespaces.iter().find(|ns| ns.nsid == nsid)
    }

    /// The namespace `nsid`, to count its I/O.
    pub(crate) fn namespace_mut(&mut self, nsid: u32) -> Option<&mut Namespace> {
        self.namespaces.iter_mut().find(|ns| ns.nsid == nsid)
    }

    /// Whether any namespace is a file (then the volatile write cache is real).
    pub(crate) fn has_files(&self) -> bool {
        self.namespaces
            .iter()
            .any(|ns| matches!(ns.storage, Storage::File(_)))
    }
}

impl Namespace {
    /// Identify Namespace data.
    pub(crate) fn identify(&self) -> IdentifyNamespace {
        IdentifyNamespace {
            nsze: self.blocks,
            ncap: self.blocks,
            nuse: self.blocks,
            // Shared by every controller of the subsystem.
            nmic: 1,
            nguid: self.nguid,
            lba_shift: BLOCK_SHIFT,
            ..IdentifyNamespace::default()
        }
    }

    /// Its identification descriptors: NGUID, UUID, and the NVM command set.
    pub(crate) fn descriptors(&self) -> Vec<u8> {
        crate::wire::identify::emit_descriptors(&[
            (NIDT_NGUID, &self.nguid),
            (NIDT_UUID, &self.uuid),
            (NIDT_CSI, &[0]),
        ])
    }

    /// Bytes.
    pub(crate) fn len(&self) -> u64 {
        self.blocks << BLOCK_SHIFT
    }
}

/// 16 bytes that stay the same for the same subsystem, namespace and purpose across runs
/// (FNV-1a, twice): a host recognises its namespaces after the target restarts.
fn identifier(nqn: &str, nsid: u32, purpose: u16) -> [u8; 16] {
    let hash = |seed: u64| {
        let mut h = 0xcbf2_9ce4_8422_2325u64 ^ seed;
        for byte in nqn
            .bytes()
            .chain(nsid.to_le_bytes())
            .chain(purpose.to_le_bytes())
        {
            h = (h ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
        }
        h
    };
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&hash(1).to_be_bytes());
    out[8..].copy_from_slice(&hash(2).to_be_bytes());
    out
}

/// An RFC 9562 version 8 (custom) UUID of these bytes.
fn uuid(mut bytes: [u8; 16]) -> [u8; 16] {
    bytes[6] = bytes[6] & 0x0F | 0x80;
    bytes[8] = bytes[8] & 0x3F | 0x80;
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_differ_by_namespace_and_purpose_and_stay_put() {
        let a = identifier("nqn.x", 1, 0x6e67);
        assert_eq!(a, identifier("nqn.x", 1, 0x6e67));
        assert_ne!(a, identifier("nqn.x", 2, 0x6e67));
        assert_ne!(a, identifier("nqn.y", 1, 0x6e67));
        assert_ne!(a, identifier("nqn.x", 1, 0x7575));
        let u = uuid(a);
        assert_eq!(u[6] >> 4, 8);
        assert_eq!(u[8] >> 6, 2);
    }

    #[test]
    fn host_access() {
        assert!(HostAccess::Any.allows("nqn.any"));
        let only = HostAccess::Only(vec!["nqn.a".into()]);
        assert!(only.allows("nqn.a") && !only.allows("nqn.b"));
    }
}

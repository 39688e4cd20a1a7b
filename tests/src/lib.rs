//! Support for the cross-crate tests: the bundled captures of real rxe traffic and the
//! per-opcode counts their README promises.

pub mod netcheck;
pub mod rdma;
pub mod rxe_vm;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use roce_provider::afxdp::AfXdpBackend;
use roce_provider::netns::{self, Netns};
use roce_provider::xdp::XdpMode;

/// Opens the AF_XDP backend on `interface` from a thread inside `ns` (a socket belongs to
/// the namespace it was bound in, and can be used from anywhere after).
pub fn afxdp_in(ns: &Netns, interface: &str, mode: XdpMode) -> AfXdpBackend {
    let (name, interface) = (ns.name.clone(), interface.to_string());
    let opened = std::thread::spawn(move || {
        netns::enter(&name)?;
        AfXdpBackend::open(&interface, mode)
    })
    .join();
    opened.expect("opening thread").expect("AF_XDP socket")
}

/// The folder of bundled pcaps (a copy of the team's `shared/captures`).
pub fn captures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("captures")
}

/// Every capture file (`.pcap`, pcap or pcapng inside) in [`captures_dir`], sorted by name.
pub fn capture_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(captures_dir())
        .expect("captures folder")
        .map(|entry| entry.expect("directory entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "pcap"))
        .collect();
    files.sort();
    files
}

/// The frames of a capture file, in order.
pub fn read_frames(path: &Path) -> Vec<Vec<u8>> {
    let frames = roce_provider::capture::read_frames(path);
    let frames = frames.unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    frames.into_iter().map(|frame| frame.data).collect()
}

/// What the captures README says a file holds: count per opcode value, and the opcode
/// names it spells out.
#[derive(Debug, Default)]
pub struct Expected {
    /// Frames per BTH opcode.
    pub counts: BTreeMap<u8, usize>,
    /// Opcode names given in the README, such as `RC_SEND_FIRST` for 0.
    pub names: BTreeMap<u8, String>,
}

/// Reads the table in the captures README: rows `| file.pcap | what ran | 0 RC_SEND_FIRST=20,
/// 1=400, ... |`.
pub fn expected_counts() -> BTreeMap<String, Expected> {
    let readme = std::fs::read_to_string(captures_dir().join("README.md")).expect("README");
    let mut table = BTreeMap::new();
    for line in readme.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let [_, file, _, counts, ..] = cells[..] else {
            continue;
        };
        if !file.ends_with(".pcap") {
            continue;
        }
        let mut expected = Expected::default();
        for item in counts.split(',') {
            let (key, count) = item.trim().split_once('=').expect("OPCODE[ NAME]=COUNT");
            let mut key = key.split_whitespace();
            let opcode: u8 = key.next().expect("opcode").parse().expect("decimal opcode");
            if let Some(name) = key.next() {
                expected.names.insert(opcode, name.to_string());
            }
            expected
                .counts
                .insert(opcode, count.parse().expect("count"));
        }
        table.insert(file.to_string(), expected);
    }
    table
}

//! The rxe VM (`roce_tests::rxe_vm`: Linux soft-RoCE and rdma-core 44 in QEMU, reached from
//! the `rxe-host` namespace, `host0` 10.88.0.1; VM 1 is 10.88.0.11) and what its captures show.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;

use roce_wire::aeth::Syndrome;
use roce_wire::frame::IpRepr;
use roce_wire::{Frame, FrameRepr};

/// Per sender (IPv4 source): request packets sent again, and NAKs (sequence, RNR, errors).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Recovery {
    pub retransmitted: usize,
    pub naks: usize,
}

/// [`Recovery`] of each sender in a capture: a request whose PSN is not beyond the highest
/// its flow (sender, destination QP) sent before was sent again.
pub fn recovery_by_sender(pcap: &Path) -> HashMap<Ipv4Addr, Recovery> {
    let mut highest = HashMap::new();
    let mut found: HashMap<_, Recovery> = HashMap::new();
    captured_frames(pcap, |src, repr| {
        let entry = found.entry(src).or_default();
        if repr.bth.opcode.info().is_request {
            let flow = (src, repr.bth.dest_qpn);
            match highest.get(&flow) {
                Some(&top) if repr.bth.psn <= top => entry.retransmitted += 1,
                _ => {
                    highest.insert(flow, repr.bth.psn);
                }
            }
        } else if let Some(aeth) = repr.ext.aeth {
            if !matches!(aeth.syndrome, Syndrome::Ack(_)) {
                entry.naks += 1;
            }
        }
    });
    found
}

/// Every RoCEv2-over-IPv4 frame of a capture, with its sender.
pub fn captured_frames(pcap: &Path, mut each: impl FnMut(Ipv4Addr, &FrameRepr)) {
    for captured in roce_provider::capture::read_frames(pcap).expect("read the capture") {
        let Ok(repr) = Frame::new_checked(&captured.data[..]).and_then(|f| FrameRepr::parse(&f))
        else {
            continue;
        };
        if let IpRepr::V4(ip) = repr.ip {
            each(ip.src, &repr);
        }
    }
}

/// Where a capture is and its last `count` frames, decoded by `roce dump`.
pub fn last_frames(pcap: &Path, count: usize) -> String {
    let dump = Command::new(env!("CARGO_BIN_EXE_roce"))
        .arg("dump")
        .arg(pcap)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let lines: Vec<&str> = dump.lines().collect();
    let tail = lines[lines.len().saturating_sub(count)..].join("\n");
    format!("capture {}, last frames:\n{tail}", pcap.display())
}

/// Where rxe-peer.sh keeps its state (`$RXE_DIR`).
fn rxe_dir() -> PathBuf {
    std::env::var_os("RXE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
            PathBuf::from(home).join(".cache/rxe-peer")
        })
}

/// Where rxe-peer.sh keeps the capture `name` (`capture-start NAME`).
pub fn capture_path(name: &str) -> PathBuf {
    rxe_dir().join("captures").join(format!("{name}.pcap"))
}

/// The folder VM 1 sees as `/host` (a file put here runs in the VM as `/host/NAME`).
pub fn vm_share() -> PathBuf {
    rxe_dir().join("run/vm1/share")
}

//! The rxe VM (../shared/rxe-peer): Linux soft-RoCE and rdma-core 44 in QEMU, reached from
//! the `rxe-host` namespace (`host0`, 10.88.0.1); VM 1 is 10.88.0.11.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use roce_provider::netns::{is_root, prerequisite};
use roce_wire::aeth::Syndrome;
use roce_wire::frame::IpRepr;
use roce_wire::{Frame, FrameRepr};

use super::text;

/// The rxe-peer script, if this checkout sits where the session's shared tools are.
fn rxe_peer() -> Option<PathBuf> {
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/rxe-peer/rxe-peer.sh");
    script.exists().then_some(script)
}

/// VM 1, powered off (with its bridge's loss removed) when dropped.
pub struct Vm(PathBuf);

impl Vm {
    /// `rxe-peer.sh ARGS...`.
    pub fn run(&self, args: &[&str]) -> Output {
        Command::new("bash")
            .arg(&self.0)
            .args(args)
            .output()
            .expect("run rxe-peer.sh")
    }

    /// (Re)starts VM 1 with the given netdev MTU (9000 gives rxe path MTU 4096).
    pub fn start(&self, mtu: &str) {
        let _ = self.run(&["stop"]);
        let started = Command::new("bash")
            .arg(&self.0)
            .args(["start", "1"])
            .env("RXE_MTU", mtu)
            .output()
            .expect("run rxe-peer.sh start");
        assert!(
            started.status.success(),
            "rxe-peer start (MTU {mtu}):\n{}",
            text(&started)
        );
    }

    /// Starts `command` in the VM in the background, bounded to `seconds`; its job id.
    pub fn spawn(&self, seconds: u32, command: &str) -> String {
        let job = self.run(&["spawn", "1", "-t", &seconds.to_string(), command]);
        String::from_utf8_lossy(&job.stdout).trim().to_string()
    }

    /// What a job [`spawn`](Self::spawn)ed said, once it ended (or `seconds` passed).
    pub fn wait(&self, job: &str, seconds: u32) -> Output {
        self.run(&["wait", "1", job, &seconds.to_string()])
    }

    /// Runs `command` in the VM, bounded to `seconds`.
    pub fn exec(&self, seconds: u32, command: &str) -> Output {
        self.run(&["exec", "1", "-t", &seconds.to_string(), command])
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        let _ = self.run(&["loss", "0"]);
        let _ = self.run(&["stop"]);
    }
}

/// The VM, built and started with netdev MTU `mtu`, or `None` (and a SKIPPED line) when
/// this is not root or the tool is missing; in CI either is a failure.
pub fn vm(test: &str, mtu: &str) -> Option<Vm> {
    let script = rxe_peer().filter(|_| is_root());
    if !prerequisite(test, "root and ../shared/rxe-peer", script.is_some()) {
        return None;
    }
    let vm = Vm(script?);
    let built = vm.run(&["build"]);
    assert!(built.status.success(), "rxe-peer build:\n{}", text(&built));
    vm.start(mtu);
    Some(vm)
}

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

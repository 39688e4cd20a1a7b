//! UD multicast over our libraries through `roce exec`: Debian's `mckey` (rdmacm-utils,
//! unmodified) between two namespaces over AF_XDP, with the IGMP reports and leaves the
//! kernel sends for our joins seen on the wire; C programs' attach and detach errno,
//! delivery of each datagram to two QPs (the datagrams' shape checked: the group's MAC and
//! address, QPN 0xFFFFFF, rdma_cm's Q_Key), and rdma_cm's join and leave; and `mckey`
//! against the kernel's rdma_cm and rxe in the VM, in both roles, both sides' datagrams of
//! the same shape on the bridge, and the C programs passing unchanged on rxe itself.
//!
//! Needs root (namespaces, AF_XDP), rdmacm-utils, tcpdump and gcc; in CI a missing
//! prerequisite fails the test, elsewhere it is skipped.

mod common;

use std::io::{BufRead, BufReader};
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use roce_provider::netns::{needs_root, prerequisite, veth, Netns};
use roce_tests::rxe_vm::vm;
use roce_wire::frame::IpRepr;
use roce_wire::Opcode;

use common::rxe::captured_frames;
use common::{build_libraries, can_compile_c, compile_c, exec_in, installed, text, VERBS_H};

const QKEY: u32 = 0x0123_4567;

fn root_and(test: &str, programs: &[&str]) -> bool {
    needs_root(test)
        && prerequisite(
            test,
            &format!("rdmacm-utils and tcpdump ({})", programs.join(", ")),
            programs.iter().all(|program| installed(program)),
        )
}

/// Two namespaces joined by a veth pair (`mca` 10.87.0.1, `mcb` 10.87.0.2).
fn two_namespaces() -> (Netns, Netns) {
    let a = Netns::create("roce-mc-a").unwrap();
    let b = Netns::create("roce-mc-b").unwrap();
    veth(
        (&a, "mca", "10.87.0.1/24"),
        (&b, "mcb", "10.87.0.2/24"),
        1500,
    )
    .unwrap();
    (a, b)
}

/// Whether the kernel of the namespace `ns` holds `group` on `interface` (`ip maddr`).
fn kernel_joined(ns: &str, interface: &str, group: &str) -> bool {
    let shown = Command::new("ip")
        .args(["-n", ns, "maddr", "show", "dev", interface])
        .output()
        .unwrap();
    text(&shown)
        .lines()
        .any(|line| line.split_whitespace().collect::<Vec<_>>() == ["inet", group])
}

/// Waits (20 s at most) until `done`; fails naming `what` otherwise.
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "waited 20 s for {what}");
        thread::sleep(Duration::from_millis(20));
    }
}

/// tcpdump writing the IGMP of `interface` in `ns` to `pcap`, once it listens; each packet
/// as it comes (`--immediate-mode`: none left in the kernel's ring when it stops).
fn capture_igmp(ns: &Netns, interface: &str, pcap: &Path) -> Child {
    let mut tcpdump = Command::new("ip")
        .args([
            "netns",
            "exec",
            &ns.name,
            "timeout",
            "60",
            "tcpdump",
            "--immediate-mode",
            "-U",
            "-i",
        ])
        .arg(interface)
        .arg("-w")
        .arg(pcap)
        .arg("igmp")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut said = String::new();
    let stderr = tcpdump.stderr.take().expect("piped");
    BufReader::new(stderr).read_line(&mut said).unwrap();
    assert!(said.contains("listening on"), "tcpdump: {said}");
    tcpdump
}

/// Stops a capture (SIGINT, which timeout(1) passes on) and waits for it.
fn stop(mut capture: Child) {
    let pid = capture.id().to_string();
    let _ = Command::new("kill").args(["-INT", &pid]).status();
    let _ = capture.wait();
}

/// What an IGMPv3 report of a capture says: the sender, and each record's type and group
/// (4, CHANGE_TO_EXCLUDE_MODE with no source, is a join; 3, CHANGE_TO_INCLUDE_MODE with
/// none, a leave).
fn igmp_records(pcap: &Path) -> Vec<(Ipv4Addr, u8, Ipv4Addr)> {
    let at =
        |bytes: &[u8], i: usize| Ipv4Addr::new(bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]);
    let mut records = Vec::new();
    for frame in roce_provider::capture::read_frames(pcap).expect("tcpdump's capture") {
        let bytes = &frame.data;
        if bytes.len() < 34 || bytes[12..14] != [0x08, 0x00] || bytes[23] != 2 {
            continue;
        }
        let igmp = 14 + usize::from(bytes[14] & 0xF) * 4;
        if bytes.get(igmp) != Some(&0x22) || bytes.len() < igmp + 8 {
            continue;
        }
        let count = u16::from_be_bytes([bytes[igmp + 6], bytes[igmp + 7]]);
        let mut record = igmp + 8;
        for _ in 0..count {
            let Some(head) = bytes.get(record..record + 8) else {
                break;
            };
            records.push((at(bytes, 26), head[0], at(head, 4)));
            let sources = usize::from(u16::from_be_bytes([head[2], head[3]]));
            record += 8 + 4 * sources + 4 * usize::from(head[1]);
        }
    }
    records
}

/// mckey's report of a completed run: joined to `group` as rdma_cm on RoCE reports it
/// (no multicast LID, SL 0), every message moved, status 0.
fn check_mckey(side: &str, output: &Output, group: &str) {
    let said = text(output);
    let joined = format!("mckey: joined dgid: ::ffff:{group} mlid 0x0 sl 0");
    assert!(
        output.status.success()
            && said.contains(&joined)
            && said.contains("data transfers complete")
            && said.contains("return status 0"),
        "{side}: {said}"
    );
}

/// The multicast datagrams of a capture from `sender`: each to the group's MAC and address
/// with TTL 64, a UD `opcode` to QPN 0xFFFFFF with rdma_cm's Q_Key, `size` bytes. Returns
/// how many.
fn check_datagrams(
    pcap: &Path,
    sender: Ipv4Addr,
    group: Ipv4Addr,
    opcode: Opcode,
    size: usize,
) -> usize {
    let o = group.octets();
    let group_mac = [0x01, 0x00, 0x5E, o[1] & 0x7F, o[2], o[3]];
    let mut count = 0;
    captured_frames(pcap, |src, repr| {
        let IpRepr::V4(ip) = repr.ip else { return };
        if src != sender || ip.dst != group {
            return;
        }
        count += 1;
        assert_eq!(repr.ethernet.dst, group_mac, "{repr:?}");
        assert_eq!(ip.ttl, 64, "{repr:?}");
        assert_eq!(repr.bth.opcode, opcode, "{repr:?}");
        assert_eq!(repr.bth.dest_qpn, 0xFF_FFFF, "{repr:?}");
        assert_eq!(repr.ext.deth.map(|deth| deth.qkey), Some(QKEY), "{repr:?}");
        assert_eq!(repr.payload.len(), size, "{repr:?}");
    });
    count
}

/// mckey's receiver in A, a full member, and sender in B, a send-only member (`-o`): B's 4
/// datagrams arrive; A's kernel sends IGMPv3 reports joining the group when mckey joins and
/// leaving it when mckey leaves (seen in B); B's sends none, as the kernel's rdma_cm joins
/// a send-only member to no group.
#[test]
fn mckey_talks_to_itself_between_namespaces_with_igmp_on_the_wire() {
    let test = "mckey_talks_to_itself_between_namespaces_with_igmp_on_the_wire";
    if !root_and(test, &["mckey", "tcpdump"]) {
        return;
    }
    build_libraries();
    let (a, b) = two_namespaces();
    let dir = tempfile::tempdir().unwrap();
    let igmp = dir.path().join("igmp.pcap");
    let capture = capture_igmp(&b, "mcb", &igmp);
    let group = "239.1.2.3";
    let flags = ["-m", group, "-C", "4", "-S", "100"];
    let receiver = exec_in(&a, &[&["mckey", "-b", "10.87.0.1"][..], &flags].concat())
        .spawn()
        .unwrap();
    wait_until("the receiver's join", || {
        kernel_joined(&a.name, "mca", group)
    });
    let sender = exec_in(
        &b,
        &[&["mckey", "-s", "-o", "-b", "10.87.0.2"][..], &flags].concat(),
    )
    .output()
    .unwrap();
    let receiver = receiver.wait_with_output().unwrap();
    check_mckey("sender", &sender, group);
    check_mckey("receiver", &receiver, group);
    assert!(!kernel_joined(&a.name, "mca", group) && !kernel_joined(&b.name, "mcb", group));
    let group: Ipv4Addr = group.parse().unwrap();

    // The leave's first report goes out at once; give it a moment to be captured.
    thread::sleep(Duration::from_millis(300));
    stop(capture);
    let records = igmp_records(&igmp);
    let of_host = |host: Ipv4Addr| -> Vec<u8> {
        records
            .iter()
            .filter(|&&(from, _, to)| from == host && to == group)
            .map(|&(_, kind, _)| kind)
            .collect()
    };
    let full = of_host(Ipv4Addr::new(10, 87, 0, 1));
    let join = full.iter().position(|&kind| kind == 4);
    let leave = full.iter().rposition(|&kind| kind == 3);
    assert!(
        matches!((join, leave), (Some(join), Some(leave)) if join < leave),
        "the full member's IGMP records for {group}: {full:?} (all: {records:?})"
    );
    let send_only = of_host(Ipv4Addr::new(10, 87, 0, 2));
    assert!(
        send_only.is_empty(),
        "the send-only member's: {send_only:?}"
    );
}

/// The C program's errno checks; then two QPs attached in A each receive each of B's 8
/// datagrams, every byte checked, to an IPv4 group (the datagrams' shape checked in A's
/// capture) and to an IPv6 one; while they are attached, and only then, A's interface
/// accepts the group's MAC.
#[test]
fn a_c_program_attaches_detaches_and_two_qps_receive_each_datagram() {
    let test = "a_c_program_attaches_detaches_and_two_qps_receive_each_datagram";
    if !needs_root(test) || !can_compile_c(test, "gcc and libibverbs-dev", VERBS_H) {
        return;
    }
    let program = compile_c("mcast", &["-libverbs"]);
    let (a, b) = two_namespaces();
    let errors = exec_in(&a, &[program.path(), "errors", "mca"])
        .output()
        .unwrap();
    assert!(
        errors.status.success() && text(&errors).contains("ok"),
        "{}",
        text(&errors)
    );
    for (group, mac) in [
        ("239.2.2.2", "01:00:5e:02:02:02"),
        ("ff12::2:2", "33:33:00:02:00:02"),
    ] {
        // The receiver's record of what it heard (it closes its device: the file is whole).
        let heard = program.dir.path().join("heard.pcap");
        let mut receiver = exec_in(&a, &[program.path(), "recv", "mca", group, "8"])
            .env("ROCE_PCAP", &heard)
            .spawn()
            .unwrap();
        let mut said = String::new();
        let mut stdout = BufReader::new(receiver.stdout.take().expect("piped"));
        stdout.read_line(&mut said).unwrap();
        assert_eq!(said.trim(), "ready", "{group}");
        // Attached: the interface accepts the group's MAC (no IP membership: only ours).
        assert!(filter_lists(&a.name, "mca", mac), "{group}");
        let sender = exec_in(&b, &[program.path(), "send", "mcb", group, "8"])
            .output()
            .unwrap();
        assert!(sender.status.success(), "{group} sender: {}", text(&sender));
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
        let received = receiver.wait_with_output().unwrap();
        assert!(
            received.status.success() && rest.contains("received 8 8") && rest.ends_with("ok\n"),
            "{group} receiver: {rest}{}",
            text(&received)
        );
        assert!(
            !filter_lists(&a.name, "mca", mac),
            "{group} after the detach"
        );
        // The IPv4 group's datagrams as they came (the IPv6 group's destination is checked
        // in the receiver's GRH).
        if let Ok(group) = group.parse() {
            let b_ip = Ipv4Addr::new(10, 87, 0, 2);
            assert_eq!(
                check_datagrams(&heard, b_ip, group, Opcode::UdSendOnly, 256),
                8
            );
        }
    }
}

/// Whether the interface `interface` of the namespace `ns` accepts the MAC `mac`.
fn filter_lists(ns: &str, interface: &str, mac: &str) -> bool {
    let shown = Command::new("ip")
        .args(["-n", ns, "maddr", "show", "dev", interface])
        .output()
        .unwrap();
    text(&shown)
        .lines()
        .any(|line| line.split_whitespace().take(2).eq(["link", mac]))
}

/// rdma_cm's multicast calls from C (`mcast_cm.c`): librdmacm's and the kernel's refusals,
/// the join event's parameters, the QP attached on a full member's join (not a send-only
/// one's) and detached by the leave, MULTICAST_ERROR when the attach fails.
#[test]
fn rdma_cm_joins_and_leaves_answer_as_librdmacm_and_the_kernel() {
    let test = "rdma_cm_joins_and_leaves_answer_as_librdmacm_and_the_kernel";
    let headers = "/usr/include/rdma/rdma_cma.h";
    if !needs_root(test) || !can_compile_c(test, "gcc and librdmacm-dev", headers) {
        return;
    }
    let program = compile_c("mcast_cm", &["-lrdmacm", "-libverbs"]);
    let (a, _b) = two_namespaces();
    let run = exec_in(&a, &[program.path(), "10.87.0.1"])
        .output()
        .unwrap();
    assert!(
        run.status.success() && String::from_utf8_lossy(&run.stdout).ends_with("ok\n"),
        "{}",
        text(&run)
    );
}

/// `program` over our libraries in the VM's host namespace (`host0`, 10.88.0.1).
fn in_host(program: &[&str]) -> Command {
    build_libraries();
    let mut command = Command::new("ip");
    command
        .args(["netns", "exec", "rxe-host", "timeout", "60"])
        .args([env!("CARGO_BIN_EXE_roce"), "exec", "--"])
        .args(program)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// mckey against the kernel's rdma_cm and rxe in the VM: the VM receives our datagrams,
/// and we receive the VM's. Both sides' datagrams on the bridge have the same shape. And
/// the C programs' expectations (errno, limits, the join event) are rxe's own: they pass
/// in the VM over rdma-core's libraries and rxe, unchanged.
#[test]
fn mckey_against_the_kernel_in_the_rxe_vm_in_both_roles() {
    let test = "mckey_against_the_kernel_in_the_rxe_vm_in_both_roles";
    let headers = "/usr/include/rdma/rdma_cma.h";
    if !root_and(test, &["mckey"]) || !can_compile_c(test, "gcc and librdmacm-dev", headers) {
        return;
    }
    let programs = [
        compile_c("mcast", &["-libverbs"]),
        compile_c("mcast_cm", &["-lrdmacm", "-libverbs"]),
    ];
    let Some(vm) = vm(test, "1500") else {
        return;
    };
    for program in &programs {
        let name = program.binary.file_name().expect("a file name");
        std::fs::copy(&program.binary, common::rxe::vm_share().join(name)).unwrap();
    }
    let rxe = vm.exec(60, "/host/mcast errors rxe0 && /host/mcast_cm 10.88.0.11");
    for program in &programs {
        let name = program.binary.file_name().expect("a file name");
        let _ = std::fs::remove_file(common::rxe::vm_share().join(name));
    }
    assert!(
        rxe.status.success() && String::from_utf8_lossy(&rxe.stdout) == "ok\nok\n",
        "the C programs on rxe: {}",
        text(&rxe)
    );
    let capture = format!("roce-mcast-{}", std::process::id());
    let started = vm.run(&["capture-start", &capture]);
    assert!(started.status.success(), "capture: {}", text(&started));
    let group = "239.1.2.4";
    let flags = ["-m", group, "-C", "4", "-S", "100"];

    // The VM receives: it joins (and posts its receives) well before our sender, which
    // waits 3 s after its own join, sends.
    let job = vm.spawn(60, &format!("mckey -b 10.88.0.11 {}", flags.join(" ")));
    thread::sleep(Duration::from_secs(2));
    let ours = in_host(&[&["mckey", "-s", "-b", "10.88.0.1"][..], &flags].concat())
        .output()
        .unwrap();
    let kernel = vm.wait(&job, 60);
    check_mckey("our sender", &ours, group);
    check_mckey("the kernel's receiver", &kernel, group);

    // We receive.
    let receiver = in_host(&[&["mckey", "-b", "10.88.0.1"][..], &flags].concat())
        .spawn()
        .unwrap();
    wait_until("our receiver's join", || {
        kernel_joined("rxe-host", "host0", group)
    });
    let kernel = vm.exec(60, &format!("mckey -s -b 10.88.0.11 {}", flags.join(" ")));
    let ours = receiver.wait_with_output().unwrap();
    check_mckey("the kernel's sender", &kernel, group);
    check_mckey("our receiver", &ours, group);

    let _ = vm.run(&["capture-stop"]);
    let pcap = common::rxe::capture_path(&capture);
    let group: Ipv4Addr = group.parse().unwrap();
    let with_imm = Opcode::UdSendOnlyWithImmediate;
    let from_us = check_datagrams(&pcap, Ipv4Addr::new(10, 88, 0, 1), group, with_imm, 100);
    let from_rxe = check_datagrams(&pcap, Ipv4Addr::new(10, 88, 0, 11), group, with_imm, 100);
    let _ = std::fs::remove_file(&pcap);
    assert_eq!((from_us, from_rxe), (4, 4));
}

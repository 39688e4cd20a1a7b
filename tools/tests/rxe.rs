//! Interoperability with Linux soft-RoCE in a VM (../shared/rxe-peer), in both roles:
//! `roce pingpong` against rdma-core's `ibv_rc_pingpong`, `ibv_uc_pingpong` and
//! `ibv_ud_pingpong` (over AF_XDP and kernel UDP, path MTU 1024 and 4096, 1 B to 64 KiB, RC
//! with `-e` events), and `roce perf` against perftest's `ib_{send,write,read}_{bw,lat}` and
//! `ib_atomic_bw` (both atomics). Needs root and the rxe-peer tool (CI has both; the VM build
//! is cached in $RXE_DIR). The tests share the one VM: `vm` gives it to one at a time.

mod common;

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

use common::rxe::{capture_path, captured_frames, last_frames, recovery_by_sender};
use common::{has_row, said, text, wait_for_listener_in};
use roce_tests::rxe_vm::{vm, Listener, Vm};

const ITERS: &str = "50";

/// Our pingpong in the host namespace.
fn ours(args: &[&str]) -> Child {
    ours_tool("pingpong", &[&["-d", "host0", "-n", ITERS], args].concat())
}

/// Where our side of the current run records every frame (runs take turns).
const OUR_PCAP: &str = "/tmp/roce-rxe-run.pcap";

/// The evidence of a failed run for the log: our capture's last frames, decoded.
fn evidence() -> String {
    last_frames(Path::new(OUR_PCAP), 40)
}

/// `roce TOOL ARGS...` in the host namespace, bounded in time, recording to [`OUR_PCAP`].
fn ours_tool(tool: &str, args: &[&str]) -> Child {
    Command::new("ip")
        .args([
            "netns",
            "exec",
            "rxe-host",
            "timeout",
            "120",
            env!("CARGO_BIN_EXE_roce"),
            tool,
            "--pcap",
            OUR_PCAP,
        ])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start roce")
}

fn check(what: &str, ours: Output, theirs: Output) {
    let (ours_said, theirs_said) = (said(&ours), said(&theirs));
    let done = format!("{ITERS} iters in");
    assert!(
        ours.status.success() && ours_said.contains(&done),
        "{what}: ours failed:\n{ours_said}\nrxe:\n{theirs_said}\n{}",
        evidence()
    );
    assert!(
        theirs.status.success() && theirs_said.contains(&done),
        "{what}: rxe failed:\n{theirs_said}\nours:\n{ours_said}\n{}",
        evidence()
    );
}

/// The TCP port of the exchange of rdma-core's pingpongs and perftest.
const EXCHANGE_PORT: u16 = 18515;

/// Waits until our server in the host namespace takes connections.
fn our_server_listens() {
    wait_for_listener_in("rxe-host", EXCHANGE_PORT);
}

/// The IPv4-mapped GID unless the program line picks one itself.
fn gid_flag(program: &str) -> &'static str {
    if program.contains(" -g ") {
        ""
    } else {
        "-g $(rxe-gid)"
    }
}

/// rdma-core's `program` serves, we connect.
fn rxe_server(vm: &Vm, program: &str, what: &str, our_args: &[&str]) {
    let command = format!("{program} -d rxe0 {} -n {ITERS}", gid_flag(program));
    let job = vm.spawn_server(150, &command, Listener::Tcp(EXCHANGE_PORT));
    let mut args = our_args.to_vec();
    args.push("10.88.0.11");
    let ours = ours(&args).wait_with_output().expect("our client");
    let theirs = vm.wait(&job, 150);
    check(what, ours, theirs);
}

/// We serve, rdma-core's `program` connects.
fn rxe_client(vm: &Vm, program: &str, what: &str, our_args: &[&str]) {
    let server = ours(our_args);
    our_server_listens();
    let command = format!(
        "{program} -d rxe0 {} -n {ITERS} 10.88.0.1",
        gid_flag(program)
    );
    let theirs = vm.exec(120, &command);
    let ours = server.wait_with_output().expect("our server");
    check(what, ours, theirs);
}

#[test]
fn pingpong_with_rxe_in_both_roles() {
    let Some(vm) = vm("pingpong_with_rxe_in_both_roles", "1500") else {
        return;
    };

    let rc = "ibv_rc_pingpong";
    rxe_server(&vm, rc, "RC, AF_XDP client", &[]);
    rxe_server(&vm, rc, "RC, UDP client", &["--udp"]);
    rxe_client(&vm, rc, "RC, AF_XDP server", &[]);
    rxe_client(&vm, rc, "RC, UDP server", &["--udp"]);
    // Sizes from 1 byte to 64 KiB, and completion events on both sides.
    for size in ["1", "1024", "65536"] {
        let theirs = format!("ibv_rc_pingpong -s {size}");
        rxe_server(
            &vm,
            &theirs,
            &format!("RC {size} B, AF_XDP client"),
            &["-s", size],
        );
        rxe_client(
            &vm,
            &theirs,
            &format!("RC {size} B, AF_XDP server"),
            &["-s", size],
        );
    }
    let events = "ibv_rc_pingpong -e";
    rxe_server(&vm, events, "RC -e, AF_XDP client", &["-e"]);
    rxe_client(&vm, events, "RC -e, AF_XDP server", &["-e"]);
    let uc = "ibv_uc_pingpong";
    rxe_server(&vm, uc, "UC, AF_XDP client", &["--uc"]);
    rxe_client(&vm, uc, "UC, UDP server", &["--uc", "--udp"]);
    let uc_big = "ibv_uc_pingpong -s 65536";
    rxe_client(
        &vm,
        uc_big,
        "UC 64 KiB, AF_XDP server",
        &["--uc", "-s", "65536"],
    );
    // UD messages must fit the path MTU (1024 here).
    let ud = "ibv_ud_pingpong -s 512";
    rxe_server(&vm, ud, "UD, AF_XDP client", &["--ud", "-s", "512"]);
    rxe_client(&vm, ud, "UD, UDP server", &["--ud", "-s", "512", "--udp"]);
    // Loss (`rxe-peer.sh loss 5`) is not checked here yet: with rdma-core's side under loss
    // the runs fail now and then without a message from it (see the session notes).
    // Path MTU 4096: our frames span two AF_XDP buffers.
    vm.start("9000");
    let big = "ibv_rc_pingpong -m 4096 -s 16384";
    let ours_big = ["-m", "4096", "-s", "16384"];
    rxe_server(&vm, big, "RC, path MTU 4096, AF_XDP client", &ours_big);
    let ours_big_udp = [&ours_big[..], &["--udp"]].concat();
    rxe_client(&vm, big, "RC, path MTU 4096, UDP server", &ours_big_udp);
    // UD messages up to the path MTU: 4 KiB now.
    let ud_big = "ibv_ud_pingpong -s 4096";
    let ours_ud_big = ["--ud", "-m", "4096", "-s", "4096"];
    rxe_server(
        &vm,
        ud_big,
        "UD 4 KiB, path MTU 4096, AF_XDP client",
        &ours_ud_big,
    );
    rxe_client(
        &vm,
        ud_big,
        "UD 4 KiB, path MTU 4096, AF_XDP server",
        &ours_ud_big,
    );
}

/// One perftest program against `roce perf TEST`, in both roles. `rows` says which sides print
/// a result row (perftest's read_lat server prints none).
fn perf_pair(vm: &Vm, test: &str, extra: &[&str], size: &str, rows: (bool, bool)) {
    const N: &str = "100";
    let program = format!(
        "ib_{test} -d rxe0 -x $(rxe-gid) -F -n {N} {}",
        extra.join(" ")
    );
    // Rows count every QP's iterations.
    let qps: u32 = extra
        .windows(2)
        .find(|pair| pair[0] == "-q")
        .map_or(1, |pair| pair[1].parse().unwrap());
    let row_iters = (100 * qps).to_string();
    let ours_args = |host: Option<&'static str>| {
        let mut args = vec![test, "-d", "host0", "-x", "1", "-n", N];
        args.extend_from_slice(extra);
        args.extend(host);
        args
    };
    let judge = |role: &str, ours: Output, theirs: Output, server_is_ours: bool| {
        let (ours_text, theirs_text) = (text(&ours), text(&theirs));
        let what = format!("{test} {} ({role})", extra.join(" "));
        assert!(
            ours.status.success() && theirs.status.success(),
            "{what}:\nours:\n{}\nperftest:\n{}\n{}",
            said(&ours),
            said(&theirs),
            evidence()
        );
        let (client_row, server_row) = rows;
        let (ours_row, theirs_row) = if server_is_ours {
            (server_row, client_row)
        } else {
            (client_row, server_row)
        };
        assert!(
            !ours_row || has_row(&ours_text, size, &row_iters),
            "{what}: our row:\n{ours_text}"
        );
        assert!(
            !theirs_row || has_row(&theirs_text, size, &row_iters),
            "{what}: perftest's row:\n{theirs_text}"
        );
        // The figures, for the log.
        let row = |text: &str| {
            text.lines()
                .find(|line| line.split_whitespace().next() == Some(size))
                .map(|line| line.split_whitespace().collect::<Vec<_>>().join(" "))
                .unwrap_or_default()
        };
        eprintln!(
            "{what}: ours [{}] perftest [{}]",
            row(&ours_text),
            row(&theirs_text)
        );
        ours_text
    };
    // perftest serves, we connect (our client retries the connection for a few seconds).
    let job = vm.spawn_server(150, &program, Listener::Tcp(EXCHANGE_PORT));
    let ours = ours_tool("perf", &ours_args(Some("10.88.0.11")))
        .wait_with_output()
        .expect("our client");
    let theirs = vm.wait(&job, 150);
    judge("perftest server", ours, theirs, false);
    // We serve, perftest connects.
    let server = ours_tool("perf", &ours_args(None));
    our_server_listens();
    let theirs = vm.exec(120, &format!("{program} 10.88.0.1"));
    let ours = server.wait_with_output().expect("our server");
    let ours_text = judge("our server", ours, theirs, true);
    if test == "atomic_bw" {
        // Checked against our memory: every atomic perftest issued landed exactly once.
        assert!(
            ours_text.contains(&format!("verified: {N} atomics applied")),
            "{ours_text}"
        );
    }
}

/// The value of the counter `name` in `--stats` output (`name value` lines).
fn counter(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (key, value) = line.split_once(' ')?;
        (key == name).then(|| value.trim().parse().ok())?
    })
}

/// A CNP we send to rxe is harmless: rxe's `ib_write_bw` writes to our `roce perf` with
/// ECT(0) (`--tclass=2`) through a bridge port that marks every ECN-capable frame CE
/// (`roce_provider::ecn_marker`, threshold 1 byte), so we answer its writes with CNPs to its
/// RC QP all through the run. The run completes on both sides and rxe's kernel logs nothing.
fn cnps_to_rxe_are_harmless(vm: &Vm) {
    let dmesg_lines =
        |vm: &Vm| -> usize { text(&vm.exec(30, "dmesg | wc -l")).trim().parse().unwrap() };
    let before = dmesg_lines(vm);
    let link = Command::new("ip")
        .args(["-n", "rxe", "-o", "link", "show", "hostport"])
        .output()
        .unwrap();
    let ifindex: u32 = text(&link)
        .split(':')
        .next()
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // The marker goes on the bridge's port to us, from a thread in the bridge's namespace.
    let marker = std::thread::spawn(move || {
        roce_provider::netns::enter("rxe").unwrap();
        roce_provider::ecn_marker::EcnMarker::attach(ifindex, 1, 1).unwrap()
    })
    .join()
    .unwrap();
    let args = [
        "write_bw", "-d", "host0", "-x", "1", "-n", "200", "-s", "4096", "--stats",
    ];
    let server = ours_tool("perf", &args);
    our_server_listens();
    let program = "ib_write_bw -d rxe0 -x $(rxe-gid) -F -n 200 -s 4096 --tclass=2 10.88.0.1";
    let theirs = vm.exec(120, program);
    let ours = server.wait_with_output().expect("our server");
    let marked = marker.stats().unwrap().marked;
    drop(marker);
    let (ours_text, theirs_text) = (text(&ours), text(&theirs));
    assert!(
        ours.status.success() && has_row(&ours_text, "4096", "200"),
        "ours:\n{}\nrxe:\n{}",
        said(&ours),
        said(&theirs)
    );
    assert!(
        theirs.status.success() && has_row(&theirs_text, "4096", "200"),
        "rxe:\n{}\nours:\n{}",
        said(&theirs),
        said(&ours)
    );
    let cnps = counter(&ours_text, "np_cnp_sent").unwrap_or(0);
    let ce = counter(&ours_text, "np_ecn_marked_roce_packets").unwrap_or(0);
    eprintln!("CNPs to rxe: {marked} frames marked CE, {ce} seen CE, {cnps} CNPs sent");
    assert!(marked >= 200 && ce >= 200 && cnps >= 10, "{ours_text}");
    let after = text(&vm.exec(30, &format!("dmesg | tail -n +{}", before + 1)));
    let lowered = after.to_lowercase();
    assert!(
        ["warn", "bug", "error", "rxe", "call trace"]
            .iter()
            .all(|word| !lowered.contains(word)),
        "rxe's kernel after our CNPs:\n{after}"
    );
}

#[test]
fn perf_with_perftest_on_rxe_in_both_roles() {
    let Some(vm) = vm("perf_with_perftest_on_rxe_in_both_roles", "1500") else {
        return;
    };
    // (client prints a row, server prints a row)
    let both = (true, true);
    perf_pair(&vm, "write_bw", &["-s", "4096"], "4096", both);
    perf_pair(&vm, "read_bw", &["-s", "4096"], "4096", both);
    perf_pair(&vm, "send_bw", &["-s", "4096"], "4096", both);
    perf_pair(&vm, "atomic_bw", &[], "8", both);
    perf_pair(&vm, "atomic_bw", &["-A", "CMP_AND_SWAP"], "8", both);
    perf_pair(&vm, "write_lat", &[], "2", both);
    perf_pair(&vm, "send_lat", &[], "2", both);
    perf_pair(&vm, "read_lat", &[], "2", (true, false));
    // Several QPs: per-QP barriers, each QP its own window.
    perf_pair(&vm, "write_bw", &["-s", "4096", "-q", "2"], "4096", both);
    perf_pair(&vm, "send_bw", &["-s", "4096", "-q", "2"], "4096", both);
    cnps_to_rxe_are_harmless(&vm);
    // Path MTU 4096, messages of several packets.
    vm.start("9000");
    perf_pair(&vm, "write_bw", &["-s", "65536"], "65536", both);
    perf_pair(&vm, "read_bw", &["-s", "65536"], "65536", both);
}

#[test]
fn perf_with_perftest_on_rxe_under_five_percent_loss() {
    let Some(vm) = vm("perf_with_perftest_on_rxe_under_five_percent_loss", "1500") else {
        return;
    };
    let name = "roce-loss-test";
    let started = vm.run(&["capture-start", name]);
    assert!(started.status.success(), "capture: {}", text(&started));
    let lossy = vm.run(&["loss", "5"]);
    assert!(lossy.status.success(), "loss: {}", text(&lossy));
    // perftest's closing handshakes come after every completion, so a lost last ACK is
    // recovered before anyone leaves (ping-pong programs have no such barrier: a lost final
    // ACK after the peer exited fails the run in either implementation).
    let runs = std::panic::catch_unwind(|| {
        let both = (true, true);
        perf_pair(&vm, "write_bw", &["-s", "4096"], "4096", both);
        perf_pair(&vm, "read_bw", &["-s", "4096"], "4096", both);
        perf_pair(&vm, "send_bw", &["-s", "4096"], "4096", both);
    });
    let _ = vm.run(&["loss", "0"]);
    let _ = vm.run(&["capture-stop"]);
    let pcap = capture_path(name);
    if let Err(failure) = runs {
        // The capture is the evidence: say where it is and show its end in the log.
        eprintln!("the failed run's {}", last_frames(&pcap, 60));
        std::panic::resume_unwind(failure);
    }
    let found = recovery_by_sender(&pcap);
    let ours = found
        .get(&"10.88.0.1".parse().unwrap())
        .copied()
        .unwrap_or_default();
    let theirs = found
        .get(&"10.88.0.11".parse().unwrap())
        .copied()
        .unwrap_or_default();
    assert!(
        ours.retransmitted > 0 && ours.naks > 0 && theirs.retransmitted > 0 && theirs.naks > 0,
        "recovery in both directions: ours {ours:?}, rxe {theirs:?} ({})",
        pcap.display()
    );
    eprintln!("recovery under 5 % loss: ours {ours:?}, rxe {theirs:?}");
}

/// NAKs of each kind in a capture, by sender.
fn naks_by_sender(pcap: &Path) -> HashMap<(Ipv4Addr, String), usize> {
    use roce_wire::aeth::Syndrome;
    let mut naks = HashMap::new();
    captured_frames(pcap, |src, repr| {
        let kind = match repr.ext.aeth.map(|aeth| aeth.syndrome) {
            None | Some(Syndrome::Ack(_)) => return,
            Some(Syndrome::RnrNak(_)) => "RNR".to_string(),
            Some(Syndrome::Nak(code)) => format!("{code:?}"),
        };
        *naks.entry((src, kind)).or_default() += 1;
    });
    naks
}

#[test]
fn error_behaviour_against_rxe() {
    let Some(vm) = vm("error_behaviour_against_rxe", "1500") else {
        return;
    };
    let name = "roce-error-test";
    let started = vm.run(&["capture-start", name]);
    assert!(started.status.success(), "capture: {}", text(&started));

    // A WRITE naming memory with a key rxe never issued: rxe NAKs it (remote access error)
    // and our work request completes with REM_ACCESS_ERR.
    let program = "ib_write_bw -d rxe0 -x $(rxe-gid) -F -n 20 -s 4096";
    let job = vm.spawn_server(60, program, Listener::Tcp(EXCHANGE_PORT));
    let args = [
        "write_bw", "-d", "host0", "-x", "1", "-n", "20", "-s", "4096",
    ];
    let ours = ours_tool(
        "perf",
        &[&args[..], &["--wrong-rkey", "10.88.0.11"]].concat(),
    )
    .wait_with_output()
    .expect("our client");
    // perftest's server gives up when we hang up.
    let _ = vm.wait(&job, 60);
    let ours_text = text(&ours);
    assert!(
        !ours.status.success(),
        "a wrong rkey must fail:\n{ours_text}"
    );
    assert!(
        ours_text.contains("failed: IBV_WC_REM_ACCESS_ERR (remote access error"),
        "{ours_text}"
    );

    // SENDs before our receives are posted: we answer RNR NAKs, rxe waits and retries
    // (rnr_retry 7: for ever) and the run completes.
    let args = [
        "send_bw", "-d", "host0", "-x", "1", "-n", "50", "-s", "4096",
    ];
    let server = ours_tool("perf", &[&args[..], &["--late-receives", "300"]].concat());
    our_server_listens();
    let program = "ib_send_bw -d rxe0 -x $(rxe-gid) -F -n 50 -s 4096 10.88.0.1";
    let theirs = vm.exec(60, program);
    let ours = server.wait_with_output().expect("our server");
    let _ = vm.run(&["capture-stop"]);
    assert!(
        ours.status.success() && theirs.status.success(),
        "RNR run:\nours:\n{}\nperftest:\n{}",
        said(&ours),
        said(&theirs)
    );
    assert!(has_row(&text(&ours), "4096", "50"), "{}", text(&ours));

    let naks = naks_by_sender(&capture_path(name));
    let count = |ip: &str, kind: &str| {
        naks.get(&(ip.parse().unwrap(), kind.to_string()))
            .copied()
            .unwrap_or(0)
    };
    assert!(count("10.88.0.11", "RemoteAccessError") > 0, "{naks:?}");
    assert!(count("10.88.0.1", "RNR") > 0, "{naks:?}");
    eprintln!("NAKs seen: {naks:?}");
}

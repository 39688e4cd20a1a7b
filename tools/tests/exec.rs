//! Debian's own rdma-core and perftest programs, unmodified, over our `libibverbs.so.1`
//! through `roce exec`: the symbols they import exist with their versions, `ibv_devinfo`
//! sees the namespace's interfaces as rxe-like devices, a held device is refused to a second
//! process, and programs talk to each other between two namespaces over AF_XDP.
//!
//! Needs root (namespaces, AF_XDP) and Debian's `ibverbs-utils` and `perftest`; in CI a
//! missing prerequisite fails the test, elsewhere it is skipped with a message.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use roce_provider::netns::{needs_root, prerequisite, veth, Netns};

use common::{
    build_libraries, built_dir, can_compile_c, compile_c, dynamic_symbols, exec_in, installed,
    text, wait_for_listener, VERBS_H,
};

#[test]
fn every_versioned_symbol_debian_programs_import_is_exported() {
    let test = "every_versioned_symbol_debian_programs_import_is_exported";
    let programs = [
        "ibv_devices",
        "ibv_devinfo",
        "ibv_rc_pingpong",
        "ibv_uc_pingpong",
        "ibv_ud_pingpong",
        "ibv_srq_pingpong",
        "ibv_xsrq_pingpong",
        "ibv_asyncwatch",
        "ib_write_bw",
        "ib_read_bw",
        "ib_send_bw",
        "ib_atomic_bw",
        "ib_write_lat",
        "ib_read_lat",
        "ib_send_lat",
        "ib_atomic_lat",
    ];
    let present = programs.iter().all(|program| installed(program));
    if !prerequisite(test, "ibverbs-utils and perftest", present) {
        return;
    }
    build_libraries();
    let ours: Vec<(&str, &str, Vec<String>)> = [
        ("libibverbs.so", "IBVERBS_", "libibverbs.so.1"),
        ("libmlx5.so", "MLX5_", "libmlx5.so.1"),
        ("libefa.so", "EFA_", "libefa.so.1"),
    ]
    .iter()
    .map(|(file, prefix, soname)| {
        let path = built_dir().join(file);
        let dynamic = Command::new("readelf")
            .arg("-d")
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            text(&dynamic).contains(&format!("Library soname: [{soname}]")),
            "{file}: {}",
            text(&dynamic)
        );
        (*prefix, *soname, dynamic_symbols(&path, true))
    })
    .collect();
    let mut files: Vec<PathBuf> = programs
        .iter()
        .map(|p| Path::new("/usr/bin").join(p))
        .collect();
    // perftest needs Debian's librdmacm, which must load against our libibverbs.
    files.push("/usr/lib/x86_64-linux-gnu/librdmacm.so.1".into());
    let mut missing = Vec::new();
    let mut checked = 0;
    for file in &files {
        for import in dynamic_symbols(file, false) {
            for (prefix, soname, exports) in &ours {
                if import.contains(&format!("@{prefix}")) {
                    checked += 1;
                    if !exports.contains(&import) {
                        missing.push(format!("{import} ({soname}, for {})", file.display()));
                    }
                }
            }
        }
    }
    assert!(checked > 100, "only {checked} imports seen");
    assert!(missing.is_empty(), "not exported: {missing:#?}");
}

/// Two namespaces joined by a veth pair (`ea` 10.83.0.1, `eb` 10.83.0.2, MTU `mtu`); in the
/// first, another veth pair that is down, which must not become devices.
fn two_namespaces(mtu: u32) -> (Netns, Netns) {
    let a = Netns::create("roce-exec-a").unwrap();
    let b = Netns::create("roce-exec-b").unwrap();
    veth((&a, "ea", "10.83.0.1/24"), (&b, "eb", "10.83.0.2/24"), mtu).unwrap();
    a.ip(&[
        "link", "add", "down0", "type", "veth", "peer", "name", "down1",
    ])
    .unwrap();
    (a, b)
}

fn root_and(test: &str, programs: &[&str]) -> bool {
    needs_root(test)
        && prerequisite(
            test,
            &programs.join(", "),
            programs.iter().all(|program| installed(program)),
        )
}

#[test]
fn ibv_devinfo_shows_each_up_interface_as_an_rxe_like_device() {
    let test = "ibv_devinfo_shows_each_up_interface_as_an_rxe_like_device";
    if !root_and(test, &["ibv_devices", "ibv_devinfo"]) {
        return;
    }
    let (a, _b) = two_namespaces(1500);
    let devices = exec_in(&a, &["ibv_devices"]).output().unwrap();
    let listing = text(&devices);
    assert!(devices.status.success(), "{listing}");
    let names: Vec<&str> = listing
        .lines()
        .skip(2)
        .filter_map(|line| line.split_whitespace().next())
        .collect();
    assert_eq!(names, ["ea"], "{listing}");
    let info = exec_in(&a, &["ibv_devinfo", "-v", "-d", "ea"])
        .output()
        .unwrap();
    let info_text = text(&info);
    assert!(info.status.success(), "{info_text}");
    for expected in [
        "hca_id:\tea",
        "transport:\t\t\tInfiniBand (0)",
        "vendor_id:\t\t\t0xffffff",
        "vendor_part_id:\t\t\t0",
        "phys_port_cnt:\t\t\t1",
        "state:\t\t\tPORT_ACTIVE (4)",
        "active_mtu:\t\t1024 (3)",
        "link_layer:\t\tEthernet",
        "GID[  1]:\t\t::ffff:10.83.0.1, RoCE v2",
    ] {
        assert!(
            info_text.contains(expected),
            "no {expected:?} in\n{info_text}"
        );
    }
    let gid0 = info_text
        .lines()
        .find(|line| line.contains("GID[  0]:"))
        .unwrap_or_default();
    assert!(
        gid0.contains("fe80::") && gid0.contains("RoCE v2"),
        "{info_text}"
    );
}

fn check_pingpong(side: &str, output: &Output, iters: u32, size: u32) {
    let all = text(output);
    assert!(output.status.success(), "{side}: {all}");
    let bytes = format!("{} bytes in ", u64::from(size) * u64::from(iters) * 2);
    assert!(
        all.contains(&bytes) && all.contains(&format!("{iters} iters in ")),
        "{side}: {all}"
    );
}

/// A device a process holds is every process's (its switch, `roce_provider::switch`):
/// `ibv_devinfo` answers while a server waits on it, and a client on the same device talks to
/// that server (it refused both once: one process per device).
#[test]
fn a_second_process_uses_a_held_device() {
    let test = "a_second_process_uses_a_held_device";
    if !root_and(test, &["ibv_rc_pingpong", "ibv_devinfo"]) {
        return;
    }
    let (a, _b) = two_namespaces(1500);
    let server = exec_in(&a, &["ibv_rc_pingpong", "-d", "ea", "-g", "1", "-n", "50"])
        .spawn()
        .unwrap();
    wait_for_listener(&a, 18515);
    let devinfo = exec_in(&a, &["ibv_devinfo", "-d", "ea"]).output().unwrap();
    let client = exec_in(
        &a,
        &[
            "ibv_rc_pingpong",
            "-d",
            "ea",
            "-g",
            "1",
            "-n",
            "50",
            "10.83.0.1",
        ],
    )
    .output()
    .unwrap();
    let server = server.wait_with_output().unwrap();
    let said = text(&devinfo);
    assert!(devinfo.status.success(), "{said}");
    assert!(said.contains("hca_id:\tea"), "{said}");
    check_pingpong("client", &client, 50, 4096);
    check_pingpong("server", &server, 50, 4096);
}

#[test]
fn ibv_rc_pingpong_talks_to_itself_between_namespaces() {
    let test = "ibv_rc_pingpong_talks_to_itself_between_namespaces";
    if !root_and(test, &["ibv_rc_pingpong"]) {
        return;
    }
    let (a, b) = two_namespaces(9000);
    let runs: [(&str, &[&str], u32); 4] = [
        ("4 KiB", &["-s", "4096"], 4096),
        ("64 KiB, MTU 4096", &["-s", "65536", "-m", "4096"], 65536),
        ("events", &["-e", "-s", "4096"], 4096),
        ("ibv_wr_* builders", &["-N", "-s", "4096", "-c"], 4096),
    ];
    for (name, flags, size) in runs {
        let iters = 100;
        let n = iters.to_string();
        let mut server_args = vec!["ibv_rc_pingpong", "-g", "1", "-n", &n];
        server_args.extend_from_slice(flags);
        let mut server_args_b = server_args.clone();
        server_args_b.extend_from_slice(&["-d", "eb"]);
        let server = exec_in(&b, &server_args_b).spawn().unwrap();
        wait_for_listener(&b, 18515);
        let mut client_args = server_args.clone();
        client_args.extend_from_slice(&["-d", "ea", "10.83.0.2"]);
        let client = exec_in(&a, &client_args).output().unwrap();
        let server = server.wait_with_output().unwrap();
        check_pingpong(&format!("{name} client"), &client, iters, size);
        check_pingpong(&format!("{name} server"), &server, iters, size);
    }
}

/// One perftest run on both sides: the server in `b`, `ROCE_PROGRESS=progress`; both must
/// print their result row `row` (bytes, iterations).
struct Perftest<'a> {
    args: &'a [&'a str],
    progress: &'a str,
    row: (&'a str, &'a str),
}

/// Waits until `server` listens on perftest's port; if it exits first, fails with what it
/// said.
fn listening_or_explain(ns: &Netns, server: &mut std::process::Child, args: &[&str]) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::time::Instant::now() < deadline {
        let listening = ns.run(&["ss", "-Hltn", "sport = :18515"]).unwrap();
        if !listening.stdout.is_empty() {
            return;
        }
        if server.try_wait().unwrap().is_some() {
            let mut said = String::new();
            if let Some(mut out) = server.stdout.take() {
                let _ = std::io::Read::read_to_string(&mut out, &mut said);
            }
            if let Some(mut err) = server.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut err, &mut said);
            }
            panic!("{args:?} server exited before listening: {said}");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let _ = Command::new("kill").arg(server.id().to_string()).status();
    panic!("{args:?} server never listened");
}

fn perftest_pair(a: &Netns, b: &Netns, run: &Perftest) {
    let (program, flags) = run.args.split_first().expect("a program");
    let args = [&[*program, "-x", "1", "-F"][..], flags].concat();
    let mut server = exec_in(b, &[&args[..], &["-d", "eb"]].concat())
        .env("ROCE_PROGRESS", run.progress)
        .spawn()
        .unwrap();
    listening_or_explain(b, &mut server, run.args);
    let client = exec_in(a, &[&args[..], &["-d", "ea", "10.83.0.2"]].concat())
        .env("ROCE_PROGRESS", run.progress)
        .output()
        .unwrap();
    let server = server.wait_with_output().unwrap();
    let (size, iters) = run.row;
    for (side, output) in [("client", &client), ("server", &server)] {
        let all = text(output);
        assert!(output.status.success(), "{:?} {side}: {all}", run.args);
        // perftest's READ latency server has nothing to report.
        let reports = side == "client" || run.args[0] != "ib_read_lat";
        assert!(
            !reports || common::has_row(&all, size, iters),
            "{:?} {side}: {all}",
            run.args
        );
    }
}

#[test]
fn perftest_runs_on_both_sides_between_namespaces() {
    let test = "perftest_runs_on_both_sides_between_namespaces";
    let programs = [
        "ib_write_bw",
        "ib_read_bw",
        "ib_send_bw",
        "ib_atomic_bw",
        "ib_send_lat",
        "ib_write_lat",
        "ib_read_lat",
    ];
    if !root_and(test, &programs) {
        return;
    }
    let (a, b) = two_namespaces(9000);
    let run = |args, row| Perftest {
        args,
        progress: "events",
        row,
    };
    let runs = [
        run(
            &["ib_write_bw", "-s", "65536", "-n", "2000"],
            ("65536", "2000"),
        ),
        run(&["ib_read_bw", "-n", "1000", "-o", "4"], ("65536", "1000")),
        run(&["ib_send_bw", "-n", "1000"], ("65536", "1000")),
        run(&["ib_atomic_bw", "-n", "1000"], ("8", "1000")),
        run(
            &["ib_atomic_bw", "-n", "1000", "-A", "CMP_AND_SWAP"],
            ("8", "1000"),
        ),
        run(&["ib_send_lat", "-s", "64", "-n", "1000"], ("64", "1000")),
        run(&["ib_write_lat", "-n", "1000"], ("2", "1000")),
        run(&["ib_read_lat", "-n", "1000"], ("2", "1000")),
        // Every size from 2 B to 8 MiB.
        run(&["ib_write_bw", "-a", "-n", "20"], ("8388608", "20")),
        run(&["ib_write_bw", "-q", "4", "-n", "500"], ("65536", "2000")),
        run(
            &["ib_write_bw", "-c", "UC", "-n", "1000"],
            ("65536", "1000"),
        ),
        // UD has no flow control: 500 (perftest's RX depth is min(iterations, 512)) has every
        // receive posted before the run, where 1000 left the run to the server reposting in
        // time, and a datagram that found none lost for good hung the server under load.
        run(&["ib_send_bw", "-c", "UD", "-n", "500"], ("4096", "500")),
        // Four QPs receiving from one shared receive queue.
        run(
            &["ib_send_bw", "--use-srq", "-q", "4", "-n", "500"],
            ("65536", "2000"),
        ),
        run(
            &["ib_send_bw", "-I", "64", "-s", "64", "-n", "1000"],
            ("64", "1000"),
        ),
        // Both sides poll their CQ throughout, so they can drive the engine themselves.
        Perftest {
            args: &["ib_send_lat", "-s", "64", "-n", "1000"],
            progress: "caller",
            row: ("64", "1000"),
        },
    ];
    for perftest in &runs {
        perftest_pair(&a, &b, perftest);
    }
}

#[test]
fn ibv_uc_and_ud_pingpong_talk_to_themselves_between_namespaces() {
    let test = "ibv_uc_and_ud_pingpong_talk_to_themselves_between_namespaces";
    if !root_and(test, &["ibv_uc_pingpong", "ibv_ud_pingpong"]) {
        return;
    }
    let (a, b) = two_namespaces(1500);
    let iters = 100;
    let n = iters.to_string();
    for (program, size) in [("ibv_uc_pingpong", 4096), ("ibv_ud_pingpong", 1024)] {
        let s = size.to_string();
        let common = [program, "-g", "1", "-n", &n, "-s", &s];
        let server = exec_in(&b, &[&common[..], &["-d", "eb"]].concat())
            .spawn()
            .unwrap();
        wait_for_listener(&b, 18515);
        let client_args = [&common[..], &["-d", "ea", "10.83.0.2"]].concat();
        let client = exec_in(&a, &client_args).output().unwrap();
        let server = server.wait_with_output().unwrap();
        check_pingpong(&format!("{program} client"), &client, iters, size);
        check_pingpong(&format!("{program} server"), &server, iters, size);
    }
}

#[test]
fn the_str_helpers_say_what_rdma_core_says() {
    let test = "the_str_helpers_say_what_rdma_core_says";
    if !can_compile_c(test, "gcc and libibverbs-dev", VERBS_H) {
        return;
    }
    build_libraries();
    let strs = compile_c("strs", &["-libverbs"]);
    // Debian's libibverbs, then ours in its place.
    let theirs = Command::new(&strs.binary).output().unwrap();
    let ours = Command::new(env!("CARGO_BIN_EXE_roce"))
        .args(["exec", "--"])
        .arg(&strs.binary)
        .output()
        .unwrap();
    assert!(theirs.status.success() && ours.status.success());
    assert_eq!(text(&ours), text(&theirs));
}

#[test]
fn error_paths_answer_as_rdma_core_defines_them() {
    let test = "error_paths_answer_as_rdma_core_defines_them";
    if !needs_root(test) || !can_compile_c(test, "gcc and libibverbs-dev", VERBS_H) {
        return;
    }
    let program = compile_c("error_paths", &["-libverbs"]);
    let (a, _b) = two_namespaces(1500);
    let run = exec_in(&a, &[program.path(), "ea"]).output().unwrap();
    assert!(
        run.status.success() && text(&run).contains("ok"),
        "{}",
        text(&run)
    );
}

#[test]
fn a_failed_dereg_mr_keeps_the_region() {
    let test = "a_failed_dereg_mr_keeps_the_region";
    if !needs_root(test) || !can_compile_c(test, "gcc and libibverbs-dev", VERBS_H) {
        return;
    }
    let program = compile_c("dereg_failure", &["-libverbs"]);
    let (a, _b) = two_namespaces(1500);
    let run = exec_in(&a, &["env", "ROCE_BACKEND=udp", "ROCE_PROGRESS=caller"])
        .args([program.path(), "ea"])
        .output()
        .unwrap();
    assert!(
        run.status.success() && text(&run).contains("ok"),
        "{}: {}",
        run.status,
        text(&run)
    );
}

#[test]
fn ibv_srq_pingpong_talks_to_itself_between_namespaces() {
    let test = "ibv_srq_pingpong_talks_to_itself_between_namespaces";
    if !root_and(test, &["ibv_srq_pingpong"]) {
        return;
    }
    let (a, b) = two_namespaces(1500);
    let iters = 100;
    let n = iters.to_string();
    // 16 RC QPs on one SRQ (the default), then 4.
    let runs: [(&str, &[&str]); 2] = [("16 QPs", &[]), ("-q 4", &["-q", "4"])];
    for (name, flags) in runs {
        let common = [&["ibv_srq_pingpong", "-g", "1", "-n", &n][..], flags].concat();
        let server = exec_in(&b, &[&common[..], &["-d", "eb"]].concat())
            .spawn()
            .unwrap();
        wait_for_listener(&b, 18515);
        let client_args = [&common[..], &["-d", "ea", "10.83.0.2"]].concat();
        let client = exec_in(&a, &client_args).output().unwrap();
        let server = server.wait_with_output().unwrap();
        check_pingpong(&format!("{name} client"), &client, iters, 4096);
        check_pingpong(&format!("{name} server"), &server, iters, 4096);
    }
}

/// `ROCE_STATS=1`: each side of an `ibv_rc_pingpong` prints its device's rxe-named counters
/// on stderr when it closes the device, every one of them, with packets both ways; with
/// `ROCE_LOG` the client also shows the transport's events.
#[test]
fn roce_stats_prints_the_counters_when_a_device_is_closed() {
    let test = "roce_stats_prints_the_counters_when_a_device_is_closed";
    if !root_and(test, &["ibv_rc_pingpong"]) {
        return;
    }
    let (a, b) = two_namespaces(1500);
    let args = ["ibv_rc_pingpong", "-g", "1", "-n", "10"];
    let server = exec_in(&b, &[&args[..], &["-d", "eb"]].concat())
        .env("ROCE_STATS", "1")
        .spawn()
        .unwrap();
    wait_for_listener(&b, 18515);
    let client = exec_in(&a, &[&args[..], &["-d", "ea", "10.83.0.2"]].concat())
        .env("ROCE_STATS", "1")
        .env("ROCE_LOG", "roce_transport=debug")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&client.stderr);
    // ROCE_LOG turns on the transport's events in the drop-in: the QP's way to RTS.
    assert!(
        said.lines()
            .any(|line| line.contains("QP state") && line.contains("to=Rts")),
        "{said}"
    );
    let server = server.wait_with_output().unwrap();
    for (device, output) in [("ea", client), ("eb", server)] {
        check_pingpong(device, &output, 10, 4096);
        let stderr = String::from_utf8_lossy(&output.stderr);
        let heading = format!("roce-xdp hw_counters {device}\n");
        let table = stderr
            .split_once(&heading)
            .unwrap_or_else(|| panic!("no counters of {device} in {stderr}"))
            .1;
        let value = |name: &str| {
            table
                .lines()
                .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
                .and_then(|value| value.parse::<u64>().ok())
                .unwrap_or_else(|| panic!("no {name} of {device} in {stderr}"))
        };
        assert!(value("sent_pkts") > 0 && value("rcvd_pkts") > 0, "{stderr}");
        assert!(
            value("rdma_sends") >= 10 && value("rdma_recvs") >= 10,
            "{stderr}"
        );
        for name in [
            "duplicate_request",
            "retry_exceeded_err",
            "send_err",
            "link_downed",
        ] {
            assert_eq!(value(name), 0, "{device} on a clean link: {stderr}");
        }
    }
}

#[test]
fn qps_of_one_device_reach_each_other_and_themselves_without_the_wire() {
    let test = "qps_of_one_device_reach_each_other_and_themselves_without_the_wire";
    if !needs_root(test) || !can_compile_c(test, "gcc and libibverbs-dev", VERBS_H) {
        return;
    }
    let program = compile_c("loopback", &["-libverbs"]);
    let (a, _b) = two_namespaces(1500);
    let pcap = program.dir.path().join("loopback.pcap");
    let run = exec_in(&a, &[program.path(), "ea"])
        .env("ROCE_PCAP", &pcap)
        .output()
        .unwrap();
    assert!(
        run.status.success() && text(&run).contains("ok"),
        "{}",
        text(&run)
    );
    // The recorder saw every frame the device sent or received: none was RoCE.
    let frames = roce_provider::capture::read_frames(&pcap).expect("the device's capture");
    let roce = frames
        .iter()
        .filter(|captured| {
            let parsed = roce_wire::Frame::new_checked(&captured.data[..])
                .and_then(|frame| roce_wire::FrameRepr::parse(&frame));
            !matches!(parsed, Err(roce_wire::FrameError::NotRoce))
        })
        .count();
    assert_eq!(roce, 0, "RoCE frames on the wire: {}", pcap.display());
}

#[test]
fn async_fd_signals_a_qp_error_and_answers_eagain_when_non_blocking() {
    let test = "async_fd_signals_a_qp_error_and_answers_eagain_when_non_blocking";
    if !needs_root(test) || !can_compile_c(test, "gcc and libibverbs-dev", VERBS_H) {
        return;
    }
    let program = compile_c("async_events", &["-libverbs"]);
    // The peer's address answers ARP, but nothing there speaks RoCE.
    let (a, _b) = two_namespaces(1500);
    // Both kinds of engine thread; without one, nothing moves while a program polls the fd.
    let runs: Vec<Output> = ["events", "busy"]
        .iter()
        .map(|progress| {
            exec_in(&a, &[program.path(), "ea", "10.83.0.2"])
                .env("ROCE_PROGRESS", progress)
                .output()
                .unwrap()
        })
        .collect();
    for (progress, run) in ["events", "busy"].iter().zip(&runs) {
        assert!(
            run.status.success() && text(run).contains("ok"),
            "ROCE_PROGRESS={progress}: {}",
            text(run)
        );
    }
}

#[test]
fn the_port_follows_its_interface_down_and_up_with_async_events() {
    let test = "the_port_follows_its_interface_down_and_up_with_async_events";
    let headers = Path::new("/usr/include/infiniband/verbs.h").exists();
    let gcc = Command::new("gcc").arg("--version").output().is_ok();
    if !needs_root(test) || !prerequisite(test, "gcc and libibverbs-dev", headers && gcc) {
        return;
    }
    let dir = std::env::temp_dir().join(format!("roce-exec-port-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let binary = dir.join("port_events");
    let compiled = Command::new("gcc")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/c/port_events.c"
        ))
        .arg("-o")
        .arg(&binary)
        .arg("-libverbs")
        .output()
        .unwrap();
    assert!(compiled.status.success(), "{}", text(&compiled));
    // The program sets the link of `ea`, in the namespace the test made, down and up.
    let (a, _b) = two_namespaces(1500);
    let runs: Vec<Output> = ["events", "busy"]
        .iter()
        .map(|progress| {
            exec_in(&a, &[binary.to_str().unwrap(), "ea"])
                .env("ROCE_PROGRESS", progress)
                .output()
                .unwrap()
        })
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    for (progress, run) in ["events", "busy"].iter().zip(&runs) {
        assert!(
            run.status.success() && text(run).contains("ok"),
            "ROCE_PROGRESS={progress}: {}",
            text(run)
        );
    }
}

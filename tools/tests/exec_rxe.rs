//! Debian's own rdma-core and perftest programs, unmodified, over our `libibverbs.so.1`
//! (`roce exec` in the `rxe-host` namespace, device `host0`) against the same programs on
//! Linux soft-RoCE and rdma-core 44 in the rxe VM (../shared/rxe-peer), in both roles: every
//! program once as the server and once as the client on our side, path MTU 1024 and 4096,
//! IPv4-mapped and link-local IPv6 GIDs, and `ib_write_bw`/`ib_read_bw` under 5 % loss on
//! the bridge.
//!
//! One VM boot (netdev MTU 9000, so both ports say 4096; `-m 1024` picks path MTU 1024) for
//! a table of cases, each named in its failure message. Every case runs, then the test fails
//! listing those that failed, with both sides' output and our capture's last frames.
//!
//! Needs root, the rxe-peer tool, Debian's `ibverbs-utils` and `perftest`; in CI a missing
//! prerequisite fails the test, elsewhere it is skipped with a message.

mod common;

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use roce_provider::netns::{needs_root, prerequisite};

use common::rxe::{last_frames, recovery_by_sender};
use common::{build_libraries, has_row, installed, text};
use roce_tests::rxe_vm::{vm, Vm};

/// Our side's capture of the current case (cases take turns).
const OUR_PCAP: &str = "/tmp/roce-exec-rxe.pcap";
const OUR_IP: &str = "10.88.0.1";
const RXE_IP: &str = "10.88.0.11";
/// Seconds any one program may run, on either side.
const BOUND: u32 = 60;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Server {
    Ours,
    Rxe,
}

/// What both sides print when a case succeeds.
#[derive(Clone, Copy)]
enum Expect {
    /// rdma-core's pingpong result lines: `BYTES bytes in`, `ITERS iters in`.
    Pingpong { size: u64, iters: u64 },
    /// perftest's result row: `SIZE ITERS ...` (`None`: any count, as `-D` runs for a time);
    /// `server_row` false where perftest's server prints none (`ib_read_lat`).
    Row {
        size: &'static str,
        iters: Option<&'static str>,
        server_row: bool,
    },
}

struct Case {
    program: &'static str,
    args: &'static [&'static str],
    server: Server,
    expect: Expect,
    /// Percent of UDP 4791 frames the bridge drops during the case.
    loss: u32,
}

impl Case {
    fn name(&self) -> String {
        let who = match self.server {
            Server::Ours => "we serve, rxe connects",
            Server::Rxe => "rxe serves, we connect",
        };
        let loss = match self.loss {
            0 => String::new(),
            percent => format!(", {percent} % loss"),
        };
        format!("{} {} ({who}{loss})", self.program, self.args.join(" "))
    }

    fn perftest(&self) -> bool {
        self.program.starts_with("ib_")
    }

    /// The device flags: the IPv4-mapped GID (perftest's `-x`, rdma-core's `-g`), and
    /// perftest's `-F` (no CPU frequency check: the VM's clock is emulated).
    fn device_flags(&self, device: &str, gid: &str) -> String {
        if self.perftest() {
            format!("-d {device} -x {gid} -F")
        } else {
            format!("-d {device} -g {gid}")
        }
    }
}

const fn pingpong(
    program: &'static str,
    args: &'static [&'static str],
    server: Server,
    size: u64,
    iters: u64,
) -> Case {
    Case {
        program,
        args,
        server,
        expect: Expect::Pingpong { size, iters },
        loss: 0,
    }
}

const fn perftest(
    program: &'static str,
    args: &'static [&'static str],
    server: Server,
    size: &'static str,
    iters: &'static str,
) -> Case {
    Case {
        program,
        args,
        server,
        expect: Expect::Row {
            size,
            iters: Some(iters),
            server_row: !matches!(program.as_bytes(), b"ib_read_lat"),
        },
        loss: 0,
    }
}

use Server::{Ours, Rxe};

/// Every program in both roles; each path MTU with a pingpong and `ib_write_bw`. Small
/// iteration counts: the VM's emulated rxe moves about 20 MB/s.
#[rustfmt::skip]
const CASES: &[Case] = &[
    // Path MTU 1024.
    pingpong("ibv_rc_pingpong", &["-m", "1024", "-s", "4096", "-n", "20"], Ours, 4096, 20),
    pingpong("ibv_rc_pingpong", &["-m", "1024", "-s", "4096", "-n", "20"], Rxe, 4096, 20),
    perftest("ib_write_bw", &["-m", "1024", "-n", "20"], Rxe, "65536", "20"),
    pingpong("ibv_uc_pingpong", &["-s", "4096", "-n", "20"], Ours, 4096, 20),
    pingpong("ibv_ud_pingpong", &["-s", "1024", "-n", "20"], Rxe, 1024, 20),
    pingpong("ibv_srq_pingpong", &["-q", "4", "-s", "4096", "-n", "20"], Ours, 4096, 20),
    pingpong("ibv_srq_pingpong", &["-q", "4", "-s", "4096", "-n", "20"], Rxe, 4096, 20),
    // Path MTU 4096 (the ports' MTU, perftest's default).
    pingpong("ibv_rc_pingpong", &["-m", "4096", "-s", "65536", "-n", "20"], Ours, 65536, 20),
    pingpong("ibv_rc_pingpong", &["-m", "4096", "-e", "-n", "20"], Rxe, 4096, 20),
    pingpong("ibv_uc_pingpong", &["-m", "4096", "-s", "4096", "-n", "20"], Rxe, 4096, 20),
    pingpong("ibv_ud_pingpong", &["-s", "4096", "-n", "20"], Ours, 4096, 20),
    perftest("ib_write_bw", &["-n", "20"], Ours, "65536", "20"),
    perftest("ib_read_bw", &["-n", "20"], Rxe, "65536", "20"),
    perftest("ib_read_bw", &["-o", "4", "-n", "20"], Ours, "65536", "20"),
    perftest("ib_send_bw", &["-n", "20"], Ours, "65536", "20"),
    perftest("ib_send_bw", &["-c", "UD", "-n", "20"], Rxe, "4096", "20"),
    perftest("ib_send_bw", &["-I", "64", "-s", "64", "-n", "50"], Ours, "64", "50"),
    perftest("ib_atomic_bw", &["-n", "50"], Ours, "8", "50"),
    perftest("ib_atomic_bw", &["-A", "CMP_AND_SWAP", "-n", "50"], Rxe, "8", "50"),
    perftest("ib_send_lat", &["-n", "50"], Ours, "2", "50"),
    perftest("ib_send_lat", &["-s", "4096", "-n", "50"], Rxe, "4096", "50"),
    perftest("ib_write_lat", &["-n", "50"], Rxe, "2", "50"),
    perftest("ib_write_lat", &["-n", "50"], Ours, "2", "50"),
    perftest("ib_read_lat", &["-n", "50"], Ours, "2", "50"),
    perftest("ib_read_lat", &["-n", "50"], Rxe, "2", "50"),
    // Every size from 2 B to 8 MiB.
    perftest("ib_write_bw", &["-a", "-n", "5"], Rxe, "8388608", "5"),
    // Four QPs: rows count every QP's iterations.
    perftest("ib_write_bw", &["-q", "4", "-n", "10"], Rxe, "65536", "40"),
    perftest("ib_write_bw", &["-c", "UC", "-n", "20"], Rxe, "65536", "20"),
    // Two seconds, however many iterations that is.
    Case {
        program: "ib_write_bw",
        args: &["-D", "2"],
        server: Ours,
        expect: Expect::Row {
            size: "65536",
            iters: None,
            server_row: true,
        },
        loss: 0,
    },
    // The link-local IPv6 GID (index 0 on both sides): a case's flags come after the
    // device's, so its `-g`/`-x` is the one the program keeps.
    pingpong("ibv_ud_pingpong", &["-g", "0", "-s", "2048", "-n", "20"], Ours, 2048, 20),
    perftest("ib_write_bw", &["-x", "0", "-n", "20"], Rxe, "65536", "20"),
    // Under loss we are the requester for WRITE and the responder for READ.
    Case {
        loss: 5,
        ..perftest("ib_write_bw", &["-n", "20"], Rxe, "65536", "20")
    },
    Case {
        loss: 5,
        ..perftest("ib_read_bw", &["-n", "20"], Ours, "65536", "20")
    },
];

/// `roce exec --pcap OUR_PCAP -- PROGRAM ARGS...` in the `rxe-host` namespace, bounded.
fn ours(program: &str, args: &[&str]) -> Command {
    let mut command = Command::new("ip");
    command
        .args(["netns", "exec", "rxe-host", "timeout", &BOUND.to_string()])
        .args([env!("CARGO_BIN_EXE_roce"), "exec", "--pcap", OUR_PCAP, "--"])
        .arg(program)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// The program's whole command line on our side (to `server`, if we connect).
fn our_args<'a>(case: &'a Case, flags: &'a str, server: Option<&'a str>) -> Vec<&'a str> {
    flags
        .split_whitespace()
        .chain(case.args.iter().copied())
        .chain(server)
        .collect()
}

/// Waits (bounded) until our server listens on 18515; if it exits first, says so.
fn our_server_listens(server: &mut Child) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        let listening = Command::new("ip")
            .args(["netns", "exec", "rxe-host", "ss", "-Hltn", "sport = :18515"])
            .output()
            .expect("ss");
        if !listening.stdout.is_empty() {
            return Ok(());
        }
        if server.try_wait().expect("our server").is_some() {
            return Err("our server exited before listening".into());
        }
        thread::sleep(Duration::from_millis(20));
    }
    Err("our server never listened".into())
}

/// Waits (bounded) until a server in the VM listens on 18515.
fn rxe_server_listens(vm: &Vm) {
    let wait = "for i in $(seq 150); do ss -ltn | grep -q ':18515 ' && exit 0; sleep 0.1; done";
    vm.exec(30, wait);
}

/// Runs one case: (our output, rxe's output).
fn run(vm: &Vm, case: &Case) -> (Output, Output) {
    let _ = std::fs::remove_file(OUR_PCAP);
    let our_flags = case.device_flags("host0", "1");
    let rxe_flags = case.device_flags("rxe0", "$(rxe-gid)");
    let rxe_command = |server: Option<&str>| {
        format!(
            "{} {rxe_flags} {} {}",
            case.program,
            case.args.join(" "),
            server.unwrap_or("")
        )
    };
    match case.server {
        Server::Rxe => {
            let job = vm.spawn(BOUND, &rxe_command(None));
            // A server that never listens fails the case with what it said, and our
            // client's connection is refused.
            rxe_server_listens(vm);
            let ours = ours(case.program, &our_args(case, &our_flags, Some(RXE_IP)))
                .output()
                .expect("run roce exec");
            (ours, vm.wait(&job, BOUND))
        }
        Server::Ours => {
            let mut server = ours(case.program, &our_args(case, &our_flags, None))
                .spawn()
                .expect("run roce exec");
            let theirs = match our_server_listens(&mut server) {
                Ok(()) => vm.exec(BOUND, &rxe_command(Some(OUR_IP))),
                Err(why) => vm.exec(5, &format!("echo '{why}'; exit 1")),
            };
            if !theirs.status.success() {
                // SIGTERM to `timeout`, which passes it on: our server is not kept waiting
                // for a client that gave up.
                let _ = Command::new("kill").arg(server.id().to_string()).status();
            }
            (server.wait_with_output().expect("our server"), theirs)
        }
    }
}

/// Why a finished case failed, if it did.
fn judge(case: &Case, ours: &Output, theirs: &Output) -> Result<(), String> {
    let we_serve = case.server == Server::Ours;
    for (side, output, serves) in [("ours", ours, we_serve), ("rxe", theirs, !we_serve)] {
        let said = text(output);
        if !output.status.success() {
            return Err(format!("{side} failed ({})", output.status));
        }
        let shows = match case.expect {
            Expect::Pingpong { size, iters } => {
                said.contains(&format!("{} bytes in ", 2 * size * iters))
                    && said.contains(&format!("{iters} iters in "))
            }
            Expect::Row {
                size,
                iters,
                server_row,
            } => {
                (serves && !server_row)
                    || match iters {
                        Some(iters) => has_row(&said, size, iters),
                        None => said.lines().any(|line| {
                            let mut words = line.split_whitespace();
                            words.next() == Some(size)
                                && words.next().and_then(|n| n.parse::<u64>().ok()) > Some(0)
                        }),
                    }
            }
        };
        if !shows {
            return Err(format!("{side} printed no result"));
        }
    }
    if case.loss > 0 {
        // The loss must have been recovered from, not missed.
        let recovery = recovery_by_sender(Path::new(OUR_PCAP));
        let recovered: usize = recovery
            .values()
            .map(|found| found.retransmitted + found.naks)
            .sum();
        if recovered == 0 {
            return Err(format!("no retransmission or NAK under loss: {recovery:?}"));
        }
        eprintln!("recovery under {} % loss: {recovery:?}", case.loss);
    }
    Ok(())
}

/// `ibv_devinfo -v` on our side lists `host0` as rxe lists `rxe0`: the attributes programs
/// choose their paths by are rxe's.
fn devinfo_matches_rxe(vm: &Vm) -> Result<(), String> {
    let ours = ours("ibv_devinfo", &["-v", "-d", "host0"])
        .output()
        .expect("run roce exec");
    let theirs = vm.exec(BOUND, "ibv_devinfo -v -d rxe0");
    let (ours, theirs) = (text(&ours), text(&theirs));
    let field = |listing: &str, key: &str| {
        listing
            .lines()
            .find(|line| line.trim_start().starts_with(&format!("{key}:")))
            .map(|line| line.split_once(':').unwrap().1.trim().to_string())
    };
    let mut differ = Vec::new();
    for key in [
        "transport",
        "vendor_id",
        "vendor_part_id",
        "phys_port_cnt",
        "atomic_cap",
        "state",
        "max_mtu",
        "active_mtu",
        "link_layer",
    ] {
        let (mine, rxe) = (field(&ours, key), field(&theirs, key));
        if mine.is_none() || mine != rxe {
            differ.push(format!("{key}: ours {mine:?}, rxe {rxe:?}"));
        }
    }
    for expected in ["hca_id:\thost0", "GID[  1]:\t\t::ffff:10.88.0.1, RoCE v2"] {
        if !ours.contains(expected) {
            differ.push(format!("no {expected:?}"));
        }
    }
    if differ.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{}\nours:\n{ours}\nrxe:\n{theirs}",
            differ.join("\n")
        ))
    }
}

#[test]
fn debian_programs_over_our_library_talk_to_rxe_in_both_roles() {
    let test = "debian_programs_over_our_library_talk_to_rxe_in_both_roles";
    if !needs_root(test) {
        return;
    }
    let mut programs: Vec<&str> = CASES.iter().map(|case| case.program).collect();
    programs.push("ibv_devinfo");
    let present = programs.iter().all(|program| installed(program));
    if !prerequisite(test, "ibverbs-utils and perftest", present) {
        return;
    }
    build_libraries();
    let began = Instant::now();
    let Some(vm) = vm(test, "9000") else {
        return;
    };
    eprintln!("rxe VM started in {:.1} s", began.elapsed().as_secs_f64());
    let mut failures = Vec::new();
    let timed = Instant::now();
    let devinfo = devinfo_matches_rxe(&vm);
    eprintln!(
        "{} {:5.1} s ibv_devinfo -v",
        if devinfo.is_ok() { "PASS" } else { "FAIL" },
        timed.elapsed().as_secs_f64()
    );
    if let Err(why) = devinfo {
        failures.push(format!("ibv_devinfo -v: {why}"));
    }
    for case in CASES {
        let timed = Instant::now();
        if case.loss > 0 {
            let lossy = vm.run(&["loss", &case.loss.to_string()]);
            assert!(lossy.status.success(), "loss: {}", text(&lossy));
        }
        let (ours, theirs) = run(&vm, case);
        if case.loss > 0 {
            let _ = vm.run(&["loss", "0"]);
        }
        let verdict = judge(case, &ours, &theirs);
        eprintln!(
            "{} {:5.1} s {}",
            if verdict.is_ok() { "PASS" } else { "FAIL" },
            timed.elapsed().as_secs_f64(),
            case.name()
        );
        if let Err(why) = verdict {
            failures.push(format!(
                "{}: {why}\nours:\n{}\nrxe:\n{}\n{}",
                case.name(),
                text(&ours),
                text(&theirs),
                last_frames(Path::new(OUR_PCAP), 30)
            ));
        }
    }
    eprintln!(
        "{} cases and the VM in {:.1} s",
        CASES.len() + 1,
        began.elapsed().as_secs_f64()
    );
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n\n{}",
        failures.len(),
        CASES.len() + 1,
        failures.join("\n\n")
    );
}

//! Debian's rdma_cm programs (rdmacm-utils), unmodified, over our `librdmacm.so.1` and
//! `libibverbs.so.1` through `roce exec`: every librdmacm symbol they import exists with its
//! version, `rping`, `rdma_server`/`rdma_client` and `ucmatose` talk to themselves between
//! two namespaces over AF_XDP (rping with every byte checked), `rping` talks to the rxe VM's
//! kernel CM in both roles, and the event channel and the calls not offered answer as
//! rdma-core defines.
//!
//! Needs root (namespaces, AF_XDP) and Debian's `rdmacm-utils` (and `gcc` for the C
//! program); in CI a missing prerequisite fails the test, elsewhere it is skipped.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::thread;
use std::time::Duration;

use roce_provider::netns::{needs_root, prerequisite, veth, Netns};

use common::{build_libraries, built_dir, dynamic_symbols, exec_in, installed, text};

fn root_and(test: &str, programs: &[&str]) -> bool {
    needs_root(test)
        && prerequisite(
            test,
            &format!("rdmacm-utils ({})", programs.join(", ")),
            programs.iter().all(|program| installed(program)),
        )
}

/// Two namespaces joined by a veth pair (`ca` 10.85.0.1, `cb` 10.85.0.2, MTU 9000).
fn two_namespaces() -> (Netns, Netns) {
    let a = Netns::create("roce-cm-a").unwrap();
    let b = Netns::create("roce-cm-b").unwrap();
    veth((&a, "ca", "10.85.0.1/24"), (&b, "cb", "10.85.0.2/24"), 9000).unwrap();
    (a, b)
}

#[test]
fn every_librdmacm_symbol_debian_programs_import_is_exported() {
    let test = "every_librdmacm_symbol_debian_programs_import_is_exported";
    let programs = [
        "rping",
        "ucmatose",
        "udaddy",
        "mckey",
        "rdma_server",
        "rdma_client",
        "rdma_xserver",
        "rdma_xclient",
        "cmtime",
        "riostream",
        "rstream",
        "udpong",
        "ib_write_bw",
        "ib_send_lat",
    ];
    let present = programs.iter().all(|program| installed(program));
    if !prerequisite(test, "rdmacm-utils and perftest", present) {
        return;
    }
    build_libraries();
    let ours = built_dir().join("librdmacm.so");
    let dynamic = Command::new("readelf")
        .arg("-d")
        .arg(&ours)
        .output()
        .unwrap();
    assert!(
        text(&dynamic).contains("Library soname: [librdmacm.so.1]"),
        "{}",
        text(&dynamic)
    );
    let exports = dynamic_symbols(&ours, true);
    let mut missing = Vec::new();
    let mut checked = 0;
    for program in programs {
        for import in dynamic_symbols(&Path::new("/usr/bin").join(program), false) {
            if import.contains("@RDMACM_") {
                checked += 1;
                if !exports.contains(&import) {
                    missing.push(format!("{import} (for {program})"));
                }
            }
        }
    }
    assert!(checked > 150, "only {checked} imports seen");
    assert!(missing.is_empty(), "not exported: {missing:#?}");
}

/// Runs an rping client in `a` against the server `server` in `b`: the server needs a
/// moment to listen, and a client that comes too early is rejected (nobody listens), so it
/// tries again, a bounded number of times.
fn rping_client(a: &Netns, args: &[&str]) -> Output {
    let mut last = None;
    for _ in 0..50 {
        let output = exec_in(a, args).output().unwrap();
        let said = text(&output);
        if output.status.success() || !said.contains("RDMA_CM_EVENT_REJECTED") {
            return output;
        }
        last = Some(output);
        thread::sleep(Duration::from_millis(200));
    }
    last.expect("tried at least once")
}

#[test]
fn rping_talks_to_itself_between_namespaces() {
    let test = "rping_talks_to_itself_between_namespaces";
    if !root_and(test, &["rping"]) {
        return;
    }
    let (a, b) = two_namespaces();
    let count = 100;
    let n = count.to_string();
    let flags = ["-v", "-V", "-C", &n, "-S", "4096", "-a", "10.85.0.2"];
    let server = exec_in(&b, &[&["rping", "-s"][..], &flags].concat())
        .spawn()
        .unwrap();
    // Read the server's output as it comes: 100 pings of 4 KiB fill a pipe.
    let server = thread::spawn(move || server.wait_with_output().unwrap());
    let client = rping_client(&a, &[&["rping", "-c"][..], &flags].concat());
    let server = server.join().unwrap();
    for (side, output, prefix) in [
        ("client", &client, "ping data: rdma-ping-"),
        ("server", &server, "server ping data: rdma-ping-"),
    ] {
        let said = text(output);
        assert!(output.status.success(), "{side}: {said}");
        check_pings(side, &said, prefix, count, Some(4096));
    }
}

/// A client in `a` against the server `server` already spawned in `b`: again while the
/// server is not listening yet (rejected), a bounded number of times; both must succeed.
fn pair_in(a: &Netns, b: &Netns, server: &[&str], client: &[&str]) -> (Output, Output) {
    let server = exec_in(b, server).spawn().unwrap();
    let server = thread::spawn(move || server.wait_with_output().unwrap());
    let mut last = None;
    for _ in 0..50 {
        let output = exec_in(a, client).output().unwrap();
        let said = text(&output);
        let refused = said.contains("REJECTED") || said.contains("refused");
        last = Some(output);
        if !refused {
            break;
        }
        thread::sleep(Duration::from_millis(200));
    }
    (last.expect("tried at least once"), server.join().unwrap())
}

#[test]
fn rdma_server_client_and_ucmatose_talk_to_themselves_between_namespaces() {
    let test = "rdma_server_client_and_ucmatose_talk_to_themselves_between_namespaces";
    if !root_and(test, &["rdma_server", "rdma_client", "ucmatose"]) {
        return;
    }
    let (a, b) = two_namespaces();
    // Synchronous ids, rdma_create_ep/rdma_get_request and rdma_verbs.h's helpers.
    let (client, server) = pair_in(
        &a,
        &b,
        &["rdma_server", "-s", "10.85.0.2"],
        &["rdma_client", "-s", "10.85.0.2"],
    );
    assert!(
        client.status.success() && text(&client).contains("rdma_client: end 0"),
        "{}",
        text(&client)
    );
    assert!(
        server.status.success() && text(&server).contains("rdma_server: end 0"),
        "{}",
        text(&server)
    );
    // Four connections on one channel, data both ways, disconnects.
    let (client, server) = pair_in(
        &a,
        &b,
        &["ucmatose", "-b", "10.85.0.2", "-c", "4"],
        &["ucmatose", "-s", "10.85.0.2", "-c", "4"],
    );
    for (side, output) in [("client", &client), ("server", &server)] {
        let said = text(output);
        assert!(
            output.status.success()
                && said.contains("test complete")
                && said.contains("return status 0"),
            "ucmatose {side}: {said}"
        );
    }
}

/// perftest's `-R` (both sides ours) and what each side must print: a key exchange over a
/// first rdma_cm connection, then the data connection to a listener the server opens on the
/// same port only after that exchange, then disconnects from both sides.
const PERFTEST_R: [(&str, &str, &str); 2] =
    [("ib_write_bw", "65536", "100"), ("ib_send_lat", "2", "100")];

#[test]
fn perftest_with_rdma_cm_talks_to_itself_between_namespaces() {
    let test = "perftest_with_rdma_cm_talks_to_itself_between_namespaces";
    let programs = PERFTEST_R.map(|(program, ..)| program);
    if !needs_root(test) || !prerequisite(test, "perftest", programs.iter().all(|p| installed(p))) {
        return;
    }
    let (a, b) = two_namespaces();
    for (program, size, iters) in PERFTEST_R {
        let (client, server) = pair_in(
            &a,
            &b,
            &[program, "-R", "-n", iters],
            &[program, "-R", "-n", iters, "10.85.0.2"],
        );
        for (side, output) in [("client", &client), ("server", &server)] {
            let said = text(output);
            assert!(
                output.status.success() && common::has_row(&said, size, iters),
                "{program} -R {side}: {said}"
            );
        }
    }
}

#[test]
fn the_event_channel_and_what_is_not_offered_answer_as_rdma_core() {
    let test = "the_event_channel_and_what_is_not_offered_answer_as_rdma_core";
    let gcc = Command::new("gcc").arg("--version").output().is_ok();
    let debian = Path::new("/usr/lib/x86_64-linux-gnu/librdmacm.so.1").exists();
    if !needs_root(test) || !prerequisite(test, "gcc and librdmacm1", gcc && debian) {
        return;
    }
    let dir = std::env::temp_dir().join(format!("roce-rdmacm-paths-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let binary = dir.join("rdmacm_paths");
    // Linked against Debian's librdmacm for its symbol versions; run over ours.
    let compiled = Command::new("gcc")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/c/rdmacm_paths.c"
        ))
        .arg("-o")
        .arg(&binary)
        .arg("/usr/lib/x86_64-linux-gnu/librdmacm.so.1")
        .output()
        .unwrap();
    assert!(compiled.status.success(), "{}", text(&compiled));
    let (a, _b) = two_namespaces();
    let run = exec_in(&a, &[binary.to_str().unwrap(), "10.85.0.2"])
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        run.status.success() && String::from_utf8_lossy(&run.stdout).ends_with("ok\n"),
        "{}",
        text(&run)
    );
}

/// The rxe-peer tool beside the repository (../shared).
fn rxe_peer() -> Option<PathBuf> {
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/rxe-peer/rxe-peer.sh");
    script.exists().then_some(script)
}

/// The rxe VM, stopped again however the test ends.
struct Vm(PathBuf);

impl Vm {
    fn run(&self, args: &[&str]) -> Output {
        Command::new("bash")
            .arg(&self.0)
            .args(args)
            .output()
            .expect("run rxe-peer.sh")
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        let _ = self.run(&["stop"]);
    }
}

/// `rping` over our libraries in the VM's host namespace (`host0`, 10.88.0.1).
fn rping_in_host(args: &[&str]) -> Command {
    in_host("rping", args)
}

/// `program` over our libraries in the VM's host namespace.
fn in_host(program: &str, args: &[&str]) -> Command {
    build_libraries();
    let mut command = Command::new("ip");
    command
        .args(["netns", "exec", "rxe-host", "timeout", "60"])
        .args([env!("CARGO_BIN_EXE_roce"), "exec", "--", program])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// Every ping of `count` in `said` (lines starting `prefix`), in order, and whole where
/// `size` is given (what the VM says comes back through its console, which may cut a
/// line; `-V` has the VM's rping check the bytes itself).
fn check_pings(side: &str, said: &str, prefix: &str, count: usize, size: Option<usize>) {
    let pings: Vec<&str> = said
        .lines()
        .filter(|line| line.starts_with(prefix))
        .collect();
    assert_eq!(pings.len(), count, "{side}: {said}");
    for (index, ping) in pings.iter().enumerate() {
        let payload = &ping[ping.find("rdma-ping-").expect("prefix")..];
        assert!(
            payload.starts_with(&format!("rdma-ping-{index}: ")),
            "{side}: {ping}"
        );
        if let Some(size) = size {
            assert_eq!(payload.len(), size - 1, "{side}: {ping}");
        }
    }
}

#[test]
fn rping_and_perftest_against_the_kernel_cm_in_the_rxe_vm_in_both_roles() {
    let test = "rping_and_perftest_against_the_kernel_cm_in_the_rxe_vm_in_both_roles";
    if !root_and(test, &["rping"]) {
        return;
    }
    let Some(script) = rxe_peer() else {
        prerequisite(test, "../shared/rxe-peer/rxe-peer.sh", false);
        return;
    };
    let vm = Vm(script);
    let _ = vm.run(&["stop"]);
    let started = vm.run(&["start", "1"]);
    assert!(
        started.status.success(),
        "rxe-peer start: {}",
        text(&started)
    );
    let (count, size) = (100, 4096);
    let flags = format!("-v -V -C {count} -S {size}");

    // Nothing listens in the VM yet: the kernel's CM rejects our REQ (invalid service ID).
    let refused = rping_in_host(&["-c", "-a", "10.88.0.11", "-C", "1"])
        .output()
        .unwrap();
    assert!(
        !refused.status.success() && text(&refused).contains("RDMA_CM_EVENT_REJECTED, error 8"),
        "our client with nobody listening: {}",
        text(&refused)
    );

    // The kernel's rping server in the VM, ours the client.
    let spawned = vm.run(&[
        "spawn",
        "1",
        "-t",
        "60",
        &format!("rping -s -a 10.88.0.11 {flags}"),
    ]);
    assert!(spawned.status.success(), "rping server: {}", text(&spawned));
    let job = String::from_utf8_lossy(&spawned.stdout).trim().to_string();
    let mut client = None;
    for _ in 0..50 {
        let args: Vec<&str> = ["-c", "-a", "10.88.0.11"]
            .into_iter()
            .chain(flags.split(' '))
            .collect();
        let output = rping_in_host(&args).output().unwrap();
        let rejected = text(&output).contains("RDMA_CM_EVENT_REJECTED");
        client = Some(output);
        if !rejected {
            break;
        }
        thread::sleep(Duration::from_millis(200));
    }
    let client = client.expect("tried at least once");
    let server = vm.run(&["wait", "1", &job, "60"]);
    assert!(
        client.status.success(),
        "our client: {}\nkernel server: {}",
        text(&client),
        text(&server)
    );
    check_pings(
        "our client",
        &text(&client),
        "ping data: rdma-ping-",
        count,
        Some(size),
    );
    check_pings(
        "kernel server",
        &text(&server),
        "server ping data: rdma-ping-",
        count,
        None,
    );

    // Ours the server, the kernel's rping the client (again until our server listens).
    let args: Vec<&str> = ["-s", "-a", "10.88.0.1"]
        .into_iter()
        .chain(flags.split(' '))
        .collect();
    let server = rping_in_host(&args).spawn().unwrap();
    let server = thread::spawn(move || server.wait_with_output().unwrap());
    // Our CM, up for the server, answers a REQ for a port nobody listens on with a REJ
    // (after holding it for a listener): the kernel's rping says so and stops.
    let refused = vm.run(&[
        "exec",
        "1",
        "-t",
        "30",
        "sleep 2; rping -c -a 10.88.0.1 -p 7999 -C 1",
    ]);
    assert!(
        text(&refused).contains("RDMA_CM_EVENT_REJECTED, error 8"),
        "kernel client to a port we do not listen on: {}",
        text(&refused)
    );
    let client = vm.run(&[
        "exec",
        "1",
        "-t",
        "60",
        &format!(
            "for try in $(seq 50); do rping -c -a 10.88.0.1 {flags} > /tmp/rping.out 2>&1 && break; sleep 0.2; done; cat /tmp/rping.out"
        ),
    ]);
    let server = server.join().unwrap();
    assert!(
        server.status.success(),
        "our server: {}\nkernel client: {}",
        text(&server),
        text(&client)
    );
    check_pings(
        "kernel client",
        &text(&client),
        "ping data: rdma-ping-",
        count,
        None,
    );
    check_pings(
        "our server",
        &text(&server),
        "server ping data: rdma-ping-",
        count,
        Some(size),
    );

    // Under 5 % loss on the bridge: the kernel's rping serves, ours connects.
    let lossy = vm.run(&["loss", "5"]);
    assert!(lossy.status.success(), "loss 5: {}", text(&lossy));
    let job = vm.run(&[
        "spawn",
        "1",
        "-t",
        "60",
        "rping -s -a 10.88.0.11 -v -V -C 20",
    ]);
    let job = String::from_utf8_lossy(&job.stdout).trim().to_string();
    let mut client = None;
    for _ in 0..50 {
        let output = rping_in_host(&["-c", "-a", "10.88.0.11", "-v", "-V", "-C", "20"])
            .output()
            .unwrap();
        let rejected = text(&output).contains("RDMA_CM_EVENT_REJECTED");
        client = Some(output);
        if !rejected {
            break;
        }
        thread::sleep(Duration::from_millis(200));
    }
    let client = client.expect("tried at least once");
    let server = vm.run(&["wait", "1", &job, "60"]);
    let _ = vm.run(&["loss", "0"]);
    assert!(
        client.status.success(),
        "under loss, our client: {}\nkernel server: {}",
        text(&client),
        text(&server)
    );
    check_pings(
        "our client under loss",
        &text(&client),
        "ping data: rdma-ping-",
        20,
        None,
    );

    // perftest -R: rxe serves, we connect (again while the kernel rejects: nobody listens
    // yet), then we serve and the kernel connects.
    for (program, size, iters) in PERFTEST_R {
        let job = vm.run(&[
            "spawn",
            "1",
            "-t",
            "60",
            &format!("{program} -R -n {iters}"),
        ]);
        assert!(job.status.success(), "{program} server: {}", text(&job));
        let job = String::from_utf8_lossy(&job.stdout).trim().to_string();
        let mut client = None;
        for _ in 0..50 {
            let output = in_host(program, &["-R", "-n", iters, "10.88.0.11"])
                .output()
                .unwrap();
            // perftest names the event only by number on its first connection.
            let said = text(&output);
            let rejected = said.contains("REJECTED") || said.contains("CM event bl blka 8");
            client = Some(output);
            if !rejected {
                break;
            }
            thread::sleep(Duration::from_millis(200));
        }
        let client = client.expect("tried at least once");
        let server = vm.run(&["wait", "1", &job, "60"]);
        assert!(
            client.status.success() && common::has_row(&text(&client), size, iters),
            "{program} -R, our client: {}\nkernel server: {}",
            text(&client),
            text(&server)
        );
        assert!(
            common::has_row(&text(&server), size, iters),
            "{program} -R, kernel server: {}",
            text(&server)
        );

        let server = in_host(program, &["-R", "-n", iters]).spawn().unwrap();
        let server = thread::spawn(move || server.wait_with_output().unwrap());
        let client = vm.run(&[
            "exec",
            "1",
            "-t",
            "60",
            &format!(
                "for try in $(seq 50); do {program} -R -n {iters} 10.88.0.1 > /tmp/perf.out 2>&1 && break; sleep 0.2; done; cat /tmp/perf.out"
            ),
        ]);
        let server = server.join().unwrap();
        assert!(
            server.status.success() && common::has_row(&text(&server), size, iters),
            "{program} -R, our server: {}\nkernel client: {}",
            text(&server),
            text(&client)
        );
        assert!(
            common::has_row(&text(&client), size, iters),
            "{program} -R, kernel client: {}",
            text(&client)
        );
    }
}

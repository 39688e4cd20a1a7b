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

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::thread;
use std::time::Duration;

use roce_provider::netns::{needs_root, prerequisite, veth, Netns};
use roce_tests::rxe_vm::{vm, Listener, Vm};

use common::{
    build_libraries, built_dir, can_compile_c, compile_c, dynamic_symbols, exec_in, installed,
    said, text,
};

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
    // Each forwards to its implementation in our libibverbs, exported privately there.
    let private = dynamic_symbols(&built_dir().join("libibverbs.so"), true);
    let unforwarded: Vec<&String> = exports
        .iter()
        .filter(|export| export.contains("@RDMACM_"))
        .filter(|export| {
            let name = export.split('@').next().unwrap_or_default();
            !private.contains(&format!("roce_{name}@ROCE_RDMACM_PRIVATE"))
        })
        .collect();
    assert!(
        unforwarded.is_empty(),
        "no implementation in libibverbs.so.1: {unforwarded:#?}"
    );
}

/// The rdma_cm calls run in libibverbs' own roce-verbs (one copy per process): the QP
/// state changes `rdma_accept` makes are logged by the `ROCE_LOG` subscriber libibverbs
/// installed. When librdmacm linked a roce-verbs of its own, they ran in its copy, whose
/// tracing had no subscriber, and the server's log lacked them.
#[test]
fn rdma_cm_calls_share_libibverbs_roce_verbs() {
    let test = "rdma_cm_calls_share_libibverbs_roce_verbs";
    if !root_and(test, &["rping"]) {
        return;
    }
    let (a, b) = two_namespaces();
    let server = exec_in(
        &b,
        &[
            "env",
            "ROCE_LOG=roce_transport=debug",
            "rping",
            "-s",
            "-C",
            "3",
            "-a",
            "10.85.0.2",
        ],
    )
    .spawn()
    .unwrap();
    let server = thread::spawn(move || server.wait_with_output().unwrap());
    let client = rping_client(&a, &["rping", "-c", "-C", "3", "-a", "10.85.0.2"]);
    let server = server.join().unwrap();
    assert!(client.status.success(), "client: {}", text(&client));
    let said = text(&server);
    assert!(server.status.success(), "server: {said}");
    for change in ["from=Init to=Rtr", "from=Rtr to=Rts"] {
        assert!(
            said.lines()
                .any(|line| line.contains("QP state") && line.contains(change)),
            "the server's log lacks {change}: {said}"
        );
    }
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
    rping_pair(&a, &b, "10.85.0.2", "10.85.0.2", 100);
}

/// `count` pings of 4 KiB from an rping client in `a` (to `client_to`) to an rping server
/// in `b` (bound to `server_on`), every byte checked (`-V`) and every ping seen on both
/// sides.
fn rping_pair(a: &Netns, b: &Netns, server_on: &str, client_to: &str, count: usize) {
    let n = count.to_string();
    let flags = ["-v", "-V", "-C", &n, "-S", "4096", "-a"];
    let server = exec_in(b, &[&["rping", "-s"][..], &flags, &[server_on]].concat())
        .spawn()
        .unwrap();
    // Read the server's output as it comes: 100 pings of 4 KiB fill a pipe.
    let server = thread::spawn(move || server.wait_with_output().unwrap());
    let client = rping_client(a, &[&["rping", "-c"][..], &flags, &[client_to]].concat());
    let server = server.join().unwrap();
    for (side, output, prefix) in [
        ("client", &client, "ping data: rdma-ping-"),
        ("server", &server, "server ping data: rdma-ping-"),
    ] {
        let said = text(output);
        assert!(
            output.status.success(),
            "{side} ({}, to {client_to}): {said}",
            output.status
        );
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
    let debian = "/usr/lib/x86_64-linux-gnu/librdmacm.so.1";
    if !needs_root(test) || !can_compile_c(test, "gcc and librdmacm1", debian) {
        return;
    }
    // Linked against Debian's librdmacm for its symbol versions; run over ours.
    let program = compile_c("rdmacm_paths", &[debian]);
    let (a, _b) = two_namespaces();
    let run = exec_in(&a, &[program.path(), "10.85.0.2"])
        .output()
        .unwrap();
    assert!(
        run.status.success() && String::from_utf8_lossy(&run.stdout).ends_with("ok\n"),
        "{}: {}",
        run.status,
        text(&run)
    );
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
    let Some(vm) = vm(test, "1500") else {
        return;
    };
    let (count, size) = (100, 4096);

    // Nothing listens in the VM: the kernel's CM rejects our REQ (invalid service ID), and
    // goes on rejecting it while our CM sends it again (`CmConfig::unlistened_retry`).
    let refused = rping_in_host(&["-c", "-a", "10.88.0.11", "-C", "1"])
        .output()
        .unwrap();
    assert!(
        !refused.status.success() && text(&refused).contains("RDMA_CM_EVENT_REJECTED, error 8"),
        "our client with nobody listening: {}",
        said(&refused)
    );

    kernel_server_our_client(&vm, "10.88.0.11", "10.88.0.11", count, size);
    our_server_kernel_client(&vm, "10.88.0.1", "10.88.0.1", count, size);
    our_client_under_loss(&vm);
    perftest_rdma_cm_in_both_roles(&vm);
}

/// The rping flags of the VM tests: `count` pings of `size` bytes, checked by the VM's
/// rping itself (`-V`).
fn vm_rping_flags(count: usize, size: usize) -> String {
    format!("-v -V -C {count} -S {size}")
}

/// How long a VM server may run: longer than our client may (`in_host`'s 60 s) after it
/// listens, so that a failure is our client's to tell, not the server's time limit's.
const VM_SERVER_LIMIT: u32 = 150;

/// A shell command for the VM: `command`, each try bounded to `seconds`, tried again (for
/// at most 30 s) while its output contains `again`, a refusal that left nothing half done
/// on either side (a client that failed later must not be restarted: our server would take
/// its next first connection for the one it waits for). Prints the last try's output and
/// how it ended, and exits with its status.
fn vm_client(command: &str, again: &str, seconds: u32) -> String {
    format!(
        "end=$((SECONDS + 30)); try=0
         while :; do
           try=$((try + 1)); timeout {seconds} {command} > /tmp/client.out 2>&1; rc=$?
           grep -q '{again}' /tmp/client.out && ((SECONDS < end)) || break
           sleep 0.2
         done
         cat /tmp/client.out; echo \"[exit status $rc after $try tries]\"; exit $rc"
    )
}

/// How long [`vm_client`]'s command may take in all, for `exec`'s bound.
fn vm_client_limit(seconds: u32) -> u32 {
    seconds + 30 + 30
}

/// The kernel's rping server in the VM bound to `server_on`, listening; ours the client
/// (in the host's namespace) to `client_to`.
fn kernel_server_our_client(vm: &Vm, server_on: &str, client_to: &str, count: usize, size: usize) {
    let flags = vm_rping_flags(count, size);
    let job = vm.spawn_server(
        VM_SERVER_LIMIT,
        &format!("rping -s -a {server_on} {flags}"),
        Listener::RdmaCm(RPING_PORT),
    );
    let args: Vec<&str> = ["-c", "-a", client_to]
        .into_iter()
        .chain(flags.split(' '))
        .collect();
    let client = rping_in_host(&args).output().unwrap();
    let server = vm.wait(&job, VM_SERVER_LIMIT);
    assert!(
        client.status.success(),
        "our client to {client_to}: {}\nkernel server: {}",
        said(&client),
        said(&server)
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
}

/// rping's port.
const RPING_PORT: u16 = 7174;

/// Ours the rping server bound to `server_on`, the kernel's rping in the VM the client to
/// `client_to`.
fn our_server_kernel_client(vm: &Vm, server_on: &str, client_to: &str, count: usize, size: usize) {
    let flags = vm_rping_flags(count, size);
    let args: Vec<&str> = ["-s", "-a", server_on]
        .into_iter()
        .chain(flags.split(' '))
        .collect();
    let server = rping_in_host(&args).spawn().unwrap();
    let server = thread::spawn(move || server.wait_with_output().unwrap());
    // Our CM, up for the server, answers a REQ for a port nobody listens on with a REJ
    // (after holding it for a listener): the kernel's rping says so and stops. Once it has,
    // our rping listens (it listens right after its bind opened the device).
    let refused = vm.exec(30, "sleep 2; rping -c -a 10.88.0.1 -p 7999 -C 1");
    assert!(
        text(&refused).contains("RDMA_CM_EVENT_REJECTED, error 8"),
        "kernel client to a port we do not listen on: {}",
        said(&refused)
    );
    let client = vm.exec(
        vm_client_limit(60),
        &vm_client(
            &format!("rping -c -a {client_to} {flags}"),
            "RDMA_CM_EVENT_REJECTED, error 8",
            60,
        ),
    );
    let server = server.join().unwrap();
    assert!(
        server.status.success() && client.status.success(),
        "our server on {server_on}: {}\nkernel client: {}",
        said(&server),
        said(&client)
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
}

/// Under 5 % loss on the bridge: the kernel's rping serves, ours connects.
fn our_client_under_loss(vm: &Vm) {
    let lossy = vm.run(&["loss", "5"]);
    assert!(lossy.status.success(), "loss 5: {}", said(&lossy));
    let job = vm.spawn_server(
        VM_SERVER_LIMIT,
        "rping -s -a 10.88.0.11 -v -V -C 20",
        Listener::RdmaCm(RPING_PORT),
    );
    let client = rping_in_host(&["-c", "-a", "10.88.0.11", "-v", "-V", "-C", "20"])
        .output()
        .unwrap();
    let server = vm.wait(&job, VM_SERVER_LIMIT);
    let _ = vm.run(&["loss", "0"]);
    assert!(
        client.status.success(),
        "under loss, our client: {}\nkernel server: {}",
        said(&client),
        said(&server)
    );
    check_pings(
        "our client under loss",
        &text(&client),
        "ping data: rdma-ping-",
        20,
        None,
    );
}

/// perftest `-R` against the kernel's CM: rxe serves (listening), we connect; then we serve
/// and the kernel connects. Each connects twice (the key exchange, then the data QP): the
/// second REQ may come before the server listens again, which our CM rides out in both
/// roles (`CmConfig::unlistened_hold` as the server, `unlistened_retry` as the client).
fn perftest_rdma_cm_in_both_roles(vm: &Vm) {
    for (program, size, iters) in PERFTEST_R {
        let job = vm.spawn_server(
            VM_SERVER_LIMIT,
            &format!("{program} -R -n {iters}"),
            Listener::RdmaCm(PERFTEST_PORT),
        );
        let client = in_host(program, &["-R", "-n", iters, "10.88.0.11"])
            .output()
            .unwrap();
        let server = vm.wait(&job, VM_SERVER_LIMIT);
        assert!(
            client.status.success()
                && common::has_row(&text(&client), size, iters)
                && common::has_row(&text(&server), size, iters),
            "{program} -R, our client: {}\nkernel server: {}",
            said(&client),
            said(&server)
        );

        let server = in_host(program, &["-R", "-n", iters]).spawn().unwrap();
        let server = thread::spawn(move || server.wait_with_output().unwrap());
        // Until our server listens, its CM (or, before it runs, nobody) refuses the first
        // connection: perftest says "bl blka 8" for that one alone.
        let client = vm.exec(
            vm_client_limit(60),
            &vm_client(
                &format!("{program} -R -n {iters} 10.88.0.1"),
                "CM event bl blka 8",
                60,
            ),
        );
        let server = server.join().unwrap();
        assert!(
            server.status.success()
                && common::has_row(&text(&server), size, iters)
                && common::has_row(&text(&client), size, iters),
            "{program} -R, our server: {}\nkernel client: {}",
            said(&server),
            said(&client)
        );
    }
}

/// perftest's port.
const PERFTEST_PORT: u16 = 18515;

/// rping `-q`: each side creates its QP with `ibv_create_qp` and moves it through
/// `rdma_init_qp_attr`'s INIT, RTR and RTS attributes itself; the client hears
/// CONNECT_RESPONSE and calls `rdma_establish`. Every ping's bytes are checked (`-V`).
#[test]
fn rping_moving_its_own_qp_talks_to_itself_between_namespaces() {
    let test = "rping_moving_its_own_qp_talks_to_itself_between_namespaces";
    if !root_and(test, &["rping"]) {
        return;
    }
    let (a, b) = two_namespaces();
    let flags = [
        "-q",
        "-v",
        "-V",
        "-C",
        "10",
        "-S",
        "1024",
        "-a",
        "10.85.0.2",
    ];
    let (client, server) = pair_in(
        &a,
        &b,
        &[&["rping", "-s"][..], &flags].concat(),
        &[&["rping", "-c"][..], &flags].concat(),
    );
    for (side, output, prefix) in [
        ("client", &client, "ping data: rdma-ping-"),
        ("server", &server, "server ping data: rdma-ping-"),
    ] {
        let said = text(output);
        assert!(
            output.status.success(),
            "{side} ({}): {said}",
            output.status
        );
        check_pings(side, &said, prefix, 10, Some(1024));
    }
}

/// udaddy's output says every connection resolved and every message came back, and it
/// exited 0.
fn check_udaddy(side: &str, output: &Output) {
    let printed = text(output);
    assert!(
        output.status.success()
            && printed.contains("test complete")
            && printed.contains("return status 0"),
        "udaddy {side}: {}",
        said(output)
    );
}

/// What a SIDR_REQ for a port nobody listens on draws (the SIDR_REP's status 1,
/// "unsupported service", as udaddy prints it).
const NOBODY_LISTENS: &str = "RDMA_CM_EVENT_UNREACHABLE, error: 1";

/// Runs a udaddy client until the server listens (a bounded number of tries).
fn udaddy_client(run: impl Fn() -> Output) -> Output {
    let mut last = None;
    for _ in 0..50 {
        let output = run();
        let early = text(&output).contains(NOBODY_LISTENS);
        last = Some(output);
        if !early {
            break;
        }
        thread::sleep(Duration::from_millis(200));
    }
    last.expect("tried at least once")
}

/// UD ids: udaddy's clients resolve the server's UD QP with SIDR (two ids), send, and the
/// server answers each from the address its datagram came from. (A SIDR_REQ nobody
/// listens for is answered only by a running CM: the rxe VM's test and the verbs API's
/// check that.)
#[test]
fn udaddy_talks_to_itself_between_namespaces() {
    let test = "udaddy_talks_to_itself_between_namespaces";
    if !root_and(test, &["udaddy"]) {
        return;
    }
    let (a, b) = two_namespaces();
    let client = ["udaddy", "-s", "10.85.0.2", "-c", "2", "-C", "5"];
    let server = exec_in(&b, &["udaddy", "-b", "10.85.0.2", "-c", "2", "-C", "5"])
        .spawn()
        .unwrap();
    let server = thread::spawn(move || server.wait_with_output().unwrap());
    let client = udaddy_client(|| exec_in(&a, &client).output().unwrap());
    check_udaddy("client", &client);
    check_udaddy("server", &server.join().unwrap());
}

/// UD ids and self-moved QPs against the kernel's CM (one VM boot): udaddy in both roles,
/// a SIDR_REQ nobody listens for, and our rping `-q` client against the kernel's server.
#[test]
fn udaddy_and_rping_q_against_the_kernel_cm_in_the_rxe_vm() {
    let test = "udaddy_and_rping_q_against_the_kernel_cm_in_the_rxe_vm";
    if !root_and(test, &["rping", "udaddy"]) {
        return;
    }
    let Some(vm) = vm(test, "1500") else {
        return;
    };
    let ours = ["-s", "10.88.0.11", "-c", "2", "-C", "5"];
    let refused = in_host("udaddy", &ours).output().unwrap();
    assert!(
        !refused.status.success() && text(&refused).contains(NOBODY_LISTENS),
        "our client with nobody listening: {}",
        text(&refused)
    );

    let job = vm.spawn_server(
        VM_SERVER_LIMIT,
        "udaddy -b 10.88.0.11 -c 2 -C 5",
        Listener::RdmaCm(RPING_PORT),
    );
    let client = in_host("udaddy", &ours).output().unwrap();
    let server = vm.wait(&job, VM_SERVER_LIMIT);
    check_udaddy("our client", &client);
    check_udaddy("kernel server", &server);

    let server = in_host("udaddy", &["-b", "10.88.0.1", "-c", "2", "-C", "5"])
        .spawn()
        .unwrap();
    let server = thread::spawn(move || server.wait_with_output().unwrap());
    let client = vm.exec(
        vm_client_limit(60),
        &vm_client("udaddy -s 10.88.0.1 -c 2 -C 5", NOBODY_LISTENS, 60),
    );
    check_udaddy("kernel client", &client);
    check_udaddy("our server", &server.join().unwrap());

    let job = vm.spawn_server(
        VM_SERVER_LIMIT,
        "rping -s -q -a 10.88.0.11 -v -C 10 -S 1024",
        Listener::RdmaCm(RPING_PORT),
    );
    let client = rping_in_host(&[
        "-c",
        "-q",
        "-a",
        "10.88.0.11",
        "-v",
        "-V",
        "-C",
        "10",
        "-S",
        "1024",
    ])
    .output()
    .unwrap();
    let server = vm.wait(&job, VM_SERVER_LIMIT);
    assert!(
        client.status.success(),
        "our rping -q client: {}\nkernel server: {}",
        said(&client),
        said(&server)
    );
    check_pings(
        "our client",
        &text(&client),
        "ping data: rdma-ping-",
        10,
        Some(1024),
    );
    check_pings(
        "kernel server",
        &text(&server),
        "server ping data: rdma-ping-",
        10,
        None,
    );
}

/// [`two_namespaces`] with IPv6 as well: `ca` fd85::1/64, `cb` fd85::2/64 (no duplicate
/// address detection: usable at once).
fn two_namespaces_with_ipv6() -> (Netns, Netns) {
    let (a, b) = two_namespaces();
    for (ns, interface, address) in [(&a, "ca", "fd85::1/64"), (&b, "cb", "fd85::2/64")] {
        let added = ns
            .ip(&["-6", "addr", "add", address, "dev", interface, "nodad"])
            .unwrap();
        assert!(added.status.success(), "{}", text(&added));
    }
    (a, b)
}

/// The link-local IPv6 address of `interface` as `ip addr` shows it (`fe80::…`).
fn link_local(said: &str) -> String {
    said.split_whitespace()
        .skip_while(|word| *word != "inet6")
        .nth(1)
        .and_then(|address| address.split('/').next())
        .filter(|address| address.starts_with("fe80:"))
        .unwrap_or_else(|| panic!("no link-local address in {said:?}"))
        .to_owned()
}

#[test]
fn rping_and_ucmatose_over_ipv6_between_namespaces() {
    let test = "rping_and_ucmatose_over_ipv6_between_namespaces";
    if !root_and(test, &["rping", "ucmatose"]) {
        return;
    }
    let (a, b) = two_namespaces_with_ipv6();
    // Global addresses: RoCEv2 over IPv6 from the CM's REQ to the last ping.
    rping_pair(&a, &b, "fd85::2", "fd85::2", 100);
    // Link-local, each side naming its own interface as the scope.
    let shown = b
        .ip(&["-o", "-6", "addr", "show", "dev", "cb", "scope", "link"])
        .unwrap();
    let server = link_local(&text(&shown));
    rping_pair(&a, &b, &format!("{server}%cb"), &format!("{server}%ca"), 10);
    // A listener on the IPv6 wildcard takes IPv4 requests too (the kernel's bindv6only 0).
    rping_pair(&a, &b, "::", "10.85.0.2", 10);
    // One on the IPv4 wildcard does not take IPv6 ones: the kernel's rdma_cm rejects them
    // (consumer defined, 28), where a port nobody listens on is an invalid service ID (8).
    let server = exec_in(&b, &["rping", "-s", "-a", "0.0.0.0", "-C", "1"])
        .spawn()
        .unwrap();
    let mut refused = String::new();
    for _ in 0..50 {
        let output = exec_in(&a, &["rping", "-c", "-a", "fd85::2", "-C", "1"])
            .output()
            .unwrap();
        refused = text(&output);
        if !refused.contains("REJECTED, error 8") {
            break;
        }
        thread::sleep(Duration::from_millis(200));
    }
    let ended = exec_in(&a, &["rping", "-c", "-a", "10.85.0.2", "-C", "1"])
        .output()
        .unwrap();
    let server = server.wait_with_output().unwrap();
    assert!(
        refused.contains("RDMA_CM_EVENT_REJECTED, error 28"),
        "IPv6 client of an IPv4 listener: {refused}"
    );
    assert!(
        ended.status.success() && server.status.success(),
        "IPv4 client: {}\nserver: {}",
        text(&ended),
        text(&server)
    );
    // Four connections on one channel, the client bound to its address (`-b`).
    let (client, server) = pair_in(
        &a,
        &b,
        &["ucmatose", "-b", "fd85::2", "-c", "4"],
        &["ucmatose", "-s", "fd85::2", "-b", "fd85::1", "-c", "4"],
    );
    for (side, output) in [("client", &client), ("server", &server)] {
        let said = text(output);
        assert!(
            output.status.success()
                && said.contains("test complete")
                && said.contains("return status 0"),
            "ucmatose over IPv6, {side}: {said}"
        );
    }
}

/// Runs `command` in the rxe VM's host namespace (`host0`).
fn run_in_host(command: &[&str]) -> Output {
    Command::new("ip")
        .args(["netns", "exec", "rxe-host"])
        .args(command)
        .output()
        .unwrap()
}

#[test]
fn rping_over_ipv6_against_the_kernel_cm_in_the_rxe_vm_in_both_roles() {
    let test = "rping_over_ipv6_against_the_kernel_cm_in_the_rxe_vm_in_both_roles";
    if !root_and(test, &["rping"]) {
        return;
    }
    let Some(vm) = vm(test, "1500") else {
        return;
    };
    // Global addresses on both ends of the VM's private bridge; the kernel adds the VM's
    // as a RoCEv2 GID of rxe0.
    let added = run_in_host(&[
        "ip",
        "-6",
        "addr",
        "add",
        "fd88::1/64",
        "dev",
        "host0",
        "nodad",
    ]);
    assert!(added.status.success(), "{}", text(&added));
    let gids = vm.run(&[
        "exec",
        "1",
        "-t",
        "30",
        "ip -6 addr add fd88::11/64 dev eth0 nodad && sleep 0.5 && cat /sys/class/infiniband/rxe0/ports/1/gids/*",
    ]);
    assert!(
        text(&gids).contains("fd88:0000:0000:0000:0000:0000:0000:0011"),
        "the VM's GIDs: {}",
        text(&gids)
    );
    let capture = format!("roce-rdmacm-ipv6-{}", std::process::id());
    let started = vm.run(&["capture-start", &capture]);
    assert!(started.status.success(), "capture: {}", text(&started));
    let (count, size) = (100, 4096);
    kernel_server_our_client(&vm, "fd88::11", "fd88::11", count, size);
    our_server_kernel_client(&vm, "fd88::1", "fd88::1", count, size);
    // Link-local, scoped: the VM's is made from its MAC (52:54:00:88:00:0b).
    let vm_link_local = "fe80::5054:ff:fe88:b";
    kernel_server_our_client(
        &vm,
        &format!("{vm_link_local}%eth0"),
        &format!("{vm_link_local}%host0"),
        10,
        size,
    );
    let shown = run_in_host(&[
        "ip", "-o", "-6", "addr", "show", "dev", "host0", "scope", "link",
    ]);
    let host_link_local = link_local(&text(&shown));
    our_server_kernel_client(
        &vm,
        &format!("{host_link_local}%host0"),
        &format!("{host_link_local}%eth0"),
        10,
        size,
    );
    let _ = vm.run(&["capture-stop"]);
    // The CM's MADs on the bridge, as `roce dump` decodes them: each connection's
    // REQ/REP/RTU and DREQ/DREP over IPv6, from whichever side opened or closed it.
    let pcap = common::rxe::capture_path(&capture);
    let dump = Command::new(env!("CARGO_BIN_EXE_roce"))
        .arg("dump")
        .arg(&pcap)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&pcap);
    let dump = text(&dump);
    let mads: Vec<(&str, &str, &str)> = dump
        .lines()
        .filter_map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            let mad = words.iter().find(|word| word.starts_with("CM_"))?;
            Some((*words.get(1)?, *words.get(3)?, *mad))
        })
        .collect();
    let host = host_link_local.as_str();
    for (from, to) in [
        ("fd88::1", "fd88::11"),
        ("fd88::11", "fd88::1"),
        (host, vm_link_local),
        (vm_link_local, host),
    ] {
        for (opens, answers) in [("CM_REQ", "CM_REP"), ("CM_DREQ", "CM_DREP")] {
            assert!(
                mads.contains(&(from, to, opens)) && mads.contains(&(to, from, answers)),
                "{opens} {from} -> {to} and its answer: {mads:?}"
            );
        }
        assert!(
            mads.contains(&(from, to, "CM_RTU")),
            "RTU {from} -> {to}: {mads:?}"
        );
    }
}

/// `ROCE_LOSS=5` on both sides (our fault injector drops 5 % of the frames each side sends,
/// so both directions): three rping connections in a row, each with every byte checked,
/// complete over the CM's resends (REQ, REP, RTU, DREQ) and the transport's
/// retransmissions. The counters (`ROCE_STATS`) must show go-back-N retries, which a clean
/// veth never causes, so the test cannot pass without loss. A response time of 2^14 ×
/// 4.096 µs (67 ms) keeps a lost MAD's resend at about 2.2 s (twice the packet lifetime
/// plus that) instead of 6.4 s. rping's client exits right after its DREQ (it does not wait
/// for the DREP), so nobody resends a lost one and the server waits for ever, as it would
/// with the kernel's CM: a server still waiting after all its pings is stopped after
/// `SERVER_LIMIT` and accepted when the client completed.
#[test]
fn rping_connects_and_completes_under_five_percent_loss_between_namespaces() {
    let test = "rping_connects_and_completes_under_five_percent_loss_between_namespaces";
    if !root_and(test, &["rping"]) {
        return;
    }
    let (a, b) = two_namespaces();
    let flags = ["-v", "-V", "-C", "20", "-S", "1024", "-a", "10.85.0.2"];
    let lossy = |ns: &Netns, program: &[&str], seed: usize| {
        let mut command = exec_in(ns, program);
        command
            .env("ROCE_LOSS", "5")
            .env("ROCE_LOSS_SEED", seed.to_string())
            .env("ROCE_CM_RESPONSE_TIMEOUT", "14")
            .env("ROCE_STATS", "1");
        command
    };
    let mut retries = 0;
    let mut lost_dreqs = 0;
    for round in 0..3 {
        // Line-buffered, so that a server stopped by `timeout` has said every ping.
        let server = lossy(
            &b,
            &[
                &["timeout", SERVER_LIMIT, "stdbuf", "-oL", "rping", "-s"][..],
                &flags,
            ]
            .concat(),
            2 * round,
        )
        .spawn()
        .unwrap();
        let server = thread::spawn(move || server.wait_with_output().unwrap());
        let mut client = None;
        for _ in 0..50 {
            let output = lossy(&a, &[&["rping", "-c"][..], &flags].concat(), 2 * round + 1)
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
        let server = server.join().unwrap();
        for (side, output, prefix) in [
            ("client", &client, "ping data: rdma-ping-"),
            ("server", &server, "server ping data: rdma-ping-"),
        ] {
            let said = text(output);
            let lost_dreq = side == "server" && output.status.code() == Some(124);
            assert!(
                output.status.success() || lost_dreq,
                "round {round}, {side} ({}): {said}",
                output.status
            );
            check_pings(side, &said, prefix, 20, Some(1024));
            retries += counter(&said, "completer_retry_err");
            if lost_dreq {
                eprintln!("round {round}: the server waited for a lost DREQ");
                lost_dreqs += 1;
            }
        }
    }
    eprintln!("{retries} go-back-N retries, {lost_dreqs} final DREQs lost");
    assert!(
        retries > 0,
        "no retransmission in three rounds: nothing was lost"
    );
}

/// How long the lossy rping server may take (`timeout`'s argument): the rounds take a few
/// seconds, and a few more for each lost MAD.
const SERVER_LIMIT: &str = "30";

/// The sum of the counter `name` over every `ROCE_STATS` report in `said`.
fn counter(said: &str, name: &str) -> u64 {
    said.lines()
        .filter_map(|line| line.strip_prefix(name)?.trim().parse::<u64>().ok())
        .sum()
}

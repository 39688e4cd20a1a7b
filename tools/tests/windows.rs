//! Memory windows from C programs over our `libibverbs.so.1`: every call, work request and
//! failure on two QPs of one device (`tests/c/windows.c`); binds, access through windows and
//! SEND with invalidate across the wire between two of our namespaces, with `roce dump`
//! showing the IETH (`tests/c/windows_peer.c`); and the same program against Linux rxe in
//! the rxe VM, in both roles.
//!
//! Needs root, gcc and libibverbs-dev (and for the last test the rxe-peer tool); in CI a
//! missing prerequisite fails the test, elsewhere it is skipped with a message.

mod common;

use std::process::{Child, Output};
use std::thread;
use std::time::Duration;

use roce_provider::netns::{needs_root, veth, Netns};
use roce_tests::rxe_vm::vm;

use common::{can_compile_c, compile_c, exec_in, exec_in_named, text, CProgram, VERBS_H};

fn prerequisites(test: &str) -> bool {
    needs_root(test) && can_compile_c(test, "gcc and libibverbs-dev", VERBS_H)
}

fn succeeded(output: &Output) -> bool {
    output.status.success() && String::from_utf8_lossy(&output.stdout).contains("ok")
}

/// The `(server, client)` pair of a run, failing the test with both sides' output unless
/// both said "ok".
fn assert_both(what: &str, server: &Output, client: &Output) {
    assert!(
        succeeded(server) && succeeded(client),
        "{what}\n--- server\n{}\n--- client\n{}",
        text(server),
        text(client)
    );
}

fn finish(child: Child) -> Output {
    child.wait_with_output().expect("wait for the program")
}

#[test]
fn memory_windows_through_the_c_abi() {
    let test = "memory_windows_through_the_c_abi";
    if !prerequisites(test) {
        return;
    }
    let program = compile_c("windows", &["-libverbs"]);
    let ns = Netns::create("roce-mw").unwrap();
    let peer = Netns::create("roce-mw-peer").unwrap();
    veth(
        (&ns, "wa", "10.86.0.1/24"),
        (&peer, "wb", "10.86.0.2/24"),
        1500,
    )
    .unwrap();
    let run = exec_in(&ns, &[program.path(), "wa"]).output().unwrap();
    assert!(succeeded(&run), "{}", text(&run));
}

/// The server of `windows_peer` in `server_ns`, the client in `client_ns`.
fn peer_run(program: &CProgram, server: &Netns, client: &Netns, pcap: &str) -> (Output, Output) {
    let serving = exec_in(server, &[program.path(), "pa", "1"])
        .env("ROCE_PCAP", pcap)
        .spawn()
        .unwrap();
    let client = exec_in(client, &[program.path(), "pb", "1", "10.87.0.1"])
        .output()
        .unwrap();
    (finish(serving), client)
}

#[test]
fn memory_windows_across_the_wire_between_our_namespaces() {
    let test = "memory_windows_across_the_wire_between_our_namespaces";
    if !prerequisites(test) {
        return;
    }
    let program = compile_c("windows_peer", &["-libverbs"]);
    let (a, b) = (
        Netns::create("roce-mwp-a").unwrap(),
        Netns::create("roce-mwp-b").unwrap(),
    );
    veth((&a, "pa", "10.87.0.1/24"), (&b, "pb", "10.87.0.2/24"), 1500).unwrap();
    let pcap = program.dir.path().join("server.pcap");
    let pcap = pcap.to_str().unwrap();
    let (server, client) = peer_run(&program, &a, &b, pcap);
    assert_both("between two namespaces of ours", &server, &client);
    // Our completion says IBV_WC_WITH_INV (bit 3), as verbs.h defines it.
    assert!(text(&server).contains("wc_flags 0x8"), "{}", text(&server));
    let dump = std::process::Command::new(env!("CARGO_BIN_EXE_roce"))
        .args(["dump", pcap])
        .output()
        .unwrap();
    let lines = text(&dump);
    let invalidate = lines
        .lines()
        .find(|line| line.contains("RC_SEND_ONLY_WITH_INVALIDATE"))
        .unwrap_or_else(|| panic!("no SEND with invalidate in\n{lines}"));
    assert!(invalidate.contains("ieth(rkey=0x"), "{invalidate}");
    assert!(
        lines
            .lines()
            .any(|line| line.contains("NAK REMOTE_ACCESS_ERROR")),
        "the last WRITE's NAK:\n{lines}"
    );
}

/// `windows_peer` with Linux rxe in the VM: rxe owning the windows while our client writes,
/// reads and invalidates through them, then the reverse.
#[test]
fn memory_windows_against_rxe_in_both_roles() {
    let test = "memory_windows_against_rxe_in_both_roles";
    if !prerequisites(test) {
        return;
    }
    let program = compile_c("windows_peer", &["-libverbs"]);
    let Some(vm) = vm(test, "1500") else {
        return;
    };
    let guest = vm.copy_in(&program.binary, "windows_peer");
    let host = "rxe-host";

    let job = vm.spawn(60, &format!("{guest} rxe0 $(rxe-gid)"));
    let ours = exec_in_named(host, &[program.path(), "host0", "1", "10.88.0.11"])
        .output()
        .unwrap();
    let theirs = vm.wait(&job, 60);
    assert_both("rxe owns the windows", &theirs, &ours);

    let serving = exec_in_named(host, &[program.path(), "host0", "1"])
        .spawn()
        .unwrap();
    // Our server listens within a few milliseconds; the client retries its connect anyway.
    thread::sleep(Duration::from_millis(500));
    let theirs = vm.exec(60, &format!("{guest} rxe0 $(rxe-gid) 10.88.0.1"));
    assert_both("we own the windows", &finish(serving), &theirs);
}

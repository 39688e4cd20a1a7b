//! XRC from C programs over our `libibverbs.so.1`, between two of our namespaces
//! (`tests/c/xrc.c`): XRC domains opened by file, XRC SRQs, both QP halves, `ibv_open_qp`,
//! sends into the SRQ each request names (by `ibv_post_send` and through `ibv_qp_ex`),
//! WRITE and READ in the named SRQ's PD, and an SRQ number the domain lacks (NAKed).
//! `roce dump` shows each request's XRCETH. Linux rxe has no XRC, so there is no rxe
//! counterpart (docs/interop.md).
//!
//! Needs root, gcc and libibverbs-dev; in CI a missing prerequisite fails the test,
//! elsewhere it is skipped with a message.

mod common;

use std::process::Command;

use roce_provider::netns::{needs_root, veth, Netns};

use common::{can_compile_c, compile_c, exec_in, text, VERBS_H};

#[test]
fn xrc_between_two_of_our_namespaces() {
    let test = "xrc_between_two_of_our_namespaces";
    if !needs_root(test) || !can_compile_c(test, "gcc and libibverbs-dev", VERBS_H) {
        return;
    }
    let program = compile_c("xrc", &["-libverbs"]);
    let (a, b) = (
        Netns::create("roce-xrc-a").unwrap(),
        Netns::create("roce-xrc-b").unwrap(),
    );
    veth((&a, "xa", "10.89.0.1/24"), (&b, "xb", "10.89.0.2/24"), 1500).unwrap();
    let pcap = program.dir.path().join("server.pcap");
    let server = exec_in(&a, &[program.path(), "xa", "1"])
        .env("ROCE_PCAP", &pcap)
        .spawn()
        .unwrap();
    let client = exec_in(&b, &[program.path(), "xb", "1", "10.89.0.1"])
        .output()
        .unwrap();
    let server = server.wait_with_output().unwrap();
    let ok = |output: &std::process::Output| {
        output.status.success() && String::from_utf8_lossy(&output.stdout).contains("ok")
    };
    assert!(
        ok(&server) && ok(&client),
        "--- server\n{}\n--- client\n{}",
        text(&server),
        text(&client)
    );
    let dump = Command::new(env!("CARGO_BIN_EXE_roce"))
        .arg("dump")
        .arg(&pcap)
        .output()
        .unwrap();
    let lines = text(&dump);
    let requests: Vec<&str> = lines
        .lines()
        .filter(|line| line.contains("10.89.0.2 -> 10.89.0.1") && line.contains(" XRC_"))
        .collect();
    assert!(requests.len() >= 7, "XRC requests:\n{lines}");
    assert!(
        requests.iter().all(|line| line.contains("xrceth(srqn=0x")),
        "every XRC request carries its XRCETH:\n{lines}"
    );
    for answer in [
        "XRC_ACKNOWLEDGE",
        "XRC_RDMA_READ_RESPONSE",
        "NAK INVALID_REQUEST",
    ] {
        assert!(lines.contains(answer), "{answer}:\n{lines}");
    }
}

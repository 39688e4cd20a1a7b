//! Congestion control through our `libibverbs.so.1`, as C programs see it:
//! `tests/c/rate_limit.c` (ibv_modify_qp_rate_limit and IBV_QP_RATE_LIMIT pace a QP), between
//! two QPs of one device under `roce exec`.
//!
//! Needs root (a namespace, AF_XDP), gcc and libibverbs-dev; in CI a missing prerequisite
//! fails the test, elsewhere it is skipped with a message.

mod common;

use roce_provider::netns::{needs_root, veth, Netns};

use common::{can_compile_c, compile_c, exec_in, text, VERBS_H};

/// Runs `tests/c/NAME.c` on the device of a namespace's veth (`cc0`), expecting "ok".
fn run_c(test: &str, name: &str) -> String {
    if !needs_root(test) || !can_compile_c(test, "gcc and libibverbs-dev", VERBS_H) {
        return String::new();
    }
    let program = compile_c(name, &["-libverbs"]);
    let ns = Netns::create("roce-congestion").unwrap();
    let peer = Netns::create("roce-congestion-peer").unwrap();
    veth(
        (&ns, "cc0", "10.86.0.1/24"),
        (&peer, "cc1", "10.86.0.2/24"),
        1500,
    )
    .unwrap();
    let run = exec_in(&ns, &[program.path(), "cc0"]).output().unwrap();
    let out = text(&run);
    assert!(run.status.success() && out.contains("ok"), "{out}");
    out
}

#[test]
fn a_rate_limit_set_through_the_verbs_paces_the_qp() {
    let out = run_c(
        "a_rate_limit_set_through_the_verbs_paces_the_qp",
        "rate_limit",
    );
    eprintln!("{out}");
}

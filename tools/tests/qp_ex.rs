//! C programs over our `libibverbs.so.1` through `roce exec`, for the QP surface rdma-core's
//! own test suite uses: `ibv_create_qp_ex` and the `ibv_qp_ex` work request builders
//! (`tools/tests/c/qp_ex.c`), between QPs of one device in a namespace of the test's own.
//!
//! Needs root (namespaces, AF_XDP), gcc and libibverbs-dev; in CI a missing prerequisite
//! fails the test, elsewhere it is skipped with a message.

mod common;

use roce_provider::netns::{needs_root, veth, Netns};

use common::{can_compile_c, run_verbs_program, VERBS_H};

/// A namespace with a veth pair, `qa` (10.84.0.1) and its peer `qb`, both up, MTU 1500: the
/// device the programs use is `qa`.
fn namespace() -> (Netns, Netns) {
    let a = Netns::create("roce-qpex-a").unwrap();
    let b = Netns::create("roce-qpex-b").unwrap();
    veth((&a, "qa", "10.84.0.1/24"), (&b, "qb", "10.84.0.2/24"), 1500).unwrap();
    (a, b)
}

/// Runs the C program `name` on device `qa`; it must print "ok".
fn run_c(test: &str, name: &str) {
    if !needs_root(test) || !can_compile_c(test, "gcc and libibverbs-dev", VERBS_H) {
        return;
    }
    let (a, _b) = namespace();
    run_verbs_program(name, &a, "qa");
}

#[test]
fn create_qp_ex_and_every_qp_ex_builder_work_as_rdma_core_defines_them() {
    run_c(
        "create_qp_ex_and_every_qp_ex_builder_work_as_rdma_core_defines_them",
        "qp_ex",
    );
}

#[test]
fn a_context_imported_from_a_cmd_fd_shares_its_pd_and_mr_and_carries_traffic() {
    run_c(
        "a_context_imported_from_a_cmd_fd_shares_its_pd_and_mr_and_carries_traffic",
        "import",
    );
}

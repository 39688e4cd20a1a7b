//! Extended CQs, memory regions and domains through our `libibverbs.so.1`, as C programs see
//! them: `tests/c/cq_ex.c` (ibv_create_cq_ex and its polling API with timestamps, resize,
//! create-CQ bad flows, ibv_query_device_ex, ibv_query_rt_values_ex, the GID table's empty
//! entries) and `tests/c/mr_domains.c` (ibv_rereg_mr, on-demand paging explicit and implicit,
//! ibv_advise_mr, parent and thread domains with allocators, fork), each between two QPs of
//! one device under `roce exec`.
//!
//! Needs root (a namespace, AF_XDP), gcc and libibverbs-dev; in CI a missing prerequisite
//! fails the test, elsewhere it is skipped with a message.

mod common;

use roce_provider::netns::{needs_root, veth, Netns};

use common::{can_compile_c, run_verbs_program, VERBS_H};

/// Runs `tests/c/NAME.c` on the device of a namespace's veth (`cq0`), expecting "ok".
fn run_c(test: &str, name: &str) {
    if !needs_root(test) || !can_compile_c(test, "gcc and libibverbs-dev", VERBS_H) {
        return;
    }
    let ns = Netns::create("roce-verbscq").unwrap();
    let peer = Netns::create("roce-verbscq-peer").unwrap();
    veth(
        (&ns, "cq0", "10.84.0.1/24"),
        (&peer, "cq1", "10.84.0.2/24"),
        1500,
    )
    .unwrap();
    run_verbs_program(name, &ns, "cq0");
}

#[test]
fn extended_cqs_poll_every_field_with_timestamps_and_resize_as_rdma_core() {
    run_c(
        "extended_cqs_poll_every_field_with_timestamps_and_resize_as_rdma_core",
        "cq_ex",
    );
}

#[test]
fn regions_reregister_page_on_demand_and_live_in_parent_domains() {
    run_c(
        "regions_reregister_page_on_demand_and_live_in_parent_domains",
        "mr_domains",
    );
}

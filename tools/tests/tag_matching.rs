//! Tag matching through our `libibverbs.so.1`, as a C program sees it (`tests/c/tm.c`):
//! `tm_caps`, tag-matching SRQs and their refusals, `ibv_post_srq_ops` lists, eager,
//! unexpected and untagged messages, the sync, a rendezvous read by the receiving QP and its
//! FIN, read through an extended CQ with `IBV_WC_EX_WITH_TM_INFO`, between two RC QPs of one
//! device under `roce exec`. rxe has no tag matching: this is between our own QPs only.
//!
//! Needs root (a namespace, AF_XDP), gcc and libibverbs-dev; in CI a missing prerequisite
//! fails the test, elsewhere it is skipped with a message.

mod common;

use roce_provider::netns::{needs_root, veth, Netns};

use common::{can_compile_c, run_verbs_program, VERBS_H};

#[test]
fn tag_matching_srqs_match_eager_unexpected_and_rendezvous_messages_as_mlx5() {
    let test = "tag_matching_srqs_match_eager_unexpected_and_rendezvous_messages_as_mlx5";
    if !needs_root(test) || !can_compile_c(test, "gcc and libibverbs-dev", VERBS_H) {
        return;
    }
    let ns = Netns::create("roce-tm").unwrap();
    let peer = Netns::create("roce-tm-peer").unwrap();
    veth(
        (&ns, "tm0", "10.85.0.1/24"),
        (&peer, "tm1", "10.85.0.2/24"),
        1500,
    )
    .unwrap();
    run_verbs_program("tm", &ns, "tm0");
}

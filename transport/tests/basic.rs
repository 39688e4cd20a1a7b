//! Each RC, UC and UD operation once, over a clean and over a lossy simulated link.

use roce_transport::cq::{WcOpcode, WcStatus, WorkCompletion};
use roce_transport::qp_state::{PathMtu, QpType};
use roce_transport::sim::{LinkConfig, RetryConfig, Sim};
use roce_transport::wr::{RecvWr, SendFlags, SendOp, SendWr, Sge};
use roce_transport::AccessFlags;

const ALL: AccessFlags = AccessFlags::all();

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Registers `len` bytes on `node` at `iova`, filled with `fill`; returns the key.
fn region(sim: &mut Sim, node: usize, iova: u64, fill: &[u8]) -> u32 {
    let pd = sim.nodes[node].pd;
    let mrs = sim.nodes[node].endpoint.mrs();
    let key = mrs.reg_mr(pd, iova, fill.len(), ALL).unwrap();
    mrs.get_mut(key).unwrap().bytes_mut().copy_from_slice(fill);
    key
}

fn bytes(sim: &mut Sim, node: usize, key: u32) -> Vec<u8> {
    sim.nodes[node]
        .endpoint
        .mrs()
        .get(key)
        .unwrap()
        .bytes()
        .to_vec()
}

fn poll(sim: &mut Sim, node: usize, send: bool) -> Vec<WorkCompletion> {
    let n = &mut sim.nodes[node];
    let cq = if send { n.send_cq } else { n.recv_cq };
    let mut out = Vec::new();
    n.endpoint.cq(cq).poll(usize::MAX, &mut out);
    out
}

fn send_wr(wr_id: u64, op: SendOp, sge: Sge) -> SendWr {
    SendWr {
        wr_id,
        op,
        sg_list: vec![sge],
        inline_data: Vec::new(),
        flags: SendFlags::SIGNALED,
        ud: None,
    }
}

fn lossy() -> LinkConfig {
    LinkConfig {
        loss: 0.05,
        reorder: 0.05,
        duplicate: 0.01,
        corrupt: 0.01,
        ..LinkConfig::default()
    }
}

/// SEND, WRITE, READ and both atomics over RC; every byte checked.
fn rc_all_operations(link: LinkConfig, mtu: PathMtu, seed: u64) {
    let mut sim = Sim::new(link, seed);
    let (a, b) = (sim.add_node(), sim.add_node());
    let pair = sim.connect(a, b, QpType::Rc, mtu, RetryConfig::default());
    let (qa, qb) = (pair.a.1, pair.b.1);
    let len = 300_000;
    let src = pattern(len, 1);
    let src_key = region(&mut sim, a, 0x10_0000, &src);
    let dst_key = region(&mut sim, b, 0x20_0000, &vec![0; len]);
    let now = sim.now;
    sim.nodes[b]
        .endpoint
        .post_recv(
            now,
            qb,
            RecvWr {
                wr_id: 77,
                sg_list: vec![Sge {
                    addr: 0x20_0000,
                    length: len as u32,
                    lkey: dst_key,
                }],
            },
        )
        .unwrap();
    let whole = Sge {
        addr: 0x10_0000,
        length: len as u32,
        lkey: src_key,
    };
    sim.nodes[a]
        .endpoint
        .post_send(now, qa, send_wr(1, SendOp::Send, whole))
        .unwrap();
    let mut recv = Vec::new();
    assert!(sim.run_until(1_000_000, |sim| {
        recv.extend(poll(sim, b, false));
        !recv.is_empty()
    }));
    assert_eq!(recv.len(), 1);
    assert_eq!(
        (recv[0].wr_id, recv[0].status, recv[0].byte_len),
        (77, WcStatus::Success, len as u32)
    );
    assert_eq!(bytes(&mut sim, b, dst_key), src);

    // WRITE the source into the second half of a fresh region, READ it back elsewhere.
    let target = region(&mut sim, b, 0x40_0000, &vec![0; 2 * len]);
    let write = SendOp::RdmaWrite {
        remote_addr: 0x40_0000 + len as u64,
        rkey: target,
    };
    sim.nodes[a]
        .endpoint
        .post_send(now, qa, send_wr(2, write, whole))
        .unwrap();
    let back_key = region(&mut sim, a, 0x80_0000, &vec![0; len]);
    let read = SendOp::RdmaRead {
        remote_addr: 0x40_0000 + len as u64,
        rkey: target,
    };
    let back = Sge {
        addr: 0x80_0000,
        length: len as u32,
        lkey: back_key,
    };
    sim.nodes[a]
        .endpoint
        .post_send(now, qa, send_wr(3, read, back))
        .unwrap();
    // Atomics on an 8-byte counter at the start of `target`.
    let result_key = region(&mut sim, a, 0x90_0000, &[0; 16]);
    let faa = SendOp::FetchAdd {
        remote_addr: 0x40_0000,
        rkey: target,
        add: 5,
    };
    sim.nodes[a]
        .endpoint
        .post_send(
            now,
            qa,
            send_wr(
                4,
                faa,
                Sge {
                    addr: 0x90_0000,
                    length: 8,
                    lkey: result_key,
                },
            ),
        )
        .unwrap();
    let cas = SendOp::CompareSwap {
        remote_addr: 0x40_0000,
        rkey: target,
        compare: 5,
        swap: 99,
    };
    sim.nodes[a]
        .endpoint
        .post_send(
            now,
            qa,
            send_wr(
                5,
                cas,
                Sge {
                    addr: 0x90_0008,
                    length: 8,
                    lkey: result_key,
                },
            ),
        )
        .unwrap();

    let mut sends = Vec::new();
    assert!(
        sim.run_until(2_000_000, |sim| {
            sends.extend(poll(sim, a, true));
            sends.len() == 5
        }),
        "completions: {sends:?}, stats {:?}",
        sim.stats
    );
    let statuses: Vec<(u64, WcStatus, WcOpcode)> = sends
        .iter()
        .map(|c| (c.wr_id, c.status, c.opcode))
        .collect();
    assert_eq!(
        statuses,
        [
            (1, WcStatus::Success, WcOpcode::Send),
            (2, WcStatus::Success, WcOpcode::RdmaWrite),
            (3, WcStatus::Success, WcOpcode::RdmaRead),
            (4, WcStatus::Success, WcOpcode::FetchAdd),
            (5, WcStatus::Success, WcOpcode::CompareSwap),
        ]
    );
    let target_bytes = bytes(&mut sim, b, target);
    assert_eq!(&target_bytes[len..], &src[..]);
    assert_eq!(&target_bytes[8..len], &vec![0; len - 8][..], "untouched");
    assert_eq!(
        u64::from_ne_bytes(target_bytes[..8].try_into().unwrap()),
        99
    );
    assert_eq!(bytes(&mut sim, a, back_key), src);
    let results = bytes(&mut sim, a, result_key);
    assert_eq!(
        u64::from_ne_bytes(results[..8].try_into().unwrap()),
        0,
        "FETCH_ADD saw 0"
    );
    assert_eq!(
        u64::from_ne_bytes(results[8..].try_into().unwrap()),
        5,
        "CMP_SWAP saw 5"
    );
    assert_eq!(sim.stats.corrupt_accepted, 0);
}

#[test]
fn rc_operations_on_a_clean_link() {
    rc_all_operations(LinkConfig::default(), PathMtu::Mtu1024, 1);
}

#[test]
fn rc_operations_on_a_lossy_link() {
    for seed in 0..5 {
        rc_all_operations(lossy(), PathMtu::Mtu4096, seed);
    }
}

//! Tag matching between two of our QPs (rxe has none): an RC QP on A sends to an RC QP on B
//! that takes its receives from a tag-matching SRQ. Eager messages into matched tags (one
//! packet and several), unexpected and untagged ones into ordinary receives, the phase
//! counts and SYNC, rendezvous (B reads A's buffer, completes the tag twice, sends the FIN)
//! and the cases the program finishes itself, DEL, the bounds of the list and of its
//! operations, and hostile TMHs, each NAKed and counted without a panic.

use proptest::prelude::*;
use roce_transport::cq::{TmFlags, TmInfo, WcOpcode, WcStatus, WorkCompletion};
use roce_transport::endpoint::{CreateQpError, DestroyCqError};
use roce_transport::qp::{QpCaps, QpInit};
use roce_transport::qp_state::{PathMtu, QpState, QpType};
use roce_transport::sim::{LinkConfig, RetryConfig, Sim};
use roce_transport::srq::{SrqAttr, SrqError};
use roce_transport::tm::{TmOp, TmOpError, TmOpWr, TmSrqCaps};
use roce_transport::wr::{SendFlags, SendOp};
use roce_transport::{Endpoint, SrqId, LIMITS};
use roce_wire::tmh::{self, TmOpcode};

mod common;
use common::*;

/// Bytes of each tagged or ordinary buffer at B.
const SLOT: usize = 4096;
/// Where B's ordinary receives are.
const RECV: u64 = DST2;
/// Where A's receives (for FINs) are.
const FIN_BUF: u64 = 0x30_0000;

struct Pair {
    sim: Sim,
    srq: SrqId,
    qa: u32,
    qb: u32,
    /// B's tagged buffers: `SLOT` bytes each at `DST`.
    tags_key: u32,
    /// B's ordinary receive buffers: `SLOT` bytes each at `RECV`.
    recv_key: u32,
    /// Messages A has sent so far (each in a region of its own).
    sent: u64,
}

fn pair(max_num_tags: u32, max_ops: u32) -> Pair {
    let mut sim = Sim::new(LinkConfig::default(), 29);
    assert_eq!((sim.add_node(), sim.add_node()), (A, B));
    let node = &mut sim.nodes[B];
    let attr = SrqAttr {
        max_wr: 64,
        max_sge: 1,
        srq_limit: 0,
    };
    let caps = TmSrqCaps {
        max_num_tags,
        max_ops,
    };
    let srq = node
        .endpoint
        .create_tm_srq(attr, caps, node.recv_cq)
        .unwrap();
    let init = QpInit {
        pd: node.pd,
        qp_type: QpType::Rc,
        caps: QpCaps {
            max_send_wr: 0,
            ..QpCaps::default()
        },
        sq_sig_all: false,
    };
    let qb = node
        .endpoint
        .create_qp_with_srq(init, node.send_cq, node.recv_cq, srq)
        .unwrap();
    let qa = sim.create_qp(A, QpType::Rc, QpCaps::default());
    sim.connect_qps(
        (A, qa),
        (B, qb),
        QpType::Rc,
        PathMtu::Mtu1024,
        RetryConfig::default(),
    );
    let tags_key = sim.reg(B, DST, &vec![0; SLOT * 16]);
    let recv_key = sim.reg(B, RECV, &vec![0; SLOT * 16]);
    Pair {
        sim,
        srq,
        qa,
        qb,
        tags_key,
        recv_key,
        sent: 0,
    }
}

/// A TMH followed by `data`.
fn message(opcode: TmOpcode, app_ctx: u32, tag: u64, data: &[u8]) -> Vec<u8> {
    let mut bytes = vec![0; tmh::HEADER_LEN];
    let header = tmh::Repr {
        opcode,
        app_ctx,
        tag,
    };
    header.emit(&mut tmh::Packet::new_unchecked(&mut bytes[..]));
    bytes.extend_from_slice(data);
    bytes
}

/// A rendezvous request: TMH, RVH naming `len` bytes at `va` under `rkey`, then `extra`.
fn rndv(app_ctx: u32, tag: u64, va: u64, rkey: u32, len: u32, extra: usize) -> Vec<u8> {
    let mut rvh = Vec::new();
    rvh.extend_from_slice(&va.to_be_bytes());
    rvh.extend_from_slice(&rkey.to_be_bytes());
    rvh.extend_from_slice(&len.to_be_bytes());
    rvh.extend(std::iter::repeat_n(0xEE, extra));
    message(TmOpcode::Rndv, app_ctx, tag, &rvh)
}

impl Pair {
    fn op(&mut self, wr_id: u64, op: TmOp, sync: Option<u32>) -> Result<Option<u32>, TmOpError> {
        let wr = TmOpWr {
            wr_id,
            op,
            signaled: true,
            sync,
        };
        post_one(&mut self.sim.nodes[B].endpoint, self.srq, wr)
    }

    /// ADDs a tag whose buffer is slot `slot` at `DST` (`len` bytes of it), expecting its
    /// TM_ADD completion; the handle and the completion's flags.
    fn add(
        &mut self,
        tag: u64,
        mask: u64,
        recv_wr_id: u64,
        slot: u64,
        len: usize,
    ) -> (u32, TmFlags) {
        let op = TmOp::Add {
            tag,
            mask,
            recv_wr_id,
            sg_list: [sge(DST + slot * SLOT as u64, len, self.tags_key)].into(),
        };
        let handle = self.op(1000 + recv_wr_id, op, None).unwrap().unwrap();
        let done = self.sim.poll_recv(B);
        assert_eq!(done.len(), 1, "{done:?}");
        assert_eq!(
            (done[0].wr_id, done[0].opcode, done[0].status),
            (1000 + recv_wr_id, WcOpcode::TmAdd, WcStatus::Success)
        );
        (handle, done[0].tm.flags)
    }

    /// Posts ordinary receives `first..first + count` to the SRQ, each its own slot at `RECV`.
    fn post_receives(&mut self, first: u64, count: u64) {
        for wr_id in first..first + count {
            let wr = recv_wr(wr_id, sge(RECV + wr_id * SLOT as u64, SLOT, self.recv_key));
            self.sim.nodes[B]
                .endpoint
                .post_srq_recv(self.srq, &wr)
                .unwrap();
        }
    }

    /// A sends `bytes` as one SEND (from a region of their own).
    fn send(&mut self, bytes: &[u8]) {
        self.sent += 1;
        let at = SRC + self.sent * 0x10_0000;
        let mut wr = signaled(self.sent, SendOp::Send, sge(at, bytes.len(), 0));
        if bytes.is_empty() {
            wr.sg_list.clear();
        } else {
            wr.sg_list[0].lkey = self.sim.reg(A, at, bytes);
        }
        self.sim.post_send(A, self.qa, &wr).unwrap();
    }

    /// B's completions until `n` have come (the SRQ's CQ is B's receive CQ).
    fn at_b(&mut self, n: usize) -> Vec<WorkCompletion> {
        wait_recv(&mut self.sim, B, n)
    }

    fn tag_bytes(&mut self, slot: u64, len: usize) -> Vec<u8> {
        let at = slot as usize * SLOT;
        self.sim.mr_bytes(B, self.tags_key)[at..at + len].to_vec()
    }

    fn receive_bytes(&mut self, wr_id: u64, len: usize) -> Vec<u8> {
        let at = wr_id as usize * SLOT;
        self.sim.mr_bytes(B, self.recv_key)[at..at + len].to_vec()
    }
}

/// `ibv_post_srq_ops` of a list of one: its handle, or why it was refused.
fn post_one(endpoint: &mut Endpoint, srq: SrqId, wr: TmOpWr) -> Result<Option<u32>, TmOpError> {
    let mut handle = None;
    endpoint
        .post_srq_ops(srq, [wr], |_, given| handle = given)
        .map_err(|(_, error)| error)?;
    Ok(handle)
}

/// What the test looks at in a completion.
fn seen(c: &WorkCompletion) -> (u64, WcStatus, WcOpcode, u32, TmInfo) {
    (c.wr_id, c.status, c.opcode, c.byte_len, c.tm)
}

fn matched(flags: TmFlags, app_ctx: u32, tag: u64) -> TmInfo {
    TmInfo {
        flags,
        app_ctx,
        tag,
    }
}

fn flags(flags: TmFlags) -> TmInfo {
    TmInfo {
        flags,
        ..TmInfo::NONE
    }
}

/// Eager messages of one packet and of three land after their TMH in the oldest tag their
/// tag matches under its mask, completing once with MATCH and DATA_VALID, the TMH's tag and
/// app_ctx, and the data's length; the SRQ's ordinary receives are not touched.
#[test]
fn eager_messages_land_in_their_tags() {
    let mut p = pair(8, 16);
    p.post_receives(0, 4);
    let (first, _) = p.add(0x17, 0xFF, 1, 0, SLOT);
    let (second, _) = p.add(0x100, 0xF00, 2, 1, SLOT);
    assert_eq!((first, second), (0, 1));
    let short = pattern(100, 3);
    let long = pattern(3000, 9); // three packets at MTU 1024
    p.send(&message(TmOpcode::Eager, 7, 0x1F00_0017, &short));
    p.send(&message(TmOpcode::Eager, 8, 0x1F5, &long));
    assert_eq!(
        wait_send(&mut p.sim, A, 2)
            .iter()
            .map(|c| c.status)
            .collect::<Vec<_>>(),
        [WcStatus::Success; 2]
    );
    let done = p.at_b(2);
    let both = TmFlags::MATCH | TmFlags::DATA_VALID;
    assert_eq!(
        done.iter().map(seen).collect::<Vec<_>>(),
        [
            (
                1,
                WcStatus::Success,
                WcOpcode::TmRecv,
                100,
                matched(both, 7, 0x1F00_0017)
            ),
            (
                2,
                WcStatus::Success,
                WcOpcode::TmRecv,
                3000,
                matched(both, 8, 0x1F5)
            ),
        ]
    );
    assert!(done.iter().all(|c| c.qp_num == p.qb));
    assert_eq!(p.tag_bytes(0, 100), short);
    assert_eq!(p.tag_bytes(1, 3000), long);
    let stats = p.sim.nodes[B].endpoint.tm_stats(p.srq).unwrap();
    assert_eq!(
        (stats.matched, stats.unexpected, stats.malformed),
        (2, 0, 0)
    );
    // Both tags are free again, but a new one takes the next handle never used.
    assert_eq!(p.add(5, !0, 3, 2, SLOT).0, 2);
    // A SEND with immediate data asking for a solicited event reports both.
    let bytes = message(TmOpcode::Eager, 0, 5, &[7; 8]);
    let key = p.sim.reg(A, 0x90_0000, &bytes);
    let mut wr = signaled(50, SendOp::SendWithImm(0xC0FFEE), sge(0x90_0000, 24, key));
    wr.flags |= SendFlags::SOLICITED;
    p.sim.post_send(A, p.qa, &wr).unwrap();
    let done = p.at_b(1);
    assert_eq!(
        (
            done[0].wr_id,
            done[0].byte_len,
            done[0].imm_data,
            done[0].solicited
        ),
        (3, 8, Some(0xC0FFEE), true)
    );
}

/// A tagged message no tag matches, and an untagged one (NO_TAG, or a FIN as mlx5 reports
/// one), land whole in the SRQ's next ordinary receive with no tag reported; the unexpected
/// one is counted, a tag added before the program syncs asks for a sync (SYNC_REQ) and
/// matches nothing until it does, and then matches.
#[test]
fn unexpected_messages_and_the_sync_they_need() {
    let mut p = pair(8, 16);
    p.post_receives(0, 4);
    p.add(1, !0, 1, 0, SLOT);
    let stray = message(TmOpcode::Eager, 5, 0x1234, &pattern(200, 1));
    let untagged = message(TmOpcode::NoTag, 6, 0x1234, &pattern(50, 2));
    let fin = message(TmOpcode::Fin, 9, 0x77, &[]);
    p.send(&stray);
    p.send(&untagged);
    p.send(&fin);
    let done = p.at_b(3);
    assert_eq!(
        done.iter().map(seen).collect::<Vec<_>>(),
        [
            (0, WcStatus::Success, WcOpcode::TmRecv, 216, TmInfo::NONE),
            (1, WcStatus::Success, WcOpcode::TmNoTag, 66, TmInfo::NONE),
            (2, WcStatus::Success, WcOpcode::TmNoTag, 16, TmInfo::NONE),
        ]
    );
    assert_eq!(p.receive_bytes(0, stray.len()), stray);
    assert_eq!(p.receive_bytes(1, untagged.len()), untagged);
    // The program has not handled the unexpected message yet: a new tag is not matched.
    let (_, added) = p.add(0x1234, !0, 2, 1, SLOT);
    assert_eq!(added, TmFlags::SYNC_REQ);
    p.send(&stray);
    let done = p.at_b(1);
    assert_eq!(
        seen(&done[0]),
        (3, WcStatus::Success, WcOpcode::TmRecv, 216, TmInfo::NONE)
    );
    // It handled both: SYNC with 2, and the tag takes the next one.
    p.op(27, TmOp::Sync, Some(2)).unwrap();
    let done = p.sim.poll_recv(B);
    assert_eq!(
        done.iter().map(seen).collect::<Vec<_>>(),
        [(27, WcStatus::Success, WcOpcode::TmSync, 0, TmInfo::NONE)]
    );
    p.send(&stray);
    let done = p.at_b(1);
    let both = TmFlags::MATCH | TmFlags::DATA_VALID;
    assert_eq!(
        seen(&done[0]),
        (
            2,
            WcStatus::Success,
            WcOpcode::TmRecv,
            200,
            matched(both, 5, 0x1234)
        )
    );
    let stats = p.sim.nodes[B].endpoint.tm_stats(p.srq).unwrap();
    assert_eq!((stats.matched, stats.unexpected, stats.no_tag), (1, 2, 2));
}

/// A rendezvous request matched: B completes the tag with MATCH (its tag and app_ctx), reads
/// A's buffer into the tag with an RDMA READ of its own QP (whose program posted no send at
/// all), completes the tag again with DATA_VALID and the length read, and sends A a FIN: a
/// TMH with opcode FIN and the request's tag and app_ctx, into A's next receive.
#[test]
fn rendezvous_reads_the_senders_buffer_and_answers_fin() {
    let mut p = pair(8, 16);
    let data = pattern(5000, 11);
    let data_key = p.sim.reg(A, 0x80_0000, &data);
    let fin_key = p.sim.reg(A, FIN_BUF, &[0; 64]);
    p.sim
        .post_recv(A, p.qa, &recv_wr(55, sge(FIN_BUF, 64, fin_key)))
        .unwrap();
    p.add(0xAB, !0, 9, 0, SLOT * 2);
    p.send(&rndv(0x5151, 0xAB, 0x80_0000, data_key, 5000, 0));
    let done = p.at_b(2);
    assert_eq!(
        done.iter().map(seen).collect::<Vec<_>>(),
        [
            (
                9,
                WcStatus::Success,
                WcOpcode::TmRecv,
                0,
                matched(TmFlags::MATCH, 0x5151, 0xAB)
            ),
            (
                9,
                WcStatus::Success,
                WcOpcode::TmRecv,
                5000,
                flags(TmFlags::DATA_VALID)
            ),
        ]
    );
    assert_eq!(p.tag_bytes(0, 5000), data);
    let fins = wait_recv(&mut p.sim, A, 1);
    assert_eq!(
        (
            fins[0].wr_id,
            fins[0].status,
            fins[0].opcode,
            fins[0].byte_len
        ),
        (55, WcStatus::Success, WcOpcode::Recv, 16)
    );
    let fin = p.sim.mr_bytes(A, fin_key);
    let fin = tmh::Repr::parse(&tmh::Packet::new_checked(&fin[..16]).unwrap()).unwrap();
    assert_eq!(
        (fin.opcode, fin.app_ctx, fin.tag),
        (TmOpcode::Fin, 0x5151, 0xAB)
    );
    let sends = wait_send(&mut p.sim, A, 1);
    assert_eq!(sends[0].status, WcStatus::Success);
    assert!(
        p.sim.poll_send(B).is_empty(),
        "B's own READ and FIN complete nothing"
    );
    assert_eq!(
        p.sim.nodes[B].endpoint.tm_stats(p.srq).unwrap().rendezvous,
        1
    );
    assert_eq!(state(&p.sim, B, p.qb), QpState::Rts);
}

/// A rendezvous request longer than max_rndv_hdr_size, or naming more than its tag holds,
/// is left to the program: its bytes after the TMH land in the tag and it completes with
/// IBV_WC_TM_RNDV_INCOMPLETE (MATCH and DATA_VALID); nothing is read, no FIN is sent.
#[test]
fn rendezvous_the_receiver_cannot_finish_is_the_programs() {
    let mut p = pair(8, 16);
    let long = rndv(
        1,
        0x10,
        0x80_0000,
        0x1234,
        100,
        LIMITS.max_rndv_hdr_size as usize,
    );
    let greedy = rndv(2, 0x20, 0x80_0000, 0x1234, 5000, 0);
    p.add(0x10, !0, 1, 0, SLOT);
    p.add(0x20, !0, 2, 1, 4096);
    p.send(&long);
    p.send(&greedy);
    let done = p.at_b(2);
    let both = TmFlags::MATCH | TmFlags::DATA_VALID;
    let incomplete = WcStatus::TmRndvIncomplete;
    assert_eq!(
        done.iter().map(seen).collect::<Vec<_>>(),
        [
            (
                1,
                incomplete,
                WcOpcode::TmRecv,
                long.len() as u32 - 16,
                matched(both, 1, 0x10)
            ),
            (2, incomplete, WcOpcode::TmRecv, 16, matched(both, 2, 0x20)),
        ]
    );
    assert_eq!(p.tag_bytes(0, long.len() - 16), long[16..]);
    assert_eq!(p.tag_bytes(1, 16), greedy[16..]);
    settle(&mut p.sim);
    assert!(p.sim.poll_recv(A).is_empty(), "no FIN");
    assert_eq!(
        p.sim.nodes[B].endpoint.tm_stats(p.srq).unwrap().rendezvous,
        0
    );
}

/// A rendezvous whose RVH names memory A does not have: B's READ is NAKed, the tag
/// completes with the READ's error, and B's QP enters ERR.
#[test]
fn a_failed_rendezvous_read_fails_the_tag() {
    let mut p = pair(8, 16);
    p.add(3, !0, 3, 0, SLOT);
    p.send(&rndv(0, 3, 0xDEAD_0000, 0xBAD, 64, 0));
    let done = p.at_b(2);
    assert_eq!(seen(&done[0]).4, matched(TmFlags::MATCH, 0, 3));
    assert_eq!(
        (done[1].wr_id, done[1].opcode, done[1].status),
        (3, WcOpcode::TmRecv, WcStatus::RemoteAccess)
    );
    assert_eq!(state(&p.sim, B, p.qb), QpState::Err);
}

/// DEL removes a posted tag (which then matches nothing), fails with IBV_WC_TM_ERR for a
/// tag a message consumed, and refuses a handle beyond the list; freed handles are reused
/// only after every handle was used once, oldest freed first.
#[test]
fn deleting_tags() {
    let mut p = pair(3, 16);
    p.post_receives(0, 2);
    let (h0, _) = p.add(1, !0, 1, 0, SLOT);
    let (h1, _) = p.add(2, !0, 2, 1, SLOT);
    p.op(70, TmOp::Del { handle: h0 }, None).unwrap();
    p.send(&message(TmOpcode::Eager, 0, 1, &[1, 2, 3]));
    p.send(&message(TmOpcode::Eager, 0, 2, &[4, 5, 6]));
    let done = p.at_b(3);
    assert_eq!(
        done.iter()
            .map(|c| (c.wr_id, c.opcode, c.status))
            .collect::<Vec<_>>(),
        [
            (70, WcOpcode::TmDel, WcStatus::Success),
            (0, WcOpcode::TmRecv, WcStatus::Success),
            (2, WcOpcode::TmRecv, WcStatus::Success),
        ]
    );
    assert_eq!(
        done[1].tm,
        TmInfo::NONE,
        "the deleted tag's message was unexpected"
    );
    p.op(71, TmOp::Del { handle: h1 }, None).unwrap();
    let done = p.sim.poll_recv(B);
    assert_eq!(
        (done[0].wr_id, done[0].opcode, done[0].status),
        (71, WcOpcode::TmDel, WcStatus::TmError)
    );
    assert_eq!(
        p.op(72, TmOp::Del { handle: 3 }, None),
        Err(TmOpError::UnknownHandle)
    );
    assert_eq!(p.add(4, !0, 4, 2, SLOT).0, 2);
    assert_eq!(p.add(5, !0, 5, 3, SLOT).0, h0);
    assert_eq!(p.add(6, !0, 6, 4, SLOT).0, h1);
}

/// The list's bounds: max_num_tags tags, one scatter element, max_ops unsignaled
/// operations; a basic SRQ takes no list operations; a tag-matching SRQ beyond the device's
/// caps, without a CQ, or for a UC QP is refused, and its CQ cannot go while it lives.
#[test]
fn bounds_of_the_list_and_of_tag_matching_srqs() {
    let mut p = pair(2, 2);
    p.add(1, !0, 1, 0, SLOT);
    p.add(2, !0, 2, 1, SLOT);
    let third = TmOp::Add {
        tag: 3,
        mask: !0,
        recv_wr_id: 3,
        sg_list: [sge(DST, 8, p.tags_key)].into(),
    };
    assert_eq!(p.op(3, third.clone(), None), Err(TmOpError::ListFull));
    let two = TmOp::Add {
        tag: 3,
        mask: !0,
        recv_wr_id: 3,
        sg_list: [sge(DST, 8, p.tags_key), sge(DST + 8, 8, p.tags_key)]
            .into_iter()
            .collect(),
    };
    assert_eq!(p.op(3, two, None), Err(TmOpError::TooManySge));
    let quiet = |op| TmOpWr {
        wr_id: 0,
        op,
        signaled: false,
        sync: None,
    };
    let endpoint = &mut p.sim.nodes[B].endpoint;
    post_one(endpoint, p.srq, quiet(TmOp::Sync)).unwrap();
    post_one(endpoint, p.srq, quiet(TmOp::Sync)).unwrap();
    assert_eq!(
        post_one(endpoint, p.srq, quiet(TmOp::Sync)),
        Err(TmOpError::OpsFull)
    );
    assert_eq!(TmOpError::OpsFull.errno(), roce_transport::errno::ENOMEM);
    // A list holds a slot per operation, signaled or not: the third of a list fails and
    // names its index; the two before it ran.
    let mut p = pair(2, 2);
    let signaled = |wr_id| TmOpWr {
        wr_id,
        op: TmOp::Sync,
        signaled: true,
        sync: None,
    };
    let mut ran = Vec::new();
    let endpoint = &mut p.sim.nodes[B].endpoint;
    let refused = endpoint.post_srq_ops(
        p.srq,
        [signaled(1), signaled(2), signaled(3)],
        |index, _| ran.push(index),
    );
    assert_eq!((refused, ran), (Err((2, TmOpError::OpsFull)), vec![0, 1]));
    let done = p.sim.poll_recv(B);
    assert_eq!(done.iter().map(|c| c.wr_id).collect::<Vec<_>>(), [1, 2]);
    let endpoint = &mut p.sim.nodes[B].endpoint;
    let basic = endpoint
        .create_srq(SrqAttr {
            max_wr: 4,
            max_sge: 1,
            srq_limit: 0,
        })
        .unwrap();
    assert_eq!(
        post_one(endpoint, basic, quiet(TmOp::Sync)),
        Err(TmOpError::NotTagMatching)
    );
    let node = &mut p.sim.nodes[B];
    let attr = SrqAttr {
        max_wr: 4,
        max_sge: 1,
        srq_limit: 0,
    };
    let beyond = TmSrqCaps {
        max_num_tags: LIMITS.max_tm_tags + 1,
        max_ops: 1,
    };
    assert_eq!(
        node.endpoint.create_tm_srq(attr, beyond, node.recv_cq),
        Err(SrqError::InvalidAttr("max_num_tags"))
    );
    let uc = QpInit {
        pd: node.pd,
        qp_type: QpType::Uc,
        caps: QpCaps::default(),
        sq_sig_all: false,
    };
    assert_eq!(
        node.endpoint
            .create_qp_with_srq(uc, node.send_cq, node.recv_cq, p.srq),
        Err(CreateQpError::TagMatchingNeedsRc)
    );
    let cq = node.endpoint.create_cq(4).unwrap();
    let caps = TmSrqCaps {
        max_num_tags: 1,
        max_ops: 1,
    };
    let lone = node.endpoint.create_tm_srq(attr, caps, cq).unwrap();
    assert_eq!(node.endpoint.destroy_cq(cq), Err(DestroyCqError::InUse));
    node.endpoint.destroy_srq(lone).unwrap();
    node.endpoint.destroy_cq(cq).unwrap();
    assert_eq!(
        node.endpoint.create_tm_srq(attr, caps, cq),
        Err(SrqError::InvalidAttr("cq"))
    );
}

/// An eager message longer than its tag: the tag completes with IBV_WC_LOC_LEN_ERR, the
/// SEND is NAKed as an invalid request and B's QP enters ERR, as for any receive too small.
#[test]
fn an_eager_message_longer_than_its_tag() {
    let mut p = pair(8, 16);
    p.add(1, !0, 1, 0, 64);
    p.send(&message(TmOpcode::Eager, 0, 1, &pattern(65, 0)));
    let done = p.at_b(1);
    assert_eq!(
        (done[0].wr_id, done[0].opcode, done[0].status),
        (1, WcOpcode::TmRecv, WcStatus::LocalLength)
    );
    let sends = wait_send(&mut p.sim, A, 1);
    assert_eq!(sends[0].status, WcStatus::RemoteInvalidRequest);
    assert_eq!(state(&p.sim, B, p.qb), QpState::Err);
    // Its tag is free again: all of the list can be added once more.
    let node = &mut p.sim.nodes[B];
    for tag in 0..8 {
        let add = TmOpWr {
            wr_id: tag,
            op: TmOp::Add {
                tag,
                mask: !0,
                recv_wr_id: tag,
                sg_list: Default::default(),
            },
            signaled: false,
            sync: None,
        };
        post_one(&mut node.endpoint, p.srq, add).unwrap();
    }
}

/// Hostile requests to a QP on a tag-matching SRQ: a SEND shorter than a TMH, a TMH with an
/// opcode rdma-core does not define, a matched rendezvous request cut inside its RVH. Each
/// is NAKed as an invalid request (A's SEND fails REM_INV_REQ_ERR), counted as malformed,
/// and B's QP enters ERR; nothing panics and no tag is lost.
#[test]
fn hostile_tmhs_are_naked_and_counted() {
    let mut bad_rndv = rndv(0, 9, 0x1000, 1, 8, 0);
    bad_rndv.truncate(24);
    let mut undefined = message(TmOpcode::Eager, 0, 9, &[0; 8]);
    undefined[0] = 0x42;
    for (n, bytes) in [vec![3; 8], Vec::new(), undefined, bad_rndv]
        .into_iter()
        .enumerate()
    {
        let mut p = pair(4, 16);
        p.post_receives(0, 1);
        p.add(9, !0, 9, 0, SLOT);
        p.send(&bytes);
        let sends = wait_send(&mut p.sim, A, 1);
        assert_eq!(sends[0].status, WcStatus::RemoteInvalidRequest, "case {n}");
        assert_eq!(state(&p.sim, B, p.qb), QpState::Err, "case {n}");
        let stats = p.sim.nodes[B].endpoint.tm_stats(p.srq).unwrap();
        assert_eq!((stats.malformed, stats.matched), (1, 0), "case {n}");
        // The tag is still in the list, to delete.
        p.op(80, TmOp::Del { handle: 0 }, None).unwrap();
        let done = p.sim.poll_recv(B);
        let del = done.iter().find(|c| c.opcode == WcOpcode::TmDel).unwrap();
        assert_eq!(del.status, WcStatus::Success, "case {n}");
    }
}

/// What a random run does.
#[derive(Debug, Clone)]
enum Step {
    Add {
        tag: u8,
        any_low_bit: bool,
        len: u16,
    },
    Del {
        handle: u8,
    },
    Sync {
        handled: u8,
    },
    /// A SEND whose first byte is `opcode` (defined or not), then an app_ctx, the tag, and
    /// `len` bytes of which the first 16 may pass for an RVH.
    Send {
        opcode: u8,
        tag: u8,
        len: u16,
        rvh: (u64, u32, u32),
    },
    Receives,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (any::<u8>(), any::<bool>(), 0u16..5000).prop_map(|(tag, any_low_bit, len)| Step::Add {
            tag: tag % 8,
            any_low_bit,
            len
        }),
        (0u8..6).prop_map(|handle| Step::Del { handle }),
        (0u8..6).prop_map(|handled| Step::Sync { handled }),
        (
            0u8..6,
            0u8..8,
            0u16..5000,
            (any::<u64>(), any::<u32>(), 0u32..9000)
        )
            .prop_map(|(opcode, tag, len, rvh)| Step::Send {
                opcode,
                tag,
                len,
                rvh
            }),
        Just(Step::Receives),
    ]
}

/// A tag in the property test's model of B's list.
#[derive(Debug)]
struct ModelTag {
    /// Its receive's `wr_id`, which also orders the tags as they were added.
    wr_id: u64,
    tag: u64,
    mask: u64,
    /// A rendezvous request matched it: its READ is under way.
    reading: bool,
    /// Messages may match it: it was added, or a sync came, while the program had handled
    /// every unexpected message.
    matchable: bool,
}

/// What the property test knows of B's tag list and of the messages on their way to it.
#[derive(Default)]
struct ListModel {
    /// The tags in use, by handle.
    live: std::collections::HashMap<u32, ModelTag>,
    /// Tags' receives that completed for good.
    done: std::collections::HashSet<u64>,
    /// A's SENDs that B has not completed yet: each TMH's opcode byte and tag.
    sent: std::collections::VecDeque<(u8, u64)>,
    /// Messages B received as unexpected.
    unexpected: u16,
    /// The unexpected messages the program said it handled, with its last sync.
    handled: u16,
}

/// First `recv_wr_id` of the tags the property test ADDs (each its own, increasing): B's
/// ordinary receives are below it.
const TAG_WR_ID: u64 = 1000;

impl ListModel {
    /// Checks B's completions, in the order B made them, against the messages A sent (B
    /// completes them in order: one refused stops the QPs, so what B completes is a prefix
    /// of what A sent) and the list. Untagged messages and FINs go to ordinary receives. A
    /// tagged message goes to a tag it matches (under the tag's mask, reported with the
    /// sender's tag and `app_ctx`): to the first added of the matchable tags that match it,
    /// or, if none, to an ordinary receive. A tag completes once, or (a rendezvous) with
    /// MATCH alone and then once more; its last completion frees its handle.
    fn take(&mut self, completions: &[WorkCompletion]) -> Result<(), TestCaseError> {
        for c in completions {
            if !matches!(c.opcode, WcOpcode::TmRecv | WcOpcode::TmNoTag) {
                continue;
            }
            prop_assert!(
                !self.done.contains(&c.wr_id),
                "a tag completed twice: {c:?}"
            );
            let tag = self.live.iter_mut().find(|(_, t)| t.wr_id == c.wr_id);
            if let Some((&handle, tag)) = tag.filter(|(_, t)| t.reading) {
                // The end of a rendezvous: no message of its own.
                prop_assert!(!c.tm.flags.contains(TmFlags::MATCH), "{c:?}");
                self.done.insert(tag.wr_id);
                self.live.remove(&handle);
                continue;
            }
            let Some((opcode, sent_tag)) = self.sent.pop_front() else {
                return Err(TestCaseError::fail(format!(
                    "a message A did not send: {c:?}"
                )));
            };
            let untagged = [TmOpcode::NoTag as u8, TmOpcode::Fin as u8];
            let tagged = [TmOpcode::Eager as u8, TmOpcode::Rndv as u8];
            if untagged.contains(&opcode) {
                prop_assert_eq!((c.opcode, c.wr_id < TAG_WR_ID), (WcOpcode::TmNoTag, true));
                continue;
            }
            prop_assert!(
                tagged.contains(&opcode),
                "an undefined TMH delivered: {c:?}"
            );
            prop_assert_eq!(c.opcode, WcOpcode::TmRecv);
            let first = (self.live.values())
                .filter(|t| t.matchable && !t.reading && sent_tag & t.mask == t.tag)
                .map(|t| t.wr_id)
                .min();
            prop_assert_eq!(first, (c.wr_id >= TAG_WR_ID).then_some(c.wr_id), "{:?}", c);
            if c.wr_id < TAG_WR_ID {
                self.unexpected = self.unexpected.wrapping_add(1);
                continue;
            }
            let found = self.live.iter_mut().find(|(_, t)| t.wr_id == c.wr_id);
            let Some((&handle, tag)) = found else {
                return Err(TestCaseError::fail(format!(
                    "completion of no live tag: {c:?}"
                )));
            };
            prop_assert_eq!(sent_tag & tag.mask, tag.tag, "{:?}", c);
            if c.tm.flags.contains(TmFlags::MATCH) {
                prop_assert_eq!((c.tm.tag, c.tm.app_ctx), (sent_tag, 1));
            }
            if c.tm.flags == TmFlags::MATCH && c.status == WcStatus::Success {
                tag.reading = true;
            } else {
                self.done.insert(tag.wr_id);
                self.live.remove(&handle);
            }
        }
        Ok(())
    }

    fn in_sync(&self) -> bool {
        self.unexpected == self.handled
    }

    /// The program's sync: it has handled `handled` unexpected messages.
    fn sync(&mut self, handled: u16) {
        self.handled = handled;
        if self.in_sync() {
            self.live.values_mut().for_each(|t| t.matchable = true);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Random list operations and random (often hostile) tagged SENDs, among them rendezvous
    /// requests naming random memory or A's, checked step by step against a model of the
    /// list: an ADD is refused exactly when `max_num_tags` tags are in use (none leaks) and
    /// gets a handle not in use; a DEL succeeds exactly on a tag still posted; every tag's
    /// receive completes as [`ListModel::take`] says, with a tag that matches it; nothing
    /// panics; at the end, with every tag deleted, the whole list can be added again.
    #[test]
    fn random_operations_and_tmhs(steps in proptest::collection::vec(step(), 1..40)) {
        const TAGS: usize = 4;
        let mut p = pair(TAGS as u32, 8);
        let data = p.sim.reg(A, 0x80_0000, &pattern(9000, 5));
        let mut model = ListModel::default();
        let mut next_wr_id = TAG_WR_ID;
        let mut slot = 0;
        for step in steps {
            match step {
                Step::Add { tag, any_low_bit, len } => {
                    slot = (slot + 1) % 8;
                    let (tag, mask) = (u64::from(tag) & !u64::from(any_low_bit), if any_low_bit { !1 } else { !0 });
                    let op = TmOp::Add {
                        tag,
                        mask,
                        recv_wr_id: next_wr_id,
                        sg_list: [sge(DST + slot * SLOT as u64, usize::from(len).min(SLOT), p.tags_key)].into(),
                    };
                    let added = p.op(1, op, None);
                    if model.live.len() == TAGS {
                        prop_assert_eq!(added, Err(TmOpError::ListFull));
                    } else {
                        let handle = added.unwrap().unwrap();
                        prop_assert!(!model.live.contains_key(&handle), "handle {} given twice", handle);
                        let matchable = model.in_sync();
                        model.live.insert(handle, ModelTag { wr_id: next_wr_id, tag, mask, reading: false, matchable });
                        next_wr_id += 1;
                    }
                }
                Step::Del { handle } => {
                    let handle = u32::from(handle);
                    let deleted = p.op(2, TmOp::Del { handle }, None);
                    if handle >= TAGS as u32 {
                        prop_assert_eq!(deleted, Err(TmOpError::UnknownHandle));
                    } else {
                        let done = p.sim.poll_recv(B);
                        let del = done.iter().find(|c| c.opcode == WcOpcode::TmDel).unwrap();
                        let posted = model.live.get(&handle).is_some_and(|tag| !tag.reading);
                        let expected = if posted { WcStatus::Success } else { WcStatus::TmError };
                        prop_assert_eq!(del.status, expected, "DEL of handle {}", handle);
                        if posted {
                            model.live.remove(&handle);
                        }
                    }
                }
                Step::Sync { handled } => {
                    prop_assert_eq!(p.op(3, TmOp::Sync, Some(u32::from(handled))), Ok(None));
                    model.sync(u16::from(handled));
                }
                Step::Send { opcode, tag, len, rvh: (va, rkey, rlen) } => {
                    let mut bytes = message(TmOpcode::Eager, 1, u64::from(tag), &pattern(usize::from(len), 9));
                    bytes[0] = opcode;
                    if opcode == TmOpcode::Rndv as u8 && bytes.len() >= 32 && va % 2 == 0 {
                        // Half of them name A's real buffer.
                        let va = 0x80_0000 + va % 4096;
                        bytes[16..32].copy_from_slice(&[va.to_be_bytes().as_slice(), &data.to_be_bytes(), &rlen.min(4000).to_be_bytes()].concat());
                    } else if bytes.len() >= 32 {
                        bytes[16..32].copy_from_slice(&[va.to_be_bytes().as_slice(), &rkey.to_be_bytes(), &rlen.to_be_bytes()].concat());
                    }
                    if state(&p.sim, A, p.qa) == QpState::Rts {
                        p.send(&bytes);
                        model.sent.push_back((opcode, u64::from(tag)));
                    }
                }
                Step::Receives => p.post_receives(0, 2),
            }
            p.sim.run_until(2_000, |_| false);
            model.take(&p.sim.poll_recv(B))?;
        }
        settle(&mut p.sim);
        model.take(&p.sim.poll_recv(B))?;
        let stats = p.sim.nodes[B].endpoint.tm_stats(p.srq).unwrap();
        prop_assert!(stats.matched <= next_wr_id - TAG_WR_ID);
        // Every tag still posted is deleted; then the whole list is free again.
        let posted: Vec<u32> = model.live.iter().filter(|(_, tag)| !tag.reading).map(|(&h, _)| h).collect();
        for handle in posted {
            prop_assert_eq!(p.op(2, TmOp::Del { handle }, None), Ok(None));
            model.live.remove(&handle);
        }
        prop_assert!(model.live.is_empty(), "a rendezvous never finished: {:?}", model.live);
        let endpoint = &mut p.sim.nodes[B].endpoint;
        for wr_id in 0..=TAGS as u64 {
            let add = TmOpWr {
                wr_id,
                op: TmOp::Add { tag: 0, mask: 0, recv_wr_id: wr_id, sg_list: Default::default() },
                signaled: true,
                sync: None,
            };
            let added = post_one(endpoint, p.srq, add);
            if wr_id < TAGS as u64 {
                prop_assert!(added.is_ok(), "{:?}", added);
            } else {
                prop_assert_eq!(added, Err(TmOpError::ListFull));
            }
        }
    }
}

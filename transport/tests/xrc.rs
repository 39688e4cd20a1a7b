//! XRC between two simulated endpoints: A's XRC initiator sends, writes, reads and does
//! atomics into B's XRC domain, each request naming one of B's XRC SRQs in its XRCETH; the
//! request lands in that SRQ's receive, is checked against that SRQ's PD and completes in
//! that SRQ's CQ. An XRCETH that names no SRQ of the target's domain is NAKed as an invalid
//! request and counted; the domain's life and the XRC QPs' rules are those of verbs.

use roce_transport::cq::{WcOpcode, WcStatus, WorkCompletion};
use roce_transport::endpoint::CreateQpError;
use roce_transport::mr::PdId;
use roce_transport::qp::{PostError, QpCaps, QpInit};
use roce_transport::qp_state::{PathMtu, QpAttr, QpState, QpType};
use roce_transport::sim::{LinkConfig, RetryConfig, Sim};
use roce_transport::srq::{SrqAttr, SrqId};
use roce_transport::wr::{SendOp, SendWr, Sge};
use roce_transport::xrc::{XrcError, XrcdId};
use roce_transport::{AccessFlags, CqId};
use roce_wire::aeth::{NakCode, Syndrome};
use roce_wire::{Opcode, Psn};

mod common;
use common::*;

/// B's XRC SRQ with its own PD and CQ, and a region in that PD.
struct Target {
    srq: SrqId,
    srqn: u32,
    pd: PdId,
    cq: CqId,
    region: u32,
    base: u64,
}

/// A's initiator connected to B's target; two XRC SRQs of the target's domain on B, each
/// in a PD and CQ of its own, and a basic SRQ.
struct Xrc {
    sim: Sim,
    ini: u32,
    tgt: u32,
    xrcd: XrcdId,
    targets: [Target; 2],
    basic_srqn: u32,
    src: u32,
}

const LEN: usize = 0x4000;

fn srq_attr() -> SrqAttr {
    SrqAttr {
        max_wr: 16,
        max_sge: 1,
        srq_limit: 0,
    }
}

fn xrc(seed: u64, link: LinkConfig) -> Xrc {
    let mut sim = Sim::new(link, seed);
    assert_eq!((sim.add_node(), sim.add_node()), (A, B));
    let init = QpInit {
        pd: sim.nodes[A].pd,
        qp_type: QpType::XrcSend,
        caps: QpCaps::default(),
        sq_sig_all: false,
    };
    let (send_cq, recv_cq) = (sim.nodes[A].send_cq, sim.nodes[A].recv_cq);
    let ini = sim.nodes[A]
        .endpoint
        .create_qp(init, send_cq, recv_cq)
        .unwrap();
    let b = &mut sim.nodes[B].endpoint;
    let xrcd = b.alloc_xrcd();
    let tgt = b.create_xrc_recv_qp(xrcd).unwrap();
    let targets = [0u64, 1].map(|n| {
        let pd = b.mrs().alloc_pd();
        let cq = b.create_cq(64).unwrap();
        let srq = b.create_xrc_srq(srq_attr(), xrcd, cq, pd).unwrap();
        let srqn = b.srq_number(srq).unwrap();
        let base = DST + n * 0x10_0000;
        let region = b.mrs().reg_mr(pd, base, LEN, AccessFlags::all()).unwrap();
        Target {
            srq,
            srqn,
            pd,
            cq,
            region,
            base,
        }
    });
    let basic = b.create_srq(srq_attr()).unwrap();
    let basic_srqn = b.srq_number(basic).unwrap();
    sim.connect_xrc((A, ini), (B, tgt), PathMtu::Mtu1024, RetryConfig::default());
    let src = sim.reg(A, SRC, &pattern(LEN, 3));
    Xrc {
        sim,
        ini,
        tgt,
        xrcd,
        targets,
        basic_srqn,
        src,
    }
}

impl Xrc {
    /// Posts a receive of `len` bytes at `offset` of target `t`'s region to its SRQ.
    fn post_srq_recv(&mut self, t: usize, wr_id: u64, offset: u64, len: usize) {
        let target = &self.targets[t];
        let wr = recv_wr(wr_id, sge(target.base + offset, len, target.region));
        let endpoint = &mut self.sim.nodes[B].endpoint;
        endpoint.post_srq_recv(target.srq, &wr).unwrap();
    }

    /// A posts `op` of `len` bytes from its region, for SRQ number `srqn`.
    fn post(&mut self, wr_id: u64, op: SendOp, len: usize, srqn: u32) {
        let wr = SendWr {
            xrc_srqn: srqn,
            ..signaled(wr_id, op, sge(SRC, len, self.src))
        };
        self.sim.post_send(A, self.ini, &wr).unwrap();
    }

    /// Every completion in target `t`'s CQ, after running until `n` came.
    fn wait_target(&mut self, t: usize, n: usize) -> Vec<WorkCompletion> {
        let cq = self.targets[t].cq;
        let mut out = Vec::new();
        let done = self.sim.run_until(STEPS, |sim| {
            sim.nodes[B].endpoint.cq(cq).poll(usize::MAX, &mut out);
            out.len() >= n
        });
        assert!(done, "waited for {n} completions of target {t}: {out:?}");
        out
    }

    fn bytes(&mut self, t: usize) -> Vec<u8> {
        let region = self.targets[t].region;
        self.sim.mr_bytes(B, region)
    }
}

/// SENDs naming each SRQ in turn (one of several packets each) land in that SRQ's receives
/// and complete in its CQ, reporting the target QP; every request carries the XRCETH, and
/// every answer is an XRC opcode.
#[test]
fn sends_land_in_the_srq_their_xrceth_names() {
    let mut x = xrc(1, LinkConfig::default());
    let log = tap(&mut x.sim, |_, _| false);
    for t in 0..2 {
        x.post_srq_recv(t, 10 + t as u64, 0, 4096);
    }
    let sizes = [3000, 700];
    for (t, &len) in sizes.iter().enumerate() {
        let srqn = x.targets[t].srqn;
        x.post(t as u64, SendOp::SendWithImm(0x55 + t as u32), len, srqn);
    }
    let sent = wait_send(&mut x.sim, A, 2);
    assert_eq!(
        summary(&sent),
        [(0, WcStatus::Success), (1, WcStatus::Success)]
    );
    for (t, &len) in sizes.iter().enumerate() {
        let got = x.wait_target(t, 1);
        assert_eq!(got.len(), 1, "target {t}: {got:?}");
        let wc = got[0];
        assert_eq!(
            (wc.wr_id, wc.status, wc.opcode, wc.byte_len, wc.qp_num),
            (
                10 + t as u64,
                WcStatus::Success,
                WcOpcode::Recv,
                len as u32,
                x.tgt
            )
        );
        assert_eq!(wc.imm_data, Some(0x55 + t as u32));
        assert_eq!(x.bytes(t)[..len], pattern(LEN, 3)[..len]);
    }
    let frames = log.borrow();
    let requests: Vec<_> = frames.iter().filter(|f| f.from == A).collect();
    assert_eq!(requests.len(), 3 + 1, "{requests:?}");
    assert!(requests
        .iter()
        .all(|f| f.opcode.service() == roce_wire::opcode::Service::Xrc));
    assert!(frames
        .iter()
        .filter(|f| f.from == B)
        .all(|f| f.opcode == Opcode::XrcAcknowledge));
}

/// RDMA WRITE, READ and both atomics through the target are checked against the PD of the
/// SRQ they name: target 0's region through SRQ 0 works, through SRQ 1 (another PD) is a
/// remote access error.
#[test]
fn rdma_and_atomics_are_checked_in_the_named_srqs_pd() {
    let mut x = xrc(2, LinkConfig::default());
    let (base, rkey, srqn) = (x.targets[0].base, x.targets[0].region, x.targets[0].srqn);
    let write = SendOp::RdmaWrite {
        remote_addr: base,
        rkey,
    };
    x.post(1, write, 2500, srqn);
    let read = SendOp::RdmaRead {
        remote_addr: base,
        rkey,
    };
    let back = SendWr {
        xrc_srqn: srqn,
        ..signaled(2, read, sge(SRC + 0x2000, 2500, x.src))
    };
    x.sim.post_send(A, x.ini, &back).unwrap();
    let add = SendOp::FetchAdd {
        remote_addr: base + 0x1000,
        rkey,
        add: 5,
    };
    let old = SendWr {
        xrc_srqn: srqn,
        ..signaled(3, add, sge(SRC + 0x3000, 8, x.src))
    };
    x.sim.post_send(A, x.ini, &old).unwrap();
    let done = wait_send(&mut x.sim, A, 3);
    assert!(
        done.iter().all(|wc| wc.status == WcStatus::Success),
        "{done:?}"
    );
    let a = x.sim.mr_bytes(A, x.src);
    assert_eq!(a[0x2000..0x2000 + 2500], pattern(LEN, 3)[..2500]);
    assert_eq!(x.bytes(0)[0x1000..0x1008], 5u64.to_ne_bytes());

    let foreign = x.targets[1].srqn;
    x.post(4, write, 8, foreign);
    assert_eq!(
        wait_send(&mut x.sim, A, 1)[0].status,
        WcStatus::RemoteAccess
    );
    assert_eq!(state(&x.sim, B, x.tgt), QpState::Err);
}

/// An XRCETH naming no SRQ, a basic SRQ, or an XRC SRQ of another domain: NAKed as an
/// invalid request (counted), the initiator's request fails with `REM_INV_REQ_ERR`, the
/// target enters ERR, and no SRQ gave a receive.
#[test]
fn an_xrceth_naming_no_srq_of_the_domain_is_naked() {
    for case in ["none", "basic", "other domain"] {
        let mut x = xrc(3, LinkConfig::default());
        x.post_srq_recv(0, 20, 0, 64);
        let srqn = match case {
            "none" => 0x7F_FFFF,
            "basic" => x.basic_srqn,
            _ => {
                let b = &mut x.sim.nodes[B].endpoint;
                let other = b.alloc_xrcd();
                let pd = b.mrs().alloc_pd();
                let cq = b.create_cq(4).unwrap();
                let srq = b.create_xrc_srq(srq_attr(), other, cq, pd).unwrap();
                b.srq_number(srq).unwrap()
            }
        };
        let log = tap(&mut x.sim, |_, _| false);
        x.post(5, SendOp::Send, 16, srqn);
        let done = wait_send(&mut x.sim, A, 1);
        assert_eq!(done[0].status, WcStatus::RemoteInvalidRequest, "{case}");
        assert_eq!(state(&x.sim, B, x.tgt), QpState::Err, "{case}");
        let stats = x.sim.nodes[B].endpoint.qp_stats(x.tgt).unwrap();
        assert_eq!(stats.naks_sent, 1, "{case}: counted");
        let nak = log
            .borrow()
            .iter()
            .find(|f| f.from == B)
            .map(|f| f.syndrome);
        assert_eq!(
            nak,
            Some(Some(Syndrome::Nak(NakCode::InvalidRequest))),
            "{case}"
        );
        settle(&mut x.sim);
        let cq = x.targets[0].cq;
        let mut left = Vec::new();
        x.sim.nodes[B].endpoint.cq(cq).poll(8, &mut left);
        assert!(
            left.is_empty(),
            "{case}: the SRQ's receive was not taken: {left:?}"
        );
    }
}

/// An empty SRQ is an RNR NAK; the SEND lands once a receive is posted.
#[test]
fn an_empty_srq_is_receiver_not_ready() {
    let mut x = xrc(4, LinkConfig::default());
    let srqn = x.targets[1].srqn;
    let log = tap(&mut x.sim, |_, _| false);
    x.post(6, SendOp::Send, 100, srqn);
    let rnr = x.sim.run_until(STEPS, |_| {
        log.borrow()
            .iter()
            .any(|f| matches!(f.syndrome, Some(Syndrome::RnrNak(_))))
    });
    assert!(rnr, "no RNR NAK");
    x.post_srq_recv(1, 30, 0x100, 128);
    assert_eq!(wait_send(&mut x.sim, A, 1)[0].status, WcStatus::Success);
    assert_eq!(x.wait_target(1, 1)[0].wr_id, 30);
}

/// Under loss, reordering and duplication, every message still lands once in its SRQ.
#[test]
fn xrc_recovers_from_loss() {
    let link = LinkConfig {
        loss: 0.05,
        reorder: 0.05,
        duplicate: 0.05,
        ..LinkConfig::default()
    };
    let mut x = xrc(5, link);
    for n in 0..8 {
        x.post_srq_recv((n % 2) as usize, 40 + n, n * 0x800, 0x800);
    }
    for n in 0..8u64 {
        let srqn = x.targets[(n % 2) as usize].srqn;
        x.post(n, SendOp::Send, 1500, srqn);
    }
    let done = wait_send(&mut x.sim, A, 8);
    assert!(done.iter().all(|wc| wc.status == WcStatus::Success));
    assert_eq!(x.wait_target(0, 4).len(), 4);
    assert_eq!(x.wait_target(1, 4).len(), 4);
}

/// What verbs refuses: posting a receive to either XRC QP or a send to a target; a target
/// without a domain; an XRC SRQ without a domain, CQ or PD; closing a domain in use; the
/// target's transitions take only its attributes.
#[test]
fn the_rules_of_xrc_objects() {
    let mut x = xrc(6, LinkConfig::default());
    let wr = recv_wr(
        1,
        Sge {
            addr: SRC,
            length: 8,
            lkey: x.src,
        },
    );
    assert_eq!(x.sim.post_recv(A, x.ini, &wr), Err(PostError::UsesSrq));
    assert_eq!(x.sim.post_recv(B, x.tgt, &wr), Err(PostError::UsesSrq));
    let send = signaled(1, SendOp::Send, sge(SRC, 8, x.src));
    assert_eq!(
        x.sim.post_send(B, x.tgt, &send),
        Err(PostError::UnsupportedOperation)
    );
    let b = &mut x.sim.nodes[B].endpoint;
    assert_eq!(b.dealloc_xrcd(x.xrcd), Err(XrcError::Busy));
    let spare = b.alloc_xrcd();
    assert_eq!(b.dealloc_xrcd(spare), Ok(()));
    assert_eq!(b.dealloc_xrcd(spare), Err(XrcError::UnknownXrcd));
    assert_eq!(b.create_xrc_recv_qp(spare), Err(CreateQpError::UnknownXrcd));
    let (pd, cq) = (x.targets[0].pd, x.targets[0].cq);
    assert!(b.create_xrc_srq(srq_attr(), spare, cq, pd).is_err());
    assert_eq!(b.xrc_recv_xrcd(x.tgt), Some(x.xrcd));
    assert_eq!(b.destroy_cq(cq).err().map(|e| e.errno()), Some(16));

    // A fresh target: RTR -> RTS takes the SQ PSN and timeout only.
    let tgt = b.create_xrc_recv_qp(x.xrcd).unwrap();
    let peer = x.sim.av_of(A);
    let b = &mut x.sim.nodes[B].endpoint;
    let now = std::time::Instant::now();
    b.modify_qp(now, tgt, &QpAttr::init(AccessFlags::REMOTE_WRITE))
        .unwrap();
    let rtr = QpAttr {
        state: Some(QpState::Rtr),
        av: Some(peer),
        path_mtu: Some(PathMtu::Mtu1024),
        dest_qp_num: Some(x.ini),
        rq_psn: Some(Psn::new(1)),
        max_dest_rd_atomic: Some(1),
        min_rnr_timer: Some(roce_wire::aeth::RnrTimer::new(1)),
        ..QpAttr::default()
    };
    b.modify_qp(now, tgt, &rtr).unwrap();
    let rts = QpAttr {
        state: Some(QpState::Rts),
        sq_psn: Some(Psn::new(1)),
        timeout: Some(14),
        ..QpAttr::default()
    };
    let with_retries = QpAttr {
        retry_cnt: Some(7),
        ..rts
    };
    assert!(b.modify_qp(now, tgt, &with_retries).is_err());
    b.modify_qp(now, tgt, &rts).unwrap();
    assert_eq!(b.qp_state(tgt), Some(QpState::Rts));
}

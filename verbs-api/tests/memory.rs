//! The verbs API end to end over the in-memory wire (with seeded faults): every progress
//! mode, RC WRITE/READ/SEND/atomics, UD through an address handle, completion channels, and
//! the errors a program gets for bad calls.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use roce_provider::fault::FaultInjector;
use roce_provider::memory::memory_pair;
use roce_transport::sim::LinkConfig;
use roce_transport::wr::signaled;
use roce_verbs::{
    AccessFlags, AddressVector, Addressing, AsyncEvent, BackendChoice, ConnectOptions, Context, Cq,
    Device, Error, OpenOptions, PathMtu, Progress, QpAttr, QpCaps, QpInitAttr, QpState, QpType,
    RecvWr, RetryConfig, SendFlags, SendOp, SendWr, SgList, WcOpcode, WcStatus,
};

const STALL: Duration = Duration::from_secs(20);
const IP_A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const IP_B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const MAC_A: [u8; 6] = [2, 0, 0, 0, 0, 0xA];
const MAC_B: [u8; 6] = [2, 0, 0, 0, 0, 0xB];

/// Two contexts joined by an in-memory wire that loses, reorders, duplicates and corrupts
/// frames with the given probability each.
fn pair(progress: Progress, fault: f64) -> (Context, Context) {
    let (wire_a, wire_b) = memory_pair();
    let faults = LinkConfig {
        loss: fault,
        reorder: fault,
        duplicate: fault,
        corrupt: fault,
        ..LinkConfig::default()
    };
    let open = |wire, seed, (mac, ip), (peer_mac, peer_ip)| {
        let addressing = Addressing {
            mac,
            ip,
            neighbours: HashMap::from([(peer_ip, peer_mac)]),
        };
        let backend = Box::new(FaultInjector::new(wire, faults, seed));
        let options = OpenOptions {
            backend: BackendChoice::Custom(backend, addressing),
            progress,
            seed: Some([seed as u8; 32]),
            ..OpenOptions::default()
        };
        Context::open(&Device::in_memory(mac, ip), options).expect("open")
    };
    (
        open(wire_a, 1, (MAC_A, IP_A), (MAC_B, IP_B)),
        open(wire_b, 2, (MAC_B, IP_B), (MAC_A, IP_A)),
    )
}

/// A QP of `qp_type` with both queues on `cq`, default caps, only signaled sends complete.
fn init(qp_type: QpType, cq: &Cq) -> QpInitAttr<'_> {
    QpInitAttr {
        qp_type,
        send_cq: cq,
        recv_cq: cq,
        caps: QpCaps::default(),
        sq_sig_all: false,
    }
}

/// A 16 ms ACK timeout: lost tails are resent quickly, yet two engine threads descheduled
/// for a few milliseconds on a busy two-core machine do not use up the retries (0.5 ms did).
fn fast() -> ConnectOptions {
    ConnectOptions {
        mtu: PathMtu::Mtu1024,
        retry: RetryConfig {
            timeout: 12,
            ..RetryConfig::default()
        },
        ..ConnectOptions::default()
    }
}

/// Whether `fd` polls readable within `timeout`.
fn readable(fd: BorrowedFd, timeout: Duration) -> bool {
    let mut fds = [rustix::event::PollFd::new(
        &fd,
        rustix::event::PollFlags::IN,
    )];
    let timeout = rustix::event::Timespec::try_from(timeout).unwrap();
    rustix::event::poll(&mut fds, Some(&timeout)).unwrap() == 1
}

/// Keeps polling `cq` (which, in caller-driven mode, is what moves B's engine) until told
/// to stop; returns what it collected.
fn drive_until(cq: &Cq, stop: &AtomicBool) -> Vec<roce_verbs::WorkCompletion> {
    let mut seen = Vec::new();
    for _ in 0..50_000_000u64 {
        // One last poll after the stop: what arrived before it counts.
        let stopping = stop.load(Ordering::Acquire);
        cq.poll_into(16, &mut seen).expect("poll");
        if stopping {
            break;
        }
        thread::yield_now();
    }
    seen
}

/// A WRITEs 1 MiB to B, READs it back, SENDs 4 KiB with immediate data and does both
/// atomics, over a lossy wire; every byte and result is checked.
fn rc_scenario(progress: Progress) {
    let (ctx_a, ctx_b) = pair(progress, 0.01);
    let (pd_a, pd_b) = (ctx_a.alloc_pd().unwrap(), ctx_b.alloc_pd().unwrap());
    let cq_a = ctx_a.create_cq(64, None).unwrap();
    let channel_b = ctx_b.create_comp_channel().unwrap();
    let cq_b = ctx_b.create_cq(64, Some(&channel_b)).unwrap();
    let caps = QpCaps::default();
    let qp_attr = |cq| QpInitAttr {
        caps,
        ..init(QpType::Rc, cq)
    };
    let qp_a = pd_a.create_qp(&qp_attr(&cq_a)).unwrap();
    let qp_b = pd_b.create_qp(&qp_attr(&cq_b)).unwrap();
    assert_eq!(qp_a.state().unwrap(), QpState::Reset);
    let (end_a, end_b) = (qp_a.endpoint(1).unwrap(), qp_b.endpoint(1).unwrap());
    // The typed handshake survives its byte form.
    let end_b = roce_verbs::QpEndpoint::from_bytes(&end_b.to_bytes()).unwrap();
    qp_a.connect(&end_b, &fast()).unwrap();
    qp_b.connect(&end_a, &fast()).unwrap();
    assert_eq!(qp_a.state().unwrap(), QpState::Rts);

    let len = 1 << 20;
    let data: Vec<u8> = (0..len).map(|i| (i * 13 + i / 509) as u8).collect();
    let all = AccessFlags::all();
    let src = pd_a.reg_mr(len, all).unwrap();
    src.write(0, &data).unwrap();
    let back = pd_a.reg_mr(len, all).unwrap();
    let results = pd_a.reg_mr(16, all).unwrap();
    let target = pd_b.reg_mr(len, all).unwrap();
    let inbox = pd_b.reg_mr(4096, all).unwrap();
    let counter = pd_b.reg_mr(8, all).unwrap();
    counter.write(0, &40u64.to_le_bytes()).unwrap();
    assert_ne!(src.addr(), back.addr(), "regions get their own addresses");

    qp_b.post_recv([RecvWr {
        wr_id: 9,
        sg_list: [inbox.sge(0, 4096)].into(),
    }])
    .unwrap();
    cq_b.req_notify(false).unwrap();

    let write = SendOp::RdmaWrite {
        remote_addr: target.addr(),
        rkey: target.rkey(),
    };
    let read = SendOp::RdmaRead {
        remote_addr: target.addr(),
        rkey: target.rkey(),
    };
    let fetch_add = SendOp::FetchAdd {
        remote_addr: counter.addr(),
        rkey: counter.rkey(),
        add: 2,
    };
    let compare_swap = SendOp::CompareSwap {
        remote_addr: counter.addr(),
        rkey: counter.rkey(),
        compare: 42,
        swap: 7,
    };
    let stop = Arc::new(AtomicBool::new(false));
    let b_side = {
        let stop = Arc::clone(&stop);
        thread::spawn(move || {
            // Block on the channel for B's receive, as an event-driven program would.
            if progress != Progress::Caller {
                assert_eq!(channel_b.get_cq_event(Some(STALL)).unwrap(), cq_b.id());
                assert!(channel_b.get_cq_event(Some(Duration::ZERO)).is_err());
            }
            let seen = drive_until(&cq_b, &stop);
            (seen, qp_b, target, inbox, counter, pd_b, cq_b, ctx_b)
        })
    };

    qp_a.post_send([
        signaled(1, write, src.sge(0, len as u32)),
        signaled(2, read, back.sge(0, len as u32)),
        signaled(3, SendOp::SendWithImm(0xABCD), src.sge(0, 4096)),
        signaled(4, fetch_add, results.sge(0, 8)),
        signaled(5, compare_swap, results.sge(8, 8)),
    ])
    .unwrap();
    let done = cq_a.wait_for(5, STALL).expect("A's completions");
    stop.store(true, Ordering::Release);
    let (seen_b, qp_b, target, inbox, counter, _pd_b, _cq_b, ctx_b) = b_side.join().unwrap();

    let statuses: Vec<_> = done.iter().map(|wc| (wc.wr_id, wc.status)).collect();
    let ok = WcStatus::Success;
    assert_eq!(statuses, [(1, ok), (2, ok), (3, ok), (4, ok), (5, ok)]);
    assert_eq!(target.to_vec().unwrap(), data);
    assert_eq!(back.to_vec().unwrap(), data);
    assert_eq!(inbox.to_vec().unwrap(), data[..4096]);
    let mut old = [0u8; 16];
    results.read(0, &mut old).unwrap();
    assert_eq!(old[..8], 40u64.to_le_bytes(), "FETCH_ADD saw the original");
    assert_eq!(
        old[8..],
        42u64.to_le_bytes(),
        "CMP_SWAP saw the added value"
    );
    assert_eq!(counter.to_vec().unwrap(), 7u64.to_le_bytes());
    let recv: Vec<_> = seen_b
        .iter()
        .map(|wc| (wc.wr_id, wc.status, wc.opcode, wc.byte_len, wc.imm_data))
        .collect();
    assert_eq!(
        recv,
        [(9, ok, WcOpcode::Recv, 4096, Some(0xABCD))],
        "{progress:?}"
    );
    // The faults really happened: something was resent.
    let stats = qp_a.stats().unwrap();
    assert!(stats.retransmits > 0, "{stats:?}");
    assert_eq!(ctx_b.try_get_async_event().unwrap(), None);
    drop(qp_b);
}

#[test]
fn rc_over_a_lossy_wire_with_a_sleeping_engine_thread() {
    rc_scenario(Progress::Events);
}

#[test]
fn rc_over_a_lossy_wire_with_a_busy_polling_engine_thread() {
    rc_scenario(Progress::BusyPoll);
}

#[test]
fn rc_over_a_lossy_wire_driven_by_the_callers() {
    rc_scenario(Progress::Caller);
}

#[test]
fn ud_through_an_address_handle() {
    let (ctx_a, ctx_b) = pair(Progress::Events, 0.0);
    let (pd_a, pd_b) = (ctx_a.alloc_pd().unwrap(), ctx_b.alloc_pd().unwrap());
    let (cq_a, cq_b) = (
        ctx_a.create_cq(16, None).unwrap(),
        ctx_b.create_cq(16, None).unwrap(),
    );
    let attr = |cq| QpInitAttr {
        sq_sig_all: true,
        ..init(QpType::Ud, cq)
    };
    let qp_a = pd_a.create_qp(&attr(&cq_a)).unwrap();
    let qp_b = pd_b.create_qp(&attr(&cq_b)).unwrap();
    qp_a.ready_ud(0x1111_1111).unwrap();
    qp_b.ready_ud(0x1111_1111).unwrap();
    let message: Vec<u8> = (0..1000u32).map(|i| (i % 251) as u8).collect();
    let send_buf = pd_a.reg_mr(1000, AccessFlags::LOCAL_WRITE).unwrap();
    send_buf.write(0, &message).unwrap();
    let recv_buf = pd_b.reg_mr(40 + 1000, AccessFlags::LOCAL_WRITE).unwrap();
    qp_b.post_recv([RecvWr {
        wr_id: 7,
        sg_list: [recv_buf.sge(0, 1040)].into(),
    }])
    .unwrap();

    let to_b = AddressVector {
        dgid: IP_B.to_ipv6_mapped().octets(),
        sgid_index: 1,
        hop_limit: 64,
        traffic_class: 0,
        flow_label: 0,
    };
    let ah = pd_a.create_ah(to_b).unwrap();
    let mut wr = signaled(1, SendOp::Send, send_buf.sge(0, 1000));
    wr.ud = Some(ah.dest(qp_b.qp_num(), 0x1111_1111));
    qp_a.post_send([wr]).unwrap();
    assert_eq!(
        cq_a.wait_for(1, STALL).unwrap()[0].status,
        WcStatus::Success
    );
    let got = cq_b.wait_for(1, STALL).unwrap();
    assert_eq!(
        (got[0].wr_id, got[0].status, got[0].byte_len, got[0].src_qp),
        (7, WcStatus::Success, 1040, qp_a.qp_num())
    );
    // The message follows the 40-byte GRH area, as verbs lays out a UD receive.
    assert_eq!(recv_buf.to_vec().unwrap()[40..], message[..]);

    // A UD message may be as long as the port's MTU (4096 on a 9000-byte link), no longer.
    let big = pd_a.reg_mr(4097, AccessFlags::LOCAL_WRITE).unwrap();
    let big_recv = pd_b.reg_mr(40 + 4096, AccessFlags::LOCAL_WRITE).unwrap();
    qp_b.post_recv([RecvWr {
        wr_id: 8,
        sg_list: [big_recv.sge(0, 40 + 4096)].into(),
    }])
    .unwrap();
    let mut wr = signaled(2, SendOp::Send, big.sge(0, 4096));
    wr.ud = Some(ah.dest(qp_b.qp_num(), 0x1111_1111));
    qp_a.post_send([wr.clone()]).unwrap();
    assert_eq!(cq_b.wait_for(1, STALL).unwrap()[0].byte_len, 40 + 4096);
    wr.sg_list = [big.sge(0, 4097)].into();
    let failure = qp_a.post_send([wr]).unwrap_err();
    assert!(matches!(failure.error, Error::Post(_)), "{failure}");

    // An address handle to a host whose MAC is unknown is refused up front.
    let nowhere = AddressVector {
        dgid: Ipv4Addr::new(10, 0, 0, 99).to_ipv6_mapped().octets(),
        ..to_b
    };
    assert!(matches!(
        pd_a.create_ah(nowhere),
        Err(Error::NoNeighbour(ip)) if ip == Ipv4Addr::new(10, 0, 0, 99)
    ));
    // From an IPv6 GID (index 0, link-local) to an IPv4-mapped one: no such path.
    let from_ll = AddressVector {
        sgid_index: 0,
        ..to_b
    };
    assert!(matches!(
        pd_a.create_ah(from_ll),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        pd_a.create_ah(AddressVector {
            sgid_index: 5,
            ..to_b
        }),
        Err(Error::NoGid(5))
    ));
}

#[test]
fn bad_calls_get_clear_errors() {
    let (ctx_a, ctx_b) = pair(Progress::Events, 0.0);
    let pd = ctx_a.alloc_pd().unwrap();
    let cq = ctx_a.create_cq(2, None).unwrap();
    let other_cq = ctx_b.create_cq(2, None).unwrap();
    assert!(matches!(
        ctx_a.create_cq(0, None),
        Err(Error::InvalidArgument(_))
    ));
    let attr = |cq| QpInitAttr {
        caps: QpCaps {
            max_send_wr: 2,
            ..QpCaps::default()
        },
        ..init(QpType::Rc, cq)
    };
    assert!(matches!(
        pd.create_qp(&attr(&other_cq)),
        Err(Error::ForeignObject("CQ"))
    ));
    let qp = pd.create_qp(&attr(&cq)).unwrap();
    // RESET → RTS skips INIT and RTR: refused as ibv_modify_qp refuses it.
    let to_rts = QpAttr {
        state: Some(QpState::Rts),
        ..QpAttr::default()
    };
    assert!(matches!(qp.modify(&to_rts), Err(Error::ModifyQp(_))));
    assert_eq!(qp.state().unwrap(), QpState::Reset);
    // Sends before RTS are refused, and the failure names the first request.
    let mr = pd.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    let send = |wr_id| signaled(wr_id, SendOp::Send, mr.sge(0, 8));
    let failure = qp.post_send([send(1)]).unwrap_err();
    assert_eq!(failure.index, 0);
    assert!(matches!(failure.error, Error::Post(_)));
    // A UD-only call on an RC QP.
    assert!(matches!(qp.ready_ud(1), Err(Error::InvalidArgument(_))));
    // req_notify needs a channel.
    assert!(matches!(
        cq.req_notify(false),
        Err(Error::InvalidArgument(_))
    ));
    // Regions: out-of-bounds copies fail, in-bounds ones work.
    assert!(matches!(mr.write(60, &[0; 8]), Err(Error::OutOfBounds)));
    assert!(matches!(
        mr.read(usize::MAX, &mut [0; 2]),
        Err(Error::OutOfBounds)
    ));
    mr.write(56, &[1; 8]).unwrap();
    // REMOTE_WRITE without LOCAL_WRITE is refused, as ibv_reg_mr does.
    assert!(matches!(
        pd.reg_mr(8, AccessFlags::REMOTE_WRITE),
        Err(Error::Mr(_))
    ));

    // A posted list stops at the first request over the queue's depth (2): index 2.
    let peer_pd = ctx_b.alloc_pd().unwrap();
    let peer = peer_pd.create_qp(&attr(&other_cq)).unwrap();
    qp.connect(&peer.endpoint(1).unwrap(), &fast()).unwrap();
    let failure = qp.post_send([send(1), send(2), send(3)]).unwrap_err();
    assert_eq!(failure.index, 2, "{failure}");
}

#[test]
fn cq_overflow_is_an_error_and_an_async_event() {
    let (ctx_a, ctx_b) = pair(Progress::Events, 0.0);
    let (pd_a, pd_b) = (ctx_a.alloc_pd().unwrap(), ctx_b.alloc_pd().unwrap());
    // One slot on A, and three signaled WRITEs.
    let cq_a = ctx_a.create_cq(1, None).unwrap();
    let cq_b = ctx_b.create_cq(4, None).unwrap();
    let attr = |cq| init(QpType::Rc, cq);
    let qp_a = pd_a.create_qp(&attr(&cq_a)).unwrap();
    let qp_b = pd_b.create_qp(&attr(&cq_b)).unwrap();
    qp_a.connect(&qp_b.endpoint(1).unwrap(), &fast()).unwrap();
    qp_b.connect(&qp_a.endpoint(1).unwrap(), &fast()).unwrap();
    let src = pd_a.reg_mr(8, AccessFlags::LOCAL_WRITE).unwrap();
    let dst = pd_b.reg_mr(8, AccessFlags::all()).unwrap();
    let write = SendOp::RdmaWrite {
        remote_addr: dst.addr(),
        rkey: dst.rkey(),
    };
    qp_a.post_send((1..=3).map(|wr_id| signaled(wr_id, write, src.sge(0, 8))))
        .unwrap();
    // The context's async fd polls readable once the event is there, as ibv_context's
    // async_fd does, and no longer once it is taken.
    assert!(readable(ctx_a.async_fd(), STALL), "no async event");
    let event = ctx_a.get_async_event(Some(Duration::ZERO)).unwrap();
    assert_eq!(
        event,
        AsyncEvent::CqOverflow {
            cq: cq_a.id(),
            qpn: qp_a.qp_num()
        }
    );
    assert!(!readable(ctx_a.async_fd(), Duration::ZERO));
    assert!(matches!(
        ctx_a.get_async_event(Some(Duration::from_millis(5))),
        Err(Error::TimedOut)
    ));
    assert_eq!(ctx_a.try_get_async_event().unwrap(), None);
    assert!(matches!(cq_a.poll(4), Err(Error::CqOverflow)));
    assert_eq!(qp_a.state().unwrap(), QpState::Err);
}

#[test]
fn a_channel_fd_polls_readable_only_while_an_event_waits() {
    let (ctx_a, ctx_b) = pair(Progress::Events, 0.0);
    let (pd_a, pd_b) = (ctx_a.alloc_pd().unwrap(), ctx_b.alloc_pd().unwrap());
    let cq_a = ctx_a.create_cq(8, None).unwrap();
    let channel = ctx_b.create_comp_channel().unwrap();
    let cq_b = ctx_b.create_cq(8, Some(&channel)).unwrap();
    let attr = |cq| init(QpType::Rc, cq);
    let qp_a = pd_a.create_qp(&attr(&cq_a)).unwrap();
    let qp_b = pd_b.create_qp(&attr(&cq_b)).unwrap();
    qp_a.connect(&qp_b.endpoint(1).unwrap(), &fast()).unwrap();
    qp_b.connect(&qp_a.endpoint(1).unwrap(), &fast()).unwrap();
    let buf_a = pd_a.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    let buf_b = pd_b.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    let readable = |timeout| readable(channel.as_fd(), timeout);
    let brief = Duration::from_millis(20);
    let recv = |wr_id| RecvWr {
        wr_id,
        sg_list: [buf_b.sge(0, 64)].into(),
    };
    qp_b.post_recv([recv(1), recv(2)]).unwrap();

    // Not armed: a completion arrives, but no event.
    qp_a.post_send([signaled(1, SendOp::Send, buf_a.sge(0, 8))])
        .unwrap();
    assert_eq!(cq_b.wait_for(1, STALL).unwrap()[0].wr_id, 1);
    assert!(!readable(brief));
    // Armed for solicited completions only: an unsolicited SEND does not wake.
    cq_b.req_notify(true).unwrap();
    qp_a.post_send([signaled(2, SendOp::Send, buf_a.sge(0, 8))])
        .unwrap();
    assert_eq!(cq_b.wait_for(1, STALL).unwrap()[0].wr_id, 2);
    assert!(!readable(brief));
    // A solicited one does: readable until the event is taken, once.
    qp_b.post_recv([recv(3)]).unwrap();
    let mut solicited = signaled(3, SendOp::Send, buf_a.sge(0, 8));
    solicited.flags |= SendFlags::SOLICITED;
    qp_a.post_send([solicited]).unwrap();
    assert!(readable(STALL));
    assert_eq!(channel.get_cq_event(Some(STALL)).unwrap(), cq_b.id());
    assert!(!readable(Duration::ZERO));
    assert!(matches!(
        channel.get_cq_event(Some(Duration::from_millis(5))),
        Err(Error::TimedOut)
    ));
    assert_eq!(cq_b.wait_for(1, STALL).unwrap()[0].wr_id, 3);
    assert_eq!(cq_a.wait_for(3, STALL).unwrap().len(), 3);
}

/// Four QPs on each of two contexts, connected pairwise.
struct Four {
    _ctx: (Context, Context),
    pd: (roce_verbs::Pd, roce_verbs::Pd),
    qps: Vec<(roce_verbs::Qp, roce_verbs::Qp)>,
    cq: (Cq, Cq),
}

fn four_qps(progress: Progress) -> Four {
    let (ctx_a, ctx_b) = pair(progress, 0.0);
    let (pd_a, pd_b) = (ctx_a.alloc_pd().unwrap(), ctx_b.alloc_pd().unwrap());
    let cq_a = ctx_a.create_cq(8192, None).unwrap();
    let cq_b = ctx_b.create_cq(8192, None).unwrap();
    let attr = |cq| QpInitAttr {
        caps: QpCaps {
            max_send_wr: 64,
            ..QpCaps::default()
        },
        ..init(QpType::Rc, cq)
    };
    let qps = (0..4)
        .map(|_| {
            let qa = pd_a.create_qp(&attr(&cq_a)).unwrap();
            let qb = pd_b.create_qp(&attr(&cq_b)).unwrap();
            qa.connect(&qb.endpoint(1).unwrap(), &fast()).unwrap();
            qb.connect(&qa.endpoint(1).unwrap(), &fast()).unwrap();
            (qa, qb)
        })
        .collect();
    Four {
        _ctx: (ctx_a, ctx_b),
        pd: (pd_a, pd_b),
        qps,
        cq: (cq_a, cq_b),
    }
}

#[test]
fn posting_with_an_engine_thread_never_takes_the_device_lock() {
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    // In a thread of its own: a deadlock must fail the test, not hang it.
    thread::spawn(move || {
        let four = four_qps(Progress::Events);
        let pd = &four.pd.0;
        let held = pd.reg_mr(8, AccessFlags::LOCAL_WRITE).unwrap();
        let qp = &four.qps[0].0;
        let src = pd.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
        // `with_bytes` holds the device lock while its closure runs: posting must not wait.
        let posted = held
            .with_bytes(|_| {
                qp.post_send([signaled(
                    1,
                    SendOp::RdmaWrite {
                        remote_addr: 0,
                        rkey: 0,
                    },
                    src.sge(0, 0),
                )])
            })
            .unwrap();
        posted.unwrap();
        // And the engine takes it once the lock is free: a zero-length WRITE completes.
        let done = four.cq.0.wait_for(1, STALL).unwrap();
        done_tx.send(done[0].status).unwrap();
    });
    let status = done_rx
        .recv_timeout(STALL)
        .expect("posting waited for the device lock");
    assert_eq!(status, WcStatus::Success);
}

#[test]
fn threads_post_to_their_own_qps_at_once() {
    for progress in [Progress::Events, Progress::BusyPoll] {
        let four = four_qps(progress);
        let (pd_a, pd_b) = &four.pd;
        let (qps, cq_a) = (&four.qps, &four.cq.0);
        const WRITES: u64 = 500;
        let targets: Vec<_> = (0..4)
            .map(|_| {
                pd_b.reg_mr(WRITES as usize * 8, AccessFlags::all())
                    .unwrap()
            })
            .collect();
        let sources: Vec<_> = (0..4u64)
            .map(|t| {
                let mr = pd_a
                    .reg_mr(WRITES as usize * 8, AccessFlags::LOCAL_WRITE)
                    .unwrap();
                let bytes: Vec<u8> = (0..WRITES)
                    .flat_map(|n| (t << 32 | n).to_le_bytes())
                    .collect();
                mr.write(0, &bytes).unwrap();
                mr
            })
            .collect();
        thread::scope(|scope| {
            for (t, ((qp, _), (source, target))) in
                qps.iter().zip(sources.iter().zip(&targets)).enumerate()
            {
                scope.spawn(move || {
                    let mut n = 0;
                    while n < WRITES {
                        let write = SendOp::RdmaWrite {
                            remote_addr: target.addr() + n * 8,
                            rkey: target.rkey(),
                        };
                        let wr =
                            signaled((t as u64) << 32 | n, write, source.sge(n as usize * 8, 8));
                        match qp.post_send([wr]) {
                            Ok(()) => n += 1,
                            // The queue is full until the engine's next round: try again.
                            Err(failure) if matches!(failure.error, Error::Post(_)) => {
                                thread::yield_now()
                            }
                            Err(failure) => panic!("{failure}"),
                        }
                    }
                });
            }
        });
        let done = cq_a.wait_for(4 * WRITES as usize, STALL).unwrap();
        let bad: Vec<_> = done
            .iter()
            .filter(|wc| wc.status != WcStatus::Success)
            .collect();
        assert!(
            bad.is_empty(),
            "{progress:?}: {} failed, first {:?}",
            bad.len(),
            bad.first()
        );
        // Each QP's completions come in its posting order.
        for t in 0..4u64 {
            let ids: Vec<u64> = done
                .iter()
                .filter(|wc| wc.wr_id >> 32 == t)
                .map(|wc| wc.wr_id & 0xFFFF_FFFF)
                .collect();
            assert_eq!(ids, (0..WRITES).collect::<Vec<_>>(), "{progress:?} QP {t}");
        }
        for (t, (source, target)) in sources.iter().zip(&targets).enumerate() {
            assert_eq!(target.to_vec().unwrap(), source.to_vec().unwrap(), "QP {t}");
        }
    }
}

#[test]
fn ud_over_ipv6_fills_the_grh_with_the_ipv6_header() {
    let (v6_a, v6_b): (std::net::Ipv6Addr, std::net::Ipv6Addr) =
        ("fd00::a".parse().unwrap(), "fd00::b".parse().unwrap());
    // Devices with an IPv6 GID (index 2) besides rxe's first two.
    let (wire_a, wire_b) = memory_pair();
    let context = |wire, mac, ip: Ipv4Addr, v6: std::net::Ipv6Addr, peer_v6, peer_mac, seed| {
        let mut device = Device::in_memory(mac, ip);
        device.gids.push(v6.octets());
        let addressing = Addressing {
            mac,
            ip,
            neighbours: HashMap::new(),
        };
        let options = OpenOptions {
            backend: BackendChoice::Custom(Box::new(wire), addressing),
            progress: Progress::Events,
            seed: Some([seed; 32]),
            ..OpenOptions::default()
        };
        let ctx = Context::open(&device, options).unwrap();
        ctx.add_neighbour6(peer_v6, peer_mac).unwrap();
        ctx
    };
    let ctx_a = context(wire_a, MAC_A, IP_A, v6_a, v6_b, MAC_B, 1);
    let ctx_b = context(wire_b, MAC_B, IP_B, v6_b, v6_a, MAC_A, 2);
    let (pd_a, pd_b) = (ctx_a.alloc_pd().unwrap(), ctx_b.alloc_pd().unwrap());
    let (cq_a, cq_b) = (
        ctx_a.create_cq(4, None).unwrap(),
        ctx_b.create_cq(4, None).unwrap(),
    );
    let attr = |cq| QpInitAttr {
        sq_sig_all: true,
        ..init(QpType::Ud, cq)
    };
    let qp_a = pd_a.create_qp(&attr(&cq_a)).unwrap();
    let qp_b = pd_b.create_qp(&attr(&cq_b)).unwrap();
    qp_a.ready_ud(7).unwrap();
    qp_b.ready_ud(7).unwrap();
    let send = pd_a.reg_mr(100, AccessFlags::LOCAL_WRITE).unwrap();
    send.write(0, &[0x42; 100]).unwrap();
    let recv = pd_b.reg_mr(140, AccessFlags::LOCAL_WRITE).unwrap();
    qp_b.post_recv([RecvWr {
        wr_id: 1,
        sg_list: [recv.sge(0, 140)].into(),
    }])
    .unwrap();
    let ah = pd_a
        .create_ah(AddressVector {
            dgid: v6_b.octets(),
            sgid_index: 2,
            hop_limit: 64,
            traffic_class: 0,
            flow_label: 0,
        })
        .unwrap();
    let mut wr = signaled(1, SendOp::Send, send.sge(0, 100));
    wr.ud = Some(ah.dest(qp_b.qp_num(), 7));
    qp_a.post_send([wr]).unwrap();
    assert_eq!(cq_b.wait_for(1, STALL).unwrap()[0].byte_len, 140);
    let bytes = recv.to_vec().unwrap();
    // The GRH area holds the IPv6 header: version 6, our source and destination.
    assert_eq!(bytes[0] >> 4, 6);
    assert_eq!(bytes[8..24], v6_a.octets());
    assert_eq!(bytes[24..40], v6_b.octets());
    assert_eq!(bytes[40..], [0x42; 100]);
}

/// Two connected RC QPs, B's CQ of `depth` with a completion channel.
struct Channelled {
    _ctx: (Context, Context),
    pd: (roce_verbs::Pd, roce_verbs::Pd),
    qp: (roce_verbs::Qp, roce_verbs::Qp),
    cq: (Cq, Cq),
    channel: roce_verbs::CompChannel,
}

fn channelled(depth: usize) -> Channelled {
    let (ctx_a, ctx_b) = pair(Progress::Events, 0.0);
    let (pd_a, pd_b) = (ctx_a.alloc_pd().unwrap(), ctx_b.alloc_pd().unwrap());
    let channel = ctx_b.create_comp_channel().unwrap();
    let cq_a = ctx_a.create_cq(64, None).unwrap();
    let cq_b = ctx_b.create_cq(depth, Some(&channel)).unwrap();
    let attr = |cq| init(QpType::Rc, cq);
    let qp_a = pd_a.create_qp(&attr(&cq_a)).unwrap();
    let qp_b = pd_b.create_qp(&attr(&cq_b)).unwrap();
    qp_a.connect(&qp_b.endpoint(1).unwrap(), &fast()).unwrap();
    qp_b.connect(&qp_a.endpoint(1).unwrap(), &fast()).unwrap();
    Channelled {
        _ctx: (ctx_a, ctx_b),
        pd: (pd_a, pd_b),
        qp: (qp_a, qp_b),
        cq: (cq_a, cq_b),
        channel,
    }
}

#[test]
fn completions_beyond_the_queue_reach_a_program_that_drains_before_waiting() {
    // Depth 4; two batches of four receives complete, the second while the first still
    // fills the queue pollers read: it waits in the engine's CQ.
    let c = channelled(4);
    let buf_a = c.pd.0.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    let buf_b = c.pd.1.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    c.qp.1
        .post_recv((0..8).map(|wr_id| RecvWr {
            wr_id,
            sg_list: [buf_b.sge(0, 64)].into(),
        }))
        .unwrap();
    c.cq.1.req_notify(false).unwrap();
    for batch in 0..2u64 {
        c.qp.0
            .post_send((0..4).map(|n| signaled(batch * 4 + n, SendOp::Send, buf_a.sge(0, 8))))
            .unwrap();
        assert_eq!(c.cq.0.wait_for(4, STALL).unwrap().len(), 4);
        // B's engine has run a round since (its completions are handed over at once).
        thread::sleep(Duration::from_millis(50));
    }
    // The usual loop: take the event, re-arm, drain until empty.
    assert_eq!(c.channel.get_cq_event(Some(STALL)).unwrap(), c.cq.1.id());
    c.cq.1.req_notify(false).unwrap();
    let mut drained = Vec::new();
    while c.cq.1.poll_into(2, &mut drained).unwrap() > 0 {}
    let ids: Vec<u64> = drained.iter().map(|wc| wc.wr_id).collect();
    assert_eq!(
        ids,
        (0..8).collect::<Vec<_>>(),
        "all eight, in order, without waiting"
    );
}

#[test]
fn a_failed_engine_wakes_channel_waiters_and_fails_every_call() {
    let (ctx_a, ctx_b) = pair(Progress::Events, 0.0);
    let (pd_a, pd_b) = (ctx_a.alloc_pd().unwrap(), ctx_b.alloc_pd().unwrap());
    let channel = ctx_a.create_comp_channel().unwrap();
    let cq_a = ctx_a.create_cq(8, Some(&channel)).unwrap();
    let cq_b = ctx_b.create_cq(8, None).unwrap();
    let attr = |cq| init(QpType::Rc, cq);
    let qp_a = pd_a.create_qp(&attr(&cq_a)).unwrap();
    let qp_b = pd_b.create_qp(&attr(&cq_b)).unwrap();
    qp_a.connect(&qp_b.endpoint(1).unwrap(), &fast()).unwrap();
    cq_a.req_notify(false).unwrap();
    // A waiter with no deadline.
    let waiter = thread::spawn(move || channel.get_cq_event(None));
    // Registered first: once the engine has failed, registering fails too.
    let buf = pd_a.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    // B's side of the wire goes away entirely: A's next frame cannot be sent.
    drop((qp_b, cq_b, pd_b, ctx_b));
    // The engine fails when it sends this, or already when it notices the wire gone (then
    // the post is refused): either way the waiter must wake.
    if let Err(failure) = qp_a.post_send([signaled(1, SendOp::Send, buf.sge(0, 8))]) {
        assert!(
            matches!(failure.error, Error::EngineFailed(_)),
            "{failure:?}"
        );
    }
    let deadline = std::time::Instant::now() + STALL;
    while !waiter.is_finished() {
        assert!(
            std::time::Instant::now() < deadline,
            "the waiter still waits"
        );
        thread::sleep(Duration::from_millis(5));
    }
    assert!(matches!(
        waiter.join().unwrap(),
        Err(Error::EngineFailed(_))
    ));
    assert!(matches!(ctx_a.stats(), Err(Error::EngineFailed(_))));
    assert!(matches!(cq_a.poll(1), Err(Error::EngineFailed(_))));
    let failure = qp_a
        .post_send([signaled(2, SendOp::Send, buf.sge(0, 8))])
        .unwrap_err();
    assert!(matches!(failure.error, Error::EngineFailed(_)));
}

#[test]
fn bad_arguments_are_errors_not_panics() {
    let (ctx_a, ctx_b) = pair(Progress::Events, 0.0);
    let pd = ctx_a.alloc_pd().unwrap();
    assert!(matches!(
        ctx_a.create_cq(usize::MAX / 2, None),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        pd.reg_mr(usize::MAX / 4, AccessFlags::LOCAL_WRITE),
        Err(Error::Mr(_))
    ));
    let other = ctx_b.create_comp_channel().unwrap();
    assert!(matches!(
        ctx_a.create_cq(4, Some(&other)),
        Err(Error::ForeignObject("completion channel"))
    ));
    let mr = pd.reg_mr(8, AccessFlags::LOCAL_WRITE).unwrap();
    assert_eq!(mr.sge(usize::MAX, 1).addr, u64::MAX);
    // A wait "for ever" spelled as the longest Duration.
    let c = channelled(4);
    let buf_a = c.pd.0.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    let buf_b = c.pd.1.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    c.qp.1
        .post_recv([RecvWr {
            wr_id: 1,
            sg_list: [buf_b.sge(0, 64)].into(),
        }])
        .unwrap();
    c.cq.1.req_notify(false).unwrap();
    c.qp.0
        .post_send([signaled(1, SendOp::Send, buf_a.sge(0, 8))])
        .unwrap();
    assert_eq!(
        c.channel.get_cq_event(Some(Duration::MAX)).unwrap(),
        c.cq.1.id()
    );
}

#[test]
fn a_panic_under_the_device_lock_fails_every_later_call() {
    let c = channelled(8);
    let buf = c.pd.0.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        buf.with_bytes(|_| panic!("a program's closure panics"))
            .ok();
    }));
    assert!(panicked.is_err());
    assert!(matches!(c.cq.0.poll(1), Err(Error::Poisoned)));
    let failure =
        c.qp.0
            .post_send([signaled(1, SendOp::Send, buf.sge(0, 8))])
            .unwrap_err();
    assert!(matches!(failure.error, Error::Poisoned));
}

#[test]
fn a_cq_lives_while_a_qp_uses_it_and_destroying_it_then_is_busy() {
    let (ctx_a, _ctx_b) = pair(Progress::Events, 0.0);
    let pd = ctx_a.alloc_pd().unwrap();
    let cq = ctx_a.create_cq(4, None).unwrap();
    let qp = pd.create_qp(&init(QpType::Rc, &cq)).unwrap();
    // rdma-core: ibv_destroy_cq of a CQ a QP still uses fails with EBUSY, the CQ intact.
    let (cq, error) = cq.destroy().unwrap_err();
    assert!(matches!(error, Error::Busy("CQ")), "{error}");
    assert_eq!(error.errno(), 16, "EBUSY");
    assert_eq!(cq.poll(1).unwrap().len(), 0, "the CQ still works");
    drop(qp);
    cq.destroy().expect("no QP uses it any more");
}

#[test]
fn region_addresses_neither_overflow_nor_leak_on_failure() {
    const ENOMEM: i32 = 12;
    const EINVAL: i32 = 22;
    let (ctx_a, _ctx_b) = pair(Progress::Events, 0.0);
    let pd = ctx_a.alloc_pd().unwrap();
    let max_mr_size = ctx_a.device().query().limits.max_mr_size;
    let first = pd.reg_mr(1, AccessFlags::LOCAL_WRITE).unwrap();
    // Refused, in debug and release builds alike, without a panic: beyond max_mr_size is
    // ENOMEM (rxe cannot pin it), a bad access combination EINVAL.
    for (len, access, errno) in [
        (usize::MAX, AccessFlags::LOCAL_WRITE, ENOMEM),
        (max_mr_size as usize + 1, AccessFlags::LOCAL_WRITE, ENOMEM),
        (8, AccessFlags::REMOTE_WRITE, EINVAL),
    ] {
        let error = pd.reg_mr(len, access).map(drop).unwrap_err();
        assert!(matches!(error, Error::Mr(_)), "{len}: {error}");
        assert_eq!(error.errno(), errno, "{len}: {error}");
        assert_eq!(
            std::io::Error::from(error).kind(),
            std::io::Error::from_raw_os_error(errno).kind()
        );
    }
    // The failures took no addresses: the next region follows the first (its page and
    // the guard page), as if they had not happened.
    let second = pd.reg_mr(1, AccessFlags::LOCAL_WRITE).unwrap();
    assert_eq!(second.addr(), first.addr() + 2 * 4096);
    // A caller-chosen range that would wrap around the address space is EINVAL.
    let wrapping = pd.reg_mr_at(u64::MAX - 3, 8, AccessFlags::LOCAL_WRITE);
    assert_eq!(wrapping.map(drop).unwrap_err().errno(), EINVAL);
}

const EINVAL: i32 = 22;
const ENOMEM: i32 = 12;

fn errno<T>(result: Result<T, Error>) -> i32 {
    result.map(drop).unwrap_err().errno()
}

#[test]
fn create_calls_walk_each_device_limit_to_the_boundary_and_one_past() {
    let (ctx_a, _ctx_b) = pair(Progress::Events, 0.0);
    let limits = ctx_a.device().query().limits;
    let pd = ctx_a.alloc_pd().unwrap();
    let max_cqe = limits.max_cqe as usize;
    assert_eq!(errno(ctx_a.create_cq(max_cqe + 1, None)), EINVAL);
    let cq = ctx_a.create_cq(max_cqe, None).unwrap();
    let create = |caps| {
        pd.create_qp(&QpInitAttr {
            caps,
            ..init(QpType::Rc, &cq)
        })
    };
    let at_limit = QpCaps {
        max_send_wr: limits.max_qp_wr,
        max_recv_wr: limits.max_qp_wr,
        max_send_sge: limits.max_sge,
        max_recv_sge: limits.max_sge,
        ..QpCaps::default()
    };
    create(at_limit).expect("every cap at the device's limit");
    let past: [fn(&mut QpCaps); 4] = [
        |caps| caps.max_send_wr += 1,
        |caps| caps.max_recv_wr += 1,
        |caps| caps.max_send_sge += 1,
        |caps| caps.max_recv_sge += 1,
    ];
    for (n, one_past) in past.iter().enumerate() {
        let mut caps = at_limit;
        one_past(&mut caps);
        assert_eq!(errno(create(caps)), EINVAL, "cap {n}");
    }
    let huge = QpCaps {
        max_send_wr: u32::MAX,
        max_recv_wr: u32::MAX,
        max_send_sge: u32::MAX,
        max_recv_sge: u32::MAX,
        max_inline_data: u32::MAX,
    };
    assert_eq!(errno(create(huge)), EINVAL);
}

#[test]
fn modify_refuses_a_pkey_index_or_rd_atomic_beyond_the_device() {
    let (ctx_a, ctx_b) = pair(Progress::Events, 0.0);
    let limits = ctx_a.device().query().limits;
    let (pd_a, pd_b) = (ctx_a.alloc_pd().unwrap(), ctx_b.alloc_pd().unwrap());
    let (cq_a, cq_b) = (
        ctx_a.create_cq(4, None).unwrap(),
        ctx_b.create_cq(4, None).unwrap(),
    );
    let peer = pd_b.create_qp(&init(QpType::Rc, &cq_b)).unwrap();
    let to_init = |pkey_index| QpAttr {
        state: Some(QpState::Init),
        pkey_index: Some(pkey_index),
        port_num: Some(1),
        access_flags: Some(AccessFlags::REMOTE_WRITE),
        ..QpAttr::default()
    };
    let qp = pd_a.create_qp(&init(QpType::Rc, &cq_a)).unwrap();
    for index in [limits.max_pkeys, u16::MAX] {
        assert_eq!(
            errno(qp.modify(&to_init(index))),
            EINVAL,
            "pkey_index {index}"
        );
        assert_eq!(qp.state().unwrap(), QpState::Reset);
    }
    qp.modify(&to_init(limits.max_pkeys - 1)).unwrap();
    let max = limits.max_qp_rd_atom;
    let connect = |max_rd_atomic, max_dest_rd_atomic| {
        let qp = pd_a.create_qp(&init(QpType::Rc, &cq_a)).unwrap();
        let options = ConnectOptions {
            max_rd_atomic,
            max_dest_rd_atomic,
            ..fast()
        };
        qp.connect(&peer.endpoint(1).unwrap(), &options)
    };
    connect(max, max).expect("rd_atomic at the device's limit");
    assert_eq!(errno(connect(max + 1, max)), EINVAL);
    assert_eq!(errno(connect(max, max + 1)), EINVAL);
}

#[test]
fn posts_beyond_a_queue_or_its_sges_are_enomem_and_einval() {
    // Caller-driven and B never driven: nothing A sends is acknowledged, so its send queue
    // only fills.
    let (ctx_a, ctx_b) = pair(Progress::Caller, 0.0);
    let limits = ctx_a.device().query().limits;
    let (pd_a, pd_b) = (ctx_a.alloc_pd().unwrap(), ctx_b.alloc_pd().unwrap());
    let (cq_a, cq_b) = (
        ctx_a.create_cq(4, None).unwrap(),
        ctx_b.create_cq(4, None).unwrap(),
    );
    let caps = QpCaps {
        max_send_wr: limits.max_qp_wr,
        max_recv_wr: limits.max_qp_wr,
        max_send_sge: limits.max_sge,
        max_recv_sge: limits.max_sge,
        ..QpCaps::default()
    };
    let qp = pd_a
        .create_qp(&QpInitAttr {
            caps,
            ..init(QpType::Rc, &cq_a)
        })
        .unwrap();
    let peer = pd_b.create_qp(&init(QpType::Rc, &cq_b)).unwrap();
    qp.connect(&peer.endpoint(1).unwrap(), &fast()).unwrap();
    let buf = pd_a.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    let recv = |sges: usize| RecvWr {
        wr_id: sges as u64,
        sg_list: vec![buf.sge(0, 1); sges].into(),
    };
    for sges in [limits.max_sge as usize + 1, 100_000] {
        let failure = qp.post_recv([recv(sges)]).unwrap_err();
        assert_eq!(
            (failure.index, failure.error.errno()),
            (0, EINVAL),
            "{sges} SGEs"
        );
        let mut send = signaled(1, SendOp::Send, buf.sge(0, 1));
        send.sg_list = vec![buf.sge(0, 1); sges].into();
        let failure = qp.post_send([send]).unwrap_err();
        assert_eq!(
            (failure.index, failure.error.errno()),
            (0, EINVAL),
            "{sges} SGEs"
        );
    }
    // Exactly max_qp_wr fit in each queue (the SGE limit too); the next is ENOMEM.
    let max_wr = limits.max_qp_wr as usize;
    let failure = qp
        .post_recv((0..=max_wr).map(|n| RecvWr {
            wr_id: n as u64,
            sg_list: if n == 0 {
                recv(limits.max_sge as usize).sg_list
            } else {
                [buf.sge(0, 1)].into()
            },
        }))
        .unwrap_err();
    assert_eq!((failure.index, failure.error.errno()), (max_wr, ENOMEM));
    let failure = qp
        .post_send((0..=max_wr).map(|n| SendWr {
            wr_id: n as u64,
            op: SendOp::Send,
            sg_list: SgList::new(),
            inline_data: Vec::new(),
            flags: SendFlags::empty(),
            ud: None,
            xrc_srqn: 0,
        }))
        .unwrap_err();
    assert_eq!((failure.index, failure.error.errno()), (max_wr, ENOMEM));
}

#[test]
fn a_blocked_async_event_waiter_wakes_for_the_event_in_every_progress_mode() {
    for progress in [Progress::Events, Progress::Caller] {
        let (ctx_a, ctx_b) = pair(progress, 0.0);
        let (pd_a, pd_b) = (ctx_a.alloc_pd().unwrap(), ctx_b.alloc_pd().unwrap());
        let cq_a = ctx_a.create_cq(1, None).unwrap();
        let cq_b = ctx_b.create_cq(4, None).unwrap();
        let qp_a = pd_a.create_qp(&init(QpType::Rc, &cq_a)).unwrap();
        let qp_b = pd_b.create_qp(&init(QpType::Rc, &cq_b)).unwrap();
        qp_a.connect(&qp_b.endpoint(1).unwrap(), &fast()).unwrap();
        qp_b.connect(&qp_a.endpoint(1).unwrap(), &fast()).unwrap();
        let src = pd_a.reg_mr(8, AccessFlags::LOCAL_WRITE).unwrap();
        let dst = pd_b.reg_mr(8, AccessFlags::all()).unwrap();
        let write = SendOp::RdmaWrite {
            remote_addr: dst.addr(),
            rkey: dst.rkey(),
        };
        let stop = AtomicBool::new(false);
        let event = thread::scope(|scope| {
            // B's acknowledgements need B driven when nothing else drives it.
            scope.spawn(|| drive_until(&cq_b, &stop));
            let waiter = scope.spawn(|| ctx_a.get_async_event(Some(STALL)));
            // Three signaled WRITEs into a CQ of one slot: an overflow.
            qp_a.post_send((1..=3).map(|wr_id| signaled(wr_id, write, src.sge(0, 8))))
                .unwrap();
            let event = waiter.join().unwrap();
            stop.store(true, Ordering::Release);
            event
        });
        let (cq, qpn) = (cq_a.id(), qp_a.qp_num());
        assert_eq!(
            event.unwrap(),
            AsyncEvent::CqOverflow { cq, qpn },
            "{progress:?}"
        );
    }
}

#[test]
fn a_channel_a_cq_reports_to_is_busy_until_the_cq_is_gone() {
    let (ctx_a, _ctx_b) = pair(Progress::Events, 0.0);
    let channel = ctx_a.create_comp_channel().unwrap();
    let cq = ctx_a.create_cq(4, Some(&channel)).unwrap();
    let (channel, error) = channel.destroy().unwrap_err();
    assert!(matches!(error, Error::Busy(_)), "{error}");
    assert_eq!(error.errno(), 16, "EBUSY");
    cq.destroy().unwrap();
    channel.destroy().expect("no CQ reports to it any more");
}

/// A backend that counts the engine's turns (each ends with one `submit`).
struct CountingTurns<B> {
    inner: B,
    turns: Arc<std::sync::atomic::AtomicUsize>,
}

impl<B: roce_provider::backend::Backend> roce_provider::backend::Backend for CountingTurns<B> {
    fn receive(&mut self, budget: usize, handler: &mut dyn FnMut(&[u8])) -> std::io::Result<usize> {
        self.inner.receive(budget, handler)
    }
    fn transmit(
        &mut self,
        len: usize,
        flow: u16,
        fill: roce_provider::backend::Fill<'_>,
    ) -> std::io::Result<()> {
        self.inner.transmit(len, flow, fill)
    }
    fn submit(&mut self) -> std::io::Result<()> {
        self.turns.fetch_add(1, Ordering::Relaxed);
        self.inner.submit()
    }
    fn wait(&mut self, timeout: Option<Duration>) -> std::io::Result<()> {
        self.inner.wait(timeout)
    }
}

/// A program that posts faster than rounds go (one request per post, as perftest does)
/// does not drive a round per post: the first post to an idle QP sends at once, the rest
/// wait in the ring for the round its poll runs, which sends them all.
#[test]
fn a_burst_of_posts_is_sent_by_a_round_not_a_round_per_post() {
    let (wire_a, wire_b) = memory_pair();
    let turns = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let open =
        |backend: Box<dyn roce_provider::backend::Backend>, (mac, ip), (peer_mac, peer_ip)| {
            let addressing = Addressing {
                mac,
                ip,
                neighbours: HashMap::from([(peer_ip, peer_mac)]),
            };
            let options = OpenOptions {
                backend: BackendChoice::Custom(backend, addressing),
                progress: Progress::Caller,
                ..OpenOptions::default()
            };
            Context::open(&Device::in_memory(mac, ip), options).expect("open")
        };
    let counted = CountingTurns {
        inner: wire_a,
        turns: Arc::clone(&turns),
    };
    let ctx_a = open(Box::new(counted), (MAC_A, IP_A), (MAC_B, IP_B));
    let ctx_b = open(Box::new(wire_b), (MAC_B, IP_B), (MAC_A, IP_A));
    let (pd_a, pd_b) = (ctx_a.alloc_pd().unwrap(), ctx_b.alloc_pd().unwrap());
    let (cq_a, cq_b) = (
        ctx_a.create_cq(256, None).unwrap(),
        ctx_b.create_cq(256, None).unwrap(),
    );
    let attr = |cq| QpInitAttr {
        caps: QpCaps {
            max_send_wr: 128,
            ..QpCaps::default()
        },
        ..init(QpType::Rc, cq)
    };
    let (qp_a, qp_b) = (
        pd_a.create_qp(&attr(&cq_a)).unwrap(),
        pd_b.create_qp(&attr(&cq_b)).unwrap(),
    );
    qp_a.connect(&qp_b.endpoint(1).unwrap(), &fast()).unwrap();
    qp_b.connect(&qp_a.endpoint(1).unwrap(), &fast()).unwrap();
    let target = pd_b.reg_mr(64, AccessFlags::all()).unwrap();
    let src = pd_a.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let b_side = {
        let stop = Arc::clone(&stop);
        thread::spawn(move || drive_until(&cq_b, &stop).len())
    };
    let write = |n| {
        let op = SendOp::RdmaWrite {
            remote_addr: target.addr(),
            rkey: target.rkey(),
        };
        signaled(n, op, src.sge(0, 64))
    };
    let before = turns.load(Ordering::Relaxed);
    qp_a.post_send([write(0)]).unwrap();
    let after_first = turns.load(Ordering::Relaxed);
    assert_eq!(
        after_first - before,
        1,
        "the first, to an idle QP, leaves at once"
    );
    for n in 1..100 {
        qp_a.post_send([write(n)]).unwrap();
    }
    assert_eq!(
        turns.load(Ordering::Relaxed),
        after_first,
        "no round per post behind others"
    );
    let done = cq_a.wait_for(100, STALL).unwrap();
    assert!(done.iter().all(|wc| wc.status == WcStatus::Success));
    let ids: Vec<u64> = done.iter().map(|wc| wc.wr_id).collect();
    assert_eq!(ids, (0..100).collect::<Vec<_>>());
    stop.store(true, Ordering::Release);
    assert_eq!(b_side.join().unwrap(), 0, "B saw no completions of its own");
}

//! The verbs API's changes to live objects, over the in-memory wire: a CQ resized under
//! waiting completions, a region re-registered (rights, memory, PD) under traffic, a region
//! paging on demand over memory that comes and goes, and a QP reset forgetting what it
//! completed.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::time::Duration;

use roce_provider::memory::memory_pair;
use roce_transport::wr::signaled;
use roce_verbs::{
    AccessFlags, Addressing, BackendChoice, ConnectOptions, Context, Cq, Device, Error,
    OpenOptions, PathMtu, Pd, Progress, Qp, QpAttr, QpCaps, QpInitAttr, QpState, QpType, RecvWr,
    Rereg, RetryConfig, SendOp, Sge, WcStatus,
};

const STALL: Duration = Duration::from_secs(20);

/// Two contexts joined by a faultless in-memory wire, each with an engine thread.
fn pair() -> (Context, Context) {
    let (wire_a, wire_b) = memory_pair();
    let (ip_a, ip_b) = (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2));
    let (mac_a, mac_b) = ([2, 0, 0, 0, 0, 0xA], [2, 0, 0, 0, 0, 0xB]);
    let open = |wire, seed: u8, mac, ip, peer_mac, peer_ip| {
        let addressing = Addressing {
            mac,
            ip,
            neighbours: HashMap::from([(peer_ip, peer_mac)]),
        };
        let options = OpenOptions {
            backend: BackendChoice::Custom(Box::new(wire), addressing),
            progress: Progress::Events,
            seed: Some([seed; 32]),
            ..OpenOptions::default()
        };
        Context::open(&Device::in_memory(mac, ip), options).expect("open")
    };
    (
        open(wire_a, 1, mac_a, ip_a, mac_b, ip_b),
        open(wire_b, 2, mac_b, ip_b, mac_a, ip_a),
    )
}

/// Two contexts, a PD and a CQ of `depth` entries in each, and an RC QP in each connected
/// to the other (a test binds every field: one left to `..` is dropped at once).
struct Two {
    ctx_a: Context,
    ctx_b: Context,
    pd_a: Pd,
    pd_b: Pd,
    cq_a: Cq,
    cq_b: Cq,
    qp_a: Qp,
    qp_b: Qp,
}

fn two(depth: usize) -> Two {
    let (ctx_a, ctx_b) = pair();
    let (pd_a, pd_b) = (ctx_a.alloc_pd().unwrap(), ctx_b.alloc_pd().unwrap());
    let (cq_a, cq_b) = (
        ctx_a.create_cq(depth, None).unwrap(),
        ctx_b.create_cq(depth, None).unwrap(),
    );
    let (qp_a, qp_b) = rc(&cq_a, &cq_b, (&pd_a, &pd_b));
    Two {
        ctx_a,
        ctx_b,
        pd_a,
        pd_b,
        cq_a,
        cq_b,
        qp_a,
        qp_b,
    }
}

/// Two connected RC QPs, each context's completing into its CQ.
fn rc(cq_a: &Cq, cq_b: &Cq, pds: (&Pd, &Pd)) -> (Qp, Qp) {
    let attr = |cq| QpInitAttr {
        qp_type: QpType::Rc,
        send_cq: cq,
        recv_cq: cq,
        caps: QpCaps::default(),
        sq_sig_all: true,
    };
    let (qp_a, qp_b) = (
        pds.0.create_qp(&attr(cq_a)).unwrap(),
        pds.1.create_qp(&attr(cq_b)).unwrap(),
    );
    connect(&qp_a, &qp_b);
    (qp_a, qp_b)
}

/// (Re)connects two QPs from whatever state, through RESET.
fn connect(qp_a: &Qp, qp_b: &Qp) {
    let options = ConnectOptions {
        mtu: PathMtu::Mtu1024,
        retry: RetryConfig {
            timeout: 12,
            retry_cnt: 1,
            ..RetryConfig::default()
        },
        ..ConnectOptions::default()
    };
    let reset = QpAttr {
        state: Some(QpState::Reset),
        ..QpAttr::default()
    };
    for qp in [qp_a, qp_b] {
        qp.modify(&reset).unwrap();
    }
    let (end_a, end_b) = (qp_a.endpoint(1).unwrap(), qp_b.endpoint(1).unwrap());
    qp_a.connect(&end_b, &options).unwrap();
    qp_b.connect(&end_a, &options).unwrap();
}

fn write(remote_addr: u64, rkey: u32) -> SendOp {
    SendOp::RdmaWrite { remote_addr, rkey }
}

/// The status of one signaled WRITE of `sge` to `remote_addr` through `rkey`.
fn write_status(qp: &Qp, cq: &Cq, sge: Sge, remote_addr: u64, rkey: u32) -> WcStatus {
    qp.post_send([signaled(1, write(remote_addr, rkey), sge)])
        .unwrap();
    cq.wait_for(1, STALL).unwrap()[0].status
}

#[test]
fn a_resized_cq_keeps_what_waits_and_refuses_less_room() {
    let Two {
        ctx_a: _ctx_a,
        ctx_b: _ctx_b,
        pd_a,
        pd_b,
        cq_a,
        cq_b: _cq_b,
        qp_a,
        qp_b: _qp_b,
    } = two(4);
    let all = AccessFlags::all();
    let (src, dst) = (pd_a.reg_mr(64, all).unwrap(), pd_b.reg_mr(64, all).unwrap());
    let writes = (0..3).map(|wr_id| signaled(wr_id, write(dst.addr(), dst.rkey()), src.sge(0, 64)));
    qp_a.post_send(writes).unwrap();
    // Resizing counts what completed by then; wait until all three have.
    let mut refused = false;
    for _ in 0..10_000 {
        if let Err(error) = cq_a.resize(2) {
            assert!(matches!(error, Error::InvalidArgument(_)), "{error}");
            refused = true;
            break;
        }
        cq_a.resize(4).unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(refused, "three completions never waited");
    assert!(matches!(cq_a.resize(0), Err(Error::InvalidArgument(_))));
    cq_a.resize(3).unwrap();
    cq_a.resize(64).unwrap();
    let done = cq_a.wait_for(3, STALL).unwrap();
    assert_eq!(done.iter().map(|c| c.wr_id).collect::<Vec<_>>(), [0, 1, 2]);
    // Room for the new depth: 40 completions wait without an overflow.
    let writes = (0..40).map(|wr_id| signaled(wr_id, write(dst.addr(), dst.rkey()), src.sge(0, 8)));
    qp_a.post_send(writes).unwrap();
    assert_eq!(cq_a.wait_for(40, STALL).unwrap().len(), 40);
}

/// `Cq::wait_for` gives up once `stall` passes without a completion, counted from the last
/// one: completions that keep coming, each within the stall, keep it waiting however long
/// the whole takes; none at all ends it, not before the stall.
#[test]
fn wait_for_gives_up_only_after_a_stall_without_completions() {
    let two = two(16);
    let (cq_a, qp_a) = (&two.cq_a, &two.qp_a);
    let all = AccessFlags::all();
    let (src, dst) = (
        two.pd_a.reg_mr(64, all).unwrap(),
        two.pd_b.reg_mr(64, all).unwrap(),
    );
    let stall = Duration::from_millis(300);
    let started = std::time::Instant::now();
    assert!(matches!(cq_a.wait_for(1, stall), Err(Error::TimedOut)));
    assert!(started.elapsed() >= stall, "gave up before the stall");
    // Eight WRITEs a third of the stall apart: more than twice the stall in all.
    let gap = stall / 3;
    let waited = std::thread::scope(|scope| {
        scope.spawn(|| {
            for wr_id in 0..8 {
                std::thread::sleep(gap);
                let wr = signaled(wr_id, write(dst.addr(), dst.rkey()), src.sge(0, 8));
                qp_a.post_send([wr]).unwrap();
            }
        });
        cq_a.wait_for(8, stall)
    });
    assert_eq!(waited.map(|done| done.len()).ok(), Some(8));
}

#[test]
fn a_reregistered_region_keeps_its_key_as_rights_memory_and_pd_change() {
    let Two {
        ctx_a,
        ctx_b,
        pd_a,
        pd_b,
        cq_a,
        cq_b,
        qp_a,
        qp_b,
    } = two(64);
    let all = AccessFlags::all();
    let src = pd_a.reg_mr(256, all).unwrap();
    src.write(0, &[7; 256]).unwrap();
    let mut buffer = vec![0u8; 512].into_boxed_slice();
    let base = buffer.as_mut_ptr();
    // SAFETY: `buffer` outlives the region (dropped at the end, after `target`), and the
    // test reads it only between completed transfers.
    let mut target = unsafe { pd_b.reg_mr_raw(base, 256, all) }.unwrap();
    let rkey = target.rkey();
    let at = base as u64;
    assert_eq!(
        write_status(&qp_a, &cq_a, src.sge(0, 64), at, rkey),
        WcStatus::Success
    );

    let local_only = Rereg {
        access: Some(AccessFlags::LOCAL_WRITE),
        ..Rereg::default()
    };
    // SAFETY: the same memory, as above.
    unsafe { target.rereg(local_only) }.unwrap();
    assert_eq!(target.rkey(), rkey);
    assert_eq!(
        write_status(&qp_a, &cq_a, src.sge(0, 64), at, rkey),
        WcStatus::RemoteAccess
    );
    connect(&qp_a, &qp_b);

    let moved = Rereg {
        translation: Some((base.wrapping_add(256), 128)),
        access: Some(all),
        ..Rereg::default()
    };
    // SAFETY: the upper half of the same buffer, as above.
    unsafe { target.rereg(moved) }.unwrap();
    assert_eq!((target.addr(), target.len()), (at + 256, 128));
    assert_eq!(
        write_status(&qp_a, &cq_a, src.sge(0, 64), at, rkey),
        WcStatus::RemoteAccess,
        "the old range is gone"
    );
    connect(&qp_a, &qp_b);
    assert_eq!(
        write_status(&qp_a, &cq_a, src.sge(0, 128), at + 256, rkey),
        WcStatus::Success
    );
    assert_eq!(&buffer[256..384], &[7; 128][..]);

    // A PD of another context is refused; another PD of B's takes the region away from
    // B's QP, whose receive through it then fails.
    let foreign = ctx_a.alloc_pd().unwrap();
    let to_foreign = Rereg {
        pd: Some(&foreign),
        ..Rereg::default()
    };
    // SAFETY: nothing changes memory (and it is refused).
    let refused = unsafe { target.rereg(to_foreign) };
    assert!(matches!(refused, Err(Error::ForeignObject(_))));
    let other = ctx_b.alloc_pd().unwrap();
    let to_other = Rereg {
        pd: Some(&other),
        ..Rereg::default()
    };
    // SAFETY: nothing changes memory.
    unsafe { target.rereg(to_other) }.unwrap();
    qp_b.post_recv([RecvWr {
        wr_id: 9,
        sg_list: [target.sge(0, 128)].into(),
    }])
    .unwrap();
    qp_a.post_send([signaled(2, SendOp::Send, src.sge(0, 64))])
        .unwrap();
    assert_eq!(
        cq_a.wait_for(1, STALL).unwrap()[0].status,
        WcStatus::RemoteOperation
    );
    assert_eq!(
        cq_b.wait_for(1, STALL).unwrap()[0].status,
        WcStatus::LocalProtection
    );
    drop(target);
    drop(buffer);
}

#[test]
fn a_qp_reset_forgets_its_unpolled_completions() {
    let Two {
        ctx_a: _ctx_a,
        ctx_b: _ctx_b,
        pd_a,
        pd_b,
        cq_a,
        cq_b,
        qp_a,
        qp_b,
    } = two(64);
    let (keep, _keep_peer) = rc(&cq_a, &cq_b, (&pd_a, &pd_b));
    let mr = pd_a.reg_mr(64, AccessFlags::all()).unwrap();
    let recv = |wr_id| RecvWr {
        wr_id,
        sg_list: [mr.sge(0, 64)].into(),
    };
    qp_a.post_recv([recv(1), recv(2)]).unwrap();
    keep.post_recv([recv(3)]).unwrap();
    let err = QpAttr {
        state: Some(QpState::Err),
        ..QpAttr::default()
    };
    qp_a.modify(&err).unwrap();
    keep.modify(&err).unwrap();
    // Three flushes wait; the reset of qp_a takes its two and leaves keep's.
    for _ in 0..10_000 {
        if cq_a.resize(2).is_err() {
            break;
        }
        cq_a.resize(64).unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(cq_a.resize(2).is_err(), "the flushes never came");
    cq_a.resize(64).unwrap();
    connect(&qp_a, &qp_b);
    let left = cq_a.wait_for(1, STALL).unwrap();
    assert_eq!((left[0].wr_id, left[0].status), (3, WcStatus::WrFlush));
    assert!(cq_a.poll(8).unwrap().is_empty());
}

#[test]
fn on_demand_regions_explicit_and_implicit_reach_memory_by_its_address() {
    let Two {
        ctx_a: _ctx_a,
        ctx_b: _ctx_b,
        pd_a,
        pd_b,
        cq_a,
        cq_b: _cq_b,
        qp_a,
        qp_b: _qp_b,
    } = two(64);
    let all = AccessFlags::all();
    let src = pd_a.reg_mr(64, all).unwrap();
    src.write(0, &[5; 64]).unwrap();
    let mut later = vec![0u8; 4096];
    let addr = later.as_mut_ptr();
    let odp = pd_b.reg_mr_on_demand(addr, 4096, addr as u64, all).unwrap();
    assert!(odp.is_on_demand());
    let implicit = pd_b.reg_mr_implicit(all).unwrap();
    assert_eq!(
        write_status(&qp_a, &cq_a, src.sge(0, 64), addr as u64, odp.rkey()),
        WcStatus::Success
    );
    assert_eq!(&later[..64], &[5; 64][..]);
    assert_eq!(
        write_status(
            &qp_a,
            &cq_a,
            src.sge(0, 64),
            addr as u64 + 64,
            implicit.rkey()
        ),
        WcStatus::Success
    );
    assert_eq!(&later[64..128], &[5; 64][..]);
    let whole = Sge {
        addr: addr as u64,
        length: 4096,
        lkey: odp.lkey(),
    };
    pd_b.prefetch(&[whole], true, true).unwrap();
    let plain = pd_b.reg_mr(8, all).unwrap();
    assert!(pd_b.prefetch(&[plain.sge(0, 8)], false, true).is_err());
}

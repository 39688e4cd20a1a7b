//! ATOMIC WRITE on the wire between two namespaces over AF_XDP, both ends ours (the rxe of
//! the VM's Debian 6.1 kernel predates ATOMIC WRITE, which came in Linux 6.2: its
//! `rdma_rxe.ko` has no `IB_OPCODE_RC_ATOMIC_WRITE`). One side stores 8 bytes in the other's
//! memory with it and READs them back; its capture shows the request as rxe sends it
//! (opcode 0x1D, a RETH of length 8, the 8 bytes as payload) and the answer as rxe gives it
//! (a READ response ONLY of no data at the request's PSN). Needs root (CI is root).

use std::sync::mpsc::{self, Receiver, Sender};
use std::thread;
use std::time::Duration;

use roce_provider::capture::read_frames;
use roce_provider::netns::{self, needs_root, veth, Netns};
use roce_transport::wr::signaled;
use roce_verbs::{
    devices, AccessFlags, ConnectOptions, Context, OpenOptions, QpCaps, QpEndpoint, QpInitAttr,
    QpType, SendFlags, SendOp, SendWr, WcOpcode, WcStatus,
};
use roce_wire::{Frame, FrameRepr, Opcode};

const STALL: Duration = Duration::from_secs(20);
const DATA: [u8; 8] = *b"\x01atomic!";

/// What a side tells the other: its QP's endpoint, its region's address and key.
type Offer = (QpEndpoint, u64, u32);

fn side(
    ns: String,
    active: bool,
    tx: Sender<Offer>,
    rx: Receiver<Offer>,
    pcap: Option<std::path::PathBuf>,
) {
    netns::enter(&ns).unwrap();
    let list = devices().unwrap();
    let device = &list[0];
    let options = OpenOptions {
        pcap,
        ..OpenOptions::default()
    };
    let ctx = Context::open(device, options).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, None).unwrap();
    let attr = QpInitAttr {
        qp_type: QpType::Rc,
        send_cq: &cq,
        recv_cq: &cq,
        caps: QpCaps::default(),
        sq_sig_all: false,
    };
    let qp = pd.create_qp(&attr).unwrap();
    let region = pd
        .reg_mr(
            64,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        )
        .unwrap();
    tx.send((qp.endpoint(1).unwrap(), region.addr(), region.rkey()))
        .unwrap();
    let (peer, peer_addr, peer_rkey) = rx.recv().unwrap();
    let options = ConnectOptions {
        mtu: device.query_port().active_mtu,
        sgid_index: 1,
        ..ConnectOptions::default()
    };
    qp.connect(&peer, &options).unwrap();
    // Both connected before anything is sent.
    tx.send((peer, 0, 0)).unwrap();
    rx.recv().unwrap();
    if active {
        let store = SendWr {
            wr_id: 1,
            op: SendOp::AtomicWrite {
                remote_addr: peer_addr + 8,
                rkey: peer_rkey,
                data: DATA,
            },
            flags: SendFlags::SIGNALED,
            ..SendWr::default()
        };
        let read = SendOp::RdmaRead {
            remote_addr: peer_addr,
            rkey: peer_rkey,
        };
        qp.post_send([store, signaled(2, read, region.sge(0, 24))])
            .unwrap();
        let done = cq.wait_for(2, STALL).unwrap();
        let summary: Vec<_> = done
            .iter()
            .map(|wc| (wc.wr_id, wc.status, wc.opcode, wc.byte_len))
            .collect();
        assert_eq!(
            summary,
            [
                (1, WcStatus::Success, WcOpcode::AtomicWrite, 8),
                (2, WcStatus::Success, WcOpcode::RdmaRead, 24)
            ]
        );
        let back = region.to_vec().unwrap();
        assert_eq!(&back[8..16], &DATA, "READ after the ATOMIC WRITE sees it");
        assert_eq!(&back[..8], &[0; 8]);
        assert_eq!(&back[16..24], &[0; 8]);
    }
    // Each side keeps its QP until the other is done.
    tx.send((peer, 0, 0)).unwrap();
    rx.recv().ok();
}

#[test]
fn atomic_write_between_two_namespaces_as_rxe_frames_it() {
    if !needs_root("atomic_write_between_two_namespaces_as_rxe_frames_it") {
        return;
    }
    let a = Netns::create("roce-aw-a").unwrap();
    let b = Netns::create("roce-aw-b").unwrap();
    veth((&a, "wa", "10.85.0.1/24"), (&b, "wb", "10.85.0.2/24"), 1500).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let pcap = dir.path().join("a.pcap");
    let (a_tx, b_rx) = mpsc::channel();
    let (b_tx, a_rx) = mpsc::channel();
    let (name_a, name_b, pcap_a) = (a.name.clone(), b.name.clone(), pcap.clone());
    let active = thread::spawn(move || side(name_a, true, a_tx, a_rx, Some(pcap_a)));
    let passive = thread::spawn(move || side(name_b, false, b_tx, b_rx, None));
    let results = (active.join(), passive.join());
    results.0.expect("side A");
    results.1.expect("side B");

    // Every object of side A is gone, so its capture is complete.
    let frames = read_frames(&pcap).unwrap();
    let parsed: Vec<FrameRepr> = frames
        .iter()
        .filter_map(|captured| {
            let frame = Frame::new_checked(&captured.data[..]).ok()?;
            FrameRepr::parse(&frame).ok()
        })
        .collect();
    let request = parsed
        .iter()
        .find(|frame| frame.bth.opcode == Opcode::RcAtomicWrite)
        .expect("an ATOMIC WRITE request");
    let reth = request.ext.reth.expect("its RETH");
    assert_eq!(reth.dma_length, 8);
    assert_eq!(request.payload, &DATA);
    assert!(request.bth.ack_req);
    let answers: Vec<_> = parsed
        .iter()
        .filter(|frame| frame.bth.psn == request.bth.psn && !frame.bth.opcode.info().is_request)
        .collect();
    assert_eq!(answers.len(), 1, "one answer: {answers:?}");
    assert_eq!(answers[0].bth.opcode, Opcode::RcRdmaReadResponseOnly);
    assert!(answers[0].payload.is_empty());
    assert!(answers[0].ext.aeth.is_some());
}

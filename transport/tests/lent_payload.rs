//! One copy per sent byte: with `poll_transmit_lent`, a payload in registered memory stays
//! there, checked, and `write_payload` copies it straight into the frame. The frames made
//! that way are the frames `poll_transmit_into` makes (which copies into the packet first),
//! for a WRITE over two gather elements, a READ's responses, an inline SEND and a UD SEND,
//! and the data arrives intact.

use std::time::Instant;

use roce_transport::qp_state::QpType;
use roce_transport::wr::{signaled, SendFlags, SendOp, SendWr, SgList};
use roce_transport::{Endpoint, Transmit};
use roce_wire::{Frame, FrameRepr};

mod common;

use common::{pair, pattern, recv_wr, retry, sge, A, B, DST, SRC};

/// Moves every packet between A and B until neither has one, each frame made from a lent
/// payload and compared with the frame the copying path makes; returns how many packets
/// had a lent payload.
fn exchange(sim: &mut roce_transport::sim::Sim) -> usize {
    let mut lent = 0;
    let mut transmit = Transmit::default();
    for _ in 0..10_000 {
        let mut moved = false;
        for (from, to) in [(A, B), (B, A)] {
            let now = Instant::now();
            let endpoints = &mut sim.nodes;
            if !endpoints[from]
                .endpoint
                .poll_transmit_lent(now, &mut transmit)
            {
                continue;
            }
            moved = true;
            let sender: &Endpoint = &endpoints[from].endpoint;
            let len = transmit.packet.payload_len();
            if transmit.packet.payload.len() != len {
                lent += 1;
            }
            let hosts = [from as u8 + 1, to as u8 + 1];
            let repr = common::received_frame(&transmit, hosts);
            let mut frame = vec![0; repr.buffer_len_with(len)];
            let written = repr.emit_with(len, &mut frame, |out, icrc| {
                sender.write_payload(&transmit, out, icrc)
            });
            assert_eq!(written, Ok(frame.len()));
            let mut copied = transmit.clone();
            sender.materialize(&mut copied);
            assert_eq!(copied.packet.payload.len(), len);
            let mut expected = vec![0; frame.len()];
            let copied_repr = common::received_frame(&copied, hosts);
            assert_eq!(copied_repr.emit(&mut expected), Ok(frame.len()));
            assert_eq!(frame, expected, "lent and copied frames differ");
            let parsed = Frame::new_checked(&frame[..]).and_then(|f| FrameRepr::parse(&f));
            endpoints[to].endpoint.handle_packet(now, &parsed.unwrap());
        }
        if !moved {
            return lent;
        }
    }
    panic!("the exchange did not settle");
}

#[test]
fn lent_payloads_make_the_frames_copied_ones_do() {
    let (mut sim, qa, qb) = pair(5, QpType::Rc, retry(7, 7));
    let data = pattern(3000, 1);
    let src = sim.reg(A, SRC, &data);
    let dst = sim.reg(B, DST, &vec![0; 3000]);
    // A WRITE of 3000 bytes from two elements (1000 + 2000), over MTU 1024: three packets.
    let mut write = signaled(
        1,
        SendOp::RdmaWrite {
            remote_addr: DST,
            rkey: dst,
        },
        sge(SRC, 1000, src),
    );
    write.sg_list = SgList::from_slice(&[sge(SRC, 1000, src), sge(SRC + 1000, 2000, src)]);
    sim.post_send(A, qa, &write).unwrap();
    let lent = exchange(&mut sim);
    assert_eq!(lent, 3, "each WRITE packet lends its payload");
    assert_eq!(sim.mr_bytes(B, dst), data);

    // A READ of it back into a fresh region: B's responses lend theirs.
    let back = sim.reg(A, SRC + 0x10000, &vec![0; 3000]);
    let read = signaled(
        2,
        SendOp::RdmaRead {
            remote_addr: DST,
            rkey: dst,
        },
        sge(SRC + 0x10000, 3000, back),
    );
    sim.post_send(A, qa, &read).unwrap();
    assert_eq!(
        exchange(&mut sim),
        3,
        "each READ response lends its payload"
    );
    assert_eq!(sim.mr_bytes(A, back), data);

    // An inline SEND lends the WQE's own bytes.
    let recv = sim.reg(B, DST + 0x10000, &[0; 64]);
    sim.post_recv(B, qb, &recv_wr(9, sge(DST + 0x10000, 64, recv)))
        .unwrap();
    let inline = SendWr {
        wr_id: 3,
        op: SendOp::Send,
        sg_list: SgList::new(),
        inline_data: b"inline bytes".to_vec(),
        flags: SendFlags::SIGNALED | SendFlags::INLINE,
        ud: None,
        xrc_srqn: 0,
    };
    sim.post_send(A, qa, &inline).unwrap();
    assert_eq!(exchange(&mut sim), 1);
    assert_eq!(&sim.mr_bytes(B, recv)[..12], b"inline bytes");
}

#[test]
fn a_ud_send_holds_its_payload_as_its_wqe_retires() {
    let mut sim = roce_transport::sim::Sim::new(Default::default(), 6);
    assert_eq!((sim.add_node(), sim.add_node()), (A, B));
    let caps = roce_transport::qp::QpCaps::default();
    let (qa, qb) = (
        sim.create_qp(A, QpType::Ud, caps),
        sim.create_qp(B, QpType::Ud, caps),
    );
    const QKEY: u32 = 0x1234;
    sim.bring_up_ud(A, qa, QKEY);
    sim.bring_up_ud(B, qb, QKEY);
    let data = pattern(200, 2);
    let src = sim.reg(A, SRC, &data);
    let dst = sim.reg(B, DST, &vec![0; 240]);
    sim.post_recv(B, qb, &recv_wr(9, sge(DST, 240, dst)))
        .unwrap();
    let mut send = signaled(1, SendOp::Send, sge(SRC, 200, src));
    send.ud = Some(roce_transport::wr::UdDest {
        av: sim.av_of(B),
        remote_qpn: qb,
        remote_qkey: QKEY,
    });
    sim.post_send(A, qa, &send).unwrap();
    // Completed as it leaves, its WQE gone: the packet carries its own copy.
    assert_eq!(exchange(&mut sim), 0);
    // After the 40-byte GRH.
    assert_eq!(sim.mr_bytes(B, dst)[40..], data[..]);
}

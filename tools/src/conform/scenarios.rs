//! The scenarios: each a short exchange of crafted frames with the answer the IBTA
//! specification (Volume 1, chapter 9: transport header validation, the RC responder's PSN,
//! opcode-sequence, length and access checks, the requester's checks of responses) requires.
//!
//! An observation reads step by step, separated by commas; the answers to one step are
//! joined by `+` (`none` when there were none); each answer is its kind and its PSN counted
//! from the one the target expected when we connected (`ACK@0`, `NAK_SEQ@0`, `READ_ONLY@0:64`,
//! `ATOMIC_ACK@0=o`, where `o` is the first original value seen). A scenario that checks a
//! drop ends with a well-formed request at the same PSN: a dropped packet must neither be
//! answered nor advance the target's expected PSN.

use std::io;

use roce_wire::aeth::{CreditCount, NakCode, RnrTimer, Syndrome};
use roce_wire::Opcode;

use super::conn::{Conn, UD_QKEY};
use super::link::{Answer, Damage, Packet};
use super::target::Service;

/// One named scenario.
pub struct Scenario {
    /// Its name in the result line.
    pub name: &'static str,
    /// The server it needs.
    pub service: Service,
    /// The observations the specification allows (usually one).
    pub expected: &'static [&'static str],
    /// Sends its frames and returns the observation.
    pub run: fn(&mut Conn) -> io::Result<String>,
}

/// Bytes of the WRITEs, READs and SENDs that are not about length.
const LEN: usize = 64;

/// A step whose packet must be dropped, then the normal WRITE at the same PSN.
fn dropped_then_write(c: &mut Conn, packet: Packet) -> io::Result<String> {
    let dropped = c.step(&[packet], 0)?;
    let then = c.step(&[c.write_only(0, LEN)], 1)?;
    Ok(format!("{dropped},{then}"))
}

fn one(c: &mut Conn, packet: Packet) -> io::Result<String> {
    c.step(&[packet], 1)
}

/// A UD SEND the pingpong server accepts (its message: `--send-size` bytes of 0x7b) with
/// Q_Key `qkey`; the server's answer shows as its opcode alone (its PSNs are its own).
fn ud_step(c: &mut Conn, qkey: u32) -> io::Result<String> {
    let mut packet = c.ud_send(0, c.send_size);
    packet.payload = vec![0x7b; c.send_size];
    if let Some(deth) = packet.ext.deth.as_mut() {
        deth.qkey = qkey;
    }
    let wanted = usize::from(qkey == UD_QKEY);
    let seen = c.step(&[packet], wanted)?;
    Ok(seen
        .split('+')
        .map(|answer| answer.split('@').next().unwrap_or(answer))
        .collect::<Vec<_>>()
        .join("+"))
}

/// The baseline of each service: what a normal run does once. Also the liveness probe.
pub fn baseline(service: Service) -> &'static Scenario {
    let name = match service {
        Service::Write => "write_only",
        Service::Read => "read_only",
        Service::Atomic => "fetch_add",
        Service::Send => "send_only",
        Service::Ud => "ud_send",
    };
    SCENARIOS
        .iter()
        .find(|scenario| scenario.name == name)
        .unwrap_or(&SCENARIOS[0])
}

/// Every scenario, grouped by service.
pub static SCENARIOS: &[Scenario] = &[
    // RDMA WRITE, well formed.
    Scenario {
        name: "write_only",
        service: Service::Write,
        expected: &["ACK@0"],
        run: |c| one(c, c.write_only(0, LEN)),
    },
    Scenario {
        name: "write_multi_packet",
        service: Service::Write,
        expected: &["ACK@2"],
        run: |c| {
            let mtu = c.remote.mtu;
            let total = (2 * mtu + 88) as u32;
            let packets = [
                c.write(Opcode::RcRdmaWriteFirst, 0, mtu, total),
                c.write(Opcode::RcRdmaWriteMiddle, 1, mtu, 0),
                c.write(Opcode::RcRdmaWriteLast, 2, 88, 0),
            ];
            c.step(&packets, 1)
        },
    },
    Scenario {
        name: "write_with_pad",
        service: Service::Write,
        expected: &["ACK@0"],
        run: |c| {
            let mut packet = c.write_only(0, LEN - 2);
            packet.bth.pad_count = 2;
            one(c, packet)
        },
    },
    Scenario {
        name: "write_zero_length",
        service: Service::Write,
        expected: &["ACK@0"],
        run: |c| one(c, c.write_only(0, 0)),
    },
    // PSN checks.
    Scenario {
        name: "psn_ahead",
        service: Service::Write,
        expected: &["NAK_SEQ@0,ACK@0"],
        run: |c| {
            let ahead = c.step(&[c.write_only(3, LEN)], 1)?;
            let then = c.step(&[c.write_only(0, LEN)], 1)?;
            Ok(format!("{ahead},{then}"))
        },
    },
    Scenario {
        name: "psn_ahead_nak_once",
        service: Service::Write,
        expected: &["NAK_SEQ@0,ACK@0"],
        run: |c| {
            let ahead = c.step(&[c.write_only(2, LEN), c.write_only(3, LEN)], 2)?;
            let then = c.step(&[c.write_only(0, LEN)], 1)?;
            Ok(format!("{ahead},{then}"))
        },
    },
    Scenario {
        name: "duplicate_write",
        service: Service::Write,
        expected: &["ACK@0,ACK@0"],
        run: |c| {
            let first = c.step(&[c.write_only(0, LEN)], 1)?;
            let again = c.step(&[c.write_only(0, LEN)], 1)?;
            Ok(format!("{first},{again}"))
        },
    },
    Scenario {
        name: "duplicate_older_write",
        service: Service::Write,
        // The re-ACK may name the duplicate or, coalesced, the latest PSN.
        expected: &["ACK@0,ACK@1,ACK@0", "ACK@0,ACK@1,ACK@1"],
        run: |c| {
            let first = c.step(&[c.write_only(0, LEN)], 1)?;
            let second = c.step(&[c.write_only(1, LEN)], 1)?;
            let again = c.step(&[c.write_only(0, LEN)], 1)?;
            Ok(format!("{first},{second},{again}"))
        },
    },
    // Memory checks: Remote Access Error.
    Scenario {
        name: "write_bad_rkey",
        service: Service::Write,
        expected: &["NAK_ACCESS@0"],
        run: |c| {
            let mut packet = c.write_only(0, LEN);
            if let Some(reth) = &mut packet.ext.reth {
                reth.rkey ^= 0x5A5A_5A5A;
            }
            one(c, packet)
        },
    },
    Scenario {
        name: "write_out_of_bounds",
        service: Service::Write,
        expected: &["NAK_ACCESS@0"],
        run: |c| {
            let mut packet = c.write_only(0, LEN);
            if let Some(reth) = &mut packet.ext.reth {
                reth.virtual_address = reth.virtual_address.wrapping_add(1 << 30);
            }
            one(c, packet)
        },
    },
    // Length and opcode-sequence checks: Invalid Request.
    Scenario {
        name: "write_longer_than_reth",
        service: Service::Write,
        expected: &["NAK_INV@0"],
        run: |c| one(c, c.write(Opcode::RcRdmaWriteOnly, 0, LEN, LEN as u32 / 2)),
    },
    Scenario {
        name: "write_shorter_than_reth",
        service: Service::Write,
        expected: &["NAK_INV@0"],
        run: |c| one(c, c.write(Opcode::RcRdmaWriteOnly, 0, LEN, 2 * LEN as u32)),
    },
    Scenario {
        name: "write_first_not_mtu",
        service: Service::Write,
        expected: &["NAK_INV@0"],
        run: |c| {
            let mut first = c.write(Opcode::RcRdmaWriteFirst, 0, LEN, 4 * LEN as u32);
            first.bth.ack_req = true;
            one(c, first)
        },
    },
    Scenario {
        name: "middle_without_first",
        service: Service::Write,
        expected: &["NAK_INV@0"],
        run: |c| {
            let mut middle = c.write(Opcode::RcRdmaWriteMiddle, 0, c.remote.mtu, 0);
            middle.bth.ack_req = true;
            one(c, middle)
        },
    },
    Scenario {
        name: "last_without_first",
        service: Service::Write,
        expected: &["NAK_INV@0"],
        run: |c| one(c, c.write(Opcode::RcRdmaWriteLast, 0, LEN, 0)),
    },
    Scenario {
        name: "first_then_only",
        service: Service::Write,
        expected: &["NAK_INV@1"],
        run: |c| {
            let mtu = c.remote.mtu;
            let packets = [
                c.write(Opcode::RcRdmaWriteFirst, 0, mtu, 2 * mtu as u32),
                c.write_only(1, LEN),
            ];
            c.step(&packets, 1)
        },
    },
    // Opcodes: reserved ones are an Invalid Request; another transport's are
    // dropped by header validation.
    Scenario {
        name: "reserved_opcode",
        service: Service::Write,
        expected: &["NAK_INV@0"],
        run: |c| one(c, c.write_only(0, LEN).damaged(Damage::Opcode(0x1F))),
    },
    Scenario {
        name: "reserved_opcode_0x18",
        service: Service::Write,
        expected: &["NAK_INV@0"],
        run: |c| one(c, c.write_only(0, LEN).damaged(Damage::Opcode(0x18))),
    },
    Scenario {
        name: "uc_opcode_on_rc",
        service: Service::Write,
        expected: &["none,ACK@0"],
        run: |c| {
            let packet = c.write(Opcode::UcRdmaWriteOnly, 0, LEN, LEN as u32);
            dropped_then_write(c, packet)
        },
    },
    Scenario {
        name: "ud_opcode_on_rc",
        service: Service::Write,
        expected: &["none,ACK@0"],
        run: |c| {
            let packet = c.ud_send(0, LEN);
            dropped_then_write(c, packet)
        },
    },
    // UD: a datagram whose Q_Key is not the QP's is dropped silently (9.6.1.1.3); the
    // QP still delivers the next, correct one (the server answers it).
    Scenario {
        name: "ud_send",
        service: Service::Ud,
        expected: &["UD_SEND_ONLY"],
        run: |c| ud_step(c, UD_QKEY),
    },
    Scenario {
        name: "ud_wrong_qkey",
        service: Service::Ud,
        expected: &["none,UD_SEND_ONLY"],
        run: |c| {
            let dropped = ud_step(c, UD_QKEY ^ 0x8000)?;
            let then = ud_step(c, UD_QKEY)?;
            Ok(format!("{dropped},{then}"))
        },
    },
    Scenario {
        name: "cnp_to_rc_qp",
        service: Service::Write,
        expected: &["none,ACK@0"],
        run: |c| {
            let mut cnp = c.packet(Opcode::Cnp, 0);
            cnp.ext.cnp = Some(Default::default());
            cnp.bth.becn = true;
            dropped_then_write(c, cnp)
        },
    },
    // Malformed frames with a correct ICRC: dropped.
    Scenario {
        name: "truncated_bth",
        service: Service::Write,
        expected: &["none,ACK@0"],
        run: |c| {
            let packet = c.write_only(0, LEN).damaged(Damage::Truncate(8));
            dropped_then_write(c, packet)
        },
    },
    Scenario {
        name: "truncated_reth",
        service: Service::Write,
        expected: &["none,ACK@0"],
        run: |c| {
            let packet = c.write_only(0, 0).damaged(Damage::Truncate(12 + 10));
            dropped_then_write(c, packet)
        },
    },
    Scenario {
        name: "pad_beyond_payload",
        service: Service::Write,
        expected: &["none,ACK@0"],
        run: |c| {
            let packet = c.write_only(0, 0).damaged(Damage::PadCount(3));
            dropped_then_write(c, packet)
        },
    },
    Scenario {
        name: "nonzero_tver",
        service: Service::Write,
        expected: &["none,ACK@0"],
        run: |c| {
            let packet = c.write_only(0, LEN).damaged(Damage::Tver(1));
            dropped_then_write(c, packet)
        },
    },
    Scenario {
        name: "bad_icrc",
        service: Service::Write,
        expected: &["none,ACK@0"],
        run: |c| {
            let packet = c.write_only(0, LEN).damaged(Damage::Icrc(1));
            dropped_then_write(c, packet)
        },
    },
    Scenario {
        name: "wrong_pkey",
        service: Service::Write,
        expected: &["none,ACK@0"],
        run: |c| {
            let mut packet = c.write_only(0, LEN);
            packet.bth.pkey = 0x1234;
            dropped_then_write(c, packet)
        },
    },
    Scenario {
        name: "wrong_dest_qpn",
        service: Service::Write,
        expected: &["none,ACK@0"],
        run: |c| {
            let mut packet = c.write_only(0, LEN);
            packet.bth.dest_qpn ^= 0x5A_0000;
            dropped_then_write(c, packet)
        },
    },
    // Responses to requests the target never sent: silently dropped, and the QP goes on.
    Scenario {
        name: "ghost_ack",
        service: Service::Write,
        expected: &["none,ACK@0"],
        run: |c| {
            let ack = c.response(
                Opcode::RcAcknowledge,
                Syndrome::Ack(CreditCount::UNLIMITED),
                0,
            );
            dropped_then_write(c, ack)
        },
    },
    Scenario {
        name: "ghost_nak_sequence",
        service: Service::Write,
        expected: &["none,ACK@0"],
        run: |c| {
            let nak = c.response(
                Opcode::RcAcknowledge,
                Syndrome::Nak(NakCode::PsnSequenceError),
                0,
            );
            dropped_then_write(c, nak)
        },
    },
    Scenario {
        name: "ghost_rnr_nak",
        service: Service::Write,
        expected: &["none,ACK@0"],
        run: |c| {
            let rnr = c.response(Opcode::RcAcknowledge, Syndrome::RnrNak(RnrTimer::new(1)), 0);
            dropped_then_write(c, rnr)
        },
    },
    Scenario {
        name: "ghost_read_response",
        service: Service::Write,
        expected: &["none,ACK@0"],
        run: |c| {
            let mut response = c.response(
                Opcode::RcRdmaReadResponseOnly,
                Syndrome::Ack(CreditCount::UNLIMITED),
                0,
            );
            response.payload = vec![0xAB; LEN];
            dropped_then_write(c, response)
        },
    },
    Scenario {
        name: "ghost_atomic_ack",
        service: Service::Write,
        expected: &["none,ACK@0"],
        run: |c| {
            let ack = c.response(
                Opcode::RcAtomicAcknowledge,
                Syndrome::Ack(CreditCount::UNLIMITED),
                0,
            );
            dropped_then_write(c, ack)
        },
    },
    Scenario {
        name: "ack_msn_out_of_range",
        service: Service::Write,
        expected: &["none,ACK@0"],
        run: |c| {
            let mut ack = c.response(
                Opcode::RcAcknowledge,
                Syndrome::Ack(CreditCount::UNLIMITED),
                -1,
            );
            if let Some(aeth) = &mut ack.ext.aeth {
                aeth.msn = 0xFF_FFFF;
            }
            dropped_then_write(c, ack)
        },
    },
    Scenario {
        name: "truncated_aeth",
        service: Service::Write,
        expected: &["none,ACK@0"],
        run: |c| {
            let ack = c
                .response(
                    Opcode::RcAcknowledge,
                    Syndrome::Ack(CreditCount::UNLIMITED),
                    0,
                )
                .damaged(Damage::Truncate(12 + 2));
            dropped_then_write(c, ack)
        },
    },
    // RDMA READ.
    Scenario {
        name: "read_only",
        service: Service::Read,
        expected: &["READ_ONLY@0:64"],
        run: |c| one(c, c.read(0, LEN as u32)),
    },
    Scenario {
        name: "read_multi_packet",
        service: Service::Read,
        expected: &["READ_FIRST@0:256+READ_MIDDLE@1:256+READ_LAST@2:88,READ_ONLY@3:64"],
        run: |c| {
            let mtu = c.remote.mtu as u32;
            let long = c.step(&[c.read(0, 2 * mtu + 88)], 3)?;
            // The READ took three PSNs.
            let then = c.step(&[c.read(3, LEN as u32)], 1)?;
            Ok(format!("{long},{then}"))
        },
    },
    Scenario {
        name: "read_zero_length",
        service: Service::Read,
        expected: &["READ_ONLY@0:0"],
        run: |c| one(c, c.read(0, 0)),
    },
    Scenario {
        name: "duplicate_read",
        service: Service::Read,
        // Executed again.
        expected: &["READ_ONLY@0:64,READ_ONLY@0:64"],
        run: |c| {
            let first = c.step(&[c.read(0, LEN as u32)], 1)?;
            let again = c.step(&[c.read(0, LEN as u32)], 1)?;
            Ok(format!("{first},{again}"))
        },
    },
    Scenario {
        name: "read_psn_ahead",
        service: Service::Read,
        expected: &["NAK_SEQ@0,READ_ONLY@0:64"],
        run: |c| {
            let ahead = c.step(&[c.read(2, LEN as u32)], 1)?;
            let then = c.step(&[c.read(0, LEN as u32)], 1)?;
            Ok(format!("{ahead},{then}"))
        },
    },
    Scenario {
        name: "read_bad_rkey",
        service: Service::Read,
        expected: &["NAK_ACCESS@0"],
        run: |c| {
            let mut packet = c.read(0, LEN as u32);
            if let Some(reth) = &mut packet.ext.reth {
                reth.rkey ^= 0x5A5A_5A5A;
            }
            one(c, packet)
        },
    },
    Scenario {
        name: "read_out_of_bounds",
        service: Service::Read,
        expected: &["NAK_ACCESS@0"],
        run: |c| {
            let mut packet = c.read(0, LEN as u32);
            if let Some(reth) = &mut packet.ext.reth {
                reth.virtual_address = reth.virtual_address.wrapping_add(1 << 30);
            }
            one(c, packet)
        },
    },
    Scenario {
        name: "read_with_payload",
        service: Service::Read,
        // A length that does not fit the opcode: dropped as malformed, or refused.
        expected: &["none,READ_ONLY@0:64", "NAK_INV@0"],
        run: |c| {
            let bogus = c.write_only(0, LEN).damaged(Damage::Opcode(0x0C));
            let first = c.step(&[bogus], 1)?;
            if first != "none" {
                return Ok(first);
            }
            let then = c.step(&[c.read(0, LEN as u32)], 1)?;
            Ok(format!("{first},{then}"))
        },
    },
    // Atomics.
    Scenario {
        name: "fetch_add",
        service: Service::Atomic,
        expected: &["ATOMIC_ACK@0=o"],
        run: |c| one(c, c.atomic(Opcode::RcFetchAdd, 0)),
    },
    Scenario {
        name: "compare_swap",
        service: Service::Atomic,
        expected: &["ATOMIC_ACK@0=o"],
        run: |c| one(c, c.atomic(Opcode::RcCompareSwap, 0)),
    },
    Scenario {
        name: "duplicate_atomic",
        service: Service::Atomic,
        // The saved result, not executed again; the next FETCH_ADD then sees exactly one add.
        expected: &["ATOMIC_ACK@0=o,ATOMIC_ACK@0=o,ATOMIC_ACK@1=o+1"],
        run: |c| {
            let first = c.step(&[c.atomic(Opcode::RcFetchAdd, 0)], 1)?;
            let again = c.step(&[c.atomic(Opcode::RcFetchAdd, 0)], 1)?;
            let next = c.step(&[c.atomic(Opcode::RcFetchAdd, 1)], 1)?;
            Ok(format!("{first},{again},{next}"))
        },
    },
    Scenario {
        name: "atomic_misaligned",
        service: Service::Atomic,
        expected: &["NAK_INV@0", "NAK_ACCESS@0"],
        run: |c| {
            let mut packet = c.atomic(Opcode::RcFetchAdd, 0);
            if let Some(eth) = &mut packet.ext.atomic_eth {
                eth.virtual_address += 4;
            }
            one(c, packet)
        },
    },
    Scenario {
        name: "atomic_bad_rkey",
        service: Service::Atomic,
        expected: &["NAK_ACCESS@0"],
        run: |c| {
            let mut packet = c.atomic(Opcode::RcFetchAdd, 0);
            if let Some(eth) = &mut packet.ext.atomic_eth {
                eth.rkey ^= 0x5A5A_5A5A;
            }
            one(c, packet)
        },
    },
    Scenario {
        name: "atomic_out_of_bounds",
        service: Service::Atomic,
        expected: &["NAK_ACCESS@0"],
        run: |c| {
            let mut packet = c.atomic(Opcode::RcFetchAdd, 0);
            if let Some(eth) = &mut packet.ext.atomic_eth {
                eth.virtual_address = eth.virtual_address.wrapping_add(1 << 30);
            }
            one(c, packet)
        },
    },
    Scenario {
        name: "truncated_atomic_eth",
        service: Service::Atomic,
        expected: &["none,ATOMIC_ACK@0=o"],
        run: |c| {
            let cut = c
                .atomic(Opcode::RcFetchAdd, 0)
                .damaged(Damage::Truncate(12 + 20));
            let dropped = c.step(&[cut], 0)?;
            let then = c.step(&[c.atomic(Opcode::RcFetchAdd, 0)], 1)?;
            Ok(format!("{dropped},{then}"))
        },
    },
    // SEND.
    Scenario {
        name: "send_only",
        service: Service::Send,
        expected: &["ACK@0"],
        run: |c| one(c, c.send(Opcode::RcSendOnly, 0, c.send_size)),
    },
    Scenario {
        name: "duplicate_send",
        service: Service::Send,
        expected: &["ACK@0,ACK@0"],
        run: |c| {
            let first = c.step(&[c.send(Opcode::RcSendOnly, 0, c.send_size)], 1)?;
            let again = c.step(&[c.send(Opcode::RcSendOnly, 0, c.send_size)], 1)?;
            Ok(format!("{first},{again}"))
        },
    },
    Scenario {
        name: "send_too_long",
        service: Service::Send,
        // Longer than the posted receive: Invalid Request.
        expected: &["NAK_INV@0"],
        run: |c| one(c, c.send(Opcode::RcSendOnly, 0, c.send_size + 8)),
    },
    Scenario {
        name: "send_middle_without_first",
        service: Service::Send,
        expected: &["NAK_INV@0"],
        run: |c| {
            let mut middle = c.send(Opcode::RcSendMiddle, 0, c.remote.mtu);
            middle.bth.ack_req = true;
            one(c, middle)
        },
    },
    Scenario {
        name: "rnr_when_no_receive",
        service: Service::Send,
        // Every posted receive consumed, the next SEND gets an RNR NAK at its
        // own PSN, and does not advance the expected PSN.
        expected: &["ACKs,RNR"],
        run: |c| {
            for at in 0..RECEIVES_AT_MOST {
                let answer = c.step(&[c.send(Opcode::RcSendOnly, at, c.send_size)], 1)?;
                if answer != format!("ACK@{at}") {
                    return Ok(if answer == format!("RNR@{at}") {
                        "ACKs,RNR".into()
                    } else {
                        format!("ACKs,{answer}")
                    });
                }
            }
            Ok("ACKs".into())
        },
    },
    Scenario {
        name: "send_ack_credits",
        service: Service::Send,
        // The AETH credit count of each ACK to a SEND (end-to-end flow control, IBTA
        // 9.7.7.2): the invalid code 31 (credits not tracked) on every one, or the receives
        // still posted, rounded down by the encoding: never rising while no receive is
        // posted, and 0 on the ACK of the SEND that took the last one (the next gets RNR).
        expected: &["credits=invalid", "credits=tracking"],
        run: |c| {
            let mut codes = Vec::new();
            let mut rnr = false;
            for at in 0..RECEIVES_AT_MOST {
                let answers = c.answers(&[c.send(Opcode::RcSendOnly, at, c.send_size)], 1)?;
                match answers[..] {
                    [Answer::Ack {
                        syndrome: Syndrome::Ack(credits),
                        original: None,
                        psn,
                        ..
                    }] if psn == c.psn(at) => codes.push(credits),
                    [Answer::Ack {
                        syndrome: Syndrome::RnrNak(_),
                        ..
                    }] => {
                        rnr = true;
                        break;
                    }
                    _ => break,
                }
            }
            Ok(format!("credits={}", credits_shown(&codes, rnr)))
        },
    },
];

/// How the credit counts of successive ACKs read: `invalid` (all code 31), `tracking` (all
/// valid and consistent with receives used up one per SEND, 0 last when an RNR NAK
/// followed), otherwise the codes themselves (`none` without any ACK).
fn credits_shown(codes: &[CreditCount], rnr: bool) -> String {
    let counts: Vec<Option<u32>> = codes.iter().map(|code| code.count()).collect();
    if counts.is_empty() {
        return "none".into();
    }
    if counts.iter().all(Option::is_none) {
        return "invalid".into();
    }
    let valid: Vec<u32> = counts.iter().flatten().copied().collect();
    let falling = valid.windows(2).all(|pair| pair[1] <= pair[0]);
    let drained = !rnr || valid.last() == Some(&0);
    if valid.len() == counts.len() && falling && drained {
        return "tracking".into();
    }
    codes
        .iter()
        .map(|code| code.code().to_string())
        .collect::<Vec<_>>()
        .join("/")
}

/// More receives than any perftest send server posts with the `-n` we ask for.
pub const RECEIVES_AT_MOST: i32 = 64;

#[cfg(test)]
mod tests {
    use super::*;

    fn codes(counts: &[u8]) -> Vec<CreditCount> {
        // An ACK's syndrome byte is its credit code (the top three bits 000).
        counts
            .iter()
            .map(|&code| match Syndrome::from_byte(code) {
                Ok(Syndrome::Ack(credits)) => credits,
                other => panic!("{code}: {other:?}"),
            })
            .collect()
    }

    #[test]
    fn credits_are_invalid_tracking_or_shown() {
        assert_eq!(credits_shown(&codes(&[31, 31, 31]), true), "invalid");
        assert_eq!(credits_shown(&codes(&[4, 3, 2, 1, 0]), true), "tracking");
        // Code 5 is 6 receives: 6, then 4 left (code 4), rounded down as the encoding does.
        assert_eq!(credits_shown(&codes(&[5, 4, 3]), false), "tracking");
        assert_eq!(
            credits_shown(&codes(&[4, 4, 4, 4, 4]), true),
            "4/4/4/4/4",
            "not 0 before RNR"
        );
        assert_eq!(credits_shown(&codes(&[1, 2]), false), "1/2", "rising");
        assert_eq!(credits_shown(&codes(&[31, 0]), true), "31/0", "mixed");
        assert_eq!(credits_shown(&[], true), "none");
    }
}

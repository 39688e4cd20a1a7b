//! One connection as a scenario sees it: packets built for the target's QP at PSNs counted
//! from the one it expects, and its answers shown the same way.

use std::io;

use roce_wire::aeth::{self, Syndrome};
use roce_wire::{atomic_eth, deth, reth, Opcode, Psn};

use super::link::{Answer, Link, Packet, Shown};
use super::target::{Local, Remote};

/// A scenario's view of its connection.
pub struct Conn<'a> {
    link: &'a mut Link,
    /// The target's QP.
    pub remote: Remote,
    /// Ours.
    pub local: Local,
    /// Bytes per SEND the target's receives take (its `-s`).
    pub send_size: usize,
    /// The first atomic original value seen, which later ones are shown against.
    first_original: Option<u64>,
    /// Where we believe the target's expected PSN now is, counted from `local.psn`.
    pub next: i32,
}

impl<'a> Conn<'a> {
    /// A connection to `remote` through `link`.
    pub fn new(link: &'a mut Link, remote: Remote, local: Local, send_size: usize) -> Self {
        Conn {
            link,
            remote,
            local,
            send_size,
            first_original: None,
            next: 0,
        }
    }

    /// The PSN `at` steps from the one the target expected when we connected (the PSN we
    /// announced).
    pub fn psn(&self, at: i32) -> Psn {
        Psn::new(self.local.psn.value().wrapping_add(at as u32))
    }

    /// A bare packet of `opcode` to the target's QP at `at`.
    pub fn packet(&self, opcode: Opcode, at: i32) -> Packet {
        Packet::new(opcode, self.remote.qpn, self.psn(at))
    }

    /// An RDMA WRITE packet of `len` payload bytes; a RETH (if the opcode has one) says
    /// `dma_len` bytes at the target's buffer.
    pub fn write(&self, opcode: Opcode, at: i32, len: usize, dma_len: u32) -> Packet {
        let mut packet = self.packet(opcode, at);
        packet.payload = pattern(len, at);
        if opcode.info().headers.contains(&roce_wire::ExtHeader::Reth) {
            packet.ext.reth = Some(reth::Repr {
                virtual_address: self.remote.vaddr,
                rkey: self.remote.rkey,
                dma_length: dma_len,
            });
        }
        packet
    }

    /// RDMA WRITE ONLY of `len` bytes to the start of the target's buffer.
    pub fn write_only(&self, at: i32, len: usize) -> Packet {
        self.write(Opcode::RcRdmaWriteOnly, at, len, len as u32)
    }

    /// RDMA READ of `len` bytes from the start of the target's buffer.
    pub fn read(&self, at: i32, len: u32) -> Packet {
        let mut packet = self.packet(Opcode::RcRdmaReadRequest, at);
        packet.ext.reth = Some(reth::Repr {
            virtual_address: self.remote.vaddr,
            rkey: self.remote.rkey,
            dma_length: len,
        });
        packet
    }

    /// FETCH_ADD of 1 (or COMPARE_SWAP of 0 for 0) at the start of the target's buffer.
    pub fn atomic(&self, opcode: Opcode, at: i32) -> Packet {
        let mut packet = self.packet(opcode, at);
        packet.ext.atomic_eth = Some(atomic_eth::Repr {
            virtual_address: self.remote.vaddr,
            rkey: self.remote.rkey,
            swap_add: u64::from(opcode == Opcode::RcFetchAdd),
            compare: 0,
        });
        packet
    }

    /// A SEND packet of `len` bytes.
    pub fn send(&self, opcode: Opcode, at: i32, len: usize) -> Packet {
        let mut packet = self.packet(opcode, at);
        packet.payload = pattern(len, at);
        packet
    }

    /// A UD SEND_ONLY (the wrong QP type for an RC QP).
    pub fn ud_send(&self, at: i32, len: usize) -> Packet {
        let mut packet = self.send(Opcode::UdSendOnly, at, len);
        packet.ext.deth = Some(deth::Repr {
            qkey: UD_QKEY,
            src_qpn: self.local.qpn,
        });
        packet
    }

    /// A response of `opcode` to a request the target never made, `at` steps from the PSN
    /// its requests would start from (the one it announced).
    pub fn response(&self, opcode: Opcode, syndrome: Syndrome, at: i32) -> Packet {
        let psn = Psn::new(self.remote.psn.value().wrapping_add(at as u32));
        let mut packet = Packet::new(opcode, self.remote.qpn, psn);
        packet.ext.aeth = Some(aeth::Repr { syndrome, msn: 1 });
        if opcode == Opcode::RcAtomicAcknowledge {
            packet.ext.atomic_ack_eth = Some(roce_wire::atomic_ack_eth::Repr { original: 7 });
        }
        packet
    }

    /// Sends `packets`, then waits for `wanted` answers (or the link's wait); returns them
    /// as a result line shows them: `ACK@0+NAK_SEQ@1`, or `none`.
    pub fn step(&mut self, packets: &[Packet], wanted: usize) -> io::Result<String> {
        let answers = self.answers(packets, wanted)?;
        Ok(self.show(&answers))
    }

    /// Sends `packets`, then waits for `wanted` answers (or the link's wait); returns them
    /// undecorated, for a scenario that looks at more than a result line shows.
    pub fn answers(&mut self, packets: &[Packet], wanted: usize) -> io::Result<Vec<Answer>> {
        self.link.drain()?;
        for packet in packets {
            self.link.send(packet, self.local.qpn)?;
        }
        self.link.observe(self.local.qpn, wanted)
    }

    /// Sends one packet's bytes (already emitted) and waits for `wanted` answers; returns
    /// them, having learnt from them where the target's expected PSN went.
    pub fn exchange_bytes(&mut self, bytes: &[u8], wanted: usize) -> io::Result<Vec<Answer>> {
        self.link.drain()?;
        self.link.send_bytes(bytes)?;
        let answers = self.link.observe(self.local.qpn, wanted)?;
        self.show(&answers);
        Ok(answers)
    }

    /// The link, for who is who on it.
    pub fn link(&self) -> &Link {
        self.link
    }

    /// The bytes `packet` makes on this connection's link.
    pub fn emit(&self, packet: &Packet) -> io::Result<Vec<u8>> {
        self.link.emit(packet, self.local.qpn)
    }

    /// How `answers` read, learning where the target's expected PSN went.
    fn show(&mut self, answers: &[Answer]) -> String {
        if answers.is_empty() {
            return "none".into();
        }
        let shown: Vec<String> = answers
            .iter()
            .map(|answer| {
                let text = Shown {
                    answer,
                    base: self.local.psn,
                }
                .to_string();
                let Some(at) = answer.psn().map(|psn| psn.distance(self.local.psn)) else {
                    return text;
                };
                match answer {
                    Answer::Ack {
                        syndrome: Syndrome::Nak(aeth::NakCode::PsnSequenceError),
                        ..
                    } => self.next = at,
                    Answer::Ack {
                        syndrome: Syndrome::Ack(_),
                        ..
                    }
                    | Answer::ReadResponse { .. } => self.next = self.next.max(at + 1),
                    _ => {}
                }
                match answer {
                    Answer::Ack {
                        original: Some(original),
                        ..
                    } => {
                        let first = *self.first_original.get_or_insert(*original);
                        match original.wrapping_sub(first) {
                            0 => format!("{text}=o"),
                            diff => format!("{text}=o+{diff}"),
                        }
                    }
                    _ => text,
                }
            })
            .collect();
        shown.join("+")
    }
}

/// The Q_Key of the pingpong programs' UD QPs, which our UD sends carry.
pub const UD_QKEY: u32 = 0x1111_1111;

/// Recognisable payload bytes, different for each PSN offset.
fn pattern(len: usize, at: i32) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_add(at as u8)).collect()
}

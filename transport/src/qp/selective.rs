//! Selective repeat between two roce-xdp peers (after IRN: Mittal et al., "Revisiting
//! Network Support for RDMA", SIGCOMM 2018): the responder keeps requests that arrive ahead
//! of a gap and names each gap in a sequence NAK; the requester sends again only the packet
//! a NAK names, not everything after it.
//!
//! It is negotiated in band, so that every other peer sees plain go-back-N:
//!
//! - A requester configured for it *offers*: its requests carry [`SR`], a bit of the BTH's
//!   reserved `Resv7` field (byte 8, under the ICRC), which IBTA receivers ignore, and
//!   AckReq. It offers until the first response from the peer.
//! - A responder configured for it that sees the offer *answers*: from then on it keeps
//!   out-of-order requests of that connection (up to [`WINDOW`] PSNs ahead, in a bounded
//!   buffer) and sets [`SR`] on every response, ACK and NAK it sends.
//! - The requester's first response decides: with [`SR`] the peer keeps out-of-order
//!   requests, and every sequence NAK from it names one missing packet; without, it is rxe,
//!   an HCA, or a roce-xdp that does not take part, and the requester stops offering and
//!   goes back N as the IBTA says.
//!
//! So rxe never sees a NAK it could misread (only our responders send selective ones, and
//! only to requesters that offered), and a requester that offered to rxe has set one
//! reserved bit on the requests of its first round trip.
//!
//! Recovery, once agreed: the responder NAKs the expected PSN for every packet it keeps,
//! and again whenever it has executed up to a gap with packets kept beyond it (a NAK that
//! replaces any ACK owed: it acknowledges the same); the requester sends the named packet
//! once (AckReq set) and ignores further NAKs for it until it is acknowledged or its ACK
//! timer goes off. On that timer it sends its last packet alone, as a probe: in order, it
//! fills a lost tail; beyond a gap, it draws the NAK that names the gap; a duplicate, it
//! draws the ACK that was lost. READ and atomic responses are taken out of order too (bit
//! by bit, up to 128 ahead of the first missing one): a READ request sent again asks only
//! for the responses missing up to the next one received, which the responder answers
//! alone, and the SENDs and WRITEs after a READ complete once its last missing response
//! comes (the responder executed them already).
//!
//! Until the first response of the connection the requester does not know its peer: a
//! loss before it is recovered by going back N.

use std::collections::VecDeque;

use roce_wire::frame::{EthernetRepr, IpRepr};
use roce_wire::{bth, ExtRepr, FrameRepr, Psn};

/// The bit of the BTH's `Resv7` field that offers (in a request) or answers (in a
/// response) selective repeat.
pub(crate) const SR: u8 = 0x40;

/// How far ahead of the expected PSN a kept request may be: the requester's window.
pub(crate) const WINDOW: i32 = 128;

/// Packets queued to be sent again, and remembered as sent again, at most.
const MAX_RESEND: usize = 16;

/// One QP's negotiation, and its requester's recovery.
#[derive(Debug, Default)]
pub(crate) struct Selective {
    /// The device offers and answers selective repeat.
    enabled: bool,
    /// Requester: still offering (until the peer's first response).
    pub offering: bool,
    /// Requester: the peer's responder answered; its sequence NAKs name one packet.
    pub accepted: bool,
    /// Requester: packets to send again, alone, oldest first.
    resend: VecDeque<Psn>,
    /// Requester: packets sent again and not yet acknowledged (the NAKs and READ responses
    /// that name them again are echoes of the same loss), until the ACK timer.
    sent_again: Vec<Psn>,
    /// Responder: the peer offered; we keep out-of-order requests and mark responses.
    pub answering: bool,
}

impl Selective {
    /// A connected QP's negotiation, on a device that takes part or not.
    pub fn new(enabled: bool) -> Selective {
        Selective {
            enabled,
            offering: enabled,
            ..Selective::default()
        }
    }

    /// Whether the QP must leave its usual path to offer, answer or send a packet again.
    #[inline(always)]
    pub fn active(&self) -> bool {
        self.offering || self.answering || !self.resend.is_empty()
    }

    /// Whether `psn` is to be sent again: `false` if it was (and is not acknowledged yet)
    /// or is queued already.
    pub fn wants(&self, psn: Psn) -> bool {
        !self.sent_again.contains(&psn) && !self.resend.contains(&psn)
    }

    /// Queues `psn` to be sent again, alone. What is queued is bounded: beyond
    /// [`MAX_RESEND`] the oldest is dropped (the ACK timer recovers it).
    pub fn queue(&mut self, psn: Psn) {
        if self.resend.len() >= MAX_RESEND {
            self.resend.pop_front();
        }
        self.resend.push_back(psn);
    }

    /// The next packet to send again.
    pub fn next_resend(&self) -> Option<Psn> {
        self.resend.front().copied()
    }

    /// The front packet went (or is no longer wanted).
    pub fn resent(&mut self, sent: bool) {
        if let Some(psn) = self.resend.pop_front() {
            if sent && self.sent_again.len() < MAX_RESEND {
                self.sent_again.push(psn);
            }
        }
    }

    /// Everything through `acked` is acknowledged: what was sent again up to there is done.
    pub fn progress(&mut self, acked: Psn) {
        self.sent_again.retain(|psn| psn.distance(acked) > 0);
    }

    /// The ACK timer went off: the probe replaces what was queued, and what was sent again
    /// may be sent again when a NAK names it.
    pub fn probe(&mut self, psn: Psn) {
        self.resend.clear();
        self.sent_again.clear();
        self.resend.push_back(psn);
    }

    /// Whether the device takes part (the only case in which incoming packets are looked
    /// at for the bit).
    #[inline(always)]
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Looks at a packet from the peer for the bit; returns true when the peer has just
    /// offered (the responder must start keeping out-of-order requests).
    pub fn on_packet(&mut self, bth: &bth::Repr, is_request: bool) -> bool {
        let marked = bth.resv7 & SR != 0;
        if is_request {
            let offered = marked && !self.answering;
            self.answering |= marked;
            return offered;
        }
        if self.offering {
            self.offering = false;
            self.accepted = marked;
        }
        false
    }

    /// Marks a packet we send: requests while offering (asking for an ACK, so that the
    /// answer comes within a round trip), responses while answering.
    pub fn mark(&self, bth: &mut bth::Repr, is_request: bool) {
        if is_request && self.offering {
            bth.resv7 |= SR;
            bth.ack_req = true;
        } else if !is_request && self.answering {
            bth.resv7 |= SR;
        }
    }
}

/// A request kept ahead of a gap: what the responder needs to execute it later.
#[derive(Debug)]
struct Kept {
    ethernet: EthernetRepr,
    ip: IpRepr,
    udp_src_port: u16,
    bth: bth::Repr,
    ext: ExtRepr,
    payload: Vec<u8>,
}

impl Kept {
    fn frame(&self) -> FrameRepr<'_> {
        FrameRepr {
            ethernet: self.ethernet,
            ip: self.ip,
            udp_src_port: self.udp_src_port,
            udp_checksum: false,
            bth: self.bth,
            ext: self.ext,
            payload: &self.payload,
        }
    }
}

/// The responder's out-of-order requests, at most one per PSN of the [`WINDOW`] ahead of
/// the expected PSN, each at most one MTU: bounded by the window, whatever a peer sends.
#[derive(Debug, Default)]
pub(crate) struct Reorder {
    kept: Vec<Kept>,
}

/// A request taken out of the buffer to execute.
#[derive(Debug)]
pub(crate) struct Taken(Kept);

impl Taken {
    /// The request as it arrived.
    pub fn frame(&self) -> FrameRepr<'_> {
        self.0.frame()
    }
}

impl Reorder {
    /// Keeps `frame`, `ahead` PSNs beyond the expected one; `false` when it is beyond the
    /// window (the caller drops it). A PSN kept already is kept once.
    pub fn keep(&mut self, frame: &FrameRepr, ahead: i32) -> bool {
        if !(1..=WINDOW).contains(&ahead) {
            return false;
        }
        if self.kept.iter().any(|kept| kept.bth.psn == frame.bth.psn) {
            return true;
        }
        self.kept.push(Kept {
            ethernet: frame.ethernet,
            ip: frame.ip,
            udp_src_port: frame.udp_src_port,
            bth: frame.bth,
            ext: frame.ext,
            payload: frame.payload.to_vec(),
        });
        true
    }

    /// Whether requests are kept beyond a gap.
    pub fn holding(&self) -> bool {
        !self.kept.is_empty()
    }

    /// Takes the request kept for `epsn`, forgetting any behind it (executed meanwhile
    /// from a copy sent again).
    pub fn take(&mut self, epsn: Psn) -> Option<Taken> {
        self.kept.retain(|kept| kept.bth.psn.distance(epsn) >= 0);
        let at = self.kept.iter().position(|kept| kept.bth.psn == epsn)?;
        Some(Taken(self.kept.swap_remove(at)))
    }

    /// Forgets everything kept (the requester will send it again).
    pub fn clear(&mut self) {
        self.kept.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use roce_wire::Opcode;
    use std::net::Ipv4Addr;

    fn request(psn: u32, payload: &[u8]) -> FrameRepr<'_> {
        let mut bth = bth::Repr::new(Opcode::RcSendMiddle, 0x11, Psn::new(psn));
        bth.resv7 = SR;
        FrameRepr::ipv4(
            ([2, 0, 0, 0, 0, 1], Ipv4Addr::new(10, 0, 0, 1)),
            ([2, 0, 0, 0, 0, 2], Ipv4Addr::new(10, 0, 0, 2)),
            bth,
            ExtRepr::default(),
            payload,
        )
    }

    #[test]
    fn negotiation() {
        let ack = bth::Repr::new(Opcode::RcAcknowledge, 0x11, Psn::new(1));
        let mut answered = ack;
        answered.resv7 = SR;
        // Our requester meets one of ours: it offers until the first response, which
        // answers.
        let mut ours = Selective::new(true);
        assert!(ours.active() && ours.offering);
        let mut out = bth::Repr::new(Opcode::RcSendOnly, 0x12, Psn::new(0));
        ours.mark(&mut out, true);
        assert_eq!(out.resv7, SR);
        assert!(!ours.on_packet(&answered, false));
        assert!(ours.accepted && !ours.offering && !ours.active());
        // ... or rxe, whose ACKs never have the bit: go-back-N, and no more offers.
        let mut with_rxe = Selective::new(true);
        with_rxe.on_packet(&ack, false);
        assert!(!with_rxe.accepted && !with_rxe.offering);
        let mut out = bth::Repr::new(Opcode::RcSendOnly, 0x12, Psn::new(1));
        with_rxe.mark(&mut out, true);
        assert_eq!(out.resv7, 0);
        // A responder answers an offer, once, and marks its responses from then on.
        let mut responder = Selective::new(true);
        let offer = request(5, &[]).bth;
        assert!(responder.on_packet(&offer, true));
        assert!(!responder.on_packet(&offer, true), "answered already");
        let mut response = ack;
        responder.mark(&mut response, false);
        assert_eq!(response.resv7, SR);
        // A device that does not take part neither offers nor marks.
        let off = Selective::new(false);
        assert!(!off.active() && !off.enabled());
        let mut out = ack;
        off.mark(&mut out, false);
        assert_eq!(out.resv7, 0);
    }

    #[test]
    fn the_buffer_keeps_what_is_ahead_within_the_window() {
        let mut reorder = Reorder::default();
        let data = [7u8; 64];
        assert!(reorder.keep(&request(12, &data), 2));
        assert!(reorder.keep(&request(12, &data), 2), "twice, kept once");
        assert!(reorder.keep(&request(11, &data), 1));
        assert!(
            !reorder.keep(&request(10 + 129, &data), 129),
            "beyond the window"
        );
        assert!(!reorder.keep(&request(10, &data), 0));
        assert_eq!(reorder.kept.len(), 2);
        assert!(reorder.take(Psn::new(10)).is_none());
        let taken = reorder.take(Psn::new(11)).unwrap();
        assert_eq!(taken.frame().bth.psn, Psn::new(11));
        assert_eq!(taken.frame().payload, &data);
        // Behind the expected PSN now: forgotten.
        assert!(reorder.take(Psn::new(13)).is_none());
        assert!(!reorder.holding());
        // PSNs wrap at 2^24.
        let top = (1 << 24) - 1;
        assert!(reorder.keep(&request(1, &data), 2));
        assert!(reorder.take(Psn::new(top)).is_none());
        assert!(reorder.take(Psn::new(1)).is_some());
    }
}

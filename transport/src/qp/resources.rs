//! The responder's READ/atomic (and ATOMIC WRITE) resources and what it owes the requester,
//! in order.
//!
//! A READ request becomes a resource with a cursor, not a copy of its data: each response
//! packet is built from memory when the transmit path asks for it, as the requester rebuilds
//! its packets from a WQE. A duplicate READ moves the cursor back (IBTA 9.5, as rxe does),
//! a duplicate atomic asks for its saved result again. So what is queued is bounded by the
//! number of resources (`max_dest_rd_atomic`), whatever a peer asks for.

use std::collections::VecDeque;

use roce_wire::aeth::Syndrome;
use roce_wire::Psn;

use crate::mr::PdId;

/// ACKs and NAKs queued in a row at most. A request flood between two transmit turns is
/// what makes runs: RNR and sequence NAKs for the same PSN and ACKs of duplicates.
pub(crate) const MAX_ACK_RUN: usize = 4;

/// A READ or atomic kept to answer it and its duplicates.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Resource {
    pub first_psn: Psn,
    /// PSNs its responses use.
    pub npsn: u32,
    /// The MSN its responses carry.
    pub msn: u32,
    pub kind: ResourceKind,
    /// Responses still to send, if any.
    pub owed: Option<Owed>,
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum ResourceKind {
    /// A READ of `len` bytes at `address` through `rkey`: a duplicate may ask again for any
    /// tail of it (a retry from a lost response), and for nothing else.
    /// `pd` checks each response's access (an XRC target's comes from the request's SRQ).
    Read {
        address: u64,
        rkey: u32,
        len: u32,
        pd: PdId,
    },
    /// An atomic and the value it found.
    Atomic { original: u64 },
    /// An ATOMIC WRITE done: its answer is an empty READ response.
    AtomicWrite,
}

/// Where sending a resource's responses stands: packets `next..end` are owed, as one
/// message that began at packet `start` (a retried READ is answered as a new message, of
/// the packets asked for again).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Owed {
    pub start: u32,
    pub next: u32,
    pub end: u32,
}

impl Owed {
    /// Every one of `npsn` response packets.
    pub fn all(npsn: u32) -> Owed {
        Owed {
            start: 0,
            next: 0,
            end: npsn,
        }
    }
}

impl Resource {
    /// Packet `k` of this resource, if `psn` is one of its PSNs.
    pub fn packet_of(&self, psn: Psn) -> Option<u32> {
        let offset = psn.distance(self.first_psn);
        (offset >= 0 && (offset as u32) < self.npsn).then_some(offset as u32)
    }

    /// How many response packets a duplicate READ request at `psn` for `len` bytes at
    /// `address` asks for again, if it asks for a part of this READ that begins at its
    /// packet `psn`: the rest of it (as rxe and go-back-N ask), or, from a selective-repeat
    /// requester, only the packets it lost.
    pub fn read_part(
        &self,
        psn: Psn,
        mtu: usize,
        rkey: u32,
        address: u64,
        len: u32,
    ) -> Option<u32> {
        let ResourceKind::Read {
            address: start,
            rkey: key,
            len: total,
            ..
        } = self.kind
        else {
            return None;
        };
        let k = self.packet_of(psn)?;
        let offset = u64::from(k) * mtu as u64;
        let rest = u64::from(total) - offset.min(u64::from(total));
        let fits = key == rkey && address == start + offset && u64::from(len) <= rest;
        let whole_packets = u64::from(len) == rest || u64::from(len).is_multiple_of(mtu as u64);
        (fits && (len > 0 || rest == 0) && whole_packets)
            .then(|| (u64::from(len).div_ceil(mtu as u64).max(1)) as u32)
    }
}

/// One thing the responder owes, in the order it must go out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Output {
    /// An ACK or NAK.
    Ack {
        psn: Psn,
        syndrome: Syndrome,
        msn: u32,
    },
    /// The owed responses of the resource that begins at this PSN.
    Responses(Psn),
}

/// The resources and the queue of what is owed.
#[derive(Debug, Default)]
pub(crate) struct Resources {
    /// Oldest first; at most the QP's `max_dest_rd_atomic` (at least one).
    kept: VecDeque<Resource>,
    /// At most one entry per resource, and at most `MAX_ACK_RUN` ACK/NAKs in a row.
    out: VecDeque<Output>,
}

impl Resources {
    /// Keeps a new resource, forgetting the oldest beyond `limit` (and what it still owed),
    /// and queues its responses.
    pub fn add(&mut self, resource: Resource, limit: usize) {
        while self.kept.len() >= limit.max(1) {
            if let Some(old) = self.kept.pop_front() {
                self.forget(old.first_psn);
            }
        }
        self.kept.push_back(resource);
        self.queue_responses(resource.first_psn);
    }

    /// Drops what the resource at `first_psn` owed. The ACK/NAK runs on either side of its
    /// entry become one, which keeps its first `MAX_ACK_RUN` (the rest are as if lost).
    fn forget(&mut self, first_psn: Psn) {
        let mut run = 0;
        self.out.retain(|entry| match entry {
            // The forgotten entry goes, and the runs around it are counted as one.
            Output::Responses(psn) if *psn == first_psn => false,
            Output::Responses(_) => {
                run = 0;
                true
            }
            Output::Ack { .. } => {
                run += 1;
                run <= MAX_ACK_RUN
            }
        });
    }

    /// The newest resource that `psn` belongs to.
    pub fn find(&self, psn: Psn) -> Option<&Resource> {
        self.kept.iter().rev().find(|r| r.packet_of(psn).is_some())
    }

    /// The resource that begins at `first_psn`, for sending.
    pub fn get_mut(&mut self, first_psn: Psn) -> Option<&mut Resource> {
        self.kept.iter_mut().find(|r| r.first_psn == first_psn)
    }

    /// A duplicate asks again for `count` packets from `psn`: the newest resource holding
    /// it answers (again) those, as a new message.
    pub fn restart(&mut self, psn: Psn, count: u32) {
        let Some(resource) = self
            .kept
            .iter_mut()
            .rev()
            .find(|r| r.packet_of(psn).is_some())
        else {
            return;
        };
        let k = resource.packet_of(psn).unwrap_or(0);
        let queued = resource.owed.is_some();
        // What was still owed stays owed: a part asked for again only adds to it.
        let end = k
            .saturating_add(count.max(1))
            .max(resource.owed.map_or(0, |owed| owed.end))
            .min(resource.npsn);
        resource.owed = Some(Owed {
            start: k,
            next: k,
            end,
        });
        if !queued {
            let first_psn = resource.first_psn;
            self.queue_responses(first_psn);
        }
    }

    fn queue_responses(&mut self, first_psn: Psn) {
        self.out.push_back(Output::Responses(first_psn));
    }

    /// Queues an ACK or NAK. One equal to the ACK/NAK before it adds nothing and is left
    /// out; past [`MAX_ACK_RUN`] in a row, the newest takes the last one's place (as if the
    /// network had lost that one, which the requester recovers from), so no request flood
    /// grows the queue.
    pub fn queue_ack(&mut self, psn: Psn, syndrome: Syndrome, msn: u32) {
        let entry = Output::Ack { psn, syndrome, msn };
        let run = self
            .out
            .iter()
            .rev()
            .take_while(|queued| matches!(queued, Output::Ack { .. }))
            .count();
        match self.out.back_mut() {
            Some(last) if *last == entry => {}
            Some(last) if run >= MAX_ACK_RUN => *last = entry,
            _ => self.out.push_back(entry),
        }
    }

    /// The next thing owed.
    pub fn front(&self) -> Option<Output> {
        self.out.front().copied()
    }

    /// Done with the front entry.
    pub fn pop_front(&mut self) {
        self.out.pop_front();
    }

    /// Entries queued.
    pub fn backlog(&self) -> usize {
        self.out.len()
    }

    /// The most entries the queue can hold with `limit` resources: one per resource, and a
    /// run of ACK/NAKs before each and after the last.
    pub fn backlog_bound(limit: usize) -> usize {
        let limit = limit.max(1);
        limit + MAX_ACK_RUN * (limit + 1)
    }
}

#[cfg(test)]
mod tests {
    use roce_wire::aeth::{CreditCount, NakCode, RnrTimer};

    use super::*;

    fn read(first_psn: u32, npsn: u32) -> Resource {
        Resource {
            first_psn: Psn::new(first_psn),
            npsn,
            msn: 1,
            kind: ResourceKind::Read {
                address: 0,
                rkey: 1,
                len: npsn * 256,
                pd: PdId::NONE,
            },
            owed: Some(Owed::all(npsn)),
        }
    }

    #[test]
    fn a_duplicate_moves_the_cursor_without_queueing_again() {
        let mut resources = Resources::default();
        resources.add(read(10, 100), 1);
        for _ in 0..1000 {
            resources.restart(Psn::new(40), 100);
        }
        assert_eq!(resources.backlog(), 1);
        let owed = resources.get_mut(Psn::new(10)).and_then(|r| r.owed);
        assert_eq!(
            owed,
            Some(Owed {
                start: 30,
                next: 30,
                end: 100
            })
        );
    }

    /// Found by `roce sim --selective-repeat`: a part asked for again while the rest was
    /// still owed cut the rest off, and the requester waited for it until it gave up.
    #[test]
    fn a_part_asked_again_keeps_what_was_owed() {
        let mut resources = Resources::default();
        resources.add(read(10, 100), 1);
        // Packets 0..60 went; one of them (20) is asked for again.
        if let Some(resource) = resources.get_mut(Psn::new(10)) {
            resource.owed = Some(Owed {
                start: 0,
                next: 60,
                end: 100,
            });
        }
        resources.restart(Psn::new(30), 1);
        let owed = resources.get_mut(Psn::new(10)).and_then(|r| r.owed);
        assert_eq!(
            owed,
            Some(Owed {
                start: 20,
                next: 20,
                end: 100
            })
        );
        // Once all was sent, a part asked again is just that part.
        if let Some(resource) = resources.get_mut(Psn::new(10)) {
            resource.owed = None;
        }
        resources.restart(Psn::new(40), 2);
        let owed = resources.get_mut(Psn::new(10)).and_then(|r| r.owed);
        assert_eq!(
            owed,
            Some(Owed {
                start: 30,
                next: 30,
                end: 32
            })
        );
        assert_eq!(resources.backlog(), 2);
    }

    #[test]
    fn a_forgotten_resource_leaves_the_queue() {
        let mut resources = Resources::default();
        for first in 0..100 {
            resources.add(read(first * 10, 10), 4);
        }
        assert_eq!(resources.backlog(), 4);
        assert_eq!(resources.front(), Some(Output::Responses(Psn::new(960))));
        assert!(resources.find(Psn::new(955)).is_none());
    }

    #[test]
    fn acks_and_naks_in_a_row_stay_few() {
        let mut resources = Resources::default();
        let rnr = Syndrome::RnrNak(RnrTimer::new(1));
        let sequence = Syndrome::Nak(NakCode::PsnSequenceError);
        for round in 0..1000 {
            resources.queue_ack(Psn::new(5), rnr, 0);
            resources.queue_ack(Psn::new(5), sequence, 0);
            resources.queue_ack(Psn::new(round), Syndrome::Ack(CreditCount::UNLIMITED), 0);
        }
        assert_eq!(resources.backlog(), MAX_ACK_RUN);
        // The first ones stay, in order; an equal one is not queued twice.
        assert_eq!(
            resources.front(),
            Some(Output::Ack {
                psn: Psn::new(5),
                syndrome: rnr,
                msn: 0
            })
        );
        let mut twice = Resources::default();
        twice.queue_ack(Psn::new(5), rnr, 0);
        twice.queue_ack(Psn::new(5), rnr, 0);
        assert_eq!(twice.backlog(), 1);
    }

    #[test]
    fn the_bound_holds_for_any_mix() {
        let mut resources = Resources::default();
        let limit = 3;
        for i in 0..1000u32 {
            match i % 3 {
                0 => resources.add(read(i * 100, 50), limit),
                1 => resources.restart(Psn::new((i - 1) * 100 + 7), 50),
                _ => resources.queue_ack(Psn::new(i), Syndrome::Ack(CreditCount::UNLIMITED), 0),
            }
            assert!(resources.backlog() <= Resources::backlog_bound(limit));
        }
    }
}

//! The completer: acknowledgements, NAKs, READ responses (and the empty one that answers
//! an ATOMIC WRITE) and atomic results coming back to the requester; retries (go back N), RNR waits and timeouts.
//!
//! It decides and returns an [`Outcome`] (complete N WQEs, then retry from a PSN or fail the
//! next one); the QP applies it to the send queue. What the completer changes itself is its
//! own state (retry budgets, the retry under way), the acknowledged PSN, READ progress and
//! the data READ responses and atomic results carry into local memory.

use std::time::Duration;

use roce_wire::aeth::{NakCode, RnrTimer, Syndrome};
use roce_wire::opcode::Operation;
use roce_wire::{FrameRepr, Psn};

use super::common::{Common, Ctx};
use super::send_queue::SendQueue;
use crate::cq::WcStatus;
use crate::qp_state::{QpState, QpType};
use crate::timer::{Timer, TimerTable};
use crate::wr::SendOp;

/// Retry budgets and the retry under way.
#[derive(Debug, Default)]
pub(crate) struct Completer {
    /// Transport retries left before RETRY_EXC_ERR.
    retries_left: u8,
    /// RNR retries left before RNR_RETRY_EXC_ERR (unused when rnr_retry is 7).
    rnr_retries_left: u8,
    /// Where the retry under way resumed; cleared by progress or a timeout.
    recovering: Option<Psn>,
    /// Selective repeat agreed: sequence NAKs name one missing packet, READ responses are
    /// taken out of order, and only the missing ones asked for again.
    pub selective: bool,
    /// Selective repeat: the PSN the last sequence NAK named. A NAK naming a later one is
    /// progress (the responder executed up to it), even while the acknowledged PSN waits
    /// at a READ or atomic whose response was lost.
    last_named: Option<Psn>,
    /// Selective repeat: the highest PSN the responder is known to have executed (from its
    /// ACKs and NAKs, and from responses to later requests), which completes the SENDs and
    /// WRITEs behind a READ once that READ's last missing response comes.
    peer_acked: Option<Psn>,
}

impl Completer {
    /// Selective repeat: the responder is known to have executed everything through `psn`.
    fn peer_executed(&mut self, psn: Psn) {
        if self.selective && self.peer_acked.is_none_or(|acked| psn.distance(acked) > 0) {
            self.peer_acked = Some(psn);
        }
    }

    /// A new `retry_cnt` (from `modify_qp`), which is also the budget from now on.
    pub fn set_retry_cnt(&mut self, n: u8) {
        self.retries_left = n;
    }

    /// A new `rnr_retry`, which is also the RNR budget from now on.
    pub fn set_rnr_retry(&mut self, n: u8) {
        self.rnr_retries_left = n;
    }

    /// Selective repeat probed at the ACK timer with one packet: the NAK that answers it
    /// names a loss to recover, where go-back-N would have resent it already.
    pub fn forget_recovery(&mut self) {
        self.recovering = None;
    }

    /// Progress was made: the budgets are full again.
    fn refill(&mut self, retry_cnt: u8, rnr_retry: u8) {
        self.retries_left = retry_cnt;
        self.rnr_retries_left = rnr_retry;
    }
}

/// What the send queue must do after a response or timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Outcome {
    /// WQEs at the front that succeeded, to remove and report in order.
    pub complete: usize,
    /// Then, with the WQE that is front after them.
    pub then: Then,
}

/// The second half of an [`Outcome`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Then {
    /// Nothing more.
    Nothing,
    /// Go back N: resend from `from` (after `wait`, for an RNR NAK).
    Retry { from: Psn, wait: Option<Duration> },
    /// Selective repeat: the packet at this PSN is missing (the peer kept what came after);
    /// send it alone, unless it was sent again since the last progress. No retry is charged
    /// yet: the QP charges one when it does send.
    Resend(Psn),
    /// The front WQE fails with this status and the QP enters ERR.
    Fail(WcStatus),
}

impl Outcome {
    fn complete(n: usize) -> Outcome {
        Outcome {
            complete: n,
            then: Then::Nothing,
        }
    }

    fn then(self, then: Then) -> Outcome {
        Outcome { then, ..self }
    }
}

/// Why the requester goes back.
enum Retry {
    /// Sequence NAK, implied NAK, lost READ response or local ACK timeout.
    Transport,
    /// RNR NAK with the responder's timer.
    Rnr(RnrTimer),
}

/// Handles a response or acknowledgement addressed to this QP; `None` when it is dropped
/// unread (a duplicate, a ghost, the wrong state).
pub(crate) fn handle_response(
    comp: &mut Completer,
    sq: &mut SendQueue,
    qp: &mut Common,
    ctx: &mut Ctx,
    frame: &FrameRepr,
) -> Option<Outcome> {
    let requester = matches!(qp.qp_type, QpType::Rc | QpType::XrcSend);
    if !requester || !matches!(qp.state, QpState::Rts | QpState::Sqd) {
        qp.stats.dropped += 1;
        return None;
    }
    ctx.counters.rcvd_pkts += 1;
    let psn = frame.bth.psn;
    // Only PSNs sent and not yet acknowledged can be answered; anything else is a
    // duplicate or a ghost.
    let sent_unacked = psn.distance(sq.acked_psn()) > 0 && psn.distance(sq.next_psn()) < 0;
    if !sent_unacked {
        tracing::trace!(qpn = qp.qpn, %psn, "dropped: response outside the window");
        qp.stats.dropped += 1;
        return None;
    }
    let syndrome = frame.ext.aeth.map(|aeth| aeth.syndrome);
    if let Some(nak @ (Syndrome::Nak(_) | Syndrome::RnrNak(_))) = syndrome {
        tracing::debug!(qpn = qp.qpn, %psn, syndrome = ?nak, "NAK received");
    }
    Some(match (frame.bth.opcode.info().operation, syndrome) {
        (Operation::Acknowledge, Some(Syndrome::Ack(_))) => {
            comp.peer_executed(psn);
            ack_through(comp, sq, qp, psn, true)
        }
        (Operation::Acknowledge, Some(Syndrome::RnrNak(timer))) => {
            qp.stats.naks_received += 1;
            ctx.counters.rcvd_rnr_err += 1;
            nak_retry(comp, sq, qp, psn, Retry::Rnr(timer))
        }
        (Operation::Acknowledge, Some(Syndrome::Nak(NakCode::PsnSequenceError))) => {
            qp.stats.naks_received += 1;
            if acknowledges_within_message(sq, psn) {
                ctx.counters.rcvd_seq_err += 1;
            }
            nak_retry(comp, sq, qp, psn, Retry::Transport)
        }
        (Operation::Acknowledge, Some(Syndrome::Nak(code))) => {
            qp.stats.naks_received += 1;
            let status = match code {
                NakCode::RemoteAccessError => WcStatus::RemoteAccess,
                NakCode::RemoteOperationalError => WcStatus::RemoteOperation,
                _ => WcStatus::RemoteInvalidRequest,
            };
            ack_through(comp, sq, qp, psn - 1, false).then(Then::Fail(status))
        }
        (Operation::ReadResponse, _) => read_response(comp, sq, qp, ctx, frame),
        (Operation::AtomicAcknowledge, _) => atomic_ack(comp, sq, qp, ctx, frame),
        _ => {
            qp.stats.dropped += 1;
            Outcome::complete(0)
        }
    })
}

/// After the QP applied the outcome of `frame` (and did not enter ERR): progress refills
/// the retry budgets (unless the frame itself asked for a retry), and the local ACK timer
/// runs exactly while something is unacknowledged.
pub(crate) fn settle(
    comp: &mut Completer,
    sq: &SendQueue,
    timers: &mut TimerTable,
    qp: &Common,
    ctx: &Ctx,
    frame: &FrameRepr,
    acked_before: Psn,
) {
    let retried = matches!(
        frame.ext.aeth.map(|aeth| aeth.syndrome),
        Some(Syndrome::RnrNak(_) | Syndrome::Nak(NakCode::PsnSequenceError))
    ) && frame.bth.opcode.info().operation == Operation::Acknowledge;
    let progress = sq.acked_psn() != acked_before;
    if progress {
        comp.recovering = None;
        if !retried {
            comp.refill(qp.config.retry_cnt, qp.config.rnr_retry);
        }
    }
    let outstanding = sq.next_psn().distance(sq.acked_psn()) > 1;
    match qp.config.ack_timeout() {
        Some(timeout) if outstanding => {
            if progress || !timers.is_set(Timer::Retransmit) {
                timers.set(Timer::Retransmit, ctx.now + timeout);
            }
        }
        _ => timers.stop(Timer::Retransmit),
    }
}

/// Whether a sequence NAK for `psn` acknowledges packets of the message that holds `psn`
/// that nothing acknowledged before: what rxe counts in `rcvd_seq_err`.
fn acknowledges_within_message(sq: &SendQueue, psn: Psn) -> bool {
    let mut index = 0;
    while let Some(wqe) = sq.get(index) {
        if wqe.contains(psn) {
            return psn.distance(wqe.first_psn) > 0 && psn.distance(sq.acked_psn() + 1) > 0;
        }
        index += 1;
    }
    false
}

/// A sequence or RNR NAK for `psn` acknowledges everything before it, then the requester
/// resends from the oldest PSN still unanswered: `psn` itself, or an earlier READ/atomic
/// whose response was lost on the way back.
///
/// Like rxe, once a retry is under way further sequence NAKs that bring no progress are
/// ignored: the responder sent them for gaps before it saw the retry, and acting on each
/// would burn the whole retry budget within one round trip. An RNR NAK is always obeyed.
fn nak_retry(
    comp: &mut Completer,
    sq: &mut SendQueue,
    qp: &mut Common,
    psn: Psn,
    why: Retry,
) -> Outcome {
    let before = sq.acked_psn();
    let done = ack_through(comp, sq, qp, psn - 1, false);
    if sq.acked_psn() != before {
        comp.recovering = None;
        // Progress first, then charge this NAK's retry against the fresh budget.
        comp.refill(qp.config.retry_cnt, qp.config.rnr_retry);
    }
    if comp.selective && matches!(why, Retry::Transport) {
        // The peer kept what came after `psn`: that one alone is missing.
        comp.peer_executed(psn - 1);
        if comp.last_named.is_none_or(|last| psn.distance(last) > 0) {
            comp.refill(qp.config.retry_cnt, qp.config.rnr_retry);
        }
        comp.last_named = Some(psn);
        return done.then(Then::Resend(psn));
    }
    if comp.recovering.is_some() && matches!(why, Retry::Transport) {
        qp.stats.dropped += 1;
        return done;
    }
    let resume = match sq.get(done.complete) {
        Some(front) if front.wr.op.is_read_or_atomic() && psn.distance(front.first_psn) > 0 => {
            front.answered_through()
        }
        _ => psn,
    };
    comp.recovering = Some(resume);
    let then = retry(comp, qp, resume, why);
    if matches!(then, Then::Retry { .. }) {
        tracing::debug!(qpn = qp.qpn, nak = %psn, %resume, "retransmitting after a NAK");
    }
    done.then(then)
}

/// Completes every SEND/WRITE acknowledged by an ACK of `psn`. An ACK that covers a READ or
/// atomic whose response never came is an implied NAK: that response was lost, and with
/// `implied_nak` the requester goes back for it.
fn ack_through(
    comp: &mut Completer,
    sq: &mut SendQueue,
    qp: &mut Common,
    psn: Psn,
    implied_nak: bool,
) -> Outcome {
    // The acknowledged PSN never passes a READ or atomic still waiting for its answer: the
    // answer's own PSNs must stay acceptable.
    let mut acked = psn;
    let mut index = 0;
    while let Some(wqe) = sq.get(index) {
        if !sq.started(index) {
            break;
        }
        if sq.has_locals() && wqe.local_done() {
            index += 1;
            continue;
        }
        if wqe.wr.op.is_read_or_atomic() {
            let answered = wqe.answered_through() - 1;
            if psn.distance(answered) > 0 {
                acked = answered;
                if implied_nak {
                    return Outcome::complete(index).then(retry_lost(comp, qp, answered + 1));
                }
            }
            break;
        }
        let last_psn = wqe.last_psn();
        if !sq.fully_sent(index) || psn.distance(last_psn) < 0 {
            break;
        }
        sq.acknowledge(last_psn);
        index += 1;
    }
    if acked.distance(sq.acked_psn()) > 0 && acked.distance(sq.next_psn()) < 0 {
        sq.acknowledge(acked);
    }
    Outcome::complete(index)
}

/// How many WQEs come before the one that holds `psn`: a response for `psn` proves they
/// were acknowledged. `Err` if one of them was a READ or atomic still waiting for its
/// response (that response was lost: the outcome goes back for it), or if none holds `psn`.
fn answered_before(
    comp: &mut Completer,
    sq: &mut SendQueue,
    qp: &mut Common,
    psn: Psn,
) -> Result<usize, Outcome> {
    let mut index = 0;
    while let Some(wqe) = sq.get(index) {
        if wqe.contains(psn) {
            return Ok(index);
        }
        if wqe.local_done() {
            index += 1;
            continue;
        }
        if wqe.wr.op.is_read_or_atomic() {
            let resume = wqe.answered_through();
            return Err(Outcome::complete(index).then(retry_lost(comp, qp, resume)));
        }
        let last_psn = wqe.last_psn();
        sq.acknowledge(last_psn);
        index += 1;
    }
    Err(Outcome::complete(index))
}

fn read_response(
    comp: &mut Completer,
    sq: &mut SendQueue,
    qp: &mut Common,
    ctx: &mut Ctx,
    frame: &FrameRepr,
) -> Outcome {
    let psn = frame.bth.psn;
    let (index, blocked) = if comp.selective {
        match answered_before_selective(sq, psn) {
            Some(found) => found,
            None => {
                qp.stats.dropped += 1;
                return Outcome::complete(0);
            }
        }
    } else {
        match answered_before(comp, sq, qp, psn) {
            Ok(index) => (index, None),
            Err(outcome) => return outcome,
        }
    };
    let done = Outcome::complete(if blocked.is_some() { 0 } else { index });
    let mtu = qp.config.mtu;
    let Some(wqe) = sq.get(index) else {
        return done;
    };
    let expected = wqe.answered_through();
    if let SendOp::AtomicWrite { .. } = wqe.wr.op {
        return atomic_write_done(sq, qp, frame, index, expected);
    }
    let SendOp::RdmaRead { .. } = wqe.wr.op else {
        return done.then(Then::Fail(WcStatus::BadResponse));
    };
    let ahead = match psn.distance(expected) {
        0 => 0,
        behind if behind < 0 => {
            qp.stats.dropped += 1;
            return done;
        }
        ahead if comp.selective => ahead as u32,
        _ => return done.then(retry_lost(comp, qp, expected)),
    };
    // A retried READ is answered as a new message (FIRST again), and reordering can mix the
    // two answers; what must hold is that only the final packet ends the message and every
    // packet carries exactly the bytes that belong at its offset. With selective repeat a
    // retry asks for the missing packets alone, so only the bytes are checked.
    let k = wqe.responses + ahead;
    if k >= wqe.npsn {
        return done.then(Then::Fail(WcStatus::BadResponse));
    }
    let last = k + 1 == wqe.npsn;
    let offset = k as usize * mtu;
    let want_len = (wqe.len as usize - offset).min(mtu);
    let ends = frame.bth.opcode.info().position.ends_message();
    if (ends != last && !comp.selective) || frame.payload.len() != want_len {
        return done.then(Then::Fail(WcStatus::BadResponse));
    }
    if let Some(wqe) = sq.get(index) {
        comp.peer_executed(wqe.first_psn - 1);
    }
    if ahead > 0 && !sq.record_early(index, ahead) {
        // Had it already, or too far ahead to track: it will be asked for again.
        qp.stats.dropped += 1;
        return done.then(gap_after(comp, qp, sq, index, blocked, expected));
    }
    let Some(wqe) = sq.get(index) else {
        return done;
    };
    if ctx
        .mrs
        .scatter(qp.pd, &wqe.wr.sg_list, offset as u64, frame.payload)
        .is_err()
    {
        return done.then(Then::Fail(WcStatus::LocalProtection));
    }
    if ahead > 0 {
        return done.then(gap_after(comp, qp, sq, index, blocked, expected));
    }
    let all_in = sq.record_response(index);
    let Some(wqe) = sq.get(index) else {
        return done;
    };
    let (through, gap) = (wqe.answered_through(), wqe.early != 0);
    if !comp.selective {
        sq.acknowledge(through - 1);
        return Outcome::complete(index + usize::from(all_in));
    }
    if blocked.is_none() {
        sq.acknowledge(through - 1);
    }
    let outcome = Outcome::complete(completable(comp, sq));
    match blocked {
        // An earlier READ or atomic still misses a response: that comes first.
        Some(missing) => outcome.then(ask_again(comp, qp, missing)),
        // What landed early ends at the next gap: that one is missing too (once the
        // READ's responses have all come: until then they may be on their way).
        None if gap && !all_in => outcome.then(gap_after(comp, qp, sq, index, None, through)),
        None => outcome,
    }
}

/// Selective repeat: a READ response came ahead of `expected` (the first missing one of the
/// WQE at `index`). An earlier READ or atomic missing a response is asked for first; this
/// READ's gap only once its last response came (the responder sends a READ's responses in
/// order, so a gap before the last is lost, not late).
fn gap_after(
    comp: &mut Completer,
    qp: &mut Common,
    sq: &SendQueue,
    index: usize,
    blocked: Option<Psn>,
    expected: Psn,
) -> Then {
    if let Some(missing) = blocked {
        return ask_again(comp, qp, missing);
    }
    match sq.get(index) {
        Some(wqe) if wqe.tail_seen => ask_again(comp, qp, expected),
        _ => Then::Nothing,
    }
}

/// Selective repeat: the WQE that `psn` answers, and, if an earlier READ or atomic still
/// misses a response, the PSN of that response. SENDs and WRITEs before `psn` are
/// acknowledged up to the first such READ or atomic (never past it).
fn answered_before_selective(sq: &mut SendQueue, psn: Psn) -> Option<(usize, Option<Psn>)> {
    let mut blocked = None;
    let mut index = 0;
    while let Some(wqe) = sq.get(index) {
        if wqe.contains(psn) {
            return Some((index, blocked));
        }
        if wqe.wr.op.is_read_or_atomic() {
            if wqe.responses < wqe.npsn && blocked.is_none() {
                blocked = Some(wqe.answered_through());
            }
        } else if blocked.is_none() {
            let last_psn = wqe.last_psn();
            sq.acknowledge(last_psn);
        }
        index += 1;
    }
    None
}

/// Selective repeat: how many WQEs at the front are done: READs and atomics with every
/// response in, SENDs and WRITEs the responder executed. What they cover is acknowledged.
fn completable(comp: &Completer, sq: &mut SendQueue) -> usize {
    let mut index = 0;
    while let Some(wqe) = sq.get(index) {
        if !sq.started(index) {
            break;
        }
        let done = if wqe.wr.op.is_read_or_atomic() {
            wqe.responses >= wqe.npsn
        } else {
            sq.fully_sent(index)
                && comp
                    .peer_acked
                    .is_some_and(|acked| wqe.last_psn().distance(acked) <= 0)
        };
        if !done {
            // A READ under way at the front: what came of it in order is acknowledged.
            let answered = wqe.answered_through() - 1;
            if wqe.wr.op.is_read_or_atomic() && answered.distance(sq.acked_psn()) > 0 {
                sq.acknowledge(answered);
            }
            break;
        }
        let last_psn = wqe.last_psn();
        if last_psn.distance(sq.acked_psn()) > 0 {
            sq.acknowledge(last_psn);
        }
        index += 1;
    }
    index
}

/// Selective repeat: the READ response at `psn` is missing while later ones came.
fn ask_again(_comp: &mut Completer, _qp: &mut Common, psn: Psn) -> Then {
    Then::Resend(psn)
}

/// The answer to the ATOMIC WRITE at `index` (expected at `expected`): a READ response
/// ONLY with no data, as rxe sends it.
fn atomic_write_done(
    sq: &mut SendQueue,
    qp: &mut Common,
    frame: &FrameRepr,
    index: usize,
    expected: Psn,
) -> Outcome {
    let done = Outcome::complete(index);
    if frame.bth.psn != expected {
        qp.stats.dropped += 1;
        return done;
    }
    let only = frame.bth.opcode.info().position == roce_wire::opcode::Position::Only;
    if !only || !frame.payload.is_empty() {
        return done.then(Then::Fail(WcStatus::BadResponse));
    }
    sq.acknowledge(frame.bth.psn);
    Outcome::complete(index + 1)
}

fn atomic_ack(
    comp: &mut Completer,
    sq: &mut SendQueue,
    qp: &mut Common,
    ctx: &mut Ctx,
    frame: &FrameRepr,
) -> Outcome {
    let (index, blocked) = if comp.selective {
        match answered_before_selective(sq, frame.bth.psn) {
            Some(found) => found,
            None => {
                qp.stats.dropped += 1;
                return Outcome::complete(0);
            }
        }
    } else {
        match answered_before(comp, sq, qp, frame.bth.psn) {
            Ok(index) => (index, None),
            Err(outcome) => return outcome,
        }
    };
    let done = Outcome::complete(if blocked.is_some() { 0 } else { index });
    let (Some(wqe), Some(original)) = (sq.get(index), frame.ext.atomic_ack_eth) else {
        return done;
    };
    if comp.selective && wqe.responses >= wqe.npsn {
        qp.stats.dropped += 1; // its result came already
        return done;
    }
    if !wqe.wr.op.is_atomic() {
        return done.then(Then::Fail(WcStatus::BadResponse));
    }
    // The original value lands in local memory in host byte order, as verbs defines it.
    let bytes = original.original.to_ne_bytes();
    if ctx.mrs.scatter(qp.pd, &wqe.wr.sg_list, 0, &bytes).is_err() {
        return done.then(Then::Fail(WcStatus::LocalProtection));
    }
    let last_psn = wqe.last_psn();
    if comp.selective {
        comp.peer_executed(last_psn);
        sq.record_response(index);
        if blocked.is_none() {
            sq.acknowledge(last_psn);
        }
        let outcome = Outcome::complete(completable(comp, sq));
        return match blocked {
            Some(missing) => outcome.then(ask_again(comp, qp, missing)),
            None => outcome,
        };
    }
    sq.acknowledge(last_psn);
    Outcome::complete(index + 1)
}

/// A response is missing before `psn` (responses after it arrived, or an ACK implied it):
/// go back for it, unless a retry is already under way (see [`nak_retry`]).
fn retry_lost(comp: &mut Completer, qp: &mut Common, psn: Psn) -> Then {
    if comp.selective {
        return Then::Resend(psn);
    }
    if comp.recovering.is_some() {
        qp.stats.dropped += 1;
        return Then::Nothing;
    }
    comp.recovering = Some(psn);
    let then = retry(comp, qp, psn, Retry::Transport);
    if matches!(then, Then::Retry { .. }) {
        tracing::debug!(qpn = qp.qpn, resume = %psn, "retransmitting: a response was lost");
    }
    then
}

/// Going back to resend from `psn`, charging the matching retry counter; when it is
/// exhausted the oldest WQE fails instead.
fn retry(comp: &mut Completer, qp: &Common, psn: Psn, why: Retry) -> Then {
    let wait = match why {
        Retry::Transport => {
            if comp.retries_left == 0 {
                return Then::Fail(WcStatus::RetryExceeded);
            }
            comp.retries_left -= 1;
            None
        }
        Retry::Rnr(timer) => {
            // rnr_retry 7 means retry forever (IBTA 9.7.5.2.8).
            if qp.config.rnr_retry != 7 {
                if comp.rnr_retries_left == 0 {
                    return Then::Fail(WcStatus::RnrRetryExceeded);
                }
                comp.rnr_retries_left -= 1;
            }
            Some(timer.duration())
        }
    };
    Then::Retry { from: psn, wait }
}

/// Local ACK timeout: resend everything unacknowledged.
pub(crate) fn ack_timeout(comp: &mut Completer, sq: &mut SendQueue, qp: &mut Common) -> Outcome {
    if qp.state == QpState::Err || sq.next_psn().distance(sq.acked_psn()) <= 1 {
        return Outcome::complete(0);
    }
    qp.stats.timeouts += 1;
    // This resend is the recovery now: loss signals that arrive before it makes progress
    // describe the same loss and must not cost another retry.
    let resume = sq.acked_psn() + 1;
    comp.recovering = Some(resume);
    let then = retry(comp, qp, resume, Retry::Transport);
    if matches!(then, Then::Retry { .. }) {
        tracing::debug!(qpn = qp.qpn, %resume, "retransmitting: local ACK timeout");
    }
    Outcome::complete(0).then(then)
}

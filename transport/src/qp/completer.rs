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
}

impl Completer {
    /// A new `retry_cnt` (from `modify_qp`), which is also the budget from now on.
    pub fn set_retry_cnt(&mut self, n: u8) {
        self.retries_left = n;
    }

    /// A new `rnr_retry`, which is also the RNR budget from now on.
    pub fn set_rnr_retry(&mut self, n: u8) {
        self.rnr_retries_left = n;
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
        (Operation::Acknowledge, Some(Syndrome::Ack(_))) => ack_through(comp, sq, qp, psn, true),
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
    let index = match answered_before(comp, sq, qp, psn) {
        Ok(index) => index,
        Err(outcome) => return outcome,
    };
    let done = Outcome::complete(index);
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
    match psn.distance(expected) {
        0 => {}
        behind if behind < 0 => {
            qp.stats.dropped += 1;
            return done;
        }
        _ => return done.then(retry_lost(comp, qp, expected)),
    }
    // A retried READ is answered as a new message (FIRST again), and reordering can mix the
    // two answers; what must hold is that only the final packet ends the message and every
    // packet carries exactly the bytes that belong at its offset.
    let k = wqe.responses;
    let last = k + 1 == wqe.npsn;
    let offset = k as usize * mtu;
    let want_len = (wqe.len as usize - offset).min(mtu);
    let ends = frame.bth.opcode.info().position.ends_message();
    if ends != last || frame.payload.len() != want_len {
        return done.then(Then::Fail(WcStatus::BadResponse));
    }
    if ctx
        .mrs
        .scatter(qp.pd, &wqe.wr.sg_list, offset as u64, frame.payload)
        .is_err()
    {
        return done.then(Then::Fail(WcStatus::LocalProtection));
    }
    let all_in = sq.record_response(index);
    sq.acknowledge(psn);
    Outcome::complete(index + usize::from(all_in))
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
    let index = match answered_before(comp, sq, qp, frame.bth.psn) {
        Ok(index) => index,
        Err(outcome) => return outcome,
    };
    let done = Outcome::complete(index);
    let (Some(wqe), Some(original)) = (sq.get(index), frame.ext.atomic_ack_eth) else {
        return done;
    };
    if !wqe.wr.op.is_atomic() {
        return done.then(Then::Fail(WcStatus::BadResponse));
    }
    // The original value lands in local memory in host byte order, as verbs defines it.
    let bytes = original.original.to_ne_bytes();
    if ctx.mrs.scatter(qp.pd, &wqe.wr.sg_list, 0, &bytes).is_err() {
        return done.then(Then::Fail(WcStatus::LocalProtection));
    }
    let last_psn = wqe.last_psn();
    sq.acknowledge(last_psn);
    Outcome::complete(index + 1)
}

/// A response is missing before `psn` (responses after it arrived, or an ACK implied it):
/// go back for it, unless a retry is already under way (see [`nak_retry`]).
fn retry_lost(comp: &mut Completer, qp: &mut Common, psn: Psn) -> Then {
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

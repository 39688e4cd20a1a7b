//! The completer: acknowledgements, NAKs, READ responses and atomic results coming back to
//! the requester; retries (go back N), RNR waits, timeouts and send completions.

use roce_wire::aeth::{NakCode, RnrTimer, Syndrome};
use roce_wire::{FrameRepr, Opcode, Psn};

use super::{Ctx, Qp};
use crate::cq::WcStatus;
use crate::qp_state::{QpState, QpType};
use crate::timer::Timer;
use crate::wr::SendOp;

/// Why the requester goes back.
enum Retry {
    /// Sequence NAK, implied NAK, lost READ response or local ACK timeout.
    Transport,
    /// RNR NAK with the responder's timer.
    Rnr(RnrTimer),
}

/// Handles a response or acknowledgement addressed to this QP.
pub(crate) fn handle_response(qp: &mut Qp, ctx: &mut Ctx, frame: &FrameRepr) {
    if qp.qp_type != QpType::Rc || !matches!(qp.state, QpState::Rts | QpState::Sqd) {
        qp.stats.dropped += 1;
        return;
    }
    let psn = frame.bth.psn;
    // Only PSNs sent and not yet acknowledged can be answered; anything else is a
    // duplicate or a ghost.
    let sent_unacked = psn.distance(qp.req.acked_psn) > 0 && psn.distance(qp.req.next_psn) < 0;
    if !sent_unacked {
        qp.stats.dropped += 1;
        return;
    }
    let before = qp.req.acked_psn;
    match (frame.bth.opcode, frame.ext.aeth.map(|aeth| aeth.syndrome)) {
        (Opcode::RcAcknowledge, Some(Syndrome::Ack(_))) => ack_through(qp, ctx, psn, true),
        (Opcode::RcAcknowledge, Some(Syndrome::RnrNak(timer))) => {
            qp.stats.naks_received += 1;
            nak_retry(qp, ctx, psn, Retry::Rnr(timer));
        }
        (Opcode::RcAcknowledge, Some(Syndrome::Nak(NakCode::PsnSequenceError))) => {
            qp.stats.naks_received += 1;
            nak_retry(qp, ctx, psn, Retry::Transport);
        }
        (Opcode::RcAcknowledge, Some(Syndrome::Nak(code))) => {
            qp.stats.naks_received += 1;
            ack_through(qp, ctx, psn - 1, false);
            let status = match code {
                NakCode::RemoteAccessError => WcStatus::RemoteAccess,
                NakCode::RemoteOperationalError => WcStatus::RemoteOperation,
                _ => WcStatus::RemoteInvalidRequest,
            };
            if qp.state != QpState::Err {
                fail_wqe(qp, ctx, 0, status);
            }
        }
        (
            Opcode::RcRdmaReadResponseFirst
            | Opcode::RcRdmaReadResponseMiddle
            | Opcode::RcRdmaReadResponseLast
            | Opcode::RcRdmaReadResponseOnly,
            _,
        ) => read_response(qp, ctx, frame),
        (Opcode::RcAtomicAcknowledge, _) => atomic_ack(qp, ctx, frame),
        _ => qp.stats.dropped += 1,
    }
    if qp.state == QpState::Err {
        return;
    }
    let retried = matches!(
        frame.ext.aeth.map(|aeth| aeth.syndrome),
        Some(Syndrome::RnrNak(_) | Syndrome::Nak(NakCode::PsnSequenceError))
    ) && frame.bth.opcode == Opcode::RcAcknowledge;
    if qp.req.acked_psn != before {
        qp.req.recovering = None;
        if !retried {
            qp.req.retries_left = qp.config.retry_cnt;
            qp.req.rnr_retries_left = qp.config.rnr_retry;
        }
    }
    restart_retransmit_timer(qp, ctx, qp.req.acked_psn != before);
}

/// Keeps the local ACK timer running exactly while something is unacknowledged.
fn restart_retransmit_timer(qp: &mut Qp, ctx: &Ctx, progress: bool) {
    let outstanding = qp.req.next_psn.distance(qp.req.acked_psn) > 1;
    match qp.config.ack_timeout() {
        Some(timeout) if outstanding => {
            if progress || !qp.timers.is_set(Timer::Retransmit) {
                qp.timers.set(Timer::Retransmit, ctx.now + timeout);
            }
        }
        _ => qp.timers.stop(Timer::Retransmit),
    }
}

/// A sequence or RNR NAK for `psn` acknowledges everything before it, then the requester
/// resends from the oldest PSN still unanswered: `psn` itself, or an earlier READ/atomic
/// whose response was lost on the way back.
///
/// Like rxe, once a retry is under way further sequence NAKs that bring no progress are
/// ignored: the responder sent them for gaps before it saw the retry, and acting on each
/// would burn the whole retry budget within one round trip. An RNR NAK is always obeyed.
fn nak_retry(qp: &mut Qp, ctx: &mut Ctx, psn: Psn, why: Retry) {
    let before = qp.req.acked_psn;
    ack_through(qp, ctx, psn - 1, false);
    if qp.state == QpState::Err {
        return;
    }
    if qp.req.acked_psn != before {
        qp.req.recovering = None;
        // Progress first, then charge this NAK's retry against the fresh budget.
        qp.req.retries_left = qp.config.retry_cnt;
        qp.req.rnr_retries_left = qp.config.rnr_retry;
    }
    if qp.req.recovering.is_some() && matches!(why, Retry::Transport) {
        qp.stats.dropped += 1;
        return;
    }
    let resume = match qp.req.wqes.front() {
        Some(front) if front.wr.op.is_read_or_atomic() && psn.distance(front.first_psn) > 0 => {
            front.first_psn + front.responses
        }
        _ => psn,
    };
    qp.req.recovering = Some(resume);
    retry(qp, ctx, resume, why);
}

/// Completes every SEND/WRITE acknowledged by an ACK of `psn`. An ACK that covers a READ or
/// atomic whose response never came is an implied NAK: that response was lost, and with
/// `implied_nak` the requester goes back for it.
fn ack_through(qp: &mut Qp, ctx: &mut Ctx, psn: Psn, implied_nak: bool) {
    // The acknowledged PSN never passes a READ or atomic still waiting for its answer: the
    // answer's own PSNs must stay acceptable.
    let mut acked = psn;
    while let Some(front) = qp.req.wqes.front() {
        if qp.req.next == 0 && qp.req.pkt_in_wqe == 0 {
            break; // not started
        }
        if front.wr.op.is_read_or_atomic() {
            let answered = front.first_psn + front.responses - 1;
            if psn.distance(answered) > 0 {
                acked = answered;
                if implied_nak {
                    retry_lost(qp, ctx, answered + 1);
                    return;
                }
            }
            break;
        }
        let fully_sent = qp.req.next > 0;
        if !fully_sent || psn.distance(front.last_psn()) < 0 {
            break;
        }
        complete_front(qp, ctx);
    }
    if acked.distance(qp.req.acked_psn) > 0 && acked.distance(qp.req.next_psn) < 0 {
        qp.req.acked_psn = acked;
    }
}

/// Removes the front WQE and reports its success if it is signaled.
fn complete_front(qp: &mut Qp, ctx: &mut Ctx) {
    let Some(last_psn) = qp.req.wqes.front().map(|wqe| wqe.last_psn()) else {
        return;
    };
    let completion = super::requester::success_of_front(qp);
    qp.req.wqes.pop_front();
    qp.req.next = qp.req.next.saturating_sub(1);
    qp.req.acked_psn = last_psn;
    if let Some(completion) = completion {
        qp.complete(ctx, qp.send_cq, completion);
    }
}

/// Completes the WQEs before the one that holds `psn`, which a response for `psn` proves
/// were acknowledged. Returns false if one of them was a READ or atomic still waiting for
/// its response: that response was lost, and a retry has been started.
fn complete_before(qp: &mut Qp, ctx: &mut Ctx, psn: Psn) -> bool {
    while let Some(front) = qp.req.wqes.front() {
        if front.contains(psn) {
            return true;
        }
        if front.wr.op.is_read_or_atomic() {
            let resume = front.first_psn + front.responses;
            retry_lost(qp, ctx, resume);
            return false;
        }
        complete_front(qp, ctx);
    }
    false
}

fn read_response(qp: &mut Qp, ctx: &mut Ctx, frame: &FrameRepr) {
    let psn = frame.bth.psn;
    if !complete_before(qp, ctx, psn) {
        return;
    }
    let mtu = qp.config.mtu;
    let Some(wqe) = qp.req.wqes.front() else {
        return;
    };
    let SendOp::RdmaRead { .. } = wqe.wr.op else {
        return fail_wqe(qp, ctx, 0, WcStatus::BadResponse);
    };
    let expected = wqe.first_psn + wqe.responses;
    match psn.distance(expected) {
        0 => {}
        behind if behind < 0 => {
            qp.stats.dropped += 1;
            return;
        }
        _ => return retry_lost(qp, ctx, expected),
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
        return fail_wqe(qp, ctx, 0, WcStatus::BadResponse);
    }
    if ctx
        .mrs
        .scatter(qp.pd, &wqe.wr.sg_list, offset as u64, frame.payload)
        .is_err()
    {
        return fail_wqe(qp, ctx, 0, WcStatus::LocalProtection);
    }
    let wqe = &mut qp.req.wqes[0];
    wqe.responses += 1;
    qp.req.acked_psn = psn;
    if wqe.responses == wqe.npsn {
        complete_front(qp, ctx);
    }
}

fn atomic_ack(qp: &mut Qp, ctx: &mut Ctx, frame: &FrameRepr) {
    let psn = frame.bth.psn;
    if !complete_before(qp, ctx, psn) {
        return;
    }
    let Some(wqe) = qp.req.wqes.front() else {
        return;
    };
    let Some(original) = frame.ext.atomic_ack_eth else {
        return;
    };
    if !wqe.wr.op.is_atomic() {
        return fail_wqe(qp, ctx, 0, WcStatus::BadResponse);
    }
    // The original value lands in local memory in host byte order, as verbs defines it.
    let bytes = original.original.to_ne_bytes();
    if ctx.mrs.scatter(qp.pd, &wqe.wr.sg_list, 0, &bytes).is_err() {
        return fail_wqe(qp, ctx, 0, WcStatus::LocalProtection);
    }
    complete_front(qp, ctx);
}

/// A response is missing before `psn` (responses after it arrived, or an ACK implied it):
/// go back for it, unless a retry is already under way (see [`nak_retry`]).
fn retry_lost(qp: &mut Qp, ctx: &mut Ctx, psn: Psn) {
    if qp.req.recovering.is_some() {
        qp.stats.dropped += 1;
        return;
    }
    qp.req.recovering = Some(psn);
    retry(qp, ctx, psn, Retry::Transport);
}

/// Goes back to resend from `psn`, charging the matching retry counter; when it is
/// exhausted the oldest WQE fails and the QP enters ERR.
fn retry(qp: &mut Qp, ctx: &mut Ctx, psn: Psn, why: Retry) {
    match why {
        Retry::Transport => {
            if qp.req.retries_left == 0 {
                return fail_wqe(qp, ctx, 0, WcStatus::RetryExceeded);
            }
            qp.req.retries_left -= 1;
        }
        Retry::Rnr(timer) => {
            // rnr_retry 7 means retry forever (IBTA 9.7.5.2.8).
            if qp.config.rnr_retry != 7 {
                if qp.req.rnr_retries_left == 0 {
                    return fail_wqe(qp, ctx, 0, WcStatus::RnrRetryExceeded);
                }
                qp.req.rnr_retries_left -= 1;
            }
            qp.timers.set(Timer::RnrWait, ctx.now + timer.duration());
        }
    }
    rewind(qp, psn);
}

/// Moves the transmit cursor back to `psn`.
fn rewind(qp: &mut Qp, psn: Psn) {
    let Some(index) = qp
        .req
        .wqes
        .iter()
        .take(qp.req.next + 1)
        .position(|wqe| wqe.contains(psn))
    else {
        return;
    };
    let wqe = &mut qp.req.wqes[index];
    let k = psn.distance(wqe.first_psn) as u32;
    if matches!(wqe.wr.op, SendOp::RdmaRead { .. }) {
        wqe.responses = k;
    }
    qp.req.next = index;
    qp.req.pkt_in_wqe = k;
    qp.req.next_psn = psn;
    qp.req.noack_pkts = 0;
}

/// Local ACK timeout: resend everything unacknowledged.
pub(crate) fn ack_timeout(qp: &mut Qp, ctx: &mut Ctx) {
    if qp.state == QpState::Err || qp.req.next_psn.distance(qp.req.acked_psn) <= 1 {
        return;
    }
    qp.stats.timeouts += 1;
    // This resend is the recovery now: loss signals that arrive before it makes progress
    // describe the same loss and must not cost another retry.
    let resume = qp.req.acked_psn + 1;
    qp.req.recovering = Some(resume);
    retry(qp, ctx, resume, Retry::Transport);
}

/// Completes the WQE at `index` with an error (earlier ones are flushed first, to keep
/// completions in order) and moves the QP to ERR, which flushes the rest.
pub(crate) fn fail_wqe(qp: &mut Qp, ctx: &mut Ctx, index: usize, status: WcStatus) {
    for flushed in 0..=index {
        let Some(wqe) = qp.req.wqes.front() else {
            break;
        };
        let status = if flushed < index {
            WcStatus::WrFlush
        } else {
            status
        };
        let opcode = super::requester::wc_opcode(&wqe.wr);
        let completion = qp.send_completion(wqe.wr.wr_id, status, opcode, 0);
        qp.req.wqes.pop_front();
        qp.complete(ctx, qp.send_cq, completion);
    }
    if qp.state != QpState::Err {
        qp.enter_error(ctx);
    }
}

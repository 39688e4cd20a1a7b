//! Completion queues (`ibv_cq`).
//!
//! A CQ of depth N holds at least N completions (as `ibv_create_cq` may give more than
//! asked): N (rounded up to a power of two) in the ring pollers read, and up to N more in
//! the engine's, which overflows (an async event, the QP to ERR) when both are full.
//!
//! A completion goes from the endpoint's CQ into the ring, after the round that made it,
//! and from the ring to the poller's hands ([`Cq::poll_with`]: `ibv_poll_cq` writes each
//! straight into the caller's `ibv_wc`); pollers take the ring's own lock, never the
//! device's. A poll that finds the ring short runs a round itself, the same round the
//! engine thread runs: under the lock if the engine is free (with a background thread),
//! or always (the caller drives).
//!
//! A QP holds its CQs: a CQ lives until its handle and every QP using it are gone, and
//! [`Cq::destroy`] refuses while a QP still uses it, as `ibv_destroy_cq` answers `EBUSY`.

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use roce_transport::cq::{NotifyOn, WorkCompletion};
use roce_transport::{CqId, LIMITS};

use crate::channel::CompChannel;
use crate::core::Core;
use crate::error::Error;
use crate::queues::{cq_queue, CqQueue};
use crate::shared::Shared;

/// Empty polls between two looks at the clock in [`Cq::wait_for`].
const STALL_CHECK_POLLS: u32 = 64;

/// One CQ, shared by its handle and the QPs that complete into it; destroyed in the
/// endpoint when the last of them goes.
pub(crate) struct CqInner {
    pub(crate) shared: Arc<Shared>,
    pub(crate) id: CqId,
    /// Whether it reports to a completion channel.
    has_channel: bool,
    queue: Arc<CqQueue>,
}

impl Drop for CqInner {
    fn drop(&mut self) {
        if let Ok(mut core) = self.shared.lock() {
            core.cqs.remove(&self.id);
            // The last holder: no QP holds this CQ any more, so the transport cannot refuse.
            let _ = core.endpoint().destroy_cq(self.id);
        }
    }
}

impl CqInner {
    /// Forgets the completions of QP `qpn` not yet polled, in the engine's CQ and in the
    /// queue pollers read (a QP entering RESET; see `roce_transport::cq::Cq::discard_qp`).
    pub(crate) fn discard_qp(&self, core: &mut Core, qpn: u32) -> Result<(), Error> {
        core.endpoint().cq(self.id).discard_qp(qpn);
        let mut polling = self.queue.polling.lock().map_err(|_| Error::Poisoned)?;
        polling.discard_qp(qpn);
        Ok(())
    }
}

/// A completion queue (`ibv_cq`).
pub struct Cq {
    pub(crate) inner: Arc<CqInner>,
}

impl fmt::Debug for Cq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cq").field("id", &self.inner.id).finish()
    }
}

impl Cq {
    pub(crate) fn new(
        shared: &Arc<Shared>,
        depth: usize,
        channel: Option<&CompChannel>,
    ) -> Result<Cq, Error> {
        if channel.is_some_and(|channel| !Arc::ptr_eq(&channel.shared, shared)) {
            return Err(Error::ForeignObject("completion channel"));
        }
        let mut core = shared.lock()?;
        let id = (core.endpoint().create_cq(depth))
            .map_err(|_| Error::InvalidArgument("a CQ needs 1 to max_cqe entries"))?;
        let slot = cq_queue(depth, channel.map(|channel| Arc::clone(&channel.events)));
        let queue = Arc::clone(&slot.queue);
        core.cqs.insert(id, slot);
        Ok(Cq {
            inner: Arc::new(CqInner {
                shared: Arc::clone(shared),
                id,
                has_channel: channel.is_some(),
                queue,
            }),
        })
    }

    /// Which CQ this is, as [`CompChannel::get_cq_event`] names it.
    pub fn id(&self) -> CqId {
        self.inner.id
    }

    /// `ibv_destroy_cq`: destroys the CQ now, or gives it back with [`Error::Busy`] while a
    /// QP still uses it (dropping it instead defers the destruction to the last such QP).
    pub fn destroy(self) -> Result<(), (Cq, Error)> {
        if Arc::strong_count(&self.inner) > 1 {
            return Err((self, Error::Busy("CQ")));
        }
        Ok(())
    }

    /// Moves up to `max` completions, oldest first, into `out` and returns how many
    /// (`ibv_poll_cq`). Fails once the CQ has overflowed.
    pub fn poll_into(&self, max: usize, out: &mut Vec<WorkCompletion>) -> Result<usize, Error> {
        self.poll_with(max, |completion| out.push(*completion))
    }

    /// Hands up to `max` completions, oldest first, to `take` and returns how many
    /// (`ibv_poll_cq`, which writes each into the caller's array): from the ring, and if
    /// the ring has fewer, after a round that may bring more ([`Cq`]'s docs). Fails once
    /// the CQ has overflowed.
    pub fn poll_with(
        &self,
        max: usize,
        mut take: impl FnMut(&WorkCompletion),
    ) -> Result<usize, Error> {
        let shared = &self.inner.shared;
        let queue = &self.inner.queue;
        shared.check_running()?;
        if queue.overflowed.load(Ordering::Acquire) {
            return Err(Error::CqOverflow);
        }
        let polling = || queue.polling.lock().map_err(|_| Error::Poisoned);
        let mut count = polling()?.take(max, &mut take);
        if count < max {
            let backlog = queue.backlog.load(Ordering::Acquire);
            // The caller's progress: a round, as the engine thread's. With the thread, only
            // if the engine is free (its own round delivers otherwise), unless completions
            // wait behind a full ring: a program that drains before it waits for an event
            // would otherwise wait for ever. (The ring's lock is not held meanwhile: the
            // device's lock comes first.)
            let core = if shared.caller_drives() || backlog {
                Some(shared.lock()?)
            } else if count == 0 {
                shared.try_lock()
            } else {
                None
            };
            if let Some(mut core) = core {
                let worked = shared.round(&mut core)?;
                drop(core);
                count += polling()?.take(max - count, &mut take);
                if !worked && count == 0 {
                    // Nothing came: let the kernel's softirq thread run, if it waits on this
                    // CPU (the veth's receive runs there once softirqs are deferred to it, and
                    // a program polling in a tight loop would hold it off for a scheduler
                    // slice, 4-8 ms measured; `docs/performance.md`).
                    std::thread::yield_now();
                }
            }
        }
        Ok(count)
    }

    /// Up to `max` completions, oldest first.
    pub fn poll(&self, max: usize) -> Result<Vec<WorkCompletion>, Error> {
        let mut out = Vec::new();
        self.poll_into(max, &mut out)?;
        Ok(out)
    }

    /// Polls until `count` completions arrived, giving up with [`Error::TimedOut`] when
    /// `stall` passes without a new one. Yields the CPU between empty polls.
    pub fn wait_for(&self, count: usize, stall: Duration) -> Result<Vec<WorkCompletion>, Error> {
        // The clock is read once per [`STALL_CHECK_POLLS`] empty polls, not per poll: a
        // message-rate loop polls about once per message (the demo's 64 B WRITE rate lost
        // 2 % of its core to the clock), and a stall is noticed a few polls late at worst.
        let mut out = Vec::with_capacity(count);
        let mut last_progress = Instant::now();
        let mut progressed = false;
        let mut empty_polls = 0u32;
        while out.len() < count {
            if self.poll_into(count - out.len(), &mut out)? > 0 {
                progressed = true;
                continue;
            }
            empty_polls = empty_polls.wrapping_add(1);
            if empty_polls.is_multiple_of(STALL_CHECK_POLLS) {
                let now = Instant::now();
                if std::mem::take(&mut progressed) {
                    last_progress = now;
                } else if now.saturating_duration_since(last_progress) > stall {
                    return Err(Error::TimedOut);
                }
            }
            std::thread::yield_now();
        }
        Ok(out)
    }

    /// `ibv_resize_cq`: the CQ holds at least `depth` completions from now on, keeping those
    /// that wait. Work posted before the call is handed to the engine and completions it
    /// produced are counted first; more waiting than `depth` is refused (`EINVAL`, as rxe).
    pub fn resize(&self, depth: usize) -> Result<(), Error> {
        if !LIMITS.allows_cq_depth(depth) {
            return Err(Error::InvalidArgument("a CQ needs 1 to max_cqe entries"));
        }
        let shared = &self.inner.shared;
        let mut core = shared.lock()?;
        shared.drive(&mut core)?;
        let queue = &self.inner.queue;
        if queue.overflowed.load(Ordering::Acquire) {
            return Err(Error::CqOverflow);
        }
        let handed_over = queue.polling.lock().map_err(|_| Error::Poisoned)?.len();
        let cq = core.endpoint().cq(self.inner.id);
        if handed_over + cq.len() > depth {
            return Err(Error::InvalidArgument(
                "more completions wait than the new depth holds",
            ));
        }
        // Cannot fail: fewer than `depth` wait in the engine's CQ.
        // The ring keeps its size (a power of two at least the first depth): with the
        // engine's CQ behind it, the CQ still holds at least `depth`.
        let _ = cq.resize(depth);
        core.deliver(std::time::Instant::now());
        Ok(())
    }

    /// Arms the CQ for one event on its channel (`ibv_req_notify_cq`): the next completion,
    /// or with `solicited_only` the next solicited one (or any error).
    pub fn req_notify(&self, solicited_only: bool) -> Result<(), Error> {
        if !self.inner.has_channel {
            return Err(Error::InvalidArgument("the CQ has no completion channel"));
        }
        let on = if solicited_only {
            NotifyOn::Solicited
        } else {
            NotifyOn::Any
        };
        self.inner.shared.lock()?.arm_cq(self.inner.id, on);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::net::Ipv4Addr;

    use roce_provider::engine::Addressing;
    use roce_provider::memory::memory_pair;
    use roce_transport::cq::WcStatus;
    use roce_transport::qp::QpCaps;
    use roce_transport::qp_state::{QpAttr, QpState, QpType};
    use roce_transport::wr::RecvWr;
    use roce_transport::AccessFlags;

    use crate::device::Device;
    use crate::handshake::ConnectOptions;
    use crate::options::{BackendChoice, OpenOptions, Progress};
    use crate::qp::QpInitAttr;
    use crate::Context;

    /// rping `-q`'s CQ thread: woken by an event, it arms the CQ and polls until empty,
    /// then sleeps on the channel; its main thread's `ibv_modify_qp` to ERR flushes a
    /// receive outside any round. A flush made just before the arm must be found by the
    /// poll after it, even while the engine thread holds the device (the poll then leaves
    /// the round to the thread): no event comes for it.
    #[test]
    fn a_flush_made_before_the_arm_is_polled_after_it_while_the_engine_is_busy() {
        let (wire, _peer) = memory_pair();
        let (mac, ip) = ([2, 0, 0, 0, 0, 1], Ipv4Addr::new(10, 0, 0, 1));
        let device = Device::in_memory(mac, ip);
        let addressing = Addressing {
            mac,
            ip,
            neighbours: HashMap::new(),
        };
        let options = OpenOptions {
            backend: BackendChoice::Custom(Box::new(wire), addressing),
            progress: Progress::Caller,
            seed: Some([1; 32]),
            ..OpenOptions::default()
        };
        let ctx = Context::open(&device, options).unwrap();
        // As with an engine thread: a poll that finds the lock taken leaves the round to it.
        ctx.shared().set_thread_running(true);
        let channel = ctx.create_comp_channel().unwrap();
        let cq = ctx.create_cq(4, Some(&channel)).unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let qp = pd
            .create_qp(&QpInitAttr {
                qp_type: QpType::Rc,
                send_cq: &cq,
                recv_cq: &cq,
                caps: QpCaps::default(),
                sq_sig_all: true,
            })
            .unwrap();
        let itself = qp.endpoint(1).unwrap();
        qp.connect(&itself, &ConnectOptions::default()).unwrap();
        let mr = pd.reg_mr(64, AccessFlags::all()).unwrap();
        qp.post_recv([RecvWr {
            wr_id: 7,
            sg_list: [mr.sge(0, 64)].into(),
        }])
        .unwrap();
        qp.modify(&QpAttr {
            state: Some(QpState::Err),
            ..QpAttr::default()
        })
        .unwrap();
        cq.req_notify(false).unwrap();
        let engine_busy = ctx.shared().lock().unwrap();
        let polled = cq.poll(4).unwrap();
        drop(engine_busy);
        ctx.shared().set_thread_running(false);
        let polled: Vec<_> = polled.iter().map(|wc| (wc.wr_id, wc.status)).collect();
        assert_eq!(polled, [(7, WcStatus::WrFlush)]);
    }
}

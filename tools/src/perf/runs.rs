//! The tests themselves: perftest's `run_iter_bw`, `run_iter_bw_server`,
//! `run_iter_lat_send`, `run_iter_lat_write` and `run_iter_lat` for READ.

use std::io;
use std::time::Instant;

use roce_verbs::{RecvWr, SendFlags, SendOp, SendWr, WcOpcode, WcStatus, WorkCompletion};

use super::exchange::KeyMsg;
use super::params::{AtomicType, Verb};
use super::report::{BwReport, Gaps, Timeline};
use super::setup::{Rdma, PATTERN};
use crate::rdma::{failed, signaled, STALL};
use crate::signals;

impl Rdma<'_> {
    /// Posts up to `count` receives of one message each into QP `qp`'s exposed window.
    pub(super) fn post_receives(&self, qp: usize, count: u64) -> io::Result<()> {
        let wr = RecvWr {
            wr_id: 0,
            sg_list: [self
                .buf
                .sge(self.params.exposed_at(qp), self.params.size as u32)]
            .into(),
        };
        self.qps[qp].post_recv((0..count).map(|_| wr.clone()))?;
        Ok(())
    }

    /// The `n`th request of a bandwidth client on QP `qp` (its work request id says both).
    pub(super) fn request(&self, qp: usize, n: u64, peer: &KeyMsg) -> SendWr {
        let params = &self.params;
        let offset = params.offset(n);
        let remote_addr = peer.vaddr + offset;
        let rkey = peer.rkey;
        let op = match params.test.verb() {
            Verb::Send => SendOp::Send,
            Verb::Write => SendOp::RdmaWrite { remote_addr, rkey },
            Verb::Read => SendOp::RdmaRead { remote_addr, rkey },
            Verb::Atomic => match params.atomic {
                AtomicType::FetchAndAdd => SendOp::FetchAdd {
                    remote_addr,
                    rkey,
                    add: 1,
                },
                AtomicType::CmpAndSwap => SendOp::CompareSwap {
                    remote_addr,
                    rkey,
                    compare: 0,
                    swap: 0,
                },
            },
        };
        let signaled = n % params.cq_mod == params.cq_mod - 1 || n == params.iters - 1;
        SendWr {
            wr_id: (qp as u64) << 32 | n,
            op,
            sg_list: [self.buf.sge(
                self.params.local_at(qp) + offset as usize,
                params.size as u32,
            )]
            .into(),
            inline_data: Vec::new(),
            flags: if signaled {
                SendFlags::SIGNALED
            } else {
                SendFlags::empty()
            },
            ud: None,
            xrc_srqn: 0,
        }
    }

    /// Polls until at least one completion arrives (each must be a success).
    pub(super) fn poll(&self, out: &mut Vec<WorkCompletion>) -> io::Result<()> {
        out.clear();
        let started = Instant::now();
        signals::check()?;
        while self.cq.poll_into(64, out)? == 0 {
            signals::check()?;
            if started.elapsed() > STALL {
                return Err(io::Error::other("no completion for 10 s"));
            }
            // Let an engine thread (--events, --busy-poll) have the core.
            std::thread::yield_now();
        }
        match out.iter().find(|wc| wc.status != WcStatus::Success) {
            Some(bad) => Err(failed(bad)),
            None => Ok(()),
        }
    }

    /// perftest's `run_iter_bw`: `iters` requests on each QP, `tx_depth` in flight on each,
    /// every `cq_mod`th signaled.
    pub(super) fn run_bw_client(&self, peers: &[KeyMsg]) -> io::Result<BwReport> {
        let params = &self.params;
        let qps = self.qps.len();
        let total = params.iters * qps as u64;
        let mut timeline = Timeline::new(params);
        let (mut sent, mut done) = (vec![0u64; qps], vec![0u64; qps]);
        let mut completions = Vec::new();
        let mut batch = Vec::new();
        while timeline.completions() < total {
            for (qp, peer) in peers.iter().enumerate().take(qps) {
                batch.clear();
                while sent[qp] < params.iters && sent[qp] - done[qp] < params.tx_depth {
                    batch.push(self.request(qp, sent[qp], peer));
                    sent[qp] += 1;
                }
                if !batch.is_empty() {
                    let now = Instant::now();
                    timeline.posted(now, batch.len() as u64);
                    self.qps[qp].post_send(batch.drain(..))?;
                }
            }
            self.poll(&mut completions)?;
            let now = Instant::now();
            for wc in &completions {
                // A signaled completion also completes every unsignaled request before it.
                let (qp, n) = ((wc.wr_id >> 32) as usize, wc.wr_id & 0xFFFF_FFFF);
                let newly = (n + 1).saturating_sub(done[qp]);
                timeline.completed(now, newly);
                done[qp] = done[qp].max(n + 1);
            }
        }
        Ok(BwReport::compute(params, &timeline))
    }

    /// perftest's `run_iter_bw_server`: receive `iters` SENDs on each QP, re-posting as
    /// they arrive.
    pub(super) fn run_send_bw_server(&self) -> io::Result<BwReport> {
        let params = &self.params;
        let n = params.iters * self.qps.len() as u64;
        let mut arrivals = Timeline::new(params);
        let mut posted = vec![params.rx_depth; self.qps.len()];
        let mut completions = Vec::new();
        while arrivals.completions() < n {
            self.poll(&mut completions)?;
            let now = Instant::now();
            for wc in &completions {
                if wc.opcode != WcOpcode::Recv || u64::from(wc.byte_len) != params.size {
                    return Err(io::Error::other(format!("unexpected completion {wc:?}")));
                }
                // The server's clock starts at the first arrival.
                arrivals.posted(now, 1);
                arrivals.completed(now, 1);
                let qp = self.qp_index(wc.qp_num)?;
                self.check_received(qp)?;
                if posted[qp] < params.iters {
                    self.post_receives(qp, 1)?;
                    posted[qp] += 1;
                }
            }
        }
        // The server's clock starts at the first arrival and it reports no peak.
        let report = BwReport::compute(params, &arrivals);
        Ok(BwReport {
            peak: 0.0,
            ..report
        })
    }

    /// Which of our QPs has this number.
    fn qp_index(&self, qpn: u32) -> io::Result<usize> {
        self.qps
            .iter()
            .position(|qp| qp.qp_num() == qpn)
            .ok_or_else(|| io::Error::other(format!("a completion of unknown QP {qpn:#x}")))
    }

    /// With `--verify`: QP `qp`'s exposed window holds the peer's pattern (SENDs land
    /// there).
    pub(super) fn check_received(&self, qp: usize) -> io::Result<()> {
        if !self.params.verify {
            return Ok(());
        }
        let window = self.params.exposed_at(qp);
        let size = self.params.size as usize;
        let intact = self
            .buf
            .with_bytes(|bytes| PATTERN.mismatch(0, &bytes[window..window + size]).is_none())?;
        intact
            .then_some(())
            .ok_or_else(|| io::Error::other("a received message differs from what was sent"))
    }

    /// Checks after a bandwidth or READ run what can be checked on this side, QP by QP.
    pub(super) fn verify_after(&self, peers: &[KeyMsg]) -> io::Result<()> {
        let params = &self.params;
        let bytes = self.buf.to_vec()?;
        let size = params.size as usize;
        // The offsets the run touched in each QP's window (they cycle within a page).
        let touched: std::collections::BTreeSet<usize> = (0..params.iters.min(params.cycle_buffer))
            .map(|n| params.offset(n) as usize)
            .collect();
        // Whether every touched message in each QP's window (which `base` places) holds the
        // pattern.
        let holds_pattern = |base: &dyn Fn(usize) -> usize| {
            (0..self.qps.len()).all(|qp| {
                let window = base(qp);
                touched.iter().all(|&at| {
                    PATTERN
                        .mismatch(at as u64, &bytes[window + at..window + at + size])
                        .is_none()
                })
            })
        };
        match (params.test.verb(), params.client) {
            // Any client: every atomic hit one of each QP's 64 slots.
            (Verb::Atomic, false) => {
                let step = params.step(8) as usize;
                let slots = (params.cycle_buffer as usize / step).min(params.iters as usize);
                let total: u64 = (0..self.qps.len())
                    .flat_map(|qp| (0..slots).map(move |k| self.params.exposed_at(qp) + k * step))
                    .map(|at| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap_or_default()))
                    .sum();
                let applied = params.iters * self.qps.len() as u64;
                let expected = match params.atomic {
                    AtomicType::FetchAndAdd => applied,
                    AtomicType::CmpAndSwap => 0,
                };
                if total != expected {
                    return Err(io::Error::other(format!(
                        "the atomics left {total} in our slots, expected {expected}"
                    )));
                }
                println!(" verified: {applied} atomics applied to our memory");
            }
            (Verb::Write, false) if params.verify => {
                if !holds_pattern(&|qp| self.params.exposed_at(qp)) {
                    return Err(io::Error::other("the WRITEs left wrong bytes"));
                }
                println!(" verified: every byte the peer wrote");
            }
            (Verb::Read, true) if params.verify => {
                if !holds_pattern(&|qp| self.params.local_at(qp)) {
                    return Err(io::Error::other("the READs brought back wrong bytes"));
                }
                println!(" verified: every byte read from {:#x}", peers[0].vaddr);
            }
            _ => {}
        }
        Ok(())
    }

    /// perftest's `run_iter_lat_send`: the client sends first; each side answers each
    /// arrival with its next SEND.
    pub(super) fn run_send_lat(&self) -> io::Result<Gaps> {
        let params = &self.params;
        let mut posted = Gaps::new(params.iters);
        let (mut sent, mut received, mut sends_done) = (0u64, 0u64, 0u64);
        let mut recvs_posted = params.rx_depth;
        let mut completions = Vec::new();
        let send = |n: u64| signaled(n, SendOp::Send, self.buf.sge(0, params.size as u32));
        // One poll's completions, counted: arrivals and finished SENDs.
        let mut reap = |received: &mut u64, sends_done: &mut u64| -> io::Result<()> {
            self.poll(&mut completions)?;
            for wc in &completions {
                match wc.opcode {
                    WcOpcode::Recv => *received += 1,
                    _ => *sends_done += 1,
                }
            }
            Ok(())
        };
        while sent < params.iters || received < params.iters {
            // The client sends first.
            if received < params.iters && (!params.client || sent > 0) {
                // Wait for the next arrival (send completions come along the way).
                let before = received;
                while received == before {
                    reap(&mut received, &mut sends_done)?;
                }
                self.check_received(0)?;
                let more = (params.iters - recvs_posted).min(received - before);
                self.post_receives(0, more)?;
                recvs_posted += more;
            }
            if sent < params.iters {
                // A few SENDs may await their ACK; never more than the send queue holds.
                while sent - sends_done >= 8 {
                    reap(&mut received, &mut sends_done)?;
                }
                posted.post(Instant::now());
                self.qps[0].post_send([send(sent)])?;
                sent += 1;
            }
        }
        Ok(posted)
    }

    /// perftest's `run_iter_lat_write`: the server writes first; each side waits for the
    /// peer's counter in the last byte of its window, then writes its own.
    pub(super) fn run_write_lat(&self, peer: &KeyMsg) -> io::Result<Gaps> {
        let params = &self.params;
        let size = params.size as usize;
        let window = self.params.exposed_at(0);
        let poll_at = window + size - 1;
        let mut posted = Gaps::new(params.iters);
        let (mut sent, mut received) = (0u64, 0u64);
        let mut completions = Vec::new();
        while sent < params.iters || received < params.iters {
            // The server writes first.
            if received < params.iters && (params.client || sent > 0) {
                received += 1;
                let want = received as u8;
                let started = Instant::now();
                loop {
                    // Nothing but us moves the engine while we watch memory.
                    signals::check()?;
                    self.ctx.progress()?;
                    let mut last = [0u8];
                    self.buf.read(poll_at, &mut last)?;
                    if last[0] == want {
                        break;
                    }
                    if started.elapsed() > STALL {
                        return Err(io::Error::other(format!(
                            "no WRITE {received} from the peer"
                        )));
                    }
                    std::thread::yield_now();
                }
            }
            if sent < params.iters {
                posted.post(Instant::now());
                sent += 1;
                self.buf.write(size - 1, &[sent as u8])?;
                let write = SendOp::RdmaWrite {
                    remote_addr: peer.vaddr,
                    rkey: peer.rkey,
                };
                let write = signaled(sent, write, self.buf.sge(0, params.size as u32));
                self.qps[0].post_send([write])?;
                self.poll(&mut completions)?;
            }
        }
        Ok(posted)
    }

    /// perftest's `run_iter_lat` for READ: one signaled READ at a time.
    pub(super) fn run_read_lat(&self, peer: &KeyMsg) -> io::Result<Gaps> {
        let params = &self.params;
        let mut posted = Gaps::new(params.iters);
        let mut completions = Vec::new();
        for n in 0..params.iters {
            let read = SendOp::RdmaRead {
                remote_addr: peer.vaddr,
                rkey: peer.rkey,
            };
            let read = signaled(n, read, self.buf.sge(0, params.size as u32));
            posted.post(Instant::now());
            self.qps[0].post_send([read])?;
            self.poll(&mut completions)?;
        }
        Ok(posted)
    }
}

//! The verbs objects of a run and our buffer, laid out as perftest lays out its own.

use std::io;

use roce_verbs::{AccessFlags, Context, Cq, Mr, Pd, Qp, QpCaps, QpInitAttr, QpType};

use super::exchange::KeyMsg;
use super::params::{Params, Test, Verb};
use crate::workload::Pattern;

/// What `--verify` fills buffers with, by offset in the window.
pub(super) const PATTERN: Pattern = Pattern::new(0x7065_7266);

/// The verbs objects of a run.
pub(super) struct Rdma<'a> {
    pub(super) ctx: &'a Context,
    pub(super) qps: Vec<Qp>,
    pub(super) cq: Cq,
    /// Our buffer, perftest's layout: for each QP in turn, `BUFF_SIZE` bytes of what it
    /// sends (and READs into); then for each QP the window the peer reaches.
    pub(super) buf: Mr,
    pub(super) params: Params,
    /// Owns the QPs and the buffer; kept for as long as they are.
    _pd: Pd,
}

impl<'a> Rdma<'a> {
    /// One CQ, `-q` RC QPs sized for the run's depths, and the buffer, filled.
    pub(super) fn new(ctx: &'a Context, params: Params) -> io::Result<Rdma<'a>> {
        let pd = ctx.alloc_pd()?;
        let depth = (params.tx_depth + params.rx_depth + 16) * params.qps;
        let cq = ctx.create_cq(depth as usize, None)?;
        let qps = (0..params.qps)
            .map(|_| {
                pd.create_qp(&QpInitAttr {
                    qp_type: QpType::Rc,
                    send_cq: &cq,
                    recv_cq: &cq,
                    caps: QpCaps {
                        max_send_wr: (params.tx_depth as u32).max(16),
                        max_recv_wr: (params.rx_depth as u32).max(1),
                        max_send_sge: 1,
                        max_recv_sge: 1,
                        max_inline_data: 0,
                    },
                    sq_sig_all: false,
                })
            })
            .collect::<Result<Vec<Qp>, _>>()?;
        let window = params.step(params.buff_size());
        let buf = pd.reg_mr((2 * window * params.qps) as usize, AccessFlags::all())?;
        fill(&buf, &params)?;
        Ok(Rdma {
            ctx,
            qps,
            cq,
            buf,
            params,
            _pd: pd,
        })
    }

    /// Each QP's key message: its address, and the window of ours it may reach.
    pub(super) fn key_messages(&self, gid_index: u8) -> io::Result<Vec<KeyMsg>> {
        let params = &self.params;
        self.qps
            .iter()
            .enumerate()
            .map(|(index, qp)| {
                let endpoint = qp.endpoint(gid_index)?;
                Ok(KeyMsg {
                    lid: 0,
                    out_reads: u16::from(params.out_reads()),
                    qpn: endpoint.qpn,
                    psn: endpoint.psn.value(),
                    rkey: self.buf.rkey(),
                    vaddr: self.buf.addr() + params.exposed_at(index) as u64,
                    gid: endpoint.gid,
                    srqn: 0,
                })
            })
            .collect()
    }
}

/// What goes in our buffer before the run: each QP's local and exposed parts.
fn fill(buf: &Mr, params: &Params) -> io::Result<()> {
    let part = params.buff_size() as usize;
    let qps = params.qps as usize;
    // SENDs land at the start of the receiver's window whatever offset they left from (small
    // ones cycle through the sender's page): repeat the pattern at every step, so each
    // message carries the same bytes.
    let period = if params.test.verb() == Verb::Send {
        params.step(params.size) as usize
    } else {
        usize::MAX
    };
    buf.with_bytes_mut(|bytes| {
        let patterned = |part: &mut [u8]| {
            for piece in part.chunks_mut(period) {
                PATTERN.fill(0, piece);
            }
        };
        for qp in 0..qps {
            let local = qp * part..(qp + 1) * part;
            let exposed = (qps + qp) * part..(qps + qp + 1) * part;
            if params.verify {
                match params.test.verb() {
                    // The READer's buffer stays zero: the pattern can only come from the peer.
                    Verb::Read => patterned(&mut bytes[exposed]),
                    Verb::Send | Verb::Write => patterned(&mut bytes[local.clone()]),
                    Verb::Atomic => {}
                }
            }
            // write_lat's payload is zeros but for its counter byte, as perftest's.
            if params.test == Test::WriteLat {
                bytes[local].fill(0);
            }
        }
    })?;
    Ok(())
}

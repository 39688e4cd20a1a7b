//! perftest's results: the client's five report values and the tables both programs print.

use std::io;
use std::time::Instant;

use roce_verbs::Context;

use super::params::{AtomicType, Params, Verb, NO_PEAK_ITERS, OUR_OUT_READS, RESULT_LINE};

/// The client's results, as the five 8-byte values perftest sends.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct BwReport {
    pub(super) size: u64,
    pub(super) iters: u64,
    pub(super) peak: f64,
    pub(super) average: f64,
    pub(super) msg_rate: f64,
}

impl BwReport {
    pub(super) fn to_wire(self) -> [[u8; 8]; 5] {
        [
            self.size.to_be_bytes(),
            self.iters.to_be_bytes(),
            self.peak.to_bits().to_be_bytes(),
            self.average.to_bits().to_be_bytes(),
            self.msg_rate.to_bits().to_be_bytes(),
        ]
    }

    pub(super) fn from_wire(values: &[Vec<u8>]) -> io::Result<BwReport> {
        let word = |i: usize| -> io::Result<u64> {
            let bytes: [u8; 8] = values
                .get(i)
                .and_then(|v| v.as_slice().try_into().ok())
                .ok_or_else(|| io::Error::other("short report"))?;
            Ok(u64::from_be_bytes(bytes))
        };
        Ok(BwReport {
            size: word(0)?,
            iters: word(1)?,
            peak: f64::from_bits(word(2)?),
            average: f64::from_bits(word(3)?),
            msg_rate: f64::from_bits(word(4)?),
        })
    }

    /// perftest's `print_report_bw` from post and completion times.
    pub(super) fn compute(params: &Params, posted: &[Instant], completed: &[Instant]) -> BwReport {
        let n = posted.len();
        let unit = if params.gbits { 125e6 } else { 1_048_576.0 };
        let size = params.size as f64;
        let elapsed = completed[n - 1]
            .duration_since(posted[0])
            .as_secs_f64()
            .max(1e-9);
        // Peak: the best rate over any run of operations ending at a signaled completion.
        let mut peak = 0.0;
        // (For several QPs the posts and completions interleave: no peak, as with many
        // iterations.)
        if (n as u64) <= NO_PEAK_ITERS && params.client && params.qps == 1 {
            let cq_mod = params.cq_mod as usize;
            let ends = (cq_mod - 1..n).step_by(cq_mod).chain([n - 1]);
            let mut best = f64::INFINITY;
            for j in ends {
                for (i, start) in posted.iter().enumerate().take(j + 1) {
                    let per_op =
                        completed[j].duration_since(*start).as_secs_f64() / (j - i + 1) as f64;
                    if per_op > 0.0 && per_op < best {
                        best = per_op;
                    }
                }
            }
            if best.is_finite() {
                peak = size / best / unit;
            }
        }
        BwReport {
            size: params.size,
            iters: n as u64,
            peak,
            average: size * n as f64 / elapsed / unit,
            msg_rate: n as f64 / elapsed / 1e6,
        }
    }
}

pub(super) fn print_info(ctx: &Context, params: &Params, gid_index: u8) {
    let verb = match params.test.verb() {
        Verb::Send => "Send",
        Verb::Write => "RDMA_Write",
        Verb::Read => "RDMA_Read",
        Verb::Atomic => "Atomic",
    };
    let atomic = match (params.test.verb(), params.atomic) {
        (Verb::Atomic, AtomicType::FetchAndAdd) => "FETCH_AND_ADD ",
        (Verb::Atomic, AtomicType::CmpAndSwap) => "CMP_AND_SWAP ",
        _ => "",
    };
    let kind = if params.test.is_latency() {
        "Latency"
    } else {
        "BW"
    };
    println!("{RESULT_LINE}");
    println!("                    {verb} {atomic}{kind} Test");
    println!(
        " Dual-port       : OFF\t\tDevice         : {}",
        ctx.device().name
    );
    println!(" Number of qps   : {}\t\tTransport type : IB", params.qps);
    println!(" Connection type : RC\t\tUsing SRQ      : OFF");
    if params.client || params.test.is_latency() {
        println!(" TX depth        : {}", params.tx_depth);
    } else if params.test.verb() == Verb::Send {
        println!(" RX depth        : {}", params.rx_depth);
    }
    if !params.test.is_latency() {
        println!(" CQ Moderation   : {}", params.cq_mod);
    }
    println!(" Mtu             : {}[B]", params.mtu.bytes());
    println!(" Link type       : Ethernet");
    println!(" GID index       : {gid_index}");
    match params.test.verb() {
        Verb::Read | Verb::Atomic => println!(" Outstand reads  : {OUR_OUT_READS}"),
        _ => println!(" Max inline data : 0[B]"),
    }
    println!(" rdma_cm QPs\t : OFF");
    println!(" Data ex. method : Ethernet");
    println!("{RESULT_LINE}");
}

pub(super) fn print_bw_header(params: &Params) {
    let unit = if params.gbits { "Gb/sec" } else { "MB/sec" };
    println!(" #bytes     #iterations    BW peak[{unit}]    BW average[{unit}]   MsgRate[Mpps]");
}

pub(super) fn print_bw_row(params: &Params, report: &BwReport) {
    if params.gbits && report.average < 0.1 {
        println!(
            " {:<7}    {}           {:<7.6}            {:<7.6}            {:<7.6}",
            report.size, report.iters, report.peak, report.average, report.msg_rate
        );
    } else {
        println!(
            " {:<7}    {:<10}       {:<7.2}            {:<7.2}\t\t   {:<7.6}",
            report.size, report.iters, report.peak, report.average, report.msg_rate
        );
    }
}

pub(super) fn print_lat_header() {
    println!(
        " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] "
    );
}

/// perftest's `print_report_lat`: deltas between consecutive posts over `rtt_factor`
/// (2 for ping-pongs: half a round trip), the two largest dropped.
pub(super) fn print_lat_row(params: &Params, posted: &[Instant], rtt_factor: f64) {
    let mut delta: Vec<f64> = posted
        .windows(2)
        .map(|pair| pair[1].duration_since(pair[0]).as_secs_f64() * 1e6 / rtt_factor)
        .collect();
    delta.sort_by(f64::total_cmp);
    let measured = delta.len().saturating_sub(2).max(1).min(delta.len());
    if delta.is_empty() {
        return;
    }
    let kept = &delta[..measured];
    let m = kept.len();
    let typical = if m.is_multiple_of(2) {
        (kept[m / 2] + kept[m / 2 - 1]) / 2.0
    } else {
        kept[m / 2]
    };
    let average = kept.iter().sum::<f64>() / m as f64;
    let stdev = (kept.iter().map(|d| (average - d).powi(2)).sum::<f64>() / m as f64).sqrt();
    let percentile = |p: f64| delta[((m as f64 * p).ceil() as usize).min(delta.len() - 1)];
    println!(
        " {:<7} {}          {:<7.2}        {:<7.2}      {:<7.2}  \t       {:<7.2}     \t{:<7.2}\t\t{:<7.2} \t\t{:<7.2}",
        params.size,
        params.iters,
        kept[0],
        kept[m - 1],
        typical,
        average,
        stdev,
        percentile(0.99),
        percentile(0.999)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_values_are_big_endian_doubles() {
        let report = BwReport {
            size: 4096,
            iters: 200,
            peak: 0.0405,
            average: 0.0359,
            msg_rate: 0.001095,
        };
        let wire = report.to_wire();
        assert_eq!(wire[0], [0, 0, 0, 0, 0, 0, 0x10, 0]);
        assert_eq!(wire[1], [0, 0, 0, 0, 0, 0, 0, 0xc8]);
        // 0.0405 as perftest's hton_double puts it on the wire.
        assert_eq!(wire[2][..2], [0x3f, 0xa4]);
        let back = BwReport::from_wire(&wire.iter().map(|w| w.to_vec()).collect::<Vec<_>>());
        assert_eq!(back.unwrap(), report);
    }
}

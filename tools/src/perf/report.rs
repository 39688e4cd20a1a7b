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
    pub(super) fn compute(params: &Params, timeline: &Timeline) -> BwReport {
        let n = timeline.completed;
        let unit = if params.gbits { 125e6 } else { 1_048_576.0 };
        let size = params.size as f64;
        let elapsed = match (timeline.first_post, timeline.last_completion) {
            (Some(first), Some(last)) => last.duration_since(first).as_secs_f64(),
            _ => 0.0,
        }
        .max(1e-9);
        let peak = match &timeline.each {
            Some((posted, completed)) => peak(params, posted, completed) / unit,
            None => 0.0,
        };
        BwReport {
            size: params.size,
            iters: n,
            peak,
            average: size * n as f64 / elapsed / unit,
            msg_rate: n as f64 / elapsed / 1e6,
        }
    }
}

/// The best rate, in bytes per second, over any run of operations ending at a signaled
/// completion.
fn peak(params: &Params, posted: &[Instant], completed: &[Instant]) -> f64 {
    let n = posted.len().min(completed.len());
    if n == 0 {
        return 0.0;
    }
    let cq_mod = params.cq_mod as usize;
    let ends = (cq_mod - 1..n).step_by(cq_mod).chain([n - 1]);
    let mut best = f64::INFINITY;
    for j in ends {
        for (i, start) in posted.iter().enumerate().take(j + 1) {
            let per_op = completed[j].duration_since(*start).as_secs_f64() / (j - i + 1) as f64;
            if per_op > 0.0 && per_op < best {
                best = per_op;
            }
        }
    }
    if best.is_finite() {
        params.size as f64 / best
    } else {
        0.0
    }
}

/// When the operations of a bandwidth run were posted and completed: the first post and
/// the last completion, and each one only where perftest computes a peak from them (a
/// client on one QP, at most [`NO_PEAK_ITERS`] iterations), so memory stays bounded
/// whatever `-n` and `-q` are.
pub(super) struct Timeline {
    first_post: Option<Instant>,
    last_completion: Option<Instant>,
    completed: u64,
    /// Every post and every completion, where a peak is computed.
    each: Option<(Vec<Instant>, Vec<Instant>)>,
}

impl Timeline {
    pub(super) fn new(params: &Params) -> Timeline {
        let peak = params.client && params.qps == 1 && params.iters <= NO_PEAK_ITERS;
        let n = params.iters as usize;
        Timeline {
            first_post: None,
            last_completion: None,
            completed: 0,
            each: peak.then(|| (Vec::with_capacity(n), Vec::with_capacity(n))),
        }
    }

    /// `count` operations were posted at `now`.
    pub(super) fn posted(&mut self, now: Instant, count: u64) {
        self.first_post.get_or_insert(now);
        if let Some((posted, _)) = &mut self.each {
            posted.extend((0..count).map(|_| now));
        }
    }

    /// `count` more operations were complete at `now`.
    pub(super) fn completed(&mut self, now: Instant, count: u64) {
        self.last_completion = Some(now);
        self.completed += count;
        if let Some((_, completed)) = &mut self.each {
            completed.extend((0..count).map(|_| now));
        }
    }

    pub(super) fn completions(&self) -> u64 {
        self.completed
    }
}

/// Gaps kept for a latency report; beyond it, every second one of those kept goes, and
/// every second later gap is skipped, so 8 MiB hold any `-n`.
const GAPS_KEPT: usize = 1 << 20;

/// The gaps between consecutive posts of a latency run, which perftest's latency figures
/// come from: all of them up to [`GAPS_KEPT`], then an evenly spread sample (every 2nd,
/// 4th, ... gap) of that many.
pub(super) struct Gaps {
    last: Option<Instant>,
    /// Gaps in seconds.
    kept: Vec<f64>,
    /// Gaps seen so far.
    seen: u64,
    /// Only every `every`th gap is kept.
    every: u64,
}

impl Gaps {
    pub(super) fn new(iters: u64) -> Gaps {
        Gaps {
            last: None,
            kept: Vec::with_capacity((iters as usize).min(GAPS_KEPT)),
            seen: 0,
            every: 1,
        }
    }

    /// An operation was posted at `now`.
    pub(super) fn post(&mut self, now: Instant) {
        if let Some(last) = self.last.replace(now) {
            if self.seen.is_multiple_of(self.every) && self.kept.len() == GAPS_KEPT {
                let mut index = 0;
                self.kept.retain(|_| {
                    index += 1;
                    index % 2 == 1
                });
                self.every *= 2;
            }
            if self.seen.is_multiple_of(self.every) {
                self.kept.push(now.duration_since(last).as_secs_f64());
            }
            self.seen += 1;
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
pub(super) fn print_lat_row(params: &Params, gaps: &Gaps, rtt_factor: f64) {
    if gaps.every > 1 {
        eprintln!(
            " (latency figures from every {}th of the {} gaps between posts)",
            gaps.every, gaps.seen
        );
    }
    let mut delta: Vec<f64> = gaps.kept.iter().map(|gap| gap * 1e6 / rtt_factor).collect();
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

    fn params(iters: u64, qps: u64) -> Params {
        Params {
            test: super::super::params::Test::WriteBw,
            qps,
            client: true,
            size: 64,
            iters,
            tx_depth: 128,
            rx_depth: 512,
            cq_mod: 100,
            cycle_buffer: 4096,
            cache_line: 64,
            mtu: roce_verbs::PathMtu::Mtu1024,
            atomic: AtomicType::FetchAndAdd,
            gbits: false,
            verify: false,
        }
    }

    #[test]
    fn bandwidth_timelines_keep_each_time_only_for_a_peak() {
        assert!(Timeline::new(&params(NO_PEAK_ITERS, 1)).each.is_some());
        let big = Timeline::new(&params(100_000_000, 64));
        assert!(
            big.each.is_none(),
            "-q 64 -n 100000000 keeps no per-operation times"
        );
        let mut timeline = Timeline::new(&params(1000, 2));
        let start = Instant::now();
        timeline.posted(start, 2000);
        timeline.completed(start + std::time::Duration::from_millis(1), 2000);
        let report = BwReport::compute(&params(1000, 2), &timeline);
        assert_eq!((report.iters, report.peak), (2000, 0.0));
        assert!((report.msg_rate - 2.0).abs() < 1e-6, "{}", report.msg_rate);
    }

    #[test]
    fn latency_gaps_stay_bounded_and_evenly_spread() {
        let mut gaps = Gaps::new(u64::MAX);
        let start = Instant::now();
        let total = 3 * GAPS_KEPT as u64 + 1;
        // Gap k lasts k nanoseconds, so what is kept shows which gaps were.
        let mut at = start;
        for k in 0..=total {
            at += std::time::Duration::from_nanos(k);
            gaps.post(at);
        }
        assert_eq!(gaps.seen, total);
        assert_eq!(gaps.every, 4);
        assert!(gaps.kept.len() <= GAPS_KEPT);
        let kept_ns: Vec<u64> = gaps.kept[..3]
            .iter()
            .map(|gap| (gap * 1e9).round() as u64)
            .collect();
        assert_eq!(kept_ns, [1, 5, 9], "gaps 1, 5, 9, ...: every 4th");
    }
}

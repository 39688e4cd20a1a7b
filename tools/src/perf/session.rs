//! One run from start to end: the device, the parameters, the exchange, and each test's
//! barriers around its loop, as perftest places them.

use std::io;
use std::time::{Duration, Instant};

use roce_verbs::{Context, Progress, QpState};

use super::connection::{connect, per_qp};
use super::exchange::{KeyMsg, Oob};
use super::params::{Args, Params, Test, RESULT_LINE};
use super::report::{print_bw_header, print_bw_row, print_lat_header, print_lat_row, BwReport};
use super::setup::Rdma;
use crate::rdma::{open_device, print_counters};
use crate::signals;

pub(super) fn perf(args: &Args) -> io::Result<()> {
    let progress = match (args.busy_poll, args.events) {
        (true, _) => Progress::BusyPoll,
        (_, true) => Progress::Events,
        // One thread for everything: on a two-core machine running both sides, any more
        // spinning threads than cores costs milliseconds per scheduler switch.
        _ => Progress::Caller,
    };
    let mut params = Params::new(args)?;
    let ctx = open_device("perf", &args.device, args.gid_index, progress)?;
    params.fit(args, ctx.device())?;
    let mut oob = Oob::connect(args, &ctx, progress == Progress::Caller)?;
    signals::stop_on_signals()?;
    let (page, line, their_mtu) = oob.preamble(params.mtu)?;
    params.agree(page, line, their_mtu)?;
    let rdma = Rdma::new(&ctx, params)?;
    let (mine, peers) = connect(&mut oob, &rdma, args)?;
    let result = match args.test {
        Test::WriteBw | Test::ReadBw | Test::AtomicBw => bandwidth(oob, &rdma, &mine, &peers),
        Test::SendBw | Test::SendLat => send(oob, &rdma, &mine, &peers, args.late_receives),
        Test::WriteLat => write_lat(oob, &rdma, &mine[0], &peers[0]),
        Test::ReadLat => read_lat(oob, &rdma, &mine[0], &peers),
    }
    .map_err(|error| with_our_side(error, &rdma));
    print_counters(&args.device, &ctx);
    result
}

/// A failed run's error, with what our side knows of it: a QP of ours that went to the
/// error state (its NAK and retry counters), and the device's async events.
fn with_our_side(error: io::Error, rdma: &Rdma) -> io::Error {
    let mut words = error.to_string();
    for qp in &rdma.qps {
        if let (Ok(QpState::Err), Ok(stats)) = (qp.state(), qp.stats()) {
            words.push_str(&format!(
                "; our QP {:#x} is in the error state ({} NAKs sent, {} received, {} \
                 retransmits, {} timeouts)",
                qp.qp_num(),
                stats.naks_sent,
                stats.naks_received,
                stats.retransmits,
                stats.timeouts
            ));
        }
    }
    while let Ok(Some(event)) = rdma.ctx.try_get_async_event() {
        words.push_str(&format!("; async event {event:?}"));
    }
    io::Error::new(error.kind(), words)
}

/// write_bw, read_bw and atomic_bw: the client runs, then sends its results, which both
/// sides print. `single` below is QP 0's message: the barriers perftest makes with it only.
fn bandwidth(mut oob: Oob, rdma: &Rdma, mine: &[KeyMsg], peers: &[KeyMsg]) -> io::Result<()> {
    let params = &rdma.params;
    let single = &mine[0];
    per_qp(&mut oob, mine)?;
    oob.handshake(single)?;
    print_bw_header(params);
    let report = if params.client {
        let report = rdma.run_bw_client(peers)?;
        oob.handshake(single)?;
        oob.results(&report.to_wire())?;
        report
    } else {
        oob.handshake(single)?;
        BwReport::from_wire(&oob.results(&[[0u8; 8]; 5])?)?
    };
    print_bw_row(params, &report);
    println!("{RESULT_LINE}");
    rdma.verify_after(peers)?;
    oob.close(single)
}

/// send_bw and send_lat: receives go up before the last barrier (the peer sends right after
/// it), unless `--late-receives` holds them back.
fn send(
    mut oob: Oob,
    rdma: &Rdma,
    mine: &[KeyMsg],
    peers: &[KeyMsg],
    late_receives: Option<u64>,
) -> io::Result<()> {
    let params = &rdma.params;
    let single = &mine[0];
    oob.handshake(single)?;
    per_qp(&mut oob, mine)?;
    let receiver = !params.client || params.test == Test::SendLat;
    let post_all =
        || (0..rdma.qps.len()).try_for_each(|qp| rdma.post_receives(qp, params.rx_depth));
    if receiver && late_receives.is_none() {
        post_all()?;
    }
    oob.handshake(single)?;
    if let (true, Some(ms)) = (receiver, late_receives) {
        // Meanwhile the peer's SENDs find no receive: we answer RNR NAKs.
        drive_for(rdma.ctx, Duration::from_millis(ms))?;
        post_all()?;
    }
    if params.test == Test::SendBw {
        print_bw_header(params);
        let report = if params.client {
            rdma.run_bw_client(peers)?
        } else {
            rdma.run_send_bw_server()?
        };
        print_bw_row(params, &report);
    } else {
        print_lat_header();
        let posted = rdma.run_send_lat()?;
        print_lat_row(params, &posted, 2.0);
    }
    println!("{RESULT_LINE}");
    oob.close(single)
}

/// Keeps the engine running for `how_long`.
fn drive_for(ctx: &Context, how_long: Duration) -> io::Result<()> {
    let until = Instant::now() + how_long;
    while Instant::now() < until {
        signals::check()?;
        ctx.progress()?;
        std::hint::spin_loop();
    }
    Ok(())
}

fn write_lat(mut oob: Oob, rdma: &Rdma, single: &KeyMsg, peer: &KeyMsg) -> io::Result<()> {
    oob.handshake(single)?;
    oob.handshake(single)?;
    print_lat_header();
    let posted = rdma.run_write_lat(peer)?;
    print_lat_row(&rdma.params, &posted, 2.0);
    println!("{RESULT_LINE}");
    // No closing handshake: keep answering (ACKs of the peer's last WRITE) until it hangs up.
    oob.linger()
}

fn read_lat(mut oob: Oob, rdma: &Rdma, single: &KeyMsg, peers: &[KeyMsg]) -> io::Result<()> {
    oob.handshake(single)?;
    oob.handshake(single)?;
    if rdma.params.client {
        print_lat_header();
        let posted = rdma.run_read_lat(&peers[0])?;
        print_lat_row(&rdma.params, &posted, 1.0);
        println!("{RESULT_LINE}");
        rdma.verify_after(peers)?;
    }
    // The server waits here while the client READs.
    oob.close(single)
}

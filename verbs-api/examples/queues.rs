//! How the 64-byte WRITE message rate scales with receive queues, an engine each
//! (`OpenOptions::queue`): two namespaces joined by a veth of Q queues (MTU 9000); on each
//! end Q contexts, one per queue, each with its own caller-driven engine in a thread of its
//! own, one RC QP each, connected to the peer's on the same queue. Each client thread keeps
//! 64 signaled WRITEs in flight (one request per `post_send`, as perftest posts); each
//! server thread polls its CQ, which drives its engine. Prints the aggregate rate. Needs
//! root.
//!
//! ```text
//! cargo build --release -p roce-verbs --example queues
//! target/release/examples/queues 1 200000; target/release/examples/queues 2 200000
//! ```

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use roce_provider::netns::{self, veth_with_queues, Netns};
use roce_verbs::{
    devices, AccessFlags, BackendChoice, ConnectOptions, Context, OpenOptions, PathMtu, Progress,
    QpCaps, QpEndpoint, QpInitAttr, QpType, SendFlags, SendOp, SendWr, WcStatus, XdpMode,
};

const IN_FLIGHT: u64 = 64;
/// What one end tells the other: its QP, and the region to WRITE into.
type Offer = (QpEndpoint, u64, u32);
const STALL: Duration = Duration::from_secs(20);

/// One queue's end: open, connect through `offers`, then serve or send `messages`; the
/// client returns when its WRITEs are done, the server when `stop` is set.
fn end(
    ns: String,
    queue: u32,
    client: bool,
    offers: (mpsc::Sender<Offer>, mpsc::Receiver<Offer>),
    start: Arc<Barrier>,
    messages: u64,
    stop: Arc<AtomicBool>,
) -> Duration {
    netns::enter(&ns).unwrap();
    let device = devices().unwrap().remove(0);
    let options = OpenOptions {
        backend: BackendChoice::AfXdp(XdpMode::Native),
        progress: Progress::Caller,
        queue: Some(queue),
        ..OpenOptions::default()
    };
    let ctx = Context::open(&device, options).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(1024, None).unwrap();
    let caps = QpCaps {
        max_send_wr: 256,
        ..QpCaps::default()
    };
    let qp = pd
        .create_qp(&QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: &cq,
            recv_cq: &cq,
            caps,
            sq_sig_all: false,
        })
        .unwrap();
    let region = pd.reg_mr(4096, AccessFlags::all()).unwrap();
    offers
        .0
        .send((qp.endpoint(1).unwrap(), region.addr(), region.rkey()))
        .unwrap();
    let (peer, addr, rkey) = offers.1.recv_timeout(STALL).unwrap();
    let options = ConnectOptions {
        mtu: PathMtu::Mtu4096,
        ..ConnectOptions::default()
    };
    qp.connect(&peer, &options).unwrap();
    start.wait();
    let started = Instant::now();
    let mut seen = Vec::new();
    if !client {
        while !stop.load(Ordering::Relaxed) {
            cq.poll_into(16, &mut seen).unwrap();
            seen.clear();
        }
        return started.elapsed();
    }
    let op = SendOp::RdmaWrite {
        remote_addr: addr,
        rkey,
    };
    let (mut posted, mut done) = (0, 0);
    let mut last = Instant::now();
    while done < messages {
        while posted < messages && posted - done < IN_FLIGHT {
            let wr = SendWr {
                wr_id: posted,
                op,
                sg_list: [region.sge(0, 64)].into(),
                inline_data: Vec::new(),
                flags: SendFlags::SIGNALED,
                ud: None,
                xrc_srqn: 0,
            };
            qp.post_send([wr]).unwrap();
            posted += 1;
        }
        seen.clear();
        let got = cq.poll_into(16, &mut seen).unwrap() as u64;
        assert!(seen.iter().all(|wc| wc.status == WcStatus::Success));
        if got > 0 {
            done += got;
            last = Instant::now();
        }
        assert!(last.elapsed() < STALL, "queue {queue} stalled at {done}");
    }
    started.elapsed()
}

fn main() {
    let mut args = std::env::args().skip(1);
    let queues: u32 = args.next().and_then(|q| q.parse().ok()).unwrap_or(1);
    let messages: u64 = args.next().and_then(|n| n.parse().ok()).unwrap_or(200_000);
    let a = Netns::create("roce-queues-a").unwrap();
    let b = Netns::create("roce-queues-b").unwrap();
    let ends = ((&a, "qa", "10.77.0.1/24"), (&b, "qb", "10.77.0.2/24"));
    veth_with_queues(ends.0, ends.1, 9000, queues).unwrap();
    let start = Arc::new(Barrier::new(2 * queues as usize));
    let stop = Arc::new(AtomicBool::new(false));
    let per_queue = messages / u64::from(queues);
    let mut clients = Vec::new();
    let mut servers = Vec::new();
    for queue in 0..queues {
        let (a_tx, b_rx) = mpsc::channel();
        let (b_tx, a_rx) = mpsc::channel();
        let (name_a, name_b) = (a.name.clone(), b.name.clone());
        let (start_a, start_b) = (Arc::clone(&start), Arc::clone(&start));
        let (stop_a, stop_b) = (Arc::clone(&stop), Arc::clone(&stop));
        clients.push(thread::spawn(move || {
            end(
                name_a,
                queue,
                true,
                (a_tx, a_rx),
                start_a,
                per_queue,
                stop_a,
            )
        }));
        servers.push(thread::spawn(move || {
            end(name_b, queue, false, (b_tx, b_rx), start_b, 0, stop_b)
        }));
    }
    let slowest = clients
        .into_iter()
        .map(|client| client.join().expect("client"))
        .max()
        .unwrap_or_default();
    stop.store(true, Ordering::Relaxed);
    for server in servers {
        server.join().expect("server");
    }
    let rate = (per_queue * u64::from(queues)) as f64 / slowest.as_secs_f64();
    println!(
        "queues={queues} messages={} rate={:.3} Mmsg/s",
        per_queue * u64::from(queues),
        rate / 1e6
    );
}

//! The raw AF_XDP ceiling of a link: RoCEv2-sized frames sent as fast as one AF_XDP sender
//! can and counted by an AF_XDP receiver, with no transport in between. What the RoCE
//! figures of `roce demo` are measured against.
//!
//! The frames are real RoCEv2 frames (Ethernet, IPv4, UDP to 4791, BTH, ICRC), so our XDP
//! program hands them to the receiving socket exactly as it does the transport's: an RDMA
//! WRITE middle packet for a full payload, an RDMA WRITE only packet (with its RETH) for a
//! small one. The sender copies the frame into its transmit buffer each time, as the
//! transport writes each packet; the receiver only counts.
//!
//! The sender keeps at most [`WINDOW`] frames beyond what the receiver has counted, as RoCE
//! keeps at most its PSN window unacknowledged: unpaced, on shared cores it floods a receiver
//! it competes with, whose ring overflows, and measures the drops rather than the link.
//!
//! A [`Meter`] keeps both sockets bound between measurements, so that short slices of the
//! ceiling can be taken between the chunks of the runs they are the ceiling of.

use std::io;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use roce_wire::{bth, reth, ExtRepr, FrameRepr, Opcode, Psn};

use crate::afxdp::AfXdpBackend;
use crate::backend::Backend;
use crate::netns;
use crate::xdp::XdpMode;

/// One end of the measurement: an interface in a named network namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Station {
    /// The namespace's name (as `ip netns` knows it).
    pub netns: String,
    /// The interface inside it.
    pub interface: String,
}

/// What one measurement found.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CeilingRate {
    /// RoCE payload bytes per frame.
    pub payload: usize,
    /// Whole frame, Ethernet header to ICRC.
    pub frame_len: usize,
    /// How long the sender sent.
    pub elapsed: Duration,
    /// Frames the sender sent.
    pub sent: u64,
    /// Frames the receiver counted.
    pub frames: u64,
    /// Frames per second received.
    pub frames_per_sec: f64,
    /// Frame bytes per second received (Ethernet header to ICRC).
    pub bytes_per_sec: f64,
    /// Frames the sender wrote off as lost: the window stayed full for [`LOSS_TIMEOUT`].
    pub written_off: u64,
    /// The receiving sockets' kernel counters at the end.
    pub receiver: XdpCounters,
}

/// The kernel's `XDP_STATISTICS` of a receiver's sockets, all queues together.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct XdpCounters {
    /// Frames dropped: no fill-ring buffer for them (as `rx_fill_ring_empty_descs` also
    /// counts) or too long.
    pub rx_dropped: u64,
    /// Descriptors the kernel found invalid on the RX side.
    pub rx_invalid_descs: u64,
    /// Descriptors the kernel found invalid on the TX side.
    pub tx_invalid_descs: u64,
    /// Frames dropped because the RX ring was full.
    pub rx_ring_full: u64,
    /// Times the kernel found the fill ring empty for a frame.
    pub rx_fill_ring_empty_descs: u64,
    /// Times the kernel found the TX ring empty when kicked.
    pub tx_ring_empty_descs: u64,
}

impl XdpCounters {
    fn of(backend: &AfXdpBackend) -> io::Result<XdpCounters> {
        Ok(backend
            .kernel_statistics()?
            .iter()
            .fold(XdpCounters::default(), |sum, socket| XdpCounters {
                rx_dropped: sum.rx_dropped + socket.rx_dropped,
                rx_invalid_descs: sum.rx_invalid_descs + socket.rx_invalid_descs,
                tx_invalid_descs: sum.tx_invalid_descs + socket.tx_invalid_descs,
                rx_ring_full: sum.rx_ring_full + socket.rx_ring_full,
                rx_fill_ring_empty_descs: sum.rx_fill_ring_empty_descs
                    + socket.rx_fill_ring_empty_descs,
                tx_ring_empty_descs: sum.tx_ring_empty_descs + socket.tx_ring_empty_descs,
            }))
    }
}

/// Frames sent between kicks.
const BATCH: usize = 64;
/// Most frames sent and not yet counted by the receiver: RoCE's window of 128 PSNs, well
/// inside the receiver's RX ring (1024 descriptors, two per 4 KiB-payload frame).
pub const WINDOW: u64 = 128;
/// How long the window may stay full before the sender takes its frames as lost (a veth
/// may drop a frame where no socket counts it) rather than wait for them to the end.
pub const LOSS_TIMEOUT: Duration = Duration::from_millis(100);
/// How long [`Meter::measure_counting`] goes on sending for the frames it waits for.
pub const COUNT_PATIENCE: Duration = Duration::from_secs(10);
/// How long binding waits for a queue a previous socket just released (EBUSY for ~0.5 s).
const BIND_PATIENCE: Duration = Duration::from_secs(3);
/// Time for frames in flight to arrive after the sender stops.
const DRAIN: Duration = Duration::from_millis(50);

/// The ceiling of a link, measured on demand: a sender and a counter, each on a thread of
/// its own with a socket bound once (a queue a closed socket held stays busy for about half
/// a second, too long to bind again per measurement), idle between measurements. So short
/// slices of the ceiling can be interleaved with the runs they are the ceiling of, on a
/// second link between the same namespaces: on a shared host the machine's speed drifts
/// over seconds, and a ceiling measured once, seconds away from the figure it divides,
/// carries that drift into the ratio. Dropping the meter ends both threads.
pub struct Meter {
    addresses: ([u8; 6], [u8; 6]),
    counter: Worker<(), (u64, XdpCounters)>,
    sender: Worker<(Vec<u8>, Span), Sent>,
    stop: Arc<AtomicBool>,
    counted: Arc<AtomicU64>,
}

impl Meter {
    /// Binds a counting socket on `receiver`, then a sending one on `sender` (each in its
    /// namespace).
    pub fn open(sender: &Station, receiver: &Station, mode: XdpMode) -> io::Result<Meter> {
        let addresses = (
            netns::mac_in(&sender.netns, &sender.interface)?,
            netns::mac_in(&receiver.netns, &receiver.interface)?,
        );
        let stop = Arc::new(AtomicBool::new(false));
        let counted = Arc::new(AtomicU64::new(0));
        let mut backend = open_in_thread(receiver, mode)?;
        let counter = {
            let (stop, counted) = (stop.clone(), counted.clone());
            Worker::spawn(move |()| count_frames(&mut backend, &stop, &counted))
        };
        let mut backend = open_in_thread(sender, mode)?;
        let sender = {
            let counted = counted.clone();
            Worker::spawn(move |(frame, span): (Vec<u8>, Span)| {
                send_frames(&mut backend, &frame, span, &counted)
            })
        };
        Ok(Meter {
            addresses,
            counter,
            sender,
            stop,
            counted,
        })
    }

    /// Frames carrying `payload` bytes of RoCE payload sent for `period`, as fast as the
    /// sending socket can within [`WINDOW`], and counted by the receiving one. The
    /// receiver's counters are its sockets' since the meter opened. A payload of 4096 needs
    /// an MTU of 9000 (two-buffer frames).
    pub fn measure(&self, payload: usize, period: Duration) -> io::Result<CeilingRate> {
        self.measure_counting(payload, period, 0)
    }

    /// [`measure`](Meter::measure) that goes on sending past `period` until the receiver
    /// has counted `at_least` frames, or [`COUNT_PATIENCE`] has passed: on a loaded machine
    /// either thread may wait for a CPU for much of a short period, and a check that frames
    /// are counted should not depend on how much of it they got. The rate is over the whole
    /// time sent.
    pub fn measure_counting(
        &self,
        payload: usize,
        period: Duration,
        at_least: u64,
    ) -> io::Result<CeilingRate> {
        let span = Span { period, at_least };
        let (sender_mac, receiver_mac) = self.addresses;
        let frame = roce_frame(sender_mac, receiver_mac, payload)?;
        let frame_len = frame.len();
        self.stop.store(false, Ordering::Relaxed);
        self.counted.store(0, Ordering::Release);
        // The counter starts (and says so) before anything is sent.
        self.counter.start(())?;
        let sent = self
            .sender
            .start((frame, span))
            .and_then(|()| self.sender.answer());
        thread::sleep(DRAIN);
        self.stop.store(true, Ordering::Relaxed);
        let counted = self.counter.answer();
        let Sent {
            frames: sent,
            elapsed,
            written_off,
        } = sent?;
        let (frames, receiver) = counted?;
        let seconds = elapsed.as_secs_f64();
        Ok(CeilingRate {
            payload,
            frame_len,
            elapsed,
            sent,
            frames,
            frames_per_sec: frames as f64 / seconds,
            bytes_per_sec: (frames * frame_len as u64) as f64 / seconds,
            written_off,
            receiver,
        })
    }
}

/// A thread serving jobs one at a time: each job's answer comes back in order. It ends when
/// dropped (after the job it serves, if any).
struct Worker<J, T> {
    jobs: Option<mpsc::Sender<J>>,
    started: mpsc::Receiver<()>,
    answers: mpsc::Receiver<io::Result<T>>,
    thread: Option<thread::JoinHandle<()>>,
}

impl<J: Send + 'static, T: Send + 'static> Worker<J, T> {
    fn spawn(mut serve: impl FnMut(J) -> io::Result<T> + Send + 'static) -> Self {
        let (jobs, job_rx) = mpsc::channel::<J>();
        let (started_tx, started) = mpsc::channel();
        let (answer_tx, answers) = mpsc::channel();
        let thread = thread::spawn(move || {
            while let Ok(job) = job_rx.recv() {
                let _ = started_tx.send(());
                if answer_tx.send(serve(job)).is_err() {
                    break;
                }
            }
        });
        Worker {
            jobs: Some(jobs),
            started,
            answers,
            thread: Some(thread),
        }
    }

    /// Hands the worker `job` and waits until it has taken it.
    fn start(&self, job: J) -> io::Result<()> {
        let gone = || io::Error::other("a ceiling thread ended");
        self.jobs
            .as_ref()
            .ok_or_else(gone)?
            .send(job)
            .map_err(|_| gone())?;
        self.started.recv().map_err(|_| gone())
    }

    /// The answer to the job started last; an error too if the thread ended without one
    /// (only a panic ends it while a job is out).
    fn answer(&self) -> io::Result<T> {
        self.answers
            .recv()
            .unwrap_or_else(|_| Err(io::Error::other("a ceiling thread panicked")))
    }
}

impl<J, T> Drop for Worker<J, T> {
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Opens the AF_XDP backend on `station` from a thread of its own, which enters the
/// station's namespace (the calling thread stays where it is; the sockets stay bound to the
/// station's interface wherever they are used from).
fn open_in_thread(station: &Station, mode: XdpMode) -> io::Result<AfXdpBackend> {
    let station = station.clone();
    thread::spawn(move || open(&station, mode))
        .join()
        .map_err(|_| io::Error::other("opening a ceiling socket panicked"))?
}

/// Opens the AF_XDP backend on `station` from the calling thread, entering its namespace,
/// waiting out the EBUSY a just-closed socket leaves on its queue.
fn open(station: &Station, mode: XdpMode) -> io::Result<AfXdpBackend> {
    netns::enter(&station.netns)?;
    let deadline = Instant::now() + BIND_PATIENCE;
    loop {
        match AfXdpBackend::open(&station.interface, mode) {
            Err(error)
                if error.raw_os_error() == Some(libc::EBUSY) && Instant::now() < deadline =>
            {
                thread::sleep(Duration::from_millis(100));
            }
            opened => return opened,
        }
    }
}

/// Counts frames into `counted` (zero when this is called) until `stop`. The frames and the
/// sockets' kernel counters.
fn count_frames(
    backend: &mut AfXdpBackend,
    stop: &AtomicBool,
    counted: &AtomicU64,
) -> io::Result<(u64, XdpCounters)> {
    let mut frames = 0;
    while !stop.load(Ordering::Relaxed) {
        let batch = backend.receive(1024, &mut |_| {})? as u64;
        if batch > 0 {
            frames += batch;
            counted.store(frames, Ordering::Release);
        }
    }
    let counters = XdpCounters::of(backend)?;
    // Stragglers go now, not into the next measurement.
    while backend.receive(1024, &mut |_| {})? > 0 {}
    Ok((frames, counters))
}

/// What the sender did.
struct Sent {
    /// Frames it sent.
    frames: u64,
    /// How long it sent.
    elapsed: Duration,
    /// Frames it took as lost, see [`LOSS_TIMEOUT`].
    written_off: u64,
}

/// How long the sender sends: `period`, and on (within [`COUNT_PATIENCE`]) until the
/// receiver has counted `at_least` frames.
#[derive(Clone, Copy)]
struct Span {
    period: Duration,
    at_least: u64,
}

impl Span {
    fn goes_on(&self, elapsed: Duration, counted: &AtomicU64) -> bool {
        elapsed < self.period
            || (elapsed < COUNT_PATIENCE && counted.load(Ordering::Acquire) < self.at_least)
    }
}

/// Sends `frame` for `span` as fast as the socket takes it, with at most [`WINDOW`] frames
/// beyond those the receiver has `counted` (from zero, when this is called).
fn send_frames(
    backend: &mut AfXdpBackend,
    frame: &[u8],
    span: Span,
    counted: &AtomicU64,
) -> io::Result<Sent> {
    let (mut sent, mut written_off) = (0u64, 0u64);
    let mut full_since = None;
    let started = Instant::now();
    while span.goes_on(started.elapsed(), counted) {
        let in_flight = sent
            .saturating_sub(written_off)
            .saturating_sub(counted.load(Ordering::Acquire));
        let room = WINDOW.saturating_sub(in_flight);
        if room == 0 {
            let since = *full_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= LOSS_TIMEOUT {
                written_off = sent.saturating_sub(counted.load(Ordering::Acquire));
                full_since = None;
            }
            // The receiver may need this core to catch up.
            thread::yield_now();
            continue;
        }
        full_since = None;
        for _ in 0..room.min(BATCH as u64) {
            let transmitted = backend.transmit(frame.len(), 0, &mut |buffer| {
                buffer.copy_from_slice(frame);
                frame.len()
            });
            match transmitted {
                Ok(()) => sent += 1,
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => break,
                Err(error) => return Err(error),
            }
        }
        backend.submit()?;
    }
    Ok(Sent {
        frames: sent,
        elapsed: started.elapsed(),
        written_off,
    })
}

/// An RDMA WRITE packet with `payload` bytes: a middle packet for a full 4096, an only
/// packet (with its RETH) otherwise, as the transport sends them.
fn roce_frame(src: [u8; 6], dst: [u8; 6], payload: usize) -> io::Result<Vec<u8>> {
    let (opcode, reth) = if payload == 4096 {
        (Opcode::RcRdmaWriteMiddle, None)
    } else {
        let reth = reth::Repr {
            virtual_address: 0x1000,
            rkey: 0x1234,
            dma_length: payload as u32,
        };
        (Opcode::RcRdmaWriteOnly, Some(reth))
    };
    let bytes = vec![0x5a; payload];
    let repr = FrameRepr {
        udp_src_port: 0xC011,
        ..FrameRepr::ipv4(
            (src, Ipv4Addr::new(198, 18, 0, 1)),
            (dst, Ipv4Addr::new(198, 18, 0, 2)),
            bth::Repr::new(opcode, 0x11, Psn::new(1)),
            ExtRepr {
                reth,
                ..ExtRepr::default()
            },
            &bytes,
        )
    };
    let mut frame = vec![0; repr.buffer_len()];
    repr.emit(&mut frame)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "payload too large"))?;
    Ok(frame)
}

#[cfg(test)]
mod tests {
    use super::*;
    use roce_wire::Frame;

    /// The length of the frame [`roce_frame`] builds.
    fn frame_len(payload: usize) -> io::Result<usize> {
        Ok(roce_frame([0; 6], [0; 6], payload)?.len())
    }

    #[test]
    fn frames_have_the_sizes_roce_sends() {
        // Ethernet 14 + IPv4 20 + UDP 8 + BTH 12 (+ RETH 16) + payload + ICRC 4.
        assert_eq!(frame_len(4096).unwrap(), 4154);
        assert_eq!(frame_len(64).unwrap(), 138);
        let frame = roce_frame([2; 6], [4; 6], 4096).unwrap();
        let checked = Frame::new_checked(&frame[..]).unwrap();
        let repr = FrameRepr::parse(&checked).unwrap();
        assert_eq!(
            (repr.bth.opcode, repr.payload.len()),
            (Opcode::RcRdmaWriteMiddle, 4096)
        );
    }
}

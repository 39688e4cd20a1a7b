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
/// How long [`measure_ceiling_counting`] goes on sending for the frames it waits for.
pub const COUNT_PATIENCE: Duration = Duration::from_secs(10);
/// How long binding waits for a queue a previous socket just released (EBUSY for ~0.5 s).
const BIND_PATIENCE: Duration = Duration::from_secs(3);
/// Time for frames in flight to arrive after the sender stops.
const DRAIN: Duration = Duration::from_millis(50);

/// Sends frames carrying `payload` bytes of RoCE payload from `sender` to `receiver` for
/// `period`, as fast as one AF_XDP socket can within [`WINDOW`], and counts what an AF_XDP
/// socket on `receiver` gets. Both run on threads of their own inside their namespaces, so
/// this may be called from any thread; neither interface may have another AF_XDP user
/// meanwhile (open RoCE contexts on them first close). A payload of 4096 needs an MTU of
/// 9000 (two-buffer frames).
pub fn measure_ceiling(
    sender: &Station,
    receiver: &Station,
    mode: XdpMode,
    payload: usize,
    period: Duration,
) -> io::Result<CeilingRate> {
    measure_ceiling_counting(sender, receiver, mode, payload, period, 0)
}

/// [`measure_ceiling`] that goes on sending past `period` until the receiver has counted
/// `at_least` frames, or [`COUNT_PATIENCE`] has passed: on a loaded machine either thread
/// may wait for a CPU for much of a short period, and a check that frames are counted
/// should not depend on how much of it they got. The rate is over the whole time sent.
pub fn measure_ceiling_counting(
    sender: &Station,
    receiver: &Station,
    mode: XdpMode,
    payload: usize,
    period: Duration,
    at_least: u64,
) -> io::Result<CeilingRate> {
    let receiver_mac = netns::mac_in(&receiver.netns, &receiver.interface)?;
    let sender_mac = netns::mac_in(&sender.netns, &sender.interface)?;
    let frame = roce_frame(sender_mac, receiver_mac, payload)?;
    let stop = Arc::new(AtomicBool::new(false));
    let counted = Arc::new(AtomicU64::new(0));
    let (ready_tx, ready_rx) = mpsc::channel();
    let counter = {
        let (station, stop, counted) = (receiver.clone(), stop.clone(), counted.clone());
        thread::spawn(move || count_frames(&station, mode, &ready_tx, &stop, &counted))
    };
    // The receiver is bound (or failed) before anything is sent.
    let ready = ready_rx.recv().unwrap_or(Ok(()));
    let sent = ready.and_then(|()| {
        let station = sender.clone();
        let span = Span { period, at_least };
        let sending = thread::spawn(move || send_frames(&station, mode, &frame, span, &counted));
        sending
            .join()
            .map_err(|_| io::Error::other("the sending thread panicked"))?
    });
    thread::sleep(DRAIN);
    stop.store(true, Ordering::Relaxed);
    let received = counter
        .join()
        .map_err(|_| io::Error::other("the receiving thread panicked"))?;
    let Sent {
        elapsed,
        written_off,
    } = sent?;
    let (frames, receiver) = received?;
    let seconds = elapsed.as_secs_f64();
    Ok(CeilingRate {
        payload,
        frame_len: frame_len(payload)?,
        frames,
        frames_per_sec: frames as f64 / seconds,
        bytes_per_sec: (frames * frame_len(payload)? as u64) as f64 / seconds,
        written_off,
        receiver,
    })
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

/// Counts frames on `station` into `counted` until `stop`; says on `ready` when it listens.
/// The frames and the sockets' kernel counters at the end.
fn count_frames(
    station: &Station,
    mode: XdpMode,
    ready: &mpsc::Sender<io::Result<()>>,
    stop: &AtomicBool,
    counted: &AtomicU64,
) -> io::Result<(u64, XdpCounters)> {
    let mut backend = match open(station, mode) {
        Ok(backend) => backend,
        Err(error) => {
            let _ = ready.send(Err(io::Error::new(error.kind(), error.to_string())));
            return Err(error);
        }
    };
    let _ = ready.send(Ok(()));
    let mut frames = 0;
    while !stop.load(Ordering::Relaxed) {
        let batch = backend.receive(1024, &mut |_| {})? as u64;
        if batch > 0 {
            frames += batch;
            counted.store(frames, Ordering::Release);
        }
    }
    Ok((frames, XdpCounters::of(&backend)?))
}

/// What the sender did.
struct Sent {
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

/// Sends `frame` from `station` for `span` as fast as the socket takes it, with at most
/// [`WINDOW`] frames beyond those the receiver has `counted`.
fn send_frames(
    station: &Station,
    mode: XdpMode,
    frame: &[u8],
    span: Span,
    counted: &AtomicU64,
) -> io::Result<Sent> {
    let mut backend = open(station, mode)?;
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
        elapsed: started.elapsed(),
        written_off,
    })
}

/// The length of the frame [`roce_frame`] builds.
fn frame_len(payload: usize) -> io::Result<usize> {
    Ok(roce_frame([0; 6], [0; 6], payload)?.len())
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

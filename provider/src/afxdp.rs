//! The AF_XDP backend: frames of UDP port 4791 come straight from the driver into our
//! memory through an AF_XDP socket, bypassing the kernel's stack; everything else still goes
//! to the kernel (our XDP program decides, see [`crate::xdp`]).
//!
//! Rings come from the `xdpilone` crate: pure Rust, builds in seconds with no system packages
//! (xsk-rs needs libxdp's C build, and libxdp's default program also swallows ARP and outlives
//! a crashed process). One socket per receive queue, each with its own UMEM (RSS may put a
//! QP's flow on any queue; the program sends each frame to its queue's socket), copy mode
//! (veth has no zero-copy). A UMEM chunk
//! holds 4096 bytes, of which copy mode keeps 256 as headroom on receive, so frames of path MTU
//! 4096 span two chunks: the socket is bound with XDP_USE_SG and the program loaded with frags
//! support, and a frame's descriptors carry XDP_PKT_CONTD on all but the last.

use std::collections::VecDeque;
use std::ffi::CString;
use std::io;
use std::num::NonZeroU32;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::event::epoll;
use std::os::unix::fs::MetadataExt;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use xdpilone::{DeviceQueue, IfInfo, RingRx, RingTx, Socket, SocketConfig, UmemConfig};

use crate::backend::{fill_frame, poll_readable, Backend, Fill, MAX_FRAME};
use crate::umem::{RxBuffer, TxSlot, Umem, CHUNK_SIZE, RX_STRIDE, TX_SLOT, XDP_PKT_CONTD};
use crate::xdp::{XdpMode, XdpProgram};

/// Receive buffers (the fill ring is smaller, so the kernel never runs dry while we hold
/// some) and transmit slots (a ring's worth of two-descriptor frames).
const RX_BUFFERS: u32 = 2048;
const TX_SLOTS: u32 = RING_SIZE / 2;
const RING_SIZE: u32 = 1024;
/// Bind flag for multi-buffer frames (linux/if_xdp.h, kernel 6.6 on).
const XDP_USE_SG: u16 = 1 << 4;
/// UMEM flag: descriptors may point anywhere, not only at chunk starts.
const XDP_UMEM_UNALIGNED_CHUNK_FLAG: u32 = 1;
/// Most descriptors one received frame may span (MTU 9000 needs three); longer frames are
/// dropped.
const MAX_PIECES: usize = 3;
/// Most descriptors read from the RX ring in one go.
const RX_BATCH: u32 = 64;
/// Most kicks per flush: each sends up to 32 frames in copy mode (the kernel's TX batch).
const MAX_KICKS: usize = (RING_SIZE / 32) as usize;

/// One AF_XDP socket bound to one receive queue, with its own UMEM.
struct Queue {
    // Field order is drop order: rings and socket before the UMEM and its memory.
    rx: RingRx,
    tx: RingTx,
    device: DeviceQueue,
    _socket: Socket,
    _registration: xdpilone::Umem,
    umem: Umem,
    /// Transmit slots free to write a frame into.
    free_tx: Vec<TxSlot>,
    /// Descriptors queued for sending since the last kick.
    unkicked: usize,
    received: Received,
    fd: i32,
    /// The interface's receive queue it is bound to.
    id: u32,
}

/// The receive side's buffers and counters.
struct Received {
    /// Receive buffers we hold for the fill ring, in the order they go back: the order the
    /// kernel took them, so that consecutive fill entries stay adjacent in memory.
    to_fill: VecDeque<RxBuffer>,
    /// The buffers of a frame whose last descriptor has not been read yet, and their lengths.
    pieces: Vec<RxBuffer>,
    piece_lens: Vec<u32>,
    /// Whether the frame in `pieces` lost its first buffers for being too long.
    cut: bool,
    /// Where a frame whose buffers are not adjacent is put together (a fill-ring wrap).
    scratch: Vec<u8>,
    stats: AfXdpStats,
}

/// What the AF_XDP sockets have seen.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AfXdpStats {
    /// Frames handed on.
    pub received: u64,
    /// Of those, frames that had to be copied together first because their buffers were
    /// not adjacent (where the fill ring wraps); the others were handed on in place.
    pub gathered: u64,
    /// Frames longer than three buffers, dropped.
    pub oversized: u64,
}

// SAFETY: every part (rings, UMEM mapping, memory area) is owned by this value alone and used
// only through `&mut self`; nothing is tied to the thread that created it.
#[allow(unsafe_code)]
unsafe impl Send for Queue {}

/// How long opening waits for a queue whose socket is being closed: the kernel lets go of a
/// closed socket's queue in deferred work, which a loaded machine runs late, and until then
/// binding it fails with EBUSY (a program restarted on an interface, such as a `roce perf`
/// server in a loop, met that and fell back to kernel UDP sockets). A queue another live
/// socket holds stays busy: opening fails after this wait.
const BUSY_QUEUE_WAIT: Duration = Duration::from_secs(2);
/// How often opening tries a busy queue again within that wait.
const BUSY_QUEUE_RETRY: Duration = Duration::from_millis(20);

/// Most receive queues we bind (each has its own UMEM of 3,072 pages, 12 MiB); an interface
/// with more must be given fewer (`ethtool -L IFACE combined 16`), or the frames RSS spreads
/// to the others would reach the kernel instead of us.
pub const MAX_QUEUES: u32 = 16;

/// AF_XDP sockets on every receive queue of one interface (RSS may put any QP's flow on
/// any queue), or on one of them ([`open_queue`](AfXdpBackend::open_queue): an engine per
/// queue), with our XDP program attached.
pub struct AfXdpBackend {
    // Sockets close before their claims and the program go.
    queues: Vec<Queue>,
    _claims: Vec<Claim>,
    /// What a sleeper polls: every socket's fd while [`Backend::listen`] is on.
    epoll: OwnedFd,
    listening: bool,
    /// Where the next `recv` looks first, so no queue starves the others.
    next_rx: usize,
}

/// Our program on one interface for this process, shared by the backends bound to its
/// queues (an interface takes one program; each backend's sockets go in its map), and the
/// queues they took.
struct Attached {
    program: XdpProgram,
    claimed: Mutex<Vec<u32>>,
}

/// An interface: its network namespace (the inode of the opener's) and index.
type InterfaceKey = (u64, u32);

/// The programs attached by this process, by interface; the last backend of an interface
/// detaches it.
static ATTACHED: Mutex<Vec<(InterfaceKey, Weak<Attached>)>> = Mutex::new(Vec::new());

/// A backend's hold on one queue of an interface: while it lasts, no other backend of this
/// process binds that queue.
struct Claim {
    attached: Arc<Attached>,
    queue: u32,
}

impl Drop for Claim {
    fn drop(&mut self) {
        if let Ok(mut claimed) = self.attached.claimed.lock() {
            claimed.retain(|&queue| queue != self.queue);
        }
    }
}

impl Attached {
    /// The program on interface `ifindex` of this thread's namespace, attached (in `mode`)
    /// unless this process attached it already (in whatever mode it was).
    fn on(ifindex: u32, mode: XdpMode) -> io::Result<Arc<Attached>> {
        let netns = std::fs::metadata("/proc/thread-self/ns/net")?.ino();
        let key = (netns, ifindex);
        let mut attached = ATTACHED
            .lock()
            .map_err(|_| io::Error::other("a thread panicked attaching XDP"))?;
        attached.retain(|(_, program)| program.strong_count() > 0);
        if let Some(program) = attached
            .iter()
            .find(|(known, _)| *known == key)
            .and_then(|(_, program)| program.upgrade())
        {
            return Ok(program);
        }
        let mut program = XdpProgram::load(MAX_QUEUES, true)?;
        program.attach(ifindex, mode)?;
        let program = Arc::new(Attached {
            program,
            claimed: Mutex::new(Vec::new()),
        });
        attached.push((key, Arc::downgrade(&program)));
        Ok(program)
    }

    /// Takes `queue` for `socket`: its frames go there from now on. `EBUSY` when another
    /// backend of this process holds it.
    fn claim(self: &Arc<Self>, queue: u32, socket: BorrowedFd<'_>) -> io::Result<Claim> {
        let mut claimed = self
            .claimed
            .lock()
            .map_err(|_| io::Error::other("a thread panicked binding a queue"))?;
        if claimed.contains(&queue) {
            return Err(io::Error::new(
                io::ErrorKind::ResourceBusy,
                format!("receive queue {queue} is already bound by this process"),
            ));
        }
        self.program.register_socket(queue, socket)?;
        claimed.push(queue);
        Ok(Claim {
            attached: Arc::clone(self),
            queue,
        })
    }
}

fn errno(error: xdpilone::Errno) -> io::Error {
    io::Error::from_raw_os_error(error.get_raw())
}

impl Queue {
    /// Binds a socket to queue `queue` of the interface in `info`.
    fn open(info: &IfInfo, queue: u32) -> io::Result<Queue> {
        let mut info = *info;
        info.set_queue(queue);
        let (umem, rx_buffers, free_tx) = Umem::new(RX_BUFFERS, TX_SLOTS)?;
        let config = UmemConfig {
            fill_size: RING_SIZE,
            complete_size: RING_SIZE,
            frame_size: CHUNK_SIZE,
            headroom: 0,
            flags: XDP_UMEM_UNALIGNED_CHUNK_FLAG,
        };
        // SAFETY: the area is page-aligned and outlives the registration (field order above).
        #[allow(unsafe_code)]
        let registration = unsafe { xdpilone::Umem::new(config, umem.area()) }.map_err(errno)?;
        let socket = Socket::with_shared(&info, &registration).map_err(errno)?;
        let device = registration.fq_cq(&socket).map_err(errno)?;
        let rings = SocketConfig {
            rx_size: NonZeroU32::new(RING_SIZE),
            tx_size: NonZeroU32::new(RING_SIZE),
            bind_flags: SocketConfig::XDP_BIND_COPY
                | SocketConfig::XDP_BIND_NEED_WAKEUP
                | XDP_USE_SG,
        };
        let user = registration.rx_tx(&socket, &rings).map_err(errno)?;
        let rx = user.map_rx().map_err(errno)?;
        let tx = user.map_tx().map_err(errno)?;
        registration.bind(&user).map_err(errno)?;
        let fd = user.as_raw_fd();
        let mut queue = Queue {
            rx,
            tx,
            device,
            _socket: socket,
            _registration: registration,
            umem,
            free_tx,
            unkicked: 0,
            received: Received {
                to_fill: rx_buffers.into(),
                pieces: Vec::with_capacity(MAX_PIECES),
                piece_lens: Vec::with_capacity(MAX_PIECES),
                cut: false,
                scratch: vec![0; MAX_FRAME],
                stats: AfXdpStats::default(),
            },
            fd,
            id: queue,
        };
        queue.refill();
        Ok(queue)
    }

    fn fd(&self) -> BorrowedFd<'_> {
        // SAFETY: `self.fd` is the socket's, open while `self` lives, which the borrow ties.
        #[allow(unsafe_code)]
        unsafe {
            BorrowedFd::borrow_raw(self.fd)
        }
    }

    /// Gives held receive buffers to the kernel, oldest first, as many as the fill ring has
    /// room for.
    fn refill(&mut self) {
        let to_fill = &mut self.received.to_fill;
        if to_fill.is_empty() {
            return;
        }
        let mut fill = self.device.fill(to_fill.len() as u32);
        let room = (fill.capacity() as usize).min(to_fill.len());
        let umem = &self.umem;
        fill.insert(
            to_fill
                .drain(..room)
                .map(|buffer| umem.fill_address(buffer)),
        );
        fill.commit();
    }

    /// Takes back the transmit slots whose frames the kernel has sent.
    fn reclaim(&mut self) {
        let mut done = self.device.complete(RING_SIZE);
        while let Some(address) = done.read() {
            // SAFETY: read from this UMEM's completion ring just now.
            #[allow(unsafe_code)]
            if let Some(slot) = unsafe { self.umem.completed(address) } {
                self.free_tx.push(slot);
            }
        }
        done.release();
    }
}

impl AfXdpBackend {
    /// Attaches our program to `interface` (in the calling thread's network namespace) and
    /// binds a socket to each of its receive queues.
    pub fn open(interface: &str, mode: XdpMode) -> io::Result<Self> {
        Self::open_on(interface, mode, None)
    }

    /// Binds a socket to receive queue `queue` of `interface` only, for an engine of its
    /// own: it receives what arrives on that queue and sends from it (on veth, the peer
    /// receives on the queue we send from, so engines on queue k of both ends talk through
    /// queue k). Backends of one process share the interface's program, each queue bound
    /// once (`EBUSY` otherwise).
    pub fn open_queue(interface: &str, mode: XdpMode, queue: u32) -> io::Result<Self> {
        Self::open_on(interface, mode, Some(queue))
    }

    fn open_on(interface: &str, mode: XdpMode, only: Option<u32>) -> io::Result<Self> {
        let started = Instant::now();
        loop {
            match Self::try_open(interface, mode, only) {
                Err(error)
                    if error.raw_os_error() == Some(libc::EBUSY)
                        && started.elapsed() < BUSY_QUEUE_WAIT =>
                {
                    std::thread::sleep(BUSY_QUEUE_RETRY);
                }
                opened => return opened,
            }
        }
    }

    fn try_open(interface: &str, mode: XdpMode, only: Option<u32>) -> io::Result<Self> {
        let name = CString::new(interface).map_err(io::Error::other)?;
        let mut info = IfInfo::invalid();
        info.from_name(&name)
            .map_err(|error| io::Error::other(format!("AF_XDP on {interface}: {error}")))?;
        if only.is_some_and(|queue| queue >= MAX_QUEUES) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("queues are numbered below {MAX_QUEUES}"),
            ));
        }
        let attached = Attached::on(info.ifindex(), mode)?;
        let queues = match only {
            Some(queue) => vec![Queue::open(&info, queue)?],
            None => Self::every_queue(&info, interface)?,
        };
        let claims = queues
            .iter()
            .map(|queue| attached.claim(queue.id, queue.fd()))
            .collect::<io::Result<_>>()?;
        Ok(AfXdpBackend {
            queues,
            _claims: claims,
            epoll: epoll::create(epoll::CreateFlags::CLOEXEC)?,
            listening: false,
            next_rx: 0,
        })
    }

    /// A socket on each receive queue of the interface.
    fn every_queue(info: &IfInfo, interface: &str) -> io::Result<Vec<Queue>> {
        // Queue 0 always exists; the others until binding fails (the kernel refuses a queue
        // the interface does not have).
        let mut queues = vec![Queue::open(info, 0)?];
        loop {
            let queue = match Queue::open(info, queues.len() as u32) {
                Ok(queue) => queue,
                // Binding a queue the interface does not have fails with EINVAL.
                Err(error) if error.raw_os_error() == Some(libc::EINVAL) => break,
                Err(error) => return Err(error),
            };
            if queues.len() as u32 == MAX_QUEUES {
                return Err(io::Error::other(format!(
                    "{interface} has more than {MAX_QUEUES} receive queues; \
                     reduce them (ethtool -L {interface} combined {MAX_QUEUES})"
                )));
            }
            queues.push(queue);
        }
        Ok(queues)
    }

    /// What the sockets have seen, all queues together.
    pub fn stats(&self) -> AfXdpStats {
        self.queues
            .iter()
            .fold(AfXdpStats::default(), |sum, queue| {
                let queue = queue.received.stats;
                AfXdpStats {
                    received: sum.received + queue.received,
                    gathered: sum.gathered + queue.gathered,
                    oversized: sum.oversized + queue.oversized,
                }
            })
    }

    /// Every socket's fd: polled readable when it has a frame (by a sleeper, in poll(2)).
    pub fn fds(&self) -> Vec<BorrowedFd<'_>> {
        self.queues.iter().map(Queue::fd).collect()
    }

    /// The kernel's counters (`XDP_STATISTICS`) of each socket: frames it dropped for a full
    /// RX ring or an empty fill ring, descriptors it refused.
    pub fn kernel_statistics(&self) -> io::Result<Vec<xdpilone::xdp::XdpStatisticsV2>> {
        self.queues
            .iter()
            .map(|queue| queue.device.statistics_v2().map_err(errno))
            .collect()
    }
}

impl Queue {
    /// Lends `fill` a transmit slot of `len` bytes and queues the frame it writes (of the
    /// length it returns; 0 sends nothing). The frame leaves at the next [`kick`](Self::kick).
    fn transmit(&mut self, len: usize, fill: Fill<'_>) -> io::Result<()> {
        if len > TX_SLOT as usize {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "frame larger than a transmit slot",
            ));
        }
        // Room for two descriptors, counted from the kernel's real consumer: xdpilone
        // refreshes its cached view only when it has no free slot cached, so asking for two
        // when one is cached would fail for ever.
        let ring_full = |tx: &RingTx| RING_SIZE - tx.pending() < 2;
        self.reclaim();
        if self.free_tx.is_empty() || ring_full(&self.tx) {
            // Let the kernel finish what is queued, then look again.
            self.kick();
            self.reclaim();
        }
        if ring_full(&self.tx) {
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                "AF_XDP TX ring full",
            ));
        }
        let Some(mut slot) = self.free_tx.pop() else {
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                "AF_XDP TX slots all in flight",
            ));
        };
        let Some(written) = fill_frame(&mut self.umem.slot_mut(&mut slot)[..len], fill) else {
            self.free_tx.push(slot);
            return Ok(());
        };
        // The slot is the kernel's from here until its completion comes back.
        let (first, second) = self.umem.descriptors(slot, written);
        for desc in std::iter::once(first).chain(second) {
            let mut writer = self.tx.transmit(1);
            writer.insert_once(desc);
            writer.commit();
            self.unkicked += 1;
        }
        Ok(())
    }

    /// Makes the kernel send what is queued: copy mode sends only inside a `sendto`, at most
    /// 32 frames per call, so kick until the ring is drained (bounded).
    fn kick(&mut self) {
        if self.unkicked == 0 && self.tx.pending() == 0 {
            return;
        }
        for _ in 0..MAX_KICKS {
            let before = self.tx.pending();
            if before == 0 || !self.tx.needs_wakeup() {
                break;
            }
            self.tx.wake();
            if self.tx.pending() == before {
                break; // the device takes no more now
            }
        }
        self.unkicked = 0;
    }

    /// Hands up to `budget` received frames to `handler`, each where it lies in the UMEM;
    /// returns how many.
    fn receive(&mut self, budget: usize, handler: &mut dyn FnMut(&[u8])) -> usize {
        let mut delivered = 0;
        // Each pass reads at least one descriptor or ends the loop.
        while delivered < budget {
            let mut reader = self.rx.receive(RX_BATCH);
            if reader.capacity() == 0 {
                break;
            }
            delivered += self
                .received
                .take(&mut reader, &self.umem, budget - delivered, handler);
            reader.release();
            drop(reader);
            self.refill();
        }
        delivered
    }
}

impl Received {
    /// Reads descriptors until `budget` frames went to `handler` or none is left.
    fn take(
        &mut self,
        reader: &mut xdpilone::ReadRx<'_>,
        umem: &Umem,
        budget: usize,
        handler: &mut dyn FnMut(&[u8]),
    ) -> usize {
        let mut delivered = 0;
        // A frame's descriptors arrive together, so stopping between frames splits none;
        // a frame cut by the end of the batch is finished in the next.
        while delivered < budget || !self.pieces.is_empty() {
            let Some(desc) = reader.read() else { break };
            // SAFETY: read from this UMEM's RX ring just now.
            #[allow(unsafe_code)]
            let Some(buffer) = (unsafe { umem.received(desc.addr) }) else {
                continue;
            };
            if self.pieces.len() == MAX_PIECES {
                // Too long to be ours: keep the buffers moving, drop the frame at its end.
                self.to_fill.extend(self.pieces.drain(..));
                self.piece_lens.clear();
                self.cut = true;
            }
            self.pieces.push(buffer);
            self.piece_lens.push(desc.len);
            if desc.options & XDP_PKT_CONTD != 0 {
                continue;
            }
            if std::mem::take(&mut self.cut) {
                self.stats.oversized += 1;
            } else if self.deliver(umem, handler) {
                delivered += 1;
            }
            self.to_fill.extend(self.pieces.drain(..));
            self.piece_lens.clear();
        }
        delivered
    }

    /// Hands the frame in `self.pieces` to `handler`: in place when its buffers are adjacent
    /// (almost always), else put together in `scratch`. `false` when it was dropped.
    fn deliver(&mut self, umem: &Umem, handler: &mut dyn FnMut(&[u8])) -> bool {
        let len: usize = self.piece_lens.iter().map(|&len| len as usize).sum();
        let whole = self
            .piece_lens
            .iter()
            .rev()
            .skip(1)
            .all(|&len| u64::from(len) == RX_STRIDE);
        if let Some(frame) = umem.frame(&self.pieces, len).filter(|_| whole) {
            handler(frame);
        } else if len <= self.scratch.len() {
            let mut end = 0;
            for (buffer, &piece) in self.pieces.iter().zip(&self.piece_lens) {
                let piece = piece as usize;
                let Some(bytes) = umem.frame(std::slice::from_ref(buffer), piece) else {
                    return false;
                };
                self.scratch[end..end + piece].copy_from_slice(bytes);
                end += piece;
            }
            self.stats.gathered += 1;
            handler(&self.scratch[..end]);
        } else {
            self.stats.oversized += 1;
            return false;
        }
        self.stats.received += 1;
        true
    }
}

impl Backend for AfXdpBackend {
    fn receive(&mut self, budget: usize, handler: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
        // Every queue in turn, starting after the one served first last time, so none
        // starves the others.
        let count = self.queues.len();
        let mut delivered = 0;
        for step in 0..count {
            let queue = &mut self.queues[(self.next_rx + step) % count];
            delivered += queue.receive(budget - delivered, handler);
            if delivered == budget {
                break;
            }
        }
        self.next_rx = (self.next_rx + 1) % count;
        Ok(delivered)
    }

    fn transmit(&mut self, len: usize, flow: u16, fill: Fill<'_>) -> io::Result<()> {
        // One transmit queue per flow, so a QP's frames keep their order and flows spread
        // over the queues (on veth, the peer receives on the queue we send from).
        let index = usize::from(flow) % self.queues.len();
        self.queues[index].transmit(len, fill)
    }

    fn submit(&mut self) -> io::Result<()> {
        for queue in &mut self.queues {
            queue.kick();
        }
        Ok(())
    }

    fn wait(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        poll_readable(&self.fds(), timeout)
    }

    fn readiness_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.epoll.as_fd())
    }

    fn listen(&mut self, on: bool) -> io::Result<()> {
        if on == self.listening {
            return Ok(());
        }
        for fd in self.fds() {
            if on {
                epoll::add(
                    &self.epoll,
                    fd,
                    epoll::EventData::new_u64(0),
                    epoll::EventFlags::IN,
                )?;
            } else {
                epoll::delete(&self.epoll, fd)?;
            }
        }
        self.listening = on;
        Ok(())
    }

    fn received_per_queue(&self) -> Vec<u64> {
        self.queues
            .iter()
            .map(|queue| queue.received.stats.received)
            .collect()
    }
}

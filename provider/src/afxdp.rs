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

use std::alloc::{self, Layout};
use std::ffi::CString;
use std::io;
use std::num::NonZeroU32;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::time::Duration;

use rustix::event::{epoll, poll, PollFd, PollFlags, Timespec};
use xdpilone::xdp::XdpDesc;
use xdpilone::{DeviceQueue, IfInfo, RingRx, RingTx, Socket, SocketConfig, Umem, UmemConfig};

use crate::backend::Backend;
use crate::xdp::{XdpMode, XdpProgram};

/// UMEM chunk size: a page; larger needs hugepages.
const FRAME_SIZE: u32 = 4096;
/// Chunks for receiving (the fill ring is smaller, so the kernel never runs dry while we hold
/// some) and as many for sending.
const RX_FRAMES: u32 = 2048;
const TX_FRAMES: u32 = 1024;
const RING_SIZE: u32 = 1024;
/// Bind flag for multi-buffer frames (linux/if_xdp.h, kernel 6.6 on).
const XDP_USE_SG: u16 = 1 << 4;
/// Descriptor option: more of this frame follows in the next descriptor.
const XDP_PKT_CONTD: u32 = 1;
/// Largest frame sent or received: path MTU 4096 plus every header, with room to spare.
pub const MAX_FRAME: usize = 2 * FRAME_SIZE as usize;

/// Page-aligned memory the kernel reads and writes frames in.
struct Area {
    memory: NonNull<u8>,
    layout: Layout,
}

impl Area {
    fn new(len: usize) -> io::Result<Area> {
        let layout = Layout::from_size_align(len, 4096).map_err(io::Error::other)?;
        // SAFETY: the layout has a non-zero size.
        #[allow(unsafe_code)]
        let memory = unsafe { alloc::alloc_zeroed(layout) };
        let memory = NonNull::new(memory).ok_or_else(|| io::Error::other("out of memory"))?;
        Ok(Area { memory, layout })
    }

    fn as_slice_ptr(&self) -> NonNull<[u8]> {
        NonNull::slice_from_raw_parts(self.memory, self.layout.size())
    }

    /// The bytes at `offset..offset + len`.
    ///
    /// The kernel writes a chunk only while it sits in the fill ring, and reads one only while
    /// it sits in the TX ring; we touch chunks outside those times only.
    fn bytes(&mut self, offset: u64, len: usize) -> &mut [u8] {
        assert!(
            offset as usize + len <= self.layout.size(),
            "descriptor outside the UMEM"
        );
        // SAFETY: in bounds (checked), and the kernel does not use the chunk now (above).
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts_mut(self.memory.as_ptr().add(offset as usize), len)
        }
    }
}

impl Drop for Area {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout; the socket using it is closed first
        // (it is declared before the area in `AfXdpBackend`).
        #[allow(unsafe_code)]
        unsafe {
            alloc::dealloc(self.memory.as_ptr(), self.layout)
        }
    }
}

/// One AF_XDP socket bound to one receive queue, with its own UMEM.
struct Queue {
    // Field order is drop order: rings and socket before the UMEM and its memory.
    rx: RingRx,
    tx: RingTx,
    device: DeviceQueue,
    _socket: Socket,
    _umem: Umem,
    area: Area,
    /// RX chunks we hold, waiting for room in the fill ring.
    to_fill: Vec<u64>,
    /// TX chunks free to write a frame into.
    free_tx: Vec<u64>,
    /// The first pieces of a multi-buffer frame whose last piece has not been read yet.
    partial: Vec<u8>,
    fd: i32,
    /// Frames received on this queue.
    received: u64,
}

// SAFETY: every part (rings, UMEM mapping, memory area) is owned by this value alone and used
// only through `&mut self`; nothing is tied to the thread that created it.
#[allow(unsafe_code)]
unsafe impl Send for Queue {}

/// Most receive queues we bind (each has its own UMEM of 3,072 pages, 12 MiB); an interface
/// with more must be given fewer (`ethtool -L IFACE combined 16`), or the frames RSS spreads
/// to the others would reach the kernel instead of us.
pub const MAX_QUEUES: u32 = 16;

/// AF_XDP sockets on every receive queue of one interface (RSS may put any QP's flow on
/// any queue), with our XDP program attached.
pub struct AfXdpBackend {
    // Sockets close before the program goes.
    queues: Vec<Queue>,
    program: XdpProgram,
    /// All sockets' fds, so one fd polls readable when any has a frame.
    epoll: OwnedFd,
    /// Where the next `recv` looks first, so no queue starves the others.
    next_rx: usize,
}

fn errno(error: xdpilone::Errno) -> io::Error {
    io::Error::from_raw_os_error(error.get_raw())
}

impl Queue {
    /// Binds a socket to queue `queue` of the interface in `info`.
    fn open(info: &IfInfo, queue: u32) -> io::Result<Queue> {
        let mut info = *info;
        info.set_queue(queue);
        let area = Area::new(((RX_FRAMES + TX_FRAMES) * FRAME_SIZE) as usize)?;
        let config = UmemConfig {
            fill_size: RING_SIZE,
            complete_size: RING_SIZE,
            frame_size: FRAME_SIZE,
            headroom: 0,
            flags: 0,
        };
        // SAFETY: the area is page-aligned and outlives the UMEM (field order above).
        #[allow(unsafe_code)]
        let umem = unsafe { Umem::new(config, area.as_slice_ptr()) }.map_err(errno)?;
        let socket = Socket::with_shared(&info, &umem).map_err(errno)?;
        let device = umem.fq_cq(&socket).map_err(errno)?;
        let rings = SocketConfig {
            rx_size: NonZeroU32::new(RING_SIZE),
            tx_size: NonZeroU32::new(RING_SIZE),
            bind_flags: SocketConfig::XDP_BIND_COPY | XDP_USE_SG,
        };
        let user = umem.rx_tx(&socket, &rings).map_err(errno)?;
        let rx = user.map_rx().map_err(errno)?;
        let tx = user.map_tx().map_err(errno)?;
        umem.bind(&user).map_err(errno)?;
        let fd = user.as_raw_fd();
        let to_fill: Vec<u64> = (0..RX_FRAMES).map(|i| u64::from(i * FRAME_SIZE)).collect();
        let free_tx = (RX_FRAMES..RX_FRAMES + TX_FRAMES)
            .map(|i| u64::from(i * FRAME_SIZE))
            .collect();
        let mut queue = Queue {
            rx,
            tx,
            device,
            _socket: socket,
            _umem: umem,
            area,
            to_fill,
            free_tx,
            partial: Vec::new(),
            fd,
            received: 0,
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

    /// Gives held RX chunks to the kernel, as many as the fill ring has room for.
    fn refill(&mut self) {
        let mut fill = self.device.fill(self.to_fill.len() as u32);
        let room = fill.capacity() as usize;
        let start = self.to_fill.len() - room.min(self.to_fill.len());
        let given = fill.insert(self.to_fill[start..].iter().copied()) as usize;
        fill.commit();
        drop(fill);
        self.to_fill.truncate(self.to_fill.len() - given);
    }

    /// Takes back TX chunks the kernel has sent.
    fn reclaim(&mut self) {
        let mut done = self.device.complete(TX_FRAMES);
        while let Some(offset) = done.read() {
            self.free_tx.push(offset - offset % u64::from(FRAME_SIZE));
        }
        done.release();
    }
}

impl AfXdpBackend {
    /// Attaches our program to `interface` (in the calling thread's network namespace) and
    /// binds a socket to each of its receive queues.
    pub fn open(interface: &str, mode: XdpMode) -> io::Result<Self> {
        let name = CString::new(interface).map_err(io::Error::other)?;
        let mut info = IfInfo::invalid();
        info.from_name(&name)
            .map_err(|error| io::Error::other(format!("AF_XDP on {interface}: {error}")))?;
        let mut program = XdpProgram::load(MAX_QUEUES, true)?;
        program.attach(info.ifindex(), mode)?;
        // Queue 0 always exists; the others until binding fails (the kernel refuses a queue
        // the interface does not have).
        let mut queues = vec![Queue::open(&info, 0)?];
        loop {
            let queue = match Queue::open(&info, queues.len() as u32) {
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
        let epoll = epoll::create(epoll::CreateFlags::CLOEXEC)?;
        for (index, queue) in queues.iter().enumerate() {
            program.register_socket(index as u32, queue.fd())?;
            epoll::add(
                &epoll,
                queue.fd(),
                epoll::EventData::new_u64(index as u64),
                epoll::EventFlags::IN,
            )?;
        }
        Ok(AfXdpBackend {
            queues,
            program,
            epoll,
            next_rx: 0,
        })
    }

    /// The program, e.g. to detach it early.
    pub fn program(&mut self) -> &mut XdpProgram {
        &mut self.program
    }
}

impl Queue {
    fn send(&mut self, frame: &[u8]) -> io::Result<()> {
        self.reclaim();
        let pieces = frame.chunks(FRAME_SIZE as usize);
        if self.free_tx.len() < pieces.len() {
            // Let the kernel finish what is queued, then look again.
            self.tx.wake();
            self.reclaim();
        }
        if self.free_tx.len() < pieces.len() {
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                "AF_XDP TX ring full",
            ));
        }
        let count = pieces.len();
        let mut descs = Vec::with_capacity(count);
        for (i, piece) in pieces.enumerate() {
            let offset = self.free_tx.pop().unwrap_or_default();
            self.area.bytes(offset, piece.len()).copy_from_slice(piece);
            let options = if i + 1 < count { XDP_PKT_CONTD } else { 0 };
            descs.push(XdpDesc {
                addr: offset,
                len: piece.len() as u32,
                options,
            });
        }
        // The kernel must never see the first piece of a frame without the rest, so check the
        // ring's real room first, then queue piece by piece: xdpilone refreshes its view of the
        // kernel's consumer only when it has no free slot cached, so asking for two at once
        // when one is cached would fail for ever (seen as a stalled sender at path MTU 4096).
        if RING_SIZE - self.tx.pending() < count as u32 {
            self.free_tx.extend(descs.iter().map(|desc| desc.addr));
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                "AF_XDP TX ring full",
            ));
        }
        for desc in &descs {
            let mut writer = self.tx.transmit(1);
            let queued = writer.insert_once(*desc);
            writer.commit();
            drop(writer);
            if !queued {
                return Err(io::Error::other(
                    "AF_XDP TX ring full in the middle of a frame",
                ));
            }
        }
        // Copy mode sends only when kicked.
        self.tx.wake();
        Ok(())
    }

    fn recv(&mut self, buffer: &mut [u8]) -> Option<usize> {
        loop {
            let mut reader = self.rx.receive(1);
            let desc = reader.read();
            reader.release();
            drop(reader);
            let Some(desc) = desc else {
                self.refill();
                return None;
            };
            let piece = self.area.bytes(desc.addr, desc.len as usize).to_vec();
            self.to_fill
                .push(desc.addr - desc.addr % u64::from(FRAME_SIZE));
            self.partial.extend_from_slice(&piece);
            if desc.options & XDP_PKT_CONTD != 0 {
                continue; // the rest of the frame is in the next descriptor
            }
            self.refill();
            let len = self.partial.len().min(buffer.len());
            buffer[..len].copy_from_slice(&self.partial[..len]);
            self.partial.clear();
            self.received += 1;
            return Some(len);
        }
    }
}

/// The UDP source port of a RoCEv2 frame over IPv4 or IPv6 (an 802.1Q tag allowed), which
/// carries the sending QP's flow entropy.
fn flow_entropy(frame: &[u8]) -> u16 {
    let (ethertype, ip) = match frame.get(12..14) {
        Some([0x81, 0x00]) => (frame.get(16..18), 18),
        other => (other, 14),
    };
    let udp = match ethertype {
        Some([0x08, 0x00]) => ip + 4 * usize::from(frame.get(ip).map_or(5, |b| b & 0xF)),
        Some([0x86, 0xDD]) => ip + 40,
        _ => return 0,
    };
    frame
        .get(udp..udp + 2)
        .map_or(0, |port| u16::from_be_bytes([port[0], port[1]]))
}

impl Backend for AfXdpBackend {
    fn send(&mut self, frame: &[u8]) -> io::Result<()> {
        if frame.len() > MAX_FRAME {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "frame larger than two UMEM chunks",
            ));
        }
        // One transmit queue per flow (the QP's UDP source port), so a QP's frames keep
        // their order and flows spread over the queues as RSS spreads them on receive.
        let index = usize::from(flow_entropy(frame)) % self.queues.len();
        self.queues[index].send(frame)
    }

    fn recv(&mut self, buffer: &mut [u8]) -> io::Result<Option<usize>> {
        let count = self.queues.len();
        for step in 0..count {
            let index = (self.next_rx + step) % count;
            if let Some(len) = self.queues[index].recv(buffer) {
                self.next_rx = (index + 1) % count;
                return Ok(Some(len));
            }
        }
        Ok(None)
    }

    fn wait(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        let timeout = timeout
            .map(Timespec::try_from)
            .transpose()
            .map_err(io::Error::other)?;
        let mut fds = [PollFd::new(&self.epoll, PollFlags::IN)];
        match poll(&mut fds, timeout.as_ref()) {
            Ok(_) | Err(rustix::io::Errno::INTR) => Ok(()),
            Err(error) => Err(error.into()),
        }
    }

    fn readiness_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.epoll.as_fd())
    }

    fn received_per_queue(&self) -> Vec<u64> {
        self.queues.iter().map(|queue| queue.received).collect()
    }
}

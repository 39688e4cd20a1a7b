//! The AF_XDP backend: frames of UDP port 4791 come straight from the driver into our
//! memory through an AF_XDP socket, bypassing the kernel's stack; everything else still goes
//! to the kernel (our XDP program decides, see [`crate::xdp`]).
//!
//! Rings come from the `xdpilone` crate: pure Rust, builds in seconds with no system packages
//! (xsk-rs needs libxdp's C build, and libxdp's default program also swallows ARP and outlives
//! a crashed process). One socket on one queue, copy mode (veth has no zero-copy). A UMEM chunk
//! holds 4096 bytes, of which copy mode keeps 256 as headroom on receive, so frames of path MTU
//! 4096 span two chunks: the socket is bound with XDP_USE_SG and the program loaded with frags
//! support, and a frame's descriptors carry XDP_PKT_CONTD on all but the last.

use std::alloc::{self, Layout};
use std::ffi::CString;
use std::io;
use std::num::NonZeroU32;
use std::os::fd::BorrowedFd;
use std::ptr::NonNull;
use std::time::Duration;

use rustix::event::{poll, PollFd, PollFlags, Timespec};
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

/// An AF_XDP socket on queue 0 of one interface, with our XDP program attached.
pub struct AfXdpBackend {
    // Field order is drop order: rings and socket before the UMEM and its memory.
    rx: RingRx,
    tx: RingTx,
    device: DeviceQueue,
    _socket: Socket,
    _umem: Umem,
    area: Area,
    program: XdpProgram,
    /// RX chunks we hold, waiting for room in the fill ring.
    to_fill: Vec<u64>,
    /// TX chunks free to write a frame into.
    free_tx: Vec<u64>,
    /// The first pieces of a multi-buffer frame whose last piece has not been read yet.
    partial: Vec<u8>,
    fd: i32,
}

// SAFETY: every part (rings, UMEM mapping, memory area) is owned by this value alone and used
// only through `&mut self`; nothing is tied to the thread that created it.
#[allow(unsafe_code)]
unsafe impl Send for AfXdpBackend {}

fn errno(error: xdpilone::Errno) -> io::Error {
    io::Error::other(format!("AF_XDP: {error}"))
}

impl AfXdpBackend {
    /// Attaches our program to `interface` (in the calling thread's network namespace) and
    /// binds a socket to its queue 0.
    pub fn open(interface: &str, mode: XdpMode) -> io::Result<Self> {
        let name = CString::new(interface).map_err(io::Error::other)?;
        let mut info = IfInfo::invalid();
        info.from_name(&name).map_err(errno)?;
        info.set_queue(0);
        let mut program = XdpProgram::load(1, true)?;
        program.attach(info.ifindex(), mode)?;

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
        // SAFETY: `fd` is the socket's, open for as long as `user`'s rings, which we keep.
        #[allow(unsafe_code)]
        program.register_socket(0, unsafe { BorrowedFd::borrow_raw(fd) })?;

        let to_fill: Vec<u64> = (0..RX_FRAMES).map(|i| u64::from(i * FRAME_SIZE)).collect();
        let free_tx = (RX_FRAMES..RX_FRAMES + TX_FRAMES)
            .map(|i| u64::from(i * FRAME_SIZE))
            .collect();
        let mut backend = AfXdpBackend {
            rx,
            tx,
            device,
            _socket: socket,
            _umem: umem,
            area,
            program,
            to_fill,
            free_tx,
            partial: Vec::new(),
            fd,
        };
        backend.refill();
        Ok(backend)
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

    /// The program, e.g. to detach it early.
    pub fn program(&mut self) -> &mut XdpProgram {
        &mut self.program
    }
}

impl Backend for AfXdpBackend {
    fn send(&mut self, frame: &[u8]) -> io::Result<()> {
        if frame.len() > MAX_FRAME {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "frame larger than two UMEM chunks",
            ));
        }
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

    fn recv(&mut self, buffer: &mut [u8]) -> io::Result<Option<usize>> {
        loop {
            let mut reader = self.rx.receive(1);
            let desc = reader.read();
            reader.release();
            drop(reader);
            let Some(desc) = desc else {
                self.refill();
                return Ok(None);
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
            return Ok(Some(len));
        }
    }

    fn wait(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        let timeout = timeout
            .map(Timespec::try_from)
            .transpose()
            .map_err(io::Error::other)?;
        // SAFETY: `self.fd` is the socket's, open while `self` lives.
        #[allow(unsafe_code)]
        let fd = unsafe { BorrowedFd::borrow_raw(self.fd) };
        let mut fds = [PollFd::from_borrowed_fd(fd, PollFlags::IN)];
        match poll(&mut fds, timeout.as_ref()) {
            Ok(_) | Err(rustix::io::Errno::INTR) => Ok(()),
            Err(error) => Err(error.into()),
        }
    }

    fn readiness_fd(&self) -> Option<BorrowedFd<'_>> {
        // SAFETY: `self.fd` is the socket's, open while `self` lives, which the borrow ties.
        #[allow(unsafe_code)]
        Some(unsafe { BorrowedFd::borrow_raw(self.fd) })
    }
}

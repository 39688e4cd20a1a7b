//! The one interface every way of moving Ethernet frames implements.

use std::io;
use std::os::fd::BorrowedFd;
use std::time::Duration;

/// Largest frame any backend carries: path MTU 4096 plus every header (Ethernet, 802.1Q,
/// IPv6, UDP, BTH, extension headers, ICRC), rounded up to two 4096-byte UMEM chunks.
pub const MAX_FRAME: usize = 2 * 4096;

/// Sends and receives whole Ethernet frames (from the destination MAC to the end of the
/// payload; no FCS).
///
/// Wrappers ([`FaultInjector`](crate::fault::FaultInjector),
/// [`PcapRecorder`](crate::capture::PcapRecorder)) implement it over any other backend, so they
/// compose.
pub trait Backend: Send {
    /// Sends one frame.
    fn send(&mut self, frame: &[u8]) -> io::Result<()>;

    /// Copies one waiting frame into `buffer` and returns its length, or `None` when nothing
    /// is waiting. Never blocks. A frame longer than `buffer` is truncated.
    fn recv(&mut self, buffer: &mut [u8]) -> io::Result<Option<usize>>;

    /// Blocks until a frame may be waiting or `timeout` has passed (`None`: no limit).
    fn wait(&mut self, timeout: Option<Duration>) -> io::Result<()>;

    /// A file descriptor that polls readable when a frame may be waiting, so another thread
    /// can sleep in poll(2)/epoll without holding the backend. `None` when readiness is not
    /// a file descriptor's (the in-memory wire; wrappers that hold frames back): the caller
    /// then polls with short sleeps.
    fn readiness_fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }

    /// Frames received on each hardware receive queue, where the backend has queues (AF_XDP);
    /// empty otherwise.
    fn received_per_queue(&self) -> Vec<u64> {
        Vec::new()
    }
}

impl<B: Backend + ?Sized> Backend for Box<B> {
    fn send(&mut self, frame: &[u8]) -> io::Result<()> {
        (**self).send(frame)
    }

    fn recv(&mut self, buffer: &mut [u8]) -> io::Result<Option<usize>> {
        (**self).recv(buffer)
    }

    fn wait(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        (**self).wait(timeout)
    }

    fn readiness_fd(&self) -> Option<BorrowedFd<'_>> {
        (**self).readiness_fd()
    }

    fn received_per_queue(&self) -> Vec<u64> {
        (**self).received_per_queue()
    }
}

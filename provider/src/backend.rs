//! The one interface every way of moving Ethernet frames implements.

use std::io;
use std::os::fd::BorrowedFd;
use std::time::Duration;

/// Largest frame any backend carries: path MTU 4096 plus every header (Ethernet, 802.1Q,
/// IPv6, UDP, BTH, extension headers, ICRC), rounded up to two 4096-byte UMEM chunks.
pub const MAX_FRAME: usize = 2 * 4096;

/// What [`Backend::transmit`] lends a buffer to: it writes one frame and returns its length
/// (0: nothing to send).
pub type Fill<'a> = &'a mut dyn FnMut(&mut [u8]) -> usize;

/// Moves whole Ethernet frames (from the destination MAC to the end of the payload; no FCS)
/// without copying them in the interface: a received frame is lent to a handler where it
/// lies, and a frame to send is written straight into a buffer the backend lends, as
/// smoltcp's `RxToken`/`TxToken` do.
///
/// Calling order: [`transmit`](Self::transmit) any number of times, then
/// [`submit`](Self::submit) once for the batch (the AF_XDP backend kicks the kernel there).
///
/// Wrappers ([`FaultInjector`](crate::fault::FaultInjector),
/// [`PcapRecorder`](crate::capture::PcapRecorder)) implement it over any other backend, so they
/// compose.
pub trait Backend: Send {
    /// Hands up to `budget` waiting frames to `handler`, one at a time, each lent where it
    /// lies; returns how many. Never blocks.
    fn receive(&mut self, budget: usize, handler: &mut dyn FnMut(&[u8])) -> io::Result<usize>;

    /// Lends `fill` a buffer of `len` bytes (at most [`MAX_FRAME`]) for one frame; `fill`
    /// writes the frame and returns its length (0: nothing to send). `flow` is the frame's
    /// flow entropy (its UDP source port): frames of one flow leave in order. The frame may
    /// wait in the backend until [`submit`](Self::submit). `WouldBlock` when the backend has
    /// no room now: nothing was sent.
    fn transmit(&mut self, len: usize, flow: u16, fill: Fill<'_>) -> io::Result<()>;

    /// Hands the frames [`transmit`](Self::transmit) queued to the wire.
    fn submit(&mut self) -> io::Result<()> {
        Ok(())
    }

    /// Blocks until a frame may be waiting or `timeout` has passed (`None`: no limit).
    fn wait(&mut self, timeout: Option<Duration>) -> io::Result<()>;

    /// A file descriptor that polls readable when a frame may be waiting, while
    /// [`listen`](Self::listen) is on, so another thread can sleep in poll(2) without
    /// holding the backend; the same for the backend's life. `None` when readiness is not a
    /// file descriptor's (the in-memory wire; wrappers that hold frames back): the caller
    /// then polls with short sleeps.
    fn readiness_fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }

    /// Whether a thread is about to sleep on [`readiness_fd`](Self::readiness_fd): the
    /// backend's sockets are in that epoll only from `listen(true)` to `listen(false)`. A
    /// socket an epoll holds for good costs every frame the kernel hands it a callback,
    /// whether or not anybody sleeps (through the two nested epolls a lone process's AF_XDP
    /// socket sat in, the 64 B WRITE rate was 0.32–0.44 M messages/s, without 0.49–0.54);
    /// and an epoll, unlike a duplicate fd, keeps no socket open that the backend closes.
    fn listen(&mut self, _on: bool) -> io::Result<()> {
        Ok(())
    }

    /// Frames received on each hardware receive queue, where the backend has queues (AF_XDP);
    /// empty otherwise.
    fn received_per_queue(&self) -> Vec<u64> {
        Vec::new()
    }

    /// Whether frames to this device's own MAC should be handed to the backend, which
    /// delivers them to whichever process owns their destination QP or CM ID (the switch
    /// of a device several processes share, [`crate::switch`]), rather than looped back by
    /// the engine, which knows only its own QPs. `false` for a device that is ours alone.
    fn loops_back(&self) -> bool {
        false
    }

    /// Sends one whole frame, copied in (for tests and tools that hold frames as bytes).
    fn send(&mut self, frame: &[u8]) -> io::Result<()> {
        self.transmit(frame.len(), flow_entropy(frame), &mut |buffer| {
            buffer.copy_from_slice(frame);
            frame.len()
        })?;
        self.submit()
    }

    /// Copies one waiting frame into `buffer` (truncated to fit) and returns its length, or
    /// `None` when nothing is waiting (for tests and tools that hold frames as bytes).
    fn recv(&mut self, buffer: &mut [u8]) -> io::Result<Option<usize>> {
        let mut received = None;
        self.receive(1, &mut |frame| {
            let len = frame.len().min(buffer.len());
            buffer[..len].copy_from_slice(&frame[..len]);
            received = Some(len);
        })?;
        Ok(received)
    }
}

/// Lends `buffer` to a [`Backend::transmit`] caller's `fill` and returns the length of the
/// frame it wrote, at most the buffer's; `None` when it wrote nothing to send.
#[inline]
pub(crate) fn fill_frame(buffer: &mut [u8], fill: Fill<'_>) -> Option<usize> {
    let written = fill(buffer).min(buffer.len());
    (written > 0).then_some(written)
}

impl<B: Backend + ?Sized> Backend for Box<B> {
    fn receive(&mut self, budget: usize, handler: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
        (**self).receive(budget, handler)
    }

    fn transmit(&mut self, len: usize, flow: u16, fill: Fill<'_>) -> io::Result<()> {
        (**self).transmit(len, flow, fill)
    }

    fn submit(&mut self) -> io::Result<()> {
        (**self).submit()
    }

    fn wait(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        (**self).wait(timeout)
    }

    fn readiness_fd(&self) -> Option<BorrowedFd<'_>> {
        (**self).readiness_fd()
    }

    fn listen(&mut self, on: bool) -> io::Result<()> {
        (**self).listen(on)
    }

    fn received_per_queue(&self) -> Vec<u64> {
        (**self).received_per_queue()
    }

    fn loops_back(&self) -> bool {
        (**self).loops_back()
    }
}

/// The error a backend gives, once, when its device is gone for good (the switch that
/// owned it died): the engine then fails every QP and raises `IBV_EVENT_DEVICE_FATAL`
/// rather than stopping (`Endpoint::device_fatal`).
pub fn device_lost(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::NotConnected, DeviceLost(why.to_owned()))
}

/// Whether `error` is [`device_lost`]'s.
pub fn is_device_lost(error: &io::Error) -> bool {
    error
        .get_ref()
        .is_some_and(|inner| inner.is::<DeviceLost>())
}

/// The payload of [`device_lost`]'s error.
#[derive(Debug)]
struct DeviceLost(String);

impl std::fmt::Display for DeviceLost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "device lost: {}", self.0)
    }
}

impl std::error::Error for DeviceLost {}

/// The UDP source port of a frame over IPv4 or IPv6 (an 802.1Q tag allowed), which in
/// RoCEv2 carries the sending QP's flow entropy; 0 for anything else.
pub fn flow_entropy(frame: &[u8]) -> u16 {
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

/// Sleeps in poll(2) until one of `fds` is readable or `timeout` passed (`None`: no limit);
/// a signal ends the sleep early. The `wait` of backends whose readiness is file descriptors.
pub fn poll_readable(fds: &[BorrowedFd<'_>], timeout: Option<Duration>) -> io::Result<()> {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let timeout = timeout
        .map(Timespec::try_from)
        .transpose()
        .map_err(io::Error::other)?;
    let mut polled: Vec<PollFd<'_>> = fds
        .iter()
        .map(|fd| PollFd::from_borrowed_fd(*fd, PollFlags::IN))
        .collect();
    match poll(&mut polled, timeout.as_ref()) {
        Ok(_) | Err(rustix::io::Errno::INTR) => Ok(()),
        Err(error) => Err(error.into()),
    }
}

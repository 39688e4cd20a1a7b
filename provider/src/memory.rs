//! An in-memory backend: two ends of a wire, for tests that need no network.

use std::io;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TryRecvError, TrySendError};
use std::time::Duration;

use crate::backend::{fill_frame, Backend, Fill};

/// Frames each direction of the wire holds before a sender finds it full (a NIC's ring).
pub const WIRE_CAPACITY: usize = 4096;

/// Longest a wait for the peer's frames leaves a third station's frames unnoticed.
const TAP_NOTICE: Duration = Duration::from_millis(1);

/// One end of an in-memory wire.
pub struct MemoryBackend {
    tx: SyncSender<Vec<u8>>,
    rx: Receiver<Vec<u8>>,
    /// A frame `wait` took off the channel before `recv` asked for it.
    waiting: Option<Vec<u8>>,
    /// Frames from third stations ([`MemoryTap`]s), on a lane of their own as a switch
    /// queues each port apart, so they cannot crowd the peer's frames off the wire.
    taps: (SyncSender<Vec<u8>>, Receiver<Vec<u8>>),
    /// Which lane `recv` reads first, taking turns.
    tap_first: bool,
}

/// A third station sending to one end of a wire.
#[derive(Clone)]
pub struct MemoryTap {
    tx: SyncSender<Vec<u8>>,
}

impl MemoryTap {
    /// Sends one frame; `WouldBlock` when the wire is full.
    pub fn send(&self, frame: &[u8]) -> io::Result<()> {
        send(&self.tx, frame.to_vec())
    }
}

impl MemoryBackend {
    /// A third station sending to this end.
    pub fn tap(&self) -> MemoryTap {
        MemoryTap {
            tx: self.taps.0.clone(),
        }
    }

    /// The next waiting frame of either lane, taking turns.
    fn next_frame(&mut self) -> io::Result<Option<Vec<u8>>> {
        if let Some(frame) = self.waiting.take() {
            return Ok(Some(frame));
        }
        self.tap_first = !self.tap_first;
        let tap = self.taps.1.try_recv().ok();
        if self.tap_first && tap.is_some() {
            return Ok(tap);
        }
        match self.rx.try_recv() {
            Ok(frame) => {
                self.waiting = tap;
                Ok(Some(frame))
            }
            Err(TryRecvError::Empty) => Ok(tap),
            Err(TryRecvError::Disconnected) => Err(peer_gone()),
        }
    }
}

fn send(tx: &SyncSender<Vec<u8>>, frame: Vec<u8>) -> io::Result<()> {
    match tx.try_send(frame) {
        Ok(()) => Ok(()),
        Err(TrySendError::Full(_)) => Err(io::Error::new(
            io::ErrorKind::WouldBlock,
            "the memory wire is full",
        )),
        Err(TrySendError::Disconnected(_)) => Err(peer_gone()),
    }
}

/// Two connected ends: what one sends, the other receives, in order; each direction holds
/// [`WIRE_CAPACITY`] frames.
pub fn memory_pair() -> (MemoryBackend, MemoryBackend) {
    let (a_tx, b_rx) = mpsc::sync_channel(WIRE_CAPACITY);
    let (b_tx, a_rx) = mpsc::sync_channel(WIRE_CAPACITY);
    let end = |tx, rx| MemoryBackend {
        tx,
        rx,
        waiting: None,
        taps: mpsc::sync_channel(WIRE_CAPACITY),
        tap_first: false,
    };
    (end(a_tx, a_rx), end(b_tx, b_rx))
}

fn peer_gone() -> io::Error {
    io::Error::new(
        io::ErrorKind::BrokenPipe,
        "the other end of the memory wire is gone",
    )
}

impl Backend for MemoryBackend {
    fn receive(&mut self, budget: usize, handler: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
        for delivered in 0..budget {
            let Some(frame) = self.next_frame()? else {
                return Ok(delivered);
            };
            handler(&frame);
        }
        Ok(budget)
    }

    fn transmit(&mut self, len: usize, _flow: u16, fill: Fill<'_>) -> io::Result<()> {
        let mut frame = vec![0; len];
        let Some(written) = fill_frame(&mut frame, fill) else {
            return Ok(());
        };
        frame.truncate(written);
        send(&self.tx, frame)
    }

    fn wait(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        if self.waiting.is_some() {
            return Ok(());
        }
        if let Ok(frame) = self.taps.1.try_recv() {
            self.waiting = Some(frame);
            return Ok(());
        }
        // Tap frames arriving meanwhile are noticed within a millisecond.
        let timeout = timeout.map_or(TAP_NOTICE, |timeout| timeout.min(TAP_NOTICE));
        let frame = match self.rx.recv_timeout(timeout) {
            Ok(frame) => frame,
            Err(RecvTimeoutError::Timeout) => return Ok(()),
            Err(RecvTimeoutError::Disconnected) => return Err(peer_gone()),
        };
        self.waiting = Some(frame);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_cross_in_order() {
        let (mut a, mut b) = memory_pair();
        a.send(&[1, 2, 3]).unwrap();
        a.send(&[4]).unwrap();
        let mut buffer = [0u8; 16];
        b.wait(Some(Duration::from_secs(1))).unwrap();
        assert_eq!(b.recv(&mut buffer).unwrap(), Some(3));
        assert_eq!(&buffer[..3], &[1, 2, 3]);
        assert_eq!(b.recv(&mut buffer).unwrap(), Some(1));
        assert_eq!(b.recv(&mut buffer).unwrap(), None);
        b.wait(Some(Duration::from_millis(1))).unwrap();
        assert_eq!(b.recv(&mut buffer).unwrap(), None);
        drop(a);
        assert_eq!(
            b.recv(&mut buffer).unwrap_err().kind(),
            io::ErrorKind::BrokenPipe
        );
    }
}

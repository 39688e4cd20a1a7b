//! An in-memory backend: two ends of a wire, for tests that need no network.

use std::io;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::time::Duration;

use crate::backend::Backend;

/// One end of an in-memory wire.
pub struct MemoryBackend {
    tx: Sender<Vec<u8>>,
    rx: Receiver<Vec<u8>>,
    /// A frame `wait` took off the channel before `recv` asked for it.
    waiting: Option<Vec<u8>>,
}

/// Two connected ends: what one sends, the other receives, in order.
pub fn memory_pair() -> (MemoryBackend, MemoryBackend) {
    let (a_tx, b_rx) = mpsc::channel();
    let (b_tx, a_rx) = mpsc::channel();
    let end = |tx, rx| MemoryBackend {
        tx,
        rx,
        waiting: None,
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
    fn send(&mut self, frame: &[u8]) -> io::Result<()> {
        self.tx.send(frame.to_vec()).map_err(|_| peer_gone())
    }

    fn recv(&mut self, buffer: &mut [u8]) -> io::Result<Option<usize>> {
        let frame = match self.waiting.take() {
            Some(frame) => frame,
            None => match self.rx.try_recv() {
                Ok(frame) => frame,
                Err(TryRecvError::Empty) => return Ok(None),
                Err(TryRecvError::Disconnected) => return Err(peer_gone()),
            },
        };
        let len = frame.len().min(buffer.len());
        buffer[..len].copy_from_slice(&frame[..len]);
        Ok(Some(len))
    }

    fn wait(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        if self.waiting.is_some() {
            return Ok(());
        }
        let frame = match timeout {
            Some(timeout) => match self.rx.recv_timeout(timeout) {
                Ok(frame) => frame,
                Err(RecvTimeoutError::Timeout) => return Ok(()),
                Err(RecvTimeoutError::Disconnected) => return Err(peer_gone()),
            },
            None => self.rx.recv().map_err(|_| peer_gone())?,
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

//! The TCP side channel of perftest and of rdma-core's pingpongs: every read and write has a
//! deadline, a side that waits sleeps in poll(2) instead of spinning once nothing happens,
//! and every failure says, in words, what was expected from the peer.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags, Timespec};

use crate::signals;

/// How long a side keeps spinning after the last sign of life before it sleeps between
/// turns: long enough to ride out the gaps of a run, short enough to cost nothing idle.
const SPIN_FOR: Duration = Duration::from_millis(10);
/// How often a waiting side asks whether RDMA traffic still flows.
const CHECK_EVERY: Duration = Duration::from_millis(1);

/// What a side does while it waits for the peer.
pub trait Waiting {
    /// One turn of whatever must keep running meanwhile (our engine, when no thread of its
    /// own drives it).
    fn turn(&mut self) -> io::Result<()>;
    /// Whether anything happened since the last call: frames from the peer show that it is
    /// busy with us and not gone, which postpones the deadline.
    fn activity(&mut self) -> io::Result<bool>;
    /// Whether `turn` must be called as often as possible while there is activity (it
    /// drives the engine itself) rather than only every millisecond.
    fn spins(&self) -> bool;
}

/// Nothing to keep running.
pub struct Idle;

impl Waiting for Idle {
    fn turn(&mut self) -> io::Result<()> {
        Ok(())
    }
    fn activity(&mut self) -> io::Result<bool> {
        Ok(false)
    }
    fn spins(&self) -> bool {
        false
    }
}

/// A non-blocking TCP stream whose reads and writes wait at most `stall` without a sign of
/// life from the peer.
pub struct Channel<W> {
    stream: TcpStream,
    waiting: W,
    stall: Duration,
}

/// Which way a wait goes.
#[derive(Clone, Copy)]
enum Direction {
    In,
    Out,
}

impl<W: Waiting> Channel<W> {
    pub fn new(stream: TcpStream, waiting: W, stall: Duration) -> io::Result<Channel<W>> {
        stream.set_nodelay(true)?;
        stream.set_nonblocking(true)?;
        Ok(Channel {
            stream,
            waiting,
            stall,
        })
    }

    /// Writes the whole message (`what`, in words, for errors); it fits the socket buffer,
    /// so it leaves in one piece.
    pub fn write_all(&mut self, message: &[u8], what: &str) -> io::Result<()> {
        self.transfer(message.len(), what, Direction::Out, |stream, done| {
            stream.write(&message[done..])
        })
    }

    /// Reads exactly `buf.len()` bytes of the peer's `what`.
    pub fn read_exact(&mut self, buf: &mut [u8], what: &str) -> io::Result<()> {
        let len = buf.len();
        self.transfer(len, what, Direction::In, |stream, done| {
            stream.read(&mut buf[done..])
        })
    }

    /// Moves `len` bytes with `step` (given how many have moved), waiting in between.
    fn transfer(
        &mut self,
        len: usize,
        what: &str,
        direction: Direction,
        mut step: impl FnMut(&mut TcpStream, usize) -> io::Result<usize>,
    ) -> io::Result<()> {
        let mut done = 0;
        let mut wait = Wait::new(self.stall);
        while done < len {
            match step(&mut self.stream, done) {
                Ok(0) => return Err(closed(what, done, len, direction)),
                Ok(n) => {
                    done += n;
                    wait.restart();
                }
                Err(error) if retry(&error) => {
                    self.wait(&mut wait, direction)
                        .map_err(|e| late(e, what, done, len, direction))?;
                }
                Err(error) => return Err(broken(error, what, direction)),
            }
        }
        Ok(())
    }

    /// Half-closes, then keeps waiting (and our engine running) until the peer closes too or
    /// `stall` passes without a sign of life.
    pub fn linger(&mut self) -> io::Result<()> {
        self.stream.shutdown(std::net::Shutdown::Write)?;
        let mut wait = Wait::new(self.stall);
        let mut scratch = [0u8; 64];
        loop {
            match self.stream.read(&mut scratch) {
                Ok(0) => return Ok(()),
                Ok(_) => {}
                Err(error) if error.kind() == io::ErrorKind::ConnectionReset => return Ok(()),
                Err(error) if retry(&error) => {
                    if self.wait(&mut wait, Direction::In).is_err() {
                        return Ok(());
                    }
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// One step of waiting: a turn, then a spin or a short sleep on the socket; an error of
    /// kind `TimedOut` once `stall` passed without a sign of life.
    fn wait(&mut self, wait: &mut Wait, direction: Direction) -> io::Result<()> {
        signals::check()?;
        self.waiting.turn()?;
        let now = Instant::now();
        if now.duration_since(wait.checked) >= CHECK_EVERY {
            wait.checked = now;
            if self.waiting.activity()? {
                wait.alive = now;
            }
        }
        let quiet = now.duration_since(wait.alive);
        if quiet > wait.stall {
            return Err(io::ErrorKind::TimedOut.into());
        }
        if self.waiting.spins() && quiet < SPIN_FOR {
            std::hint::spin_loop();
            return Ok(());
        }
        let flags = match direction {
            Direction::In => PollFlags::IN,
            Direction::Out => PollFlags::OUT,
        };
        let nap = if self.waiting.spins() {
            CHECK_EVERY
        } else {
            Duration::from_millis(100)
        }
        .min(wait.stall - quiet);
        let timeout = Timespec {
            tv_sec: 0,
            tv_nsec: nap.as_nanos() as _,
        };
        let mut fds = [PollFd::new(&self.stream, flags)];
        match poll(&mut fds, Some(&timeout)) {
            Ok(_) | Err(rustix::io::Errno::INTR) => Ok(()),
            Err(errno) => Err(errno.into()),
        }
    }
}

/// The clock of one read or write.
struct Wait {
    stall: Duration,
    /// The last sign of life: a byte, or RDMA traffic.
    alive: Instant,
    /// The last time `activity` was asked.
    checked: Instant,
}

impl Wait {
    fn new(stall: Duration) -> Wait {
        let now = Instant::now();
        Wait {
            stall,
            alive: now,
            checked: now,
        }
    }

    fn restart(&mut self) {
        self.alive = Instant::now();
    }
}

fn retry(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
    )
}

impl Direction {
    /// What this side was doing with `what`, in words.
    fn doing(self, what: &str) -> String {
        match self {
            Direction::In => format!("waiting for its {what}"),
            Direction::Out => format!("sending our {what}"),
        }
    }
}

fn closed(what: &str, got: usize, want: usize, direction: Direction) -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        format!(
            "the peer closed the connection while {} ({got} of {want} bytes had passed)",
            direction.doing(what)
        ),
    )
}

fn late(error: io::Error, what: &str, got: usize, want: usize, direction: Direction) -> io::Error {
    match error.kind() {
        io::ErrorKind::TimedOut => {}
        io::ErrorKind::Interrupted => return error,
        _ => return broken(error, what, direction),
    }
    io::Error::new(
        io::ErrorKind::TimedOut,
        format!(
            "no sign of the peer while {} ({got} of {want} bytes had passed): it went \
             silent or away",
            direction.doing(what)
        ),
    )
}

fn broken(error: io::Error, what: &str, direction: Direction) -> io::Error {
    io::Error::new(
        error.kind(),
        format!(
            "the connection to the peer failed while {}: {error}",
            direction.doing(what)
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        (client, listener.accept().unwrap().0)
    }

    #[test]
    fn a_silent_peer_is_an_error_naming_what_was_expected() {
        let (_silent, ours) = pair();
        let mut channel = Channel::new(ours, Idle, Duration::from_millis(300)).unwrap();
        let mut buf = [0u8; 16];
        let error = channel.read_exact(&mut buf, "version").unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert!(
            error.to_string().contains("its version (0 of 16 bytes"),
            "{error}"
        );
    }

    #[test]
    fn a_closed_peer_is_an_error_in_words() {
        let (mut theirs, ours) = pair();
        theirs.write_all(b"6.0").unwrap();
        drop(theirs);
        let mut channel = Channel::new(ours, Idle, Duration::from_secs(10)).unwrap();
        let mut buf = [0u8; 16];
        let error = channel.read_exact(&mut buf, "version").unwrap_err();
        assert_eq!(
            error.to_string(),
            "the peer closed the connection while waiting for its version (3 of 16 bytes \
             had passed)"
        );
    }

    #[test]
    fn whole_messages_pass() {
        let (theirs, ours) = pair();
        let mut a = Channel::new(theirs, Idle, Duration::from_secs(10)).unwrap();
        let mut b = Channel::new(ours, Idle, Duration::from_secs(10)).unwrap();
        a.write_all(b"done\0", "closing word").unwrap();
        let mut buf = [0u8; 5];
        b.read_exact(&mut buf, "closing word").unwrap();
        assert_eq!(&buf, b"done\0");
    }
}

//! perftest's out-of-band TCP exchange: the preamble, the 108-byte key messages used as
//! barriers, and `done`.

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use roce_verbs::{Context, PathMtu};

use super::{Args, Test, Verb, CACHE_LINE, PAGE, VERSION};
use crate::rdma::STALL;

/// One side of the TCP exchange. While it waits for the peer, it keeps our engine running:
/// the peer may be in the middle of a test against us (a bandwidth server waits here).
pub(super) struct Oob<'a> {
    pub(super) stream: TcpStream,
    pub(super) client: bool,
    pub(super) ctx: &'a Context,
}

impl<'a> Oob<'a> {
    pub(super) fn connect(args: &Args, ctx: &'a Context) -> io::Result<Oob<'a>> {
        let stream = if let Some(host) = args.host {
            // perftest's client does not retry; we do for a few seconds, as a courtesy to
            // scripts that start both sides at once.
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                match TcpStream::connect((host, args.port)) {
                    Ok(stream) => break stream,
                    Err(error) if Instant::now() > deadline => return Err(error),
                    Err(_) => std::thread::sleep(Duration::from_millis(100)),
                }
            }
        } else {
            println!("\n************************************");
            println!("* Waiting for client to connect... *");
            println!("************************************");
            let listener = TcpListener::bind((Ipv4Addr::UNSPECIFIED, args.port))?;
            listener.accept()?.0
        };
        stream.set_nodelay(true)?;
        // Never blocks: a waiting side polls the socket and drives the engine in turn (a
        // socket timeout is a scheduler tick, 4 ms, far too coarse).
        stream.set_nonblocking(true)?;
        Ok(Oob {
            stream,
            client: args.host.is_some(),
            ctx,
        })
    }

    /// Writes the whole message; it fits the socket buffer, so it leaves in one piece.
    pub(super) fn write_all(&mut self, message: &[u8]) -> io::Result<()> {
        let mut sent = 0;
        while sent < message.len() {
            match self.stream.write(&message[sent..]) {
                Ok(n) => sent += n,
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => self.ctx.progress()?,
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }

    /// Reads exactly `buf.len()` bytes, driving the engine while none are there.
    pub(super) fn read_exact(&mut self, buf: &mut [u8]) -> io::Result<()> {
        let mut filled = 0;
        while filled < buf.len() {
            match self.stream.read(&mut buf[filled..]) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => filled += n,
                Err(error)
                    if matches!(
                        error.kind(),
                        io::ErrorKind::WouldBlock
                            | io::ErrorKind::TimedOut
                            | io::ErrorKind::Interrupted
                    ) =>
                {
                    self.ctx.progress()?;
                }
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }

    /// Says we are done (half-close), then keeps the engine running until the peer closes
    /// too (perftest exits; another `roce perf` half-closes) or `STALL` passes.
    pub(super) fn linger(&mut self) -> io::Result<()> {
        self.stream.shutdown(std::net::Shutdown::Write)?;
        let started = Instant::now();
        let mut scratch = [0u8; 64];
        while started.elapsed() < STALL {
            match self.stream.read(&mut scratch) {
                Ok(0) => return Ok(()),
                Ok(_) => {}
                Err(error) if error.kind() == io::ErrorKind::ConnectionReset => return Ok(()),
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => self.ctx.progress()?,
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }

    /// perftest's `ctx_xchg_data`: the client writes then reads, the server the reverse.
    pub(super) fn exchange(&mut self, mine: &[u8]) -> io::Result<Vec<u8>> {
        let mut theirs = vec![0u8; mine.len()];
        if self.client {
            self.write_all(mine)?;
            self.read_exact(&mut theirs)?;
        } else {
            self.read_exact(&mut theirs)?;
            self.write_all(mine)?;
        }
        Ok(theirs)
    }

    /// Versions, page and cache-line sizes, MTU: returns the peer's (page, line, mtu enum).
    pub(super) fn preamble(&mut self, mtu: PathMtu) -> io::Result<(u32, u32, u8)> {
        let mut version = [0u8; 16];
        version[..VERSION.len()].copy_from_slice(VERSION);
        let theirs = self.exchange(&version)?;
        let text = String::from_utf8_lossy(&theirs);
        let number: f64 = text
            .trim_end_matches('\0')
            .parse()
            .map_err(|_| io::Error::other(format!("peer version {text:?}")))?;
        if number < 5.70 {
            return Err(io::Error::other(
                "Current implementation is not compatible with versions older than 5.70",
            ));
        }
        let word = |bytes: Vec<u8>| -> io::Result<u32> {
            let array: [u8; 4] = bytes.try_into().map_err(|_| io::Error::other("short"))?;
            Ok(u32::from_be_bytes(array))
        };
        let page = word(self.exchange(&PAGE.to_be_bytes())?)?;
        let line = word(self.exchange(&CACHE_LINE.to_be_bytes())?)?;
        let theirs = self.exchange(&[b'0' + mtu as u8, 0])?;
        Ok((page, line, theirs[0].wrapping_sub(b'0')))
    }

    /// One 108-byte key handshake; returns the peer's message.
    pub(super) fn handshake(&mut self, mine: &KeyMsg) -> io::Result<KeyMsg> {
        KeyMsg::from_wire(&self.exchange(&mine.to_wire())?)
    }

    /// perftest's `ctx_close_connection`: a handshake, then `done\0` (which nobody reads).
    pub(super) fn close(mut self, mine: &KeyMsg) -> io::Result<()> {
        self.handshake(mine)?;
        self.write_all(b"done\0")?;
        Ok(())
    }
}

/// perftest's `struct pingpong_dest` as it travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KeyMsg {
    pub(crate) lid: u16,
    pub(crate) out_reads: u16,
    pub(crate) qpn: u32,
    pub(crate) psn: u32,
    pub(crate) rkey: u32,
    pub(crate) vaddr: u64,
    pub(crate) gid: [u8; 16],
    pub(crate) srqn: u32,
}

impl KeyMsg {
    const LEN: usize = 108;

    /// `"%04x:%04x:%06x:%06x:%08x:%016llx:" + 16 × "%02x:" + "%08x:"`, NUL-terminated.
    pub(crate) fn to_wire(self) -> [u8; Self::LEN] {
        let mut text = format!(
            "{:04x}:{:04x}:{:06x}:{:06x}:{:08x}:{:016x}:",
            self.lid, self.out_reads, self.qpn, self.psn, self.rkey, self.vaddr
        );
        for byte in self.gid {
            text.push_str(&format!("{byte:02x}:"));
        }
        text.push_str(&format!("{:08x}:", self.srqn));
        let mut wire = [0u8; Self::LEN];
        wire[..text.len()].copy_from_slice(text.as_bytes());
        wire
    }

    pub(crate) fn from_wire(wire: &[u8]) -> io::Result<KeyMsg> {
        let text = String::from_utf8_lossy(wire);
        let text = text.trim_end_matches('\0');
        let bad = || io::Error::other(format!("bad key message {text:?}"));
        let fields: Vec<&str> = text.split(':').collect();
        if fields.len() < 23 {
            return Err(bad());
        }
        let hex = |i: usize| u64::from_str_radix(fields[i], 16).map_err(|_| bad());
        let mut gid = [0u8; 16];
        for (i, byte) in gid.iter_mut().enumerate() {
            *byte = hex(6 + i)? as u8;
        }
        Ok(KeyMsg {
            lid: hex(0)? as u16,
            out_reads: hex(1)? as u16,
            qpn: hex(2)? as u32,
            psn: hex(3)? as u32,
            rkey: hex(4)? as u32,
            vaddr: hex(5)?,
            gid,
            srqn: hex(22)? as u32,
        })
    }

    /// perftest's address lines.
    pub(super) fn print(&self, which: &str, test: Test) {
        let mut line = format!(
            " {which} address: LID {:#06x} QPN {:#06x} PSN {:#06x}",
            self.lid, self.qpn, self.psn
        );
        if test.verb() == Verb::Read {
            line.push_str(&format!(" OUT {:#04x}", self.out_reads));
        }
        if matches!(test.verb(), Verb::Write | Verb::Read) {
            line.push_str(&format!(
                " RKey {:#08x} VAddr {:#016x}",
                self.rkey, self.vaddr
            ));
        }
        println!("{line}");
        let gid: Vec<String> = self.gid.iter().map(|b| format!("{b:02}")).collect();
        println!(" GID: {}", gid.join(":"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_message_matches_a_captured_one() {
        // From write_bw.pcap (rxe's ib_write_bw server).
        let captured = "0000:0001:000013:68de9b:00000448:00005558d43dd000:00:00:00:00:00:00:00:00:00:00:ff:ff:0a:58:00:0b:00000000:";
        let mut wire = [0u8; KeyMsg::LEN];
        wire[..captured.len()].copy_from_slice(captured.as_bytes());
        let msg = KeyMsg::from_wire(&wire).unwrap();
        assert_eq!(
            msg,
            KeyMsg {
                lid: 0,
                out_reads: 1,
                qpn: 0x13,
                psn: 0x68de9b,
                rkey: 0x448,
                vaddr: 0x5558_d43d_d000,
                gid: Ipv4Addr::new(10, 88, 0, 11).to_ipv6_mapped().octets(),
                srqn: 0,
            }
        );
        assert_eq!(msg.to_wire(), wire, "byte for byte, NUL included");
        assert!(KeyMsg::from_wire(b"0000:0001:zz").is_err());
    }
}

//! perftest's out-of-band TCP exchange: the preamble, the 108-byte key messages used as
//! barriers, and `done`.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use roce_verbs::{Context, PathMtu};

use super::params::{Args, Test, Verb, CACHE_LINE, PAGE, VERSION};
use crate::tcp::{Channel, Waiting};

/// While a side waits for the peer, it keeps our engine running: the peer may be in the
/// middle of a test against us (a bandwidth server waits in the exchange), and frames from
/// it count as signs of life.
pub(super) struct Engine<'a> {
    ctx: &'a Context,
    /// Frames received when last asked.
    rx_frames: u64,
    /// The program thread drives the engine (no engine thread of its own).
    drives: bool,
}

impl Waiting for Engine<'_> {
    fn turn(&mut self) -> io::Result<()> {
        Ok(self.ctx.progress()?)
    }

    fn activity(&mut self) -> io::Result<bool> {
        let rx_frames = self.ctx.stats()?.rx_frames;
        let active = rx_frames != self.rx_frames;
        self.rx_frames = rx_frames;
        Ok(active)
    }

    fn spins(&self) -> bool {
        self.drives
    }
}

/// One side of the TCP exchange.
pub(super) struct Oob<'a> {
    channel: Channel<Engine<'a>>,
    client: bool,
    /// Key messages swapped so far, to say which one failed.
    handshakes: u32,
}

impl<'a> Oob<'a> {
    /// Connects to the server, or waits (asleep in accept(2)) for a client. `drives` says
    /// whether this thread drives the engine.
    pub(super) fn connect(args: &Args, ctx: &'a Context, drives: bool) -> io::Result<Oob<'a>> {
        let stream = if let Some(host) = args.host {
            // perftest's client does not retry; we do for a few seconds, as a courtesy to
            // scripts that start both sides at once.
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                match TcpStream::connect((host, args.port)) {
                    Ok(stream) => break stream,
                    Err(error) if Instant::now() > deadline => {
                        return Err(io::Error::new(
                            error.kind(),
                            format!("cannot reach {host} port {}: {error}", args.port),
                        ))
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(100)),
                }
            }
        } else {
            println!("\n************************************");
            println!("* Waiting for client to connect... *");
            println!("************************************");
            // IPv6's wildcard takes IPv4 clients too (as mapped addresses) unless the host
            // has no IPv6 or is set to bindv6only: then IPv4's.
            let listener = TcpListener::bind((Ipv6Addr::UNSPECIFIED, args.port))
                .or_else(|_| TcpListener::bind((Ipv4Addr::UNSPECIFIED, args.port)))?;
            listener.accept()?.0
        };
        let engine = Engine {
            ctx,
            rx_frames: ctx.stats()?.rx_frames,
            drives,
        };
        let stall = Duration::from_secs(args.exchange_timeout);
        Ok(Oob {
            channel: Channel::new(stream, engine, stall)?,
            client: args.host.is_some(),
            handshakes: 0,
        })
    }

    /// Says we are done (half-close), then keeps the engine running until the peer closes
    /// too (perftest exits; another `roce perf` half-closes) or goes quiet.
    pub(super) fn linger(&mut self) -> io::Result<()> {
        self.channel.linger()
    }

    /// perftest's `ctx_xchg_data`: the client writes then reads, the server the reverse.
    pub(super) fn exchange(&mut self, mine: &[u8], what: &str) -> io::Result<Vec<u8>> {
        let mut theirs = vec![0u8; mine.len()];
        if self.client {
            self.channel.write_all(mine, what)?;
            self.channel.read_exact(&mut theirs, what)?;
        } else {
            self.channel.read_exact(&mut theirs, what)?;
            self.channel.write_all(mine, what)?;
        }
        Ok(theirs)
    }

    /// Versions, page and cache-line sizes, MTU: returns the peer's (page, line, mtu enum).
    pub(super) fn preamble(&mut self, mtu: PathMtu) -> io::Result<(u32, u32, u8)> {
        let mut version = [0u8; 16];
        version[..VERSION.len()].copy_from_slice(VERSION);
        let theirs = self.exchange(&version, "perftest version")?;
        let number: f64 = std::str::from_utf8(&theirs)
            .ok()
            .and_then(|text| text.trim_end_matches('\0').parse().ok())
            .ok_or_else(|| {
                io::Error::other(
                    "the peer's first 16 bytes are not a perftest version such as 6.06: is it \
                     perftest or roce perf, on the same port?",
                )
            })?;
        if number < 5.70 {
            return Err(io::Error::other(
                "Current implementation is not compatible with versions older than 5.70",
            ));
        }
        let word = |bytes: Vec<u8>| u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        let page = word(self.exchange(&PAGE.to_be_bytes(), "page size")?);
        let line = word(self.exchange(&CACHE_LINE.to_be_bytes(), "cache-line size")?);
        let theirs = self.exchange(&[b'0' + mtu as u8, 0], "path MTU")?;
        Ok((page, line, theirs[0].wrapping_sub(b'0')))
    }

    /// One 108-byte key handshake; returns the peer's message.
    pub(super) fn handshake(&mut self, mine: &KeyMsg) -> io::Result<KeyMsg> {
        self.handshakes += 1;
        let what = format!("key message #{}", self.handshakes);
        KeyMsg::from_wire(&self.exchange(&mine.to_wire(), &what)?)
    }

    /// The client's five report values (the server sends as many meaningless ones).
    pub(super) fn results(&mut self, mine: &[[u8; 8]; 5]) -> io::Result<Vec<Vec<u8>>> {
        mine.iter()
            .map(|value| self.exchange(value, "bandwidth results"))
            .collect()
    }

    /// perftest's `ctx_close_connection`: a handshake, then `done\0` (which nobody reads).
    pub(super) fn close(mut self, mine: &KeyMsg) -> io::Result<()> {
        self.handshake(mine)?;
        self.channel.write_all(b"done\0", "closing `done`")
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
        let bad = || {
            io::Error::other(
                "the peer's key message is not perftest's \
                 LID:OUT_READS:QPN:PSN:RKEY:VADDR:GID:SRQN in hex",
            )
        };
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

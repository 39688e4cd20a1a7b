//! `roce conform --serve HOST`: the target as a requester. We play perftest's server on the
//! service ports; the target's perftest clients (`ib_write_bw`, `ib_read_bw`,
//! `ib_atomic_bw`, `ib_send_bw` with `-s 64 -n 5 -t 1`, looping) connect to us, one
//! connection per scenario, and send their requests one at a time. Each scenario answers
//! the first request with crafted frames (a malformed or ghost response, a NAK, an RNR NAK
//! loop), shows what the target sent next, then answers like an honest responder until the
//! client ends its run: `done` (it finished the exchange), `failed` (it hung up: its work
//! completed in error) or `hung`.

use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use roce_wire::aeth::{self, CreditCount, NakCode, RnrTimer, Syndrome};
use roce_wire::{atomic_ack_eth, FrameError, Opcode, Psn};

use super::link::{inspect, Damage, Link, Packet};
use super::open::link_between;
use super::target::{fresh_local, Local, Options, Remote, Service};
use super::verdict::{failed_check, failed_probe, write_suite, Line, Summary};
use crate::perf::exchange::KeyMsg;

/// How long a retransmission after a dropped answer (the requester's local ACK timeout,
/// perftest's 14: 67 ms) or an RNR wait may take to show.
const RETRANSMIT_WAIT: Duration = Duration::from_secs(2);
/// The first request comes right after the last barrier.
const FIRST_REQUEST_WAIT: Duration = Duration::from_secs(5);
/// A client that sends nothing and does not end its run for this long has hung (the
/// clients' loop should end a run some time after that, within `--patience`).
const HUNG_AFTER: Duration = Duration::from_secs(5);
/// Bound on each read and write of the exchange, or `--patience` when longer: a peer that
/// took the connection sets up its QP before it answers, which takes a slow target (an
/// emulated VM on a loaded host) more than 10 s at times.
const EXCHANGE_STALL: Duration = Duration::from_secs(10);
/// The path MTU we answer in the preamble (`ibv_mtu` 1: 256 bytes; both keep the smaller).
const PATH_MTU_ENUM: u8 = 1;
const PATH_MTU: usize = 256;
/// The RNR timer of the RNR NAK loop (40.96 ms: long enough to tell from no wait at all).
const RNR_TIMER: RnrTimer = RnrTimer::new(24);
/// RNR NAKs in a row (perftest's clients have rnr_retry 7: retry without end).
const RNR_LOOP: usize = 3;
/// ACKs advertising zero credits in a row (then honest ones, which restore them).
const ZERO_CREDIT_ACKS: usize = 2;
/// Queued connections closed before taking a fresh one (a loop queues one at a time).
const STALE_AT_MOST: usize = 16;
/// NAKs of the storm, below perftest's retry_cnt of 7.
const NAK_STORM: usize = 5;

/// A scenario with the target as requester.
pub struct ServeScenario {
    /// Its name in the result line.
    pub name: &'static str,
    /// The client it needs.
    pub service: Service,
    /// The observations the specification allows.
    pub expected: &'static [&'static str],
    /// Answers the first request; returns the observation up to the honest part.
    pub run: fn(&mut ServeConn) -> io::Result<String>,
}

/// One request of the target's, its PSN counted from the one it announced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// Its opcode.
    pub opcode: Opcode,
    /// Its PSN offset.
    pub at: i32,
    /// A READ's DMA length; otherwise the payload's.
    pub len: u32,
}

/// A frame from the target to our QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    Request(Request),
    BadIcrc,
    Malformed,
}

impl Seen {
    fn decode(bytes: &[u8], qpn: u32, base: Psn) -> Option<Seen> {
        let repr = match inspect(bytes, Some(qpn))? {
            Ok(repr) => repr,
            Err(FrameError::BadIcrc { .. }) => return Some(Seen::BadIcrc),
            Err(_) => return Some(Seen::Malformed),
        };
        let len = match repr.ext.reth {
            Some(reth) if repr.bth.opcode == Opcode::RcRdmaReadRequest => reth.dma_length,
            _ => repr.payload.len() as u32,
        };
        Some(Seen::Request(Request {
            opcode: repr.bth.opcode,
            at: repr.bth.psn.distance(base),
            len,
        }))
    }

    fn shown(&self) -> String {
        let Seen::Request(request) = self else {
            return match self {
                Seen::BadIcrc => "BAD_ICRC".into(),
                _ => "MALFORMED".into(),
            };
        };
        let at = request.at;
        match request.opcode {
            Opcode::RcRdmaWriteOnly => format!("WRITE@{at}"),
            Opcode::RcRdmaReadRequest => format!("READ@{at}:{}", request.len),
            Opcode::RcSendOnly => format!("SEND@{at}"),
            Opcode::RcFetchAdd => format!("FETCH_ADD@{at}"),
            Opcode::RcCompareSwap => format!("CMP_SWAP@{at}"),
            other => format!("{}@{at}", other.name()),
        }
    }
}

/// Distinct observations joined by `+` (a NAK storm's retransmissions show once), or
/// `none`.
fn show(seen: &[Seen]) -> String {
    let mut shown: Vec<String> = Vec::new();
    for text in seen.iter().map(Seen::shown) {
        if !shown.contains(&text) {
            shown.push(text);
        }
    }
    if shown.is_empty() {
        "none".into()
    } else {
        shown.join("+")
    }
}

/// A scenario's view of one connection, as the target's responder.
pub struct ServeConn<'a> {
    link: &'a mut Link,
    /// The target's QP (its PSN: the first of its requests).
    remote: Remote,
    /// Ours.
    local: Local,
    /// The PSN offset an honest responder expects next.
    expected: i32,
    /// Messages completed, for the AETH.
    msn: u32,
    /// The atomic target word.
    word: u64,
}

impl<'a> ServeConn<'a> {
    fn new(link: &'a mut Link, remote: Remote, local: Local) -> Self {
        ServeConn {
            link,
            remote,
            local,
            expected: 0,
            msn: 0,
            word: 0,
        }
    }

    fn psn(&self, at: i32) -> Psn {
        Psn::new(self.remote.psn.value().wrapping_add(at as u32))
    }

    /// What arrives within `wait`: at most until `wanted` came.
    fn requests(&mut self, wanted: usize, wait: Duration) -> io::Result<Vec<Seen>> {
        let (qpn, base) = (self.local.qpn, self.remote.psn);
        self.link
            .collect(wanted, wait, &mut |frame| Seen::decode(frame, qpn, base))
    }

    /// The first request, shown.
    pub fn first(&mut self) -> io::Result<(String, Option<Request>)> {
        let seen = self.requests(1, FIRST_REQUEST_WAIT)?;
        let request = seen.iter().find_map(|seen| match seen {
            Seen::Request(request) => Some(*request),
            _ => None,
        });
        Ok((show(&seen), request))
    }

    /// What the target sends within `wait` (until its first frame), shown, each request
    /// answered honestly.
    pub fn next_answered(&mut self, wait: Duration) -> io::Result<String> {
        let seen = self.requests(1, wait)?;
        self.answer_all(&seen)?;
        Ok(show(&seen))
    }

    fn answer_all(&mut self, seen: &[Seen]) -> io::Result<()> {
        for seen in seen {
            if let Seen::Request(request) = seen {
                self.answer(request)?;
            }
        }
        Ok(())
    }

    /// A response of `opcode` at `at` with `syndrome` and the current MSN.
    pub fn response(&self, opcode: Opcode, at: i32, syndrome: Syndrome) -> Packet {
        let mut packet = Packet::new(opcode, self.remote.qpn, self.psn(at));
        packet.ext.aeth = Some(aeth::Repr {
            syndrome,
            msn: self.msn,
        });
        packet
    }

    /// An ACK at `at`.
    pub fn ack(&self, at: i32) -> Packet {
        self.response(
            Opcode::RcAcknowledge,
            at,
            Syndrome::Ack(CreditCount::UNLIMITED),
        )
    }

    /// A NAK of `code` at `at`.
    pub fn nak(&self, code: NakCode, at: i32) -> Packet {
        self.response(Opcode::RcAcknowledge, at, Syndrome::Nak(code))
    }

    /// A READ response packet of `opcode` carrying `len` bytes at `at`.
    pub fn read_response(&self, opcode: Opcode, at: i32, len: usize) -> Packet {
        let mut packet = self.response(opcode, at, Syndrome::Ack(CreditCount::UNLIMITED));
        if !opcode.info().headers.contains(&roce_wire::ExtHeader::Aeth) {
            packet.ext.aeth = None;
        }
        packet.payload = vec![0xA5; len];
        packet.bth.pad_count = ((4 - len % 4) % 4) as u8;
        packet
    }

    /// Sends `packet` to the target.
    pub fn send(&mut self, packet: &Packet) -> io::Result<()> {
        self.link.send(packet, self.local.qpn)
    }

    /// Takes `request` as executed (a scenario acknowledges it its own way).
    pub fn accept(&mut self, request: &Request) {
        if request.at == self.expected {
            self.expected += 1;
            self.msn += 1;
        }
    }

    /// Answers `request` as an honest responder: executes a new one, re-answers a
    /// duplicate. A PSN ahead is taken as new too: the target took what the scenario sent
    /// as the answer to what it skipped, which the observation has shown already, and the
    /// rest of the run is to let its client finish.
    pub fn answer(&mut self, request: &Request) -> io::Result<()> {
        let new = request.at >= self.expected;
        if new {
            self.expected = request.at;
        }
        match request.opcode {
            Opcode::RcRdmaReadRequest => {
                let len = request.len as usize;
                let packets = len.div_ceil(PATH_MTU).max(1);
                if new {
                    self.expected += packets as i32;
                    self.msn += 1;
                }
                for i in 0..packets {
                    let opcode = match (packets, i) {
                        (1, _) => Opcode::RcRdmaReadResponseOnly,
                        (_, 0) => Opcode::RcRdmaReadResponseFirst,
                        (_, i) if i + 1 == packets => Opcode::RcRdmaReadResponseLast,
                        _ => Opcode::RcRdmaReadResponseMiddle,
                    };
                    let part = (len - i * PATH_MTU).min(PATH_MTU);
                    let packet = self.read_response(opcode, request.at + i as i32, part);
                    self.send(&packet)?;
                }
                Ok(())
            }
            Opcode::RcFetchAdd | Opcode::RcCompareSwap => {
                if new {
                    self.expected += 1;
                    self.msn += 1;
                    self.word += 1;
                }
                let mut packet = self.response(
                    Opcode::RcAtomicAcknowledge,
                    request.at,
                    Syndrome::Ack(CreditCount::UNLIMITED),
                );
                packet.ext.atomic_ack_eth = Some(atomic_ack_eth::Repr {
                    original: self.word - 1,
                });
                self.send(&packet)
            }
            _ => {
                if new {
                    self.expected += 1;
                    if request.opcode.info().position.ends_message() {
                        self.msn += 1;
                    }
                }
                let ack = self.ack(request.at);
                self.send(&ack)
            }
        }
    }
}

/// The listening side: one TCP listener per service, accepting only the target.
pub struct Server {
    listeners: Vec<(Service, TcpListener)>,
    host: IpAddr,
    patience: Duration,
}

impl Server {
    /// Listens on the ports of `services`.
    pub fn bind(
        services: &[Service],
        ports: super::target::Ports,
        host: IpAddr,
        patience: Duration,
    ) -> io::Result<Server> {
        let any = match host {
            IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        };
        let listeners = services
            .iter()
            .map(|&service| {
                let port = match service {
                    Service::Write => ports.write,
                    Service::Read => ports.read,
                    Service::Atomic => ports.atomic,
                    Service::Send => ports.send,
                    Service::Ud => ports.ud,
                };
                let listener = TcpListener::bind((any, port))?;
                listener.set_nonblocking(true)?;
                Ok((service, listener))
            })
            .collect::<io::Result<_>>()?;
        Ok(Server {
            listeners,
            host,
            patience,
        })
    }

    /// The next connection of the target's `service` client, made after this call: a
    /// client already queued may have waited through the previous scenario, and the loop's
    /// `timeout` could then end it in the middle of this one (a `failed` that the target's
    /// requester did not cause). Those are closed: each gives up and its loop starts a
    /// fresh one.
    fn accept(&self, service: Service) -> io::Result<TcpStream> {
        let listener = self
            .listeners
            .iter()
            .find(|(s, _)| *s == service)
            .map(|(_, listener)| listener)
            .ok_or_else(|| io::Error::other("no listener for the service"))?;
        for _ in 0..STALE_AT_MOST {
            match listener.accept() {
                Ok(_) => {}
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => break,
                Err(error) => return Err(error),
            }
        }
        let deadline = Instant::now() + self.patience;
        loop {
            match listener.accept() {
                Ok((stream, peer)) if peer.ip() == self.host => {
                    stream.set_nonblocking(false)?;
                    stream.set_read_timeout(Some(EXCHANGE_STALL.max(self.patience)))?;
                    stream.set_write_timeout(Some(EXCHANGE_STALL.max(self.patience)))?;
                    stream.set_nodelay(true)?;
                    return Ok(stream);
                }
                // Someone else's: not the target.
                Ok(_) => {}
                Err(error) if error.kind() != io::ErrorKind::WouldBlock => return Err(error),
                Err(error) if Instant::now() > deadline => return Err(error),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }
}

/// perftest's exchange, from the server's side: read theirs, then write ours.
struct Exchange {
    stream: TcpStream,
    service: Service,
    mine: KeyMsg,
}

impl Exchange {
    fn swap(&mut self, mine: &[u8]) -> io::Result<Vec<u8>> {
        let mut theirs = vec![0u8; mine.len()];
        self.stream.read_exact(&mut theirs)?;
        self.stream.write_all(mine)?;
        Ok(theirs)
    }

    /// Up to the client's run: returns its QP.
    fn open(&mut self) -> io::Result<Remote> {
        let mut version = [0u8; 16];
        version[..4].copy_from_slice(b"6.06");
        self.swap(&version)?;
        self.swap(&4096u32.to_be_bytes())?;
        self.swap(&64u32.to_be_bytes())?;
        self.swap(&[b'0' + PATH_MTU_ENUM, 0])?;
        let mine = self.mine.to_wire();
        let theirs = KeyMsg::from_wire(&self.swap(&mine)?)?;
        // write, read and atomic make three handshakes before the run, send four.
        let barriers = if self.service == Service::Send { 3 } else { 2 };
        for _ in 0..barriers {
            self.swap(&mine)?;
        }
        Ok(Remote {
            qpn: theirs.qpn & 0xFF_FFFF,
            psn: Psn::new(theirs.psn & 0xFF_FFFF),
            rkey: theirs.rkey,
            vaddr: theirs.vaddr,
            mtu: PATH_MTU,
        })
    }

    /// The rest of the exchange after the client's run: its end barrier, its five results
    /// (bandwidth tests but send), the closing handshake and `done`.
    fn close(&mut self) -> io::Result<()> {
        let mine = self.mine.to_wire();
        if self.service != Service::Send {
            self.swap(&mine)?;
            for _ in 0..5 {
                self.swap(&[0u8; 8])?;
            }
        }
        self.swap(&mine)?;
        self.stream.write_all(b"done\0")
    }

    /// Whether the client has written (reached its end barrier: `Some(true)`), hung up
    /// (`Some(false)`), or neither yet.
    fn client_moved(&mut self) -> io::Result<Option<bool>> {
        self.stream.set_nonblocking(true)?;
        let mut byte = [0u8; 1];
        let moved = match self.stream.peek(&mut byte) {
            Ok(0) => Some(false),
            Ok(_) => Some(true),
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => None,
            Err(_) => Some(false),
        };
        self.stream.set_nonblocking(false)?;
        Ok(moved)
    }
}

/// Answers honestly until the client ends its run; how it ended (`hung` after
/// [`HUNG_AFTER`] without a request or an end).
fn finish(conn: &mut ServeConn, exchange: &mut Exchange) -> io::Result<&'static str> {
    let mut deadline = Instant::now() + HUNG_AFTER;
    while Instant::now() < deadline {
        let seen = conn.requests(1, Duration::from_millis(5))?;
        if !seen.is_empty() {
            deadline = Instant::now() + HUNG_AFTER;
        }
        conn.answer_all(&seen)?;
        match exchange.client_moved()? {
            Some(true) => {
                return Ok(if exchange.close().is_ok() {
                    "done"
                } else {
                    "failed"
                })
            }
            Some(false) => return Ok("failed"),
            None => {}
        }
    }
    Ok("hung")
}

/// The suite of `--serve`.
pub struct ServeSuite<'a> {
    /// Where the target's clients connect.
    pub server: Server,
    /// `-d`.
    pub device: Option<String>,
    /// `--roce-addr`.
    pub roce_addr: Option<std::net::IpAddr>,
    /// `--pcap`.
    pub pcap: Option<std::path::PathBuf>,
    /// How long to wait for an answer that may not come.
    pub wait: Duration,
    /// `--check`.
    pub options: &'a Options,
}

impl ServeSuite<'_> {
    /// Runs `scenario` on a fresh connection of its client; the observation, or why no
    /// connection could be made.
    fn conduct(
        &self,
        link: &mut Option<Link>,
        scenario: &ServeScenario,
    ) -> io::Result<Result<String, String>> {
        let patience = self.server.patience;
        let deadline = Instant::now() + patience;
        // A client that gave up waiting for us is still queued: take the next one.
        let (mut exchange, remote, local) = loop {
            let stream = match self.server.accept(scenario.service) {
                Ok(stream) => stream,
                Err(error) => return Ok(Err(format!("connect:{error}"))),
            };
            let (ours, theirs) = (stream.local_addr()?.ip(), stream.peer_addr()?.ip());
            if link.is_none() {
                *link = Some(link_between(
                    ours,
                    theirs,
                    self.roce_addr,
                    self.device.as_deref(),
                    self.pcap.as_deref(),
                    self.wait,
                )?);
            }
            // Our GID is the link's address (`--roce-addr` may make it another than `ours`).
            let local = fresh_local(link.as_ref().map_or(ours, |link| link.ours.ip));
            let mut exchange = Exchange {
                stream,
                service: scenario.service,
                mine: KeyMsg {
                    lid: 0,
                    out_reads: 1,
                    qpn: local.qpn,
                    psn: local.psn.value(),
                    rkey: 0x5EED,
                    vaddr: 0x10_0000,
                    gid: local.gid,
                    srqn: 0,
                },
            };
            match exchange.open() {
                Ok(remote) => break (exchange, remote, local),
                Err(error) if Instant::now() > deadline => {
                    return Ok(Err(format!("exchange:{error}")))
                }
                Err(_) => {}
            }
        };
        let Some(link) = link.as_mut() else {
            return Err(io::Error::other("no link"));
        };
        let mut conn = ServeConn::new(link, remote, local);
        let steps = (scenario.run)(&mut conn)?;
        let end = finish(&mut conn, &mut exchange)?;
        Ok(Ok(format!("{steps},{end}")))
    }

    /// Runs `scenarios` as `run_suite` does the client side's: one line each, a liveness
    /// probe (the service's normal run on a fresh connection) after a scenario whose own
    /// client did not finish, `--check` after each, stopping at the first BROKE.
    pub fn run(&self, scenarios: &[&ServeScenario], out: &mut dyn Write) -> io::Result<Summary> {
        let mut link = None;
        write_suite(scenarios, out, |scenario| {
            let outcome = self.conduct(&mut link, scenario)?;
            Line::judge(scenario.name, scenario.expected, outcome, |observed| {
                let mut failed = Vec::new();
                if !observed.ends_with(",done") {
                    let probe = serve_baseline(scenario.service);
                    let seen = self.conduct(&mut link, probe)?;
                    failed.extend(failed_probe(probe.name, probe.expected, seen));
                }
                failed.extend(failed_check(self.options)?);
                Ok(failed)
            })
        })
    }
}

/// The normal run of each client: every request answered honestly.
pub fn serve_baseline(service: Service) -> &'static ServeScenario {
    let name = match service {
        Service::Write => "requester_write",
        Service::Read => "requester_read",
        Service::Atomic => "requester_atomic",
        // No requester scenario uses UD: its sends are as good a probe as any.
        Service::Send | Service::Ud => "requester_send",
    };
    SERVE_SCENARIOS
        .iter()
        .find(|scenario| scenario.name == name)
        .unwrap_or(&SERVE_SCENARIOS[0])
}

/// The first request answered honestly.
fn honest(c: &mut ServeConn) -> io::Result<String> {
    let (shown, request) = c.first()?;
    if let Some(request) = request {
        c.answer(&request)?;
    }
    Ok(shown)
}

/// The first request answered with `packets` (made for it), then what came next.
fn answered_with(
    c: &mut ServeConn,
    packets: fn(&mut ServeConn, &Request) -> Vec<Packet>,
    wait: Duration,
) -> io::Result<String> {
    let (shown, request) = c.first()?;
    let Some(request) = request else {
        return Ok(shown);
    };
    for packet in packets(c, &request) {
        c.send(&packet)?;
    }
    let then = c.next_answered(wait)?;
    Ok(format!("{shown},{then}"))
}

/// Every scenario of `--serve`, grouped by service.
pub static SERVE_SCENARIOS: &[ServeScenario] = &[
    // RDMA WRITE requester.
    ServeScenario {
        name: "requester_write",
        service: Service::Write,
        expected: &["WRITE@0,done"],
        run: honest,
    },
    ServeScenario {
        name: "requester_nak_sequence",
        service: Service::Write,
        // Go back to the NAK's PSN.
        expected: &["WRITE@0,WRITE@0,done"],
        run: |c| {
            answered_with(
                c,
                |c, r| vec![c.nak(NakCode::PsnSequenceError, r.at)],
                RETRANSMIT_WAIT,
            )
        },
    },
    ServeScenario {
        name: "requester_nak_storm",
        service: Service::Write,
        // Retransmissions of the NAKed PSN only, and the run goes on.
        expected: &["WRITE@0,WRITE@0,done"],
        run: |c| {
            answered_with(
                c,
                |c, r| vec![c.nak(NakCode::PsnSequenceError, r.at); NAK_STORM],
                RETRANSMIT_WAIT,
            )
        },
    },
    ServeScenario {
        name: "requester_ghost_ack",
        service: Service::Write,
        // An ACK for a PSN never sent is dropped: the WRITE is retransmitted on timeout.
        expected: &["WRITE@0,WRITE@0,done"],
        run: |c| answered_with(c, |c, r| vec![c.ack(r.at + 10)], RETRANSMIT_WAIT),
    },
    ServeScenario {
        name: "requester_ghost_nak",
        service: Service::Write,
        expected: &["WRITE@0,WRITE@0,done"],
        run: |c| {
            answered_with(
                c,
                |c, r| vec![c.nak(NakCode::PsnSequenceError, r.at + 10)],
                RETRANSMIT_WAIT,
            )
        },
    },
    ServeScenario {
        name: "requester_ack_msn_out_of_range",
        service: Service::Write,
        // The PSN acknowledges the WRITE, or the ACK is dropped and the WRITE retransmitted.
        expected: &["WRITE@0,WRITE@1,done", "WRITE@0,WRITE@0,done"],
        run: |c| {
            answered_with(
                c,
                |c, r| {
                    c.accept(r);
                    let mut ack = c.ack(r.at);
                    if let Some(aeth) = &mut ack.ext.aeth {
                        aeth.msn = 0xFF_FFFF;
                    }
                    vec![ack]
                },
                RETRANSMIT_WAIT,
            )
        },
    },
    ServeScenario {
        name: "requester_remote_access_nak",
        service: Service::Write,
        // Completed with REM_ACCESS_ERR, the QP in error: nothing more, the client fails.
        expected: &["WRITE@0,none,failed"],
        run: |c| {
            let wait = c.link.wait;
            answered_with(
                c,
                |c, r| vec![c.nak(NakCode::RemoteAccessError, r.at)],
                wait,
            )
        },
    },
    // RDMA READ requester: a response that does not fit the READ is dropped (then the READ
    // is retransmitted) or completes it in error; never accepted.
    ServeScenario {
        name: "requester_read",
        service: Service::Read,
        expected: &["READ@0:64,done"],
        run: honest,
    },
    ServeScenario {
        name: "requester_read_response_short",
        service: Service::Read,
        expected: &["READ@0:64,READ@0:64,done", "READ@0:64,none,failed"],
        run: |c| {
            answered_with(
                c,
                |c, r| vec![c.read_response(Opcode::RcRdmaReadResponseOnly, r.at, 32)],
                RETRANSMIT_WAIT,
            )
        },
    },
    ServeScenario {
        name: "requester_read_response_long",
        service: Service::Read,
        // Dropped and the READ sent again, or the READ failed; a slow target (rxe in a
        // loaded VM) may also time the READ out and send it again before it takes the
        // response and fails it.
        expected: &[
            "READ@0:64,READ@0:64,done",
            "READ@0:64,none,failed",
            "READ@0:64,READ@0:64,failed",
        ],
        run: |c| {
            answered_with(
                c,
                |c, r| vec![c.read_response(Opcode::RcRdmaReadResponseOnly, r.at, 128)],
                RETRANSMIT_WAIT,
            )
        },
    },
    ServeScenario {
        name: "requester_read_response_middle",
        service: Service::Read,
        expected: &["READ@0:64,READ@0:64,done", "READ@0:64,none,failed"],
        run: |c| {
            answered_with(
                c,
                |c, r| vec![c.read_response(Opcode::RcRdmaReadResponseMiddle, r.at, 64)],
                RETRANSMIT_WAIT,
            )
        },
    },
    ServeScenario {
        name: "requester_read_truncated_aeth",
        service: Service::Read,
        // Malformed: dropped, and the READ retransmitted on timeout.
        expected: &["READ@0:64,READ@0:64,done"],
        run: |c| {
            answered_with(
                c,
                |c, r| {
                    vec![c
                        .read_response(Opcode::RcRdmaReadResponseOnly, r.at, 0)
                        .damaged(Damage::Truncate(12 + 2))]
                },
                RETRANSMIT_WAIT,
            )
        },
    },
    ServeScenario {
        name: "requester_ghost_read_response",
        service: Service::Read,
        expected: &["READ@0:64,READ@0:64,done"],
        run: |c| {
            answered_with(
                c,
                |c, r| vec![c.read_response(Opcode::RcRdmaReadResponseOnly, r.at + 5, 64)],
                RETRANSMIT_WAIT,
            )
        },
    },
    // Atomics.
    ServeScenario {
        name: "requester_atomic",
        service: Service::Atomic,
        expected: &["FETCH_ADD@0,done"],
        run: honest,
    },
    ServeScenario {
        name: "requester_invalid_request_nak",
        service: Service::Atomic,
        // Completed with REM_INV_REQ_ERR, the QP in error.
        expected: &["FETCH_ADD@0,none,failed"],
        run: |c| {
            let wait = c.link.wait;
            answered_with(c, |c, r| vec![c.nak(NakCode::InvalidRequest, r.at)], wait)
        },
    },
    // SEND requester.
    ServeScenario {
        name: "requester_send",
        service: Service::Send,
        expected: &["SEND@0,done"],
        run: honest,
    },
    ServeScenario {
        name: "requester_zero_credits",
        service: Service::Send,
        // Two ACKs that advertise no receive WQEs (AETH credit code 0), then honest ones
        // (code 31, not tracked). A requester that tracks end-to-end credits still sends one
        // message at a time without them (the IBTA's limited WQE, 9.7.7.2), one that does not
        // track them sends as before: either way the next SEND comes, and the run finishes.
        expected: &["SEND@0,SEND@1,SEND@2,done"],
        run: |c| {
            let (shown, mut request) = c.first()?;
            let mut steps = vec![shown];
            for _ in 0..ZERO_CREDIT_ACKS {
                let Some(send) = request else {
                    return Ok(steps.join(","));
                };
                c.accept(&send);
                let no_credits = c.response(
                    Opcode::RcAcknowledge,
                    send.at,
                    Syndrome::Ack(CreditCount::encode(0)),
                );
                c.send(&no_credits)?;
                let (qpn, base) = (c.local.qpn, c.remote.psn);
                let seen = c.link.collect(1, RETRANSMIT_WAIT, &mut |frame| {
                    Seen::decode(frame, qpn, base)
                })?;
                steps.push(show(&seen));
                request = seen.iter().find_map(|seen| match seen {
                    Seen::Request(request) => Some(*request),
                    _ => None,
                });
            }
            if let Some(send) = request {
                c.answer(&send)?;
            }
            Ok(steps.join(","))
        },
    },
    ServeScenario {
        name: "requester_rnr_loop",
        service: Service::Send,
        // After each RNR NAK the same SEND again, no sooner than the NAK's timer.
        expected: &["SEND@0,SEND@0,SEND@0,SEND@0,done"],
        run: |c| {
            let (shown, request) = c.first()?;
            let Some(mut request) = request else {
                return Ok(shown);
            };
            let mut steps = vec![shown];
            for _ in 0..RNR_LOOP {
                let rnr = c.response(
                    Opcode::RcAcknowledge,
                    request.at,
                    Syndrome::RnrNak(RNR_TIMER),
                );
                let sent = Instant::now();
                c.send(&rnr)?;
                let mut arrived = None;
                let (qpn, base) = (c.local.qpn, c.remote.psn);
                let seen = c.link.collect(1, RETRANSMIT_WAIT, &mut |frame| {
                    let seen = Seen::decode(frame, qpn, base)?;
                    arrived.get_or_insert_with(Instant::now);
                    Some(seen)
                })?;
                let early = arrived.is_some_and(|at| at - sent < RNR_TIMER.duration());
                steps.push(format!(
                    "{}{}",
                    show(&seen),
                    if early { ":early" } else { "" }
                ));
                match seen.first() {
                    Some(Seen::Request(next)) => request = *next,
                    _ => return Ok(steps.join(",")),
                }
            }
            c.answer(&request)?;
            Ok(steps.join(","))
        },
    },
];

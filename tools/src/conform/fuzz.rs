//! `roce fuzz [flags] HOST` and `roce replay FILE HOST`: seeded mutation inside live
//! connections to a target's perftest servers.
//!
//! Each connection starts with its service's normal request at the expected PSN (the
//! anchor), then sends a batch of mutated packets: the right QPN, PSNs around the one the
//! target expects (learnt from its answers), every opcode family, header fields, lengths,
//! pads, truncations and opcode bytes changed, the ICRC recomputed after the damage (now and
//! then deliberately wrong). After every batch a fresh connection must still do the normal
//! operation and `--check` must pass; a target that answers with a malformed frame or a
//! bad ICRC is a finding too. Each finding is the connection's frames as a pcap, anchor
//! first, which `roce dump` shows and `roce replay` sends again on a fresh connection (the
//! anchor says which server, and QPN, PSN, rkey and address are moved to the new one).

use std::io;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use roce_provider::capture::{read_frames, write_frames, CapturedFrame};
use roce_wire::aeth::{self, CreditCount, NakCode, RnrTimer, Syndrome};
use roce_wire::icrc::{self, ICRC_LEN};
use roce_wire::{atomic_ack_eth, atomic_eth, cnp, deth, feth, ieth, immdt, reth, xrceth};
use roce_wire::{ExtHeader, Opcode, Psn};

use super::conduct::{conduct, use_up_receives};
use super::conn::Conn;
use super::link::{fix_lengths, Answer, Damage, Link, Offsets, Packet};
use super::open::open_link;
use super::scenarios::baseline;
use super::target::{gid_of, Local, Options, Reach, Service, Target};
use super::verdict::failed_check;

/// Arguments of `roce fuzz`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub reach: Reach,
    /// Only these services (comma-separated; default all).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub service: Vec<Service>,
    /// Seed of the mutations (default: from the OS; printed, so a run can be repeated).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Stop after this many mutated packets.
    #[arg(long, default_value_t = 10_000)]
    pub packets: u64,
    /// Stop after this many seconds, if that comes first.
    #[arg(long)]
    pub duration: Option<u64>,
    /// Mutated packets per connection (and between liveness checks).
    #[arg(long, default_value_t = 32)]
    pub batch: u64,
    /// Milliseconds to wait for an answer after each packet.
    #[arg(long, default_value_t = 20)]
    pub wait: u64,
    /// A command (run by `sh -c`) whose failure after a batch is a finding.
    #[arg(long, value_name = "CMD")]
    pub check: Option<String>,
    /// Where findings go (`finding-SEED-N.pcap`).
    #[arg(long, value_name = "DIR", default_value = ".")]
    pub findings: PathBuf,
    /// Write every frame sent and received to this pcap file.
    #[arg(long, value_name = "FILE")]
    pub pcap: Option<PathBuf>,
}

/// Arguments of `roce replay`.
#[derive(clap::Args)]
pub struct ReplayArgs {
    /// A finding of `roce fuzz`.
    pub file: PathBuf,
    #[command(flatten)]
    pub reach: Reach,
    /// Milliseconds to wait for an answer after each packet.
    #[arg(long, default_value_t = 200)]
    pub wait: u64,
    /// A command (run by `sh -c`) whose failure afterwards means the target broke.
    #[arg(long, value_name = "CMD")]
    pub check: Option<String>,
}

/// SplitMix64: small, seedable, and good enough to pick mutations.
pub struct Rng(u64);

impl Rng {
    /// A generator that repeats for the same seed.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// True with probability `percent` / 100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }
}

/// What `fuzz` is to do.
pub struct Config {
    /// The mutations' seed.
    pub seed: u64,
    /// Mutated packets to send.
    pub packets: u64,
    /// Time allowed.
    pub duration: Option<Duration>,
    /// Mutated packets per connection.
    pub batch: u64,
    /// Services to cycle through.
    pub services: Vec<Service>,
    /// `--check` and the send size.
    pub options: Options,
    /// Where findings go.
    pub findings: PathBuf,
}

/// What a fuzz run did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Report {
    /// Mutated packets sent.
    pub packets: u64,
    /// Connections made (the liveness checks' not counted).
    pub connections: u64,
    /// Findings saved.
    pub findings: u64,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "packets={} connections={} findings={}",
            self.packets, self.connections, self.findings
        )
    }
}

/// Runs `roce fuzz`.
pub fn run(args: &Args) -> ExitCode {
    let seed = args.seed.unwrap_or_else(|| {
        let mut bytes = [0u8; 8];
        let _ = rustix::rand::getrandom(&mut bytes, rustix::rand::GetRandomFlags::empty());
        u64::from_le_bytes(bytes)
    });
    let services = if args.service.is_empty() {
        vec![
            Service::Write,
            Service::Read,
            Service::Atomic,
            Service::Send,
        ]
    } else {
        args.service.clone()
    };
    if services.contains(&Service::Ud) {
        // Its liveness needs a pong per connection, which mutated traffic rarely earns.
        eprintln!("roce fuzz: the UD service is for `roce conform` only");
        return ExitCode::from(2);
    }
    let mut target = args.reach.perftest();
    let link = open_link(
        &target,
        services[0],
        args.reach.device.as_deref(),
        args.pcap.as_deref(),
        Duration::from_millis(args.wait),
    );
    let mut link = match link {
        Ok(link) => link,
        Err(error) => {
            eprintln!("roce fuzz: {error}");
            return ExitCode::from(2);
        }
    };
    println!("seed={seed}");
    let config = Config {
        seed,
        packets: args.packets,
        duration: args.duration.map(Duration::from_secs),
        batch: args.batch.max(1),
        services,
        options: Options {
            send_size: args.reach.send_size,
            check: args.check.clone(),
        },
        findings: args.findings.clone(),
    };
    let mut last_progress = Instant::now();
    let result = fuzz(&mut target, &mut link, &config, &mut |report| {
        if last_progress.elapsed() >= Duration::from_secs(1) {
            eprintln!("{report}");
            last_progress = Instant::now();
        }
    });
    match result {
        Ok(report) => {
            let status = if report.findings == 0 { "ok" } else { "FOUND" };
            println!("{report} status={status}");
            if report.findings == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(error) => {
            eprintln!("roce fuzz: {error}");
            ExitCode::from(2)
        }
    }
}

/// The fuzz loop; `progress` sees the counts after every packet.
pub fn fuzz(
    target: &mut dyn Target,
    link: &mut Link,
    config: &Config,
    progress: &mut dyn FnMut(&Report),
) -> io::Result<Report> {
    let mut rng = Rng::new(config.seed);
    let started = Instant::now();
    let mut report = Report::default();
    let out_of_time = |report: &Report| {
        report.packets >= config.packets
            || config
                .duration
                .is_some_and(|limit| started.elapsed() >= limit)
    };
    while !out_of_time(&report) {
        let service = config.services[report.connections as usize % config.services.len()];
        let local = Local {
            qpn: 0x10_0000 | (rng.next() as u32 & 0xF_FFFF),
            psn: Psn::new(rng.next() as u32),
            gid: gid_of(link.ours.ip),
        };
        let session = match target.connect(service, &local) {
            Ok(session) => session,
            Err(error) => {
                // The previous batch's liveness check passed: something since broke it.
                eprintln!("roce fuzz: cannot connect to the {service:?} server: {error}");
                report.findings += 1;
                return Ok(report);
            }
        };
        report.connections += 1;
        let mut conn = Conn::new(link, session.remote(), local, config.options.send_size);
        let batch = send_batch(
            &mut conn,
            &mut rng,
            service,
            config,
            &mut report,
            &out_of_time,
            progress,
        )?;
        if service == Service::Send {
            use_up_receives(&mut conn)?;
        }
        let _ = session.close();
        let alive = alive(target, link, service, &config.options)?;
        if batch.bad_answers > 0 || !alive {
            report.findings += 1;
            let path = config
                .findings
                .join(format!("finding-{}-{}.pcap", config.seed, report.findings));
            save(&path, &batch.sent)?;
            eprintln!(
                "roce fuzz: finding {} ({}): {}",
                report.findings,
                if alive {
                    "malformed answers"
                } else {
                    "the target stopped working"
                },
                path.display()
            );
            if !alive {
                return Ok(report);
            }
        }
    }
    Ok(report)
}

/// Whether a fresh connection still does the normal operation and `--check` passes.
fn alive(
    target: &mut dyn Target,
    link: &mut Link,
    service: Service,
    options: &Options,
) -> io::Result<bool> {
    let probe = baseline(service);
    let works = matches!(
        conduct(target, link, probe, options)?,
        Ok(seen) if probe.expected.contains(&seen.as_str())
    );
    Ok(works && failed_check(options)?.is_none())
}

fn save(path: &Path, frames: &[Vec<u8>]) -> io::Result<()> {
    let frames: Vec<CapturedFrame> = frames
        .iter()
        .enumerate()
        .map(|(i, data)| CapturedFrame {
            timestamp: Duration::from_millis(i as u64),
            data: data.clone(),
        })
        .collect();
    write_frames(path, &frames).map_err(io::Error::other)
}

/// The normal request of `service` at the expected PSN.
fn anchor_packet(conn: &Conn, service: Service) -> Packet {
    match service {
        Service::Write => conn.write_only(0, 64),
        Service::Read => conn.read(0, 64),
        Service::Atomic => conn.atomic(Opcode::RcFetchAdd, 0),
        Service::Send => conn.send(Opcode::RcSendOnly, 0, conn.send_size),
        Service::Ud => conn.ud_send(0, conn.send_size),
    }
}

/// The opcodes a service's normal traffic uses.
fn family(service: Service) -> &'static [Opcode] {
    match service {
        Service::Write => &[
            Opcode::RcRdmaWriteFirst,
            Opcode::RcRdmaWriteMiddle,
            Opcode::RcRdmaWriteLast,
            Opcode::RcRdmaWriteLastWithImmediate,
            Opcode::RcRdmaWriteOnly,
            Opcode::RcRdmaWriteOnlyWithImmediate,
        ],
        Service::Read => &[Opcode::RcRdmaReadRequest],
        Service::Atomic => &[Opcode::RcFetchAdd, Opcode::RcCompareSwap],
        Service::Send => &[
            Opcode::RcSendFirst,
            Opcode::RcSendMiddle,
            Opcode::RcSendLast,
            Opcode::RcSendLastWithImmediate,
            Opcode::RcSendOnly,
            Opcode::RcSendOnlyWithImmediate,
            Opcode::RcSendLastWithInvalidate,
            Opcode::RcSendOnlyWithInvalidate,
        ],
        Service::Ud => &[Opcode::UdSendOnly, Opcode::UdSendOnlyWithImmediate],
    }
}

/// What one connection's batch sent (its anchor first) and how many answers were malformed.
struct Batch {
    sent: Vec<Vec<u8>>,
    bad_answers: usize,
}

/// The anchor, then up to `config.batch` mutated packets on one connection.
fn send_batch(
    conn: &mut Conn,
    rng: &mut Rng,
    service: Service,
    config: &Config,
    report: &mut Report,
    out_of_time: &dyn Fn(&Report) -> bool,
    progress: &mut dyn FnMut(&Report),
) -> io::Result<Batch> {
    let mut batch = Batch {
        sent: Vec::new(),
        bad_answers: 0,
    };
    let anchor = conn.emit(&anchor_packet(conn, service))?;
    conn.exchange_bytes(&anchor, 1)?;
    batch.sent.push(anchor);
    let mut in_batch = 0;
    // A mutation that cannot be emitted is skipped; rare, so a few tries each suffice.
    for _ in 0..4 * config.batch {
        if in_batch == config.batch || out_of_time(report) {
            break;
        }
        let Ok(bytes) = conn.emit(&mutate(rng, conn, service)) else {
            continue;
        };
        in_batch += 1;
        let answers = conn.exchange_bytes(&bytes, 1)?;
        batch.sent.push(bytes);
        report.packets += 1;
        batch.bad_answers += answers
            .iter()
            .filter(|a| matches!(a, Answer::BadIcrc | Answer::Malformed))
            .count();
        progress(report);
    }
    Ok(batch)
}

/// One mutated packet for the connection's current state.
pub fn mutate(rng: &mut Rng, conn: &Conn, service: Service) -> Packet {
    let opcode = pick_opcode(rng, service);
    let at = pick_psn(rng, conn);
    let len = pick_len(rng, conn);
    let mut packet = conn.packet(opcode, at);
    if opcode.info().has_payload {
        packet.payload = (0..len).map(|i| i as u8 ^ 0x5A).collect();
        packet.bth.pad_count = ((4 - len % 4) % 4) as u8;
    }
    packet.bth.ack_req = rng.chance(80);
    packet.bth.solicited = rng.chance(5);
    packet.bth.mig_req = rng.chance(5);
    if rng.chance(3) {
        packet.bth.pkey = rng.next() as u16;
    }
    let aim = pick_aim(rng, conn, len);
    for header in opcode.info().headers {
        add_header(rng, conn, &mut packet, *header, &aim);
    }
    add_damage(rng, &mut packet, len);
    packet
}

/// Mostly the service's own opcodes, some responses, and now and then any opcode.
fn pick_opcode(rng: &mut Rng, service: Service) -> Opcode {
    match rng.below(100) {
        0..=69 => rng.pick(family(service)),
        70..=79 => rng.pick(&[
            Opcode::RcAcknowledge,
            Opcode::RcAtomicAcknowledge,
            Opcode::RcRdmaReadResponseFirst,
            Opcode::RcRdmaReadResponseMiddle,
            Opcode::RcRdmaReadResponseLast,
            Opcode::RcRdmaReadResponseOnly,
        ]),
        _ => rng.pick(Opcode::ALL),
    }
}

/// Mostly the expected PSN, often one near it, sometimes a duplicate or anything.
fn pick_psn(rng: &mut Rng, conn: &Conn) -> i32 {
    match rng.below(100) {
        0..=59 => conn.next,
        60..=89 => conn.next + rng.below(7) as i32 - 3,
        90..=97 => conn.next - 1 - rng.below(64) as i32,
        _ => rng.next() as i32,
    }
}

/// A payload length around the edges that matter: empty, tiny, the path MTU and either side.
fn pick_len(rng: &mut Rng, conn: &Conn) -> usize {
    let mtu = conn.remote.mtu;
    match rng.below(8) {
        0 => 0,
        1 => 1 + rng.below(8) as usize,
        2 => mtu - 1,
        3 => mtu,
        4 => mtu + 1,
        5 => conn.send_size,
        _ => rng.below(2 * mtu as u64) as usize,
    }
}

/// Where a RETH or AtomicETH points, with which key and length.
struct Aim {
    address: u64,
    rkey: u32,
    dma_length: u32,
}

/// Mostly the target's own region and key, sometimes a flipped key bit, an address far off
/// or at the end of the address space, or a length that disagrees with the payload.
fn pick_aim(rng: &mut Rng, conn: &Conn, len: usize) -> Aim {
    let rkey = if rng.chance(85) {
        conn.remote.rkey
    } else {
        conn.remote.rkey ^ (1 << rng.below(32))
    };
    let offset = match rng.below(10) {
        0 => 1 << (20 + rng.below(24)),
        1 => rng.below(8),
        2 => u64::MAX - rng.below(4096),
        _ => 8 * rng.below(64),
    };
    let dma_length = match rng.below(4) {
        0 => rng.next() as u32,
        1 => (len as u32)
            .wrapping_add(rng.below(5) as u32)
            .wrapping_sub(2),
        _ => len as u32,
    };
    Aim {
        address: conn.remote.vaddr.wrapping_add(offset),
        rkey,
        dma_length,
    }
}

/// The extension header `header` the opcode carries, filled from `aim` or at random.
fn add_header(rng: &mut Rng, conn: &Conn, packet: &mut Packet, header: ExtHeader, aim: &Aim) {
    let Aim {
        address,
        rkey,
        dma_length,
    } = *aim;
    match header {
        ExtHeader::Reth => {
            packet.ext.reth = Some(reth::Repr {
                virtual_address: address,
                rkey,
                dma_length,
            })
        }
        ExtHeader::Aeth => {
            let syndrome = match rng.below(4) {
                0 => Syndrome::RnrNak(RnrTimer::new(rng.below(32) as u8)),
                1 => Syndrome::Nak(rng.pick(&[
                    NakCode::PsnSequenceError,
                    NakCode::InvalidRequest,
                    NakCode::RemoteAccessError,
                    NakCode::RemoteOperationalError,
                ])),
                _ => Syndrome::Ack(CreditCount::UNLIMITED),
            };
            packet.ext.aeth = Some(aeth::Repr {
                syndrome,
                msn: rng.next() as u32 & 0xFF_FFFF,
            });
        }
        ExtHeader::Deth => {
            packet.ext.deth = Some(deth::Repr {
                qkey: rng.next() as u32,
                src_qpn: conn.local.qpn,
            })
        }
        ExtHeader::ImmDt => {
            packet.ext.immdt = Some(immdt::Repr {
                immediate: rng.next() as u32,
            })
        }
        ExtHeader::Ieth => packet.ext.ieth = Some(ieth::Repr { rkey }),
        ExtHeader::AtomicEth => {
            packet.ext.atomic_eth = Some(atomic_eth::Repr {
                virtual_address: address,
                rkey,
                swap_add: rng.next(),
                compare: rng.next(),
            })
        }
        ExtHeader::AtomicAckEth => {
            packet.ext.atomic_ack_eth = Some(atomic_ack_eth::Repr {
                original: rng.next(),
            })
        }
        ExtHeader::Feth => {
            packet.ext.feth = Some(feth::Repr {
                selectivity_level: rng.below(4) as u8,
                placement_type: rng.below(4) as u8,
            })
        }
        ExtHeader::Cnp => packet.ext.cnp = Some(cnp::Repr),
        ExtHeader::XrcEth => {
            packet.ext.xrceth = Some(xrceth::Repr {
                srqn: rng.next() as u32 & 0xFF_FFFF,
            })
        }
    }
}

/// Up to two damages after the headers are built (ICRC recomputed unless the damage is
/// to the ICRC), and a pad count beyond a short payload.
fn add_damage(rng: &mut Rng, packet: &mut Packet, len: usize) {
    if len < 4 && rng.chance(30) {
        // A pad count beyond the payload: a length that goes negative when computed.
        packet.damage.push(Damage::PadCount(1 + rng.below(3) as u8));
    }
    for _ in 0..rng.below(3) {
        let damage = match rng.below(10) {
            0..=2 => Damage::Opcode(rng.next() as u8),
            3..=4 => Damage::PadCount(rng.below(4) as u8),
            5 => Damage::Tver(rng.below(16) as u8),
            6..=8 => Damage::Truncate(rng.below(12 + 32 + len as u64) as usize),
            _ => Damage::Icrc(1 << rng.below(32)),
        };
        packet.damage.push(damage);
    }
}

/// What a finding's first frame (its anchor) says about the connection it was made on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Anchor {
    /// The server it needs.
    pub service: Service,
    /// The target QP's number.
    pub qpn: u32,
    /// The PSN the target expected.
    pub psn: Psn,
    /// The rkey and address of the target's buffer (write, read, atomic).
    pub memory: Option<(u32, u64)>,
}

fn read_u32(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

fn read_u64(bytes: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_be_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
}

impl Anchor {
    /// Reads the anchor frame.
    pub fn of(frame: &[u8]) -> Option<Anchor> {
        let bth = Offsets::of(frame)?.bth;
        let opcode = Opcode::try_from(*frame.get(bth)?).ok()?;
        let service = match opcode {
            Opcode::RcRdmaWriteOnly => Service::Write,
            Opcode::RcRdmaReadRequest => Service::Read,
            Opcode::RcFetchAdd => Service::Atomic,
            Opcode::RcSendOnly => Service::Send,
            _ => return None,
        };
        let ext = bth + 12;
        let memory = match service {
            Service::Send => None,
            _ => Some((read_u32(frame, ext + 8)?, read_u64(frame, ext)?)),
        };
        Some(Anchor {
            service,
            qpn: read_u32(frame, bth + 4)? & 0xFF_FFFF,
            psn: Psn::new(read_u32(frame, bth + 8)? & 0xFF_FFFF),
            memory,
        })
    }
}

/// Moves a frame made on the connection of `from` to that of `to` and to `link`'s
/// stations: QPN, PSN (by the same offset), rkey and address (by the same change), MACs and
/// IP addresses; an ICRC that was right is right again, one that was wrong stays as wrong.
/// The frame keeps its IP family: one of the other family's, or too short for its headers,
/// goes as it is.
pub fn retarget(frame: &[u8], from: &Anchor, to: &Anchor, link: &Link) -> Vec<u8> {
    let mut frame = frame.to_vec();
    let len = frame.len();
    let Some(at) = Offsets::of(&frame).filter(|at| len >= at.bth + ICRC_LEN) else {
        return frame;
    };
    let (ours, theirs) = (
        address_bytes(link.ours.ip, at.ipv6),
        address_bytes(link.theirs.ip, at.ipv6),
    );
    let (Some(ours), Some(theirs)) = (ours, theirs) else {
        return frame;
    };
    let wrongness = icrc::compute(&frame[at.ip..len - ICRC_LEN])
        .map(|computed| {
            let trailer = &frame[len - ICRC_LEN..];
            computed ^ icrc::read([trailer[0], trailer[1], trailer[2], trailer[3]])
        })
        .ok();
    frame[0..6].copy_from_slice(&link.theirs.mac);
    frame[6..12].copy_from_slice(&link.ours.mac);
    let (source, width) = if at.ipv6 {
        (at.ip + 8, 16)
    } else {
        (at.ip + 12, 4)
    };
    frame[source..source + width].copy_from_slice(&ours);
    frame[source + width..source + 2 * width].copy_from_slice(&theirs);
    let (bth, body) = (at.bth, len - ICRC_LEN);
    if body >= bth + 12 {
        if read_u32(&frame, bth + 4).map(|w| w & 0xFF_FFFF) == Some(from.qpn) {
            frame[bth + 5..bth + 8].copy_from_slice(&to.qpn.to_be_bytes()[1..]);
        }
        let psn = Psn::new(read_u32(&frame, bth + 8).unwrap_or(0) & 0xFF_FFFF);
        let moved = to.psn + (psn.distance(from.psn) as u32);
        frame[bth + 9..bth + 12].copy_from_slice(&moved.value().to_be_bytes()[1..]);
    }
    let memory_header = Opcode::try_from(frame[bth])
        .ok()
        .and_then(|opcode| opcode.info().headers.first().copied())
        .filter(|header| matches!(header, ExtHeader::Reth | ExtHeader::AtomicEth));
    let ext = bth + 12;
    if let (Some(_), Some((old_rkey, old_va)), Some((new_rkey, new_va))) =
        (memory_header, from.memory, to.memory)
    {
        if body >= ext + 12 {
            let va = read_u64(&frame, ext).unwrap_or(0);
            let rkey = read_u32(&frame, ext + 8).unwrap_or(0);
            let va = new_va.wrapping_add(va.wrapping_sub(old_va));
            let rkey = new_rkey ^ (rkey ^ old_rkey);
            frame[ext..ext + 8].copy_from_slice(&va.to_be_bytes());
            frame[ext + 8..ext + 12].copy_from_slice(&rkey.to_be_bytes());
        }
    }
    fix_lengths(&mut frame);
    if let (Some(wrongness), Ok(value)) = (wrongness, icrc::compute(&frame[at.ip..body])) {
        frame[body..].copy_from_slice(&icrc::to_bytes(value ^ wrongness));
    }
    frame
}

/// `ip`'s bytes as an IPv6 header (`ipv6`) or an IPv4 one carries them, if it is of that
/// family.
fn address_bytes(ip: std::net::IpAddr, ipv6: bool) -> Option<Vec<u8>> {
    match ip {
        std::net::IpAddr::V4(ip) if !ipv6 => Some(ip.octets().to_vec()),
        std::net::IpAddr::V6(ip) if ipv6 => Some(ip.octets().to_vec()),
        _ => None,
    }
}

/// Runs `roce replay`.
pub fn run_replay(args: &ReplayArgs) -> ExitCode {
    match replay_file(args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(error) => {
            eprintln!("roce replay: {error}");
            ExitCode::from(2)
        }
    }
}

fn replay_file(args: &ReplayArgs) -> io::Result<bool> {
    let frames: Vec<Vec<u8>> = read_frames(&args.file)
        .map_err(io::Error::other)?
        .into_iter()
        .map(|frame| frame.data)
        .collect();
    let from = frames
        .first()
        .and_then(|frame| Anchor::of(frame))
        .ok_or_else(|| io::Error::other("the first frame is not a finding's anchor"))?;
    let mut target = args.reach.perftest();
    let mut link = open_link(
        &target,
        from.service,
        args.reach.device.as_deref(),
        None,
        Duration::from_millis(args.wait),
    )?;
    let options = Options {
        send_size: args.reach.send_size,
        check: args.check.clone(),
    };
    replay(&mut target, &mut link, &frames, &options, &mut io::stdout())
}

/// Sends a finding's frames again on a fresh connection, one line per frame with the
/// answers, then `replayed=N status=ok|BROKE`; returns whether the target still works.
pub fn replay(
    target: &mut dyn Target,
    link: &mut Link,
    frames: &[Vec<u8>],
    options: &Options,
    out: &mut dyn io::Write,
) -> io::Result<bool> {
    let from = frames
        .first()
        .and_then(|frame| Anchor::of(frame))
        .ok_or_else(|| io::Error::other("the first frame is not a finding's anchor"))?;
    if Offsets::of(&frames[0]).map(|at| at.ipv6) != Some(link.ours.ip.is_ipv6()) {
        return Err(io::Error::other(
            "the finding was recorded over the other IP family than the target's",
        ));
    }
    let local = Local {
        qpn: 0x10_0000 | (from.psn.value() & 0xF_FFFF),
        psn: Psn::new(from.psn.value() ^ 0x55_5555),
        gid: gid_of(link.ours.ip),
    };
    let session = target.connect(from.service, &local)?;
    let remote = session.remote();
    let mut conn = Conn::new(link, remote, local, options.send_size);
    let to = Anchor {
        service: from.service,
        qpn: remote.qpn,
        psn: local.psn,
        memory: from.memory.map(|_| (remote.rkey, remote.vaddr)),
    };
    for (index, frame) in frames.iter().enumerate() {
        let bytes = retarget(frame, &from, &to, conn.link());
        let answers = conn.exchange_bytes(&bytes, 1)?;
        let shown: Vec<String> = answers
            .iter()
            .map(|answer| {
                super::link::Shown {
                    answer,
                    base: local.psn,
                }
                .to_string()
            })
            .collect();
        let shown = if shown.is_empty() {
            "none".to_string()
        } else {
            shown.join("+")
        };
        writeln!(out, "{index} answers={shown}")?;
    }
    if from.service == Service::Send {
        use_up_receives(&mut conn)?;
    }
    let _ = session.close();
    let alive = alive(target, link, from.service, options)?;
    writeln!(
        out,
        "replayed={} status={}",
        frames.len(),
        if alive { "ok" } else { "BROKE" }
    )?;
    Ok(alive)
}

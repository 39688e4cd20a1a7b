//! `roce dump`: a small tshark for RoCEv2.
//!
//! One line per RoCEv2 frame (index in its file, IP source → destination, UDP source port,
//! opcode, destination QPN, PSN, AckReq, extension headers, payload length, ICRC verdict,
//! and for a communication manager MAD to QP1 its message, e.g. `CM_REQ ... tid=...`);
//! other traffic is counted and skipped. The last line is always
//! `frames=N roce=M icrc_bad=K malformed=J`, also when a file cannot be read or stops inside
//! a record (a capture cut short, as by a killed writer): every complete record before the
//! cut is decoded and counted, stderr says where the file stops, and the next file is read.
//! The exit status is 2 when any file could not be read to its end, otherwise 1 when K or J
//! is not 0, otherwise 0 (141 when stdout is closed early).

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use roce_provider::capture::CaptureReader;
use roce_wire::{cm, mad, Frame, FrameError, FrameRepr, Opcode};

/// Arguments of `roce dump`.
#[derive(clap::Args)]
pub struct Args {
    /// Print only one `NAME COUNT` line per opcode seen, in opcode order.
    #[arg(long)]
    summary: bool,
    /// Capture files (pcap or pcapng, Ethernet link type).
    #[arg(required = true, value_name = "FILE")]
    files: Vec<PathBuf>,
}

/// What the dump has seen so far.
#[derive(Default)]
struct Tally {
    frames: u64,
    roce: u64,
    icrc_bad: u64,
    malformed: u64,
    by_opcode: BTreeMap<Opcode, u64>,
}

impl Tally {
    /// Classifies one frame and returns the line to print for it, if any.
    fn add(&mut self, data: &[u8]) -> Option<String> {
        self.frames += 1;
        let frame = match Frame::new_checked(data) {
            Ok(frame) => frame,
            Err(FrameError::NotRoce) => return None,
            Err(error) => {
                self.roce += 1;
                self.malformed += 1;
                return Some(error.to_string());
            }
        };
        self.roce += 1;
        let repr = match FrameRepr::parse_ignoring_icrc(&frame) {
            Ok(repr) => repr,
            Err(error) => {
                self.malformed += 1;
                return Some(error.to_string());
            }
        };
        *self.by_opcode.entry(repr.bth.opcode).or_default() += 1;
        let verdict = if frame.check_icrc().is_ok() {
            "ok"
        } else {
            self.icrc_bad += 1;
            "BAD"
        };
        let mut line = format!("{repr} icrc={verdict}");
        if let Some(cm) = cm_message(&repr, frame.payload()) {
            line.push(' ');
            line.push_str(&cm);
        }
        Some(line)
    }

    fn is_clean(&self) -> bool {
        self.icrc_bad == 0 && self.malformed == 0
    }
}

/// A communication manager MAD sent to QP1 (the GSI), decoded; other payloads are not.
fn cm_message(repr: &FrameRepr, payload: &[u8]) -> Option<String> {
    if repr.bth.dest_qpn != mad::GSI_QPN {
        return None;
    }
    let message = cm::Repr::parse(&mad::Packet::new_checked(payload).ok()?).ok()?;
    Some(message.to_string())
}

/// What the dump found, and whether every file could be read to its end.
struct Outcome {
    tally: Tally,
    unreadable: bool,
}

/// Runs `roce dump`.
pub fn run(args: &Args) -> ExitCode {
    let stdout = io::stdout();
    let mut out = io::BufWriter::new(stdout.lock());
    match dump(args, &mut out).and_then(|outcome| out.flush().map(|()| outcome)) {
        Ok(outcome) if outcome.unreadable => ExitCode::from(2),
        Ok(outcome) if outcome.tally.is_clean() => ExitCode::SUCCESS,
        Ok(_) => ExitCode::FAILURE,
        // The reader went away (`roce dump ... | head`): stop quietly, as tcpdump does.
        Err(error) if error.kind() == io::ErrorKind::BrokenPipe => ExitCode::from(141),
        Err(error) => {
            let _ = out.flush();
            eprintln!("roce dump: {error}");
            ExitCode::from(2)
        }
    }
}

fn dump(args: &Args, out: &mut impl Write) -> io::Result<Outcome> {
    let mut tally = Tally::default();
    let mut unreadable = false;
    let several = args.files.len() > 1;
    for path in &args.files {
        if several && !args.summary {
            writeln!(out, "# {}", path.display())?;
        }
        if let Err(why) = dump_file(path, args.summary, &mut tally, out)? {
            // Said after the frames before it, which stdout may still hold.
            out.flush()?;
            eprintln!("roce dump: {}: {why}", path.display());
            unreadable = true;
        }
    }
    if args.summary {
        for (opcode, count) in &tally.by_opcode {
            writeln!(out, "{} {count}", opcode.name())?;
        }
    }
    writeln!(
        out,
        "frames={} roce={} icrc_bad={} malformed={}",
        tally.frames, tally.roce, tally.icrc_bad, tally.malformed
    )?;
    Ok(Outcome { tally, unreadable })
}

/// Decodes the frames of one file into `tally` (and lines on `out`, unless `summary`).
/// The inner error says why the file could not be read to its end; the outer one is
/// stdout's.
fn dump_file(
    path: &Path,
    summary: bool,
    tally: &mut Tally,
    out: &mut impl Write,
) -> io::Result<Result<(), String>> {
    let reader = match CaptureReader::open(path) {
        Ok(reader) => reader,
        Err(error) => return Ok(Err(error.to_string())),
    };
    let mut complete = 0;
    for frame in reader {
        let frame = match frame {
            Ok(frame) => frame,
            Err(error) => {
                return Ok(Err(format!(
                    "the file stops inside a record after {complete} complete frames: it was \
                     cut short (as by a writer that was killed) or is damaged there ({error})"
                )))
            }
        };
        complete += 1;
        let line = tally.add(&frame.data);
        if let (Some(line), false) = (line, summary) {
            writeln!(out, "{complete} {line}")?;
        }
    }
    Ok(Ok(()))
}

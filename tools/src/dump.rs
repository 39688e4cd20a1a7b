//! `roce dump`: a small tshark for RoCEv2.
//!
//! One line per RoCEv2 frame (index in its file, IP source → destination, UDP source port,
//! opcode, destination QPN, PSN, AckReq, extension headers, payload length, ICRC verdict,
//! and for a communication manager MAD to QP1 its message, e.g. `CM_REQ ... tid=...`);
//! other traffic is counted and skipped. The last line is always
//! `frames=N roce=M icrc_bad=K malformed=J`, and the exit status is 0 exactly when K and J
//! are 0 (2 when a file cannot be read, 141 when stdout is closed early).

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::PathBuf;
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

/// Runs `roce dump`.
pub fn run(args: &Args) -> ExitCode {
    let stdout = io::stdout();
    let mut out = io::BufWriter::new(stdout.lock());
    match dump(args, &mut out).and_then(|tally| out.flush().map(|()| tally)) {
        Ok(tally) if tally.is_clean() => ExitCode::SUCCESS,
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

fn dump(args: &Args, out: &mut impl Write) -> io::Result<Tally> {
    let mut tally = Tally::default();
    let several = args.files.len() > 1;
    for path in &args.files {
        let named = |error: &dyn std::fmt::Display| {
            io::Error::other(format!("{}: {error}", path.display()))
        };
        let reader = CaptureReader::open(path).map_err(|e| named(&e))?;
        if several && !args.summary {
            writeln!(out, "# {}", path.display())?;
        }
        for (index, frame) in reader.enumerate() {
            let frame = frame.map_err(|e| named(&e))?;
            let line = tally.add(&frame.data);
            if let (Some(line), false) = (line, args.summary) {
                writeln!(out, "{} {line}", index + 1)?;
            }
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
    Ok(tally)
}

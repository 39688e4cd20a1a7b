//! Progress on stderr, a tenth at a time: on a terminal one line that updates in place, to a
//! file or pipe one whole line per step (a log must not read `10%roce demo: 20%...`).

use std::io::{self, IsTerminal, Write};
use std::time::{Duration, Instant};

/// Reports each tenth of a run that is reached, once the run has lasted `quiet_for`.
pub struct Tenths<W: Write = io::Stderr> {
    out: W,
    /// `out` is a terminal: one line, rewritten.
    terminal: bool,
    prefix: String,
    started: Instant,
    quiet_for: Duration,
    shown: u64,
    /// A line that updates in place is on the terminal, still without its newline.
    open_line: bool,
}

impl Tenths {
    /// Reports on stderr; `prefix` starts every report (`roce demo: WRITE`).
    pub fn new(prefix: impl Into<String>, quiet_for: Duration) -> Tenths {
        let terminal = io::stderr().is_terminal();
        Tenths::to(io::stderr(), terminal, prefix, quiet_for)
    }
}

impl<W: Write> Tenths<W> {
    /// Reports on `out`, which is a terminal or not.
    pub fn to(out: W, terminal: bool, prefix: impl Into<String>, quiet_for: Duration) -> Self {
        Tenths {
            out,
            terminal,
            prefix: prefix.into(),
            started: Instant::now(),
            quiet_for,
            shown: 0,
            open_line: false,
        }
    }

    /// `done` of `total` are done; `detail`, given the time since the start, follows the
    /// percentage when a tenth is shown.
    pub fn update(&mut self, done: u64, total: u64, detail: impl FnOnce(Duration) -> String) {
        let tenths = (u128::from(done) * 10 / u128::from(total.max(1))) as u64;
        if tenths > self.shown && self.started.elapsed() >= self.quiet_for {
            let detail = detail(self.started.elapsed());
            let line = format!("{} {}%{detail}", self.prefix, tenths * 10);
            // A report is a courtesy: a closed stderr must not fail the run.
            let _ = if self.terminal {
                self.open_line = true;
                write!(self.out, "\r{line}\x1b[K").and_then(|()| self.out.flush())
            } else {
                writeln!(self.out, "{line}")
            };
        }
        self.shown = self.shown.max(tenths);
    }

    /// Ends the line that updates in place, if there is one.
    pub fn finish(&mut self) {
        if std::mem::take(&mut self.open_line) {
            let _ = writeln!(self.out);
        }
    }
}

impl<W: Write> Drop for Tenths<W> {
    fn drop(&mut self) {
        self.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(terminal: bool) -> String {
        let mut out = Vec::new();
        {
            let mut tenths = Tenths::to(&mut out, terminal, "roce demo: READ", Duration::ZERO);
            for done in [0, 10, 15, 20, 100] {
                tenths.update(done, 100, |_| String::new());
            }
        }
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn a_pipe_gets_whole_lines() {
        assert_eq!(
            report(false),
            "roce demo: READ 10%\nroce demo: READ 20%\nroce demo: READ 100%\n"
        );
    }

    #[test]
    fn a_terminal_gets_one_line_rewritten_and_ended() {
        assert_eq!(
            report(true),
            "\rroce demo: READ 10%\x1b[K\rroce demo: READ 20%\x1b[K\rroce demo: READ 100%\x1b[K\n"
        );
    }
}

//! Judging a scenario and reporting it: one result line per scenario, the summary line
//! last.

use std::io::{self, Write};
use std::process::Command;

use super::target::Options;

/// A scenario's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The target answered as the specification requires.
    Pass,
    /// It answered otherwise, and still works.
    Deviates,
    /// It stopped working.
    Broke,
}

/// The counts of the last line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Summary {
    /// Scenarios run.
    pub scenarios: usize,
    /// Passed.
    pub pass: usize,
    /// Deviated.
    pub deviate: usize,
    /// Broke the target.
    pub broke: usize,
}

/// `--check`'s failure, if it failed.
pub fn failed_check(options: &Options) -> io::Result<Option<String>> {
    let Some(check) = &options.check else {
        return Ok(None);
    };
    let status = Command::new("sh").args(["-c", check]).status()?;
    Ok((!status.success()).then(|| format!("check:{status}")))
}

/// What failed in a liveness probe named `name`, if it did not see what it `expected`.
pub fn failed_probe(name: &str, expected: &[&str], seen: Result<String, String>) -> Option<String> {
    match seen {
        Ok(seen) if expected.contains(&seen.as_str()) => None,
        Ok(seen) | Err(seen) => Some(format!("{name}:{seen}")),
    }
}

/// One scenario's result line.
pub struct Line<'a> {
    /// The scenario.
    pub name: &'a str,
    /// What the specification allows.
    pub expected: &'a [&'a str],
    /// What the target did.
    pub observed: String,
    /// The verdict.
    pub verdict: Verdict,
    /// What failed after the scenario, if it broke the target.
    pub broken_by: Vec<String>,
}

impl<'a> Line<'a> {
    /// The verdict on `outcome` (an observation, or why no connection could be made):
    /// unless that broke it already, `after` (given the observation) says what fails
    /// after the scenario, which makes it BROKE.
    pub fn judge(
        name: &'a str,
        expected: &'a [&'a str],
        outcome: Result<String, String>,
        after: impl FnOnce(&str) -> io::Result<Vec<String>>,
    ) -> io::Result<Line<'a>> {
        let (observed, mut verdict) = match outcome {
            Ok(observed) if expected.contains(&observed.as_str()) => (observed, Verdict::Pass),
            Ok(observed) => (observed, Verdict::Deviates),
            Err(why) => (why, Verdict::Broke),
        };
        let mut broken_by = Vec::new();
        if verdict != Verdict::Broke {
            broken_by = after(&observed)?;
            if !broken_by.is_empty() {
                verdict = Verdict::Broke;
            }
        }
        Ok(Line {
            name,
            expected,
            observed,
            verdict,
            broken_by,
        })
    }

    /// Writes `NAME expected=... observed=... VERDICT [after=...]` and counts it.
    pub fn write(&self, out: &mut dyn Write, summary: &mut Summary) -> io::Result<()> {
        summary.scenarios += 1;
        let word = match self.verdict {
            Verdict::Pass => {
                summary.pass += 1;
                "PASS"
            }
            Verdict::Deviates => {
                summary.deviate += 1;
                "DEVIATES"
            }
            Verdict::Broke => {
                summary.broke += 1;
                "BROKE"
            }
        };
        let why = if self.broken_by.is_empty() {
            String::new()
        } else {
            format!(" after={}", one_word(&self.broken_by.join(";")))
        };
        writeln!(
            out,
            "{} expected={} observed={} {word}{why}",
            self.name,
            self.expected.join("|"),
            one_word(&self.observed),
        )?;
        out.flush()
    }
}

impl Summary {
    /// The last line.
    pub fn write(&self, out: &mut dyn Write) -> io::Result<()> {
        writeln!(
            out,
            "scenarios={} pass={} deviate={} broke={}",
            self.scenarios, self.pass, self.deviate, self.broke
        )
    }
}

/// `text` with its whitespace made underscores, so that a result line splits on spaces.
fn one_word(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join("_")
}

/// Judges `scenarios` in order with `judge`, one result line each and the summary line on
/// `out`; stops after the first BROKE (what follows would only measure a dead target).
pub fn write_suite<'s, T>(
    scenarios: &[&'s T],
    out: &mut dyn Write,
    mut judge: impl FnMut(&'s T) -> io::Result<Line<'s>>,
) -> io::Result<Summary> {
    let mut summary = Summary::default();
    for scenario in scenarios {
        let line = judge(scenario)?;
        line.write(out, &mut summary)?;
        if line.verdict == Verdict::Broke {
            break;
        }
    }
    summary.write(out)?;
    Ok(summary)
}

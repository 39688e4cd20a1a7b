//! rdma-core's own test suite (Debian's python3-pyverbs: the tests in
//! /usr/share/doc/rdma-core/tests) over our libraries, as a user runs it: each test alone,
//! `run_tests.py --dev IFACE --gid 1 -v tests.MODULE.CLASS.TEST` under `roce exec` on a veth
//! (MTU 1500) in a namespace of its own, at most 40 s, with 2 MiB huge pages allocated
//! (and the count restored after). Every test outside mlx5/efa/cuda/vfio must have the
//! outcome `rdma_core_suite.expect` gives it: `ok`; `skip KIND` with a reason of that kind
//! (device memory, dmabuf, raw packet QPs: hardware with no software meaning); or, staged
//! while the rest lands, `fails OWNER: WHY`, which is tolerated and reported (as is such a
//! test passing: take it off the list). A hang is a failure whatever the list says, and so
//! is a test the list does not name or a name it has that the suite lacks.
//!
//! `ROCE_SUITE=test_qpex,test_mr.MRTest` runs only the tests whose name (without `tests.`)
//! starts with one of the comma-separated prefixes; `ROCE_SUITE_JOBS` (default 2) how many
//! run at a time, each in a namespace pair of its own. The table of outcomes goes to
//! stderr (`-- --nocapture`).
//!
//! Needs root, python3-pyverbs and the system Python (/usr/bin/python3); in CI a missing
//! prerequisite fails the test, elsewhere it is skipped with a message.

mod common;

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use roce_provider::netns::{needs_root, prerequisite, veth, Netns};

use common::{build_libraries, text};

/// Where Debian puts the suite.
const SUITE: &str = "/usr/share/doc/rdma-core/tests";
/// pyverbs is built for the system Python, which need not be the first on PATH.
const PYTHON: &str = "/usr/bin/python3";
/// How long one test may take.
const LIMIT: &str = "40";
/// Tests of hardware or providers we are not (their own modules and classes).
const OTHERS: [&str; 4] = ["mlx5", "efa", "cuda", "vfio"];
/// The 2 MiB huge pages the suite's huge-page tests get.
const HUGE_PAGES: u64 = 64;

/// What a skip may be for: (kind, words its reason must contain, one of them).
const SKIP_KINDS: [(&str, &[&str]); 3] = [
    ("device-memory", &["Device memory"]),
    ("dmabuf", &["dmabuf"]),
    ("raw-packet-qp", &["Raw Packet", "QP type 8"]),
];

/// What a test did.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    Ok,
    Skip(String),
    Fail(String),
    Error(String),
    Hang,
    /// Ended with no verdict (a signal, an exit before unittest reported).
    Crash(String),
}

impl Outcome {
    fn word(&self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Skip(_) => "skip",
            Outcome::Fail(_) => "FAIL",
            Outcome::Error(_) => "ERROR",
            Outcome::Hang => "HANG",
            Outcome::Crash(_) => "CRASH",
        }
    }

    fn why(&self) -> &str {
        match self {
            Outcome::Ok => "",
            Outcome::Hang => "no verdict within 40 s",
            Outcome::Skip(why) | Outcome::Fail(why) | Outcome::Error(why) | Outcome::Crash(why) => {
                why
            }
        }
    }
}

/// What the list says a test must do.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Expected {
    Ok,
    Skip(&'static str),
    /// Staged: (owner, why).
    Fails(String, String),
}

fn expectations() -> BTreeMap<String, Expected> {
    let mut list = BTreeMap::new();
    for (number, line) in include_str!("rdma_core_suite.expect").lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, rest) = line
            .split_once(char::is_whitespace)
            .unwrap_or_else(|| panic!("rdma_core_suite.expect:{}: {line}", number + 1));
        let rest = rest.trim();
        let expected = if rest == "ok" {
            Expected::Ok
        } else if let Some(kind) = rest.strip_prefix("skip ") {
            let known = SKIP_KINDS.iter().find(|(known, _)| *known == kind.trim());
            Expected::Skip(
                known
                    .unwrap_or_else(|| panic!("rdma_core_suite.expect:{}: {kind}", number + 1))
                    .0,
            )
        } else if let Some((owner, why)) = rest
            .strip_prefix("fails ")
            .and_then(|rest| rest.split_once(':'))
        {
            Expected::Fails(owner.trim().into(), why.trim().into())
        } else {
            panic!("rdma_core_suite.expect:{}: {line}", number + 1);
        };
        assert!(
            list.insert(name.to_string(), expected).is_none(),
            "rdma_core_suite.expect: {name} twice"
        );
    }
    list
}

/// The suite, unpacked into `dir/tests` (Debian gzips the larger files).
fn unpack(dir: &Path) -> PathBuf {
    let tests = dir.join("tests");
    std::fs::create_dir(&tests).unwrap();
    for entry in std::fs::read_dir(SUITE).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if let Some(stem) = name.strip_suffix(".gz") {
            let output = Command::new("gzip").arg("-dc").arg(&path).output().unwrap();
            assert!(output.status.success(), "gunzip {name}: {}", text(&output));
            std::fs::write(tests.join(stem), output.stdout).unwrap();
        } else if path.is_file() {
            std::fs::copy(&path, tests.join(&name)).unwrap();
        }
    }
    tests
}

/// The suite's tests outside other vendors' hardware, as `test_x.Class.test_y`.
fn listed(tests: &Path) -> Vec<String> {
    let output = Command::new(PYTHON)
        .args(["run_tests.py", "--list-tests"])
        .current_dir(tests)
        .output()
        .unwrap();
    assert!(output.status.success(), "--list-tests: {}", text(&output));
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.trim().strip_prefix("tests."))
        .filter(|name| {
            let lower = name.to_lowercase();
            !OTHERS.iter().any(|other| lower.contains(other))
        })
        .map(str::to_string)
        .collect()
}

/// The verdict unittest printed for the one test it ran (stderr of `-v`).
fn verdict(status: Option<i32>, said: &str) -> Outcome {
    // timeout(1): 124 when it sent TERM, 137 when it had to KILL.
    if matches!(status, Some(124) | Some(137)) {
        return Outcome::Hang;
    }
    // "name (id)\ndoc ... VERDICT", the verdict on a later line if the test printed first.
    let after = said.split_once(" ... ").map(|(_, after)| after);
    let found = after.and_then(|after| {
        after.lines().find_map(|line| {
            let line = line.trim();
            if line == "ok" {
                Some(Outcome::Ok)
            } else if line == "FAIL" {
                Some(Outcome::Fail(reason(said, "FAIL: ")))
            } else if line == "ERROR" {
                Some(Outcome::Error(reason(said, "ERROR: ")))
            } else if let Some(why) = line.strip_prefix("skipped ") {
                Some(Outcome::Skip(why.trim_matches('\'').to_string()))
            } else if line == "unexpected success" || line == "expected failure" {
                Some(Outcome::Fail(line.to_string()))
            } else {
                None
            }
        })
    });
    let tail = || -> Vec<&str> { said.lines().rev().take(3).collect() };
    match found {
        // unittest exits 0 when nothing failed: a passed or skipped test whose process then
        // died (a signal, an abort at exit) did not end well.
        Some(Outcome::Ok | Outcome::Skip(_)) if status != Some(0) => Outcome::Crash(format!(
            "passed or skipped, then exit status {status:?}, ending {:?}",
            tail()
        )),
        Some(outcome) => outcome,
        None => Outcome::Crash(format!("exit status {status:?}, ending {:?}", tail())),
    }
}

/// The last line of the traceback under `FAIL: ` or `ERROR: `.
fn reason(said: &str, header: &str) -> String {
    let Some((_, block)) = said.split_once(&format!("\n{header}")) else {
        return "(no traceback)".into();
    };
    let mut parts =
        block.split("\n----------------------------------------------------------------------\n");
    parts.next(); // the test's name and description
    let traceback = parts.next().unwrap_or_default();
    traceback
        .lines()
        .rev()
        .find(|line| !line.trim().is_empty())
        .unwrap_or("(empty traceback)")
        .trim()
        .to_string()
}

/// The 2 MiB huge-page pool, grown for the run and put back by the last run using it (runs
/// of several checkouts may overlap: each holds a shared lock while it runs).
struct HugePages {
    lock: File,
}

const HUGE_COUNT: &str = "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages";
const HUGE_LOCK: &str = "/tmp/roce-rdma-core-suite-hugepages.lock";
/// The count before the first overlapping run grew it.
const HUGE_SAVED: &str = "/tmp/roce-rdma-core-suite-hugepages.saved";

impl HugePages {
    fn grow() -> HugePages {
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(HUGE_LOCK)
            .unwrap();
        lock.lock().unwrap();
        let now: u64 = std::fs::read_to_string(HUGE_COUNT)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        if now < HUGE_PAGES {
            if !Path::new(HUGE_SAVED).exists() {
                std::fs::write(HUGE_SAVED, now.to_string()).unwrap();
            }
            std::fs::write(HUGE_COUNT, HUGE_PAGES.to_string()).unwrap();
        }
        let got: u64 = std::fs::read_to_string(HUGE_COUNT)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(got > 0, "no 2 MiB huge pages could be allocated");
        lock.unlock().unwrap();
        lock.lock_shared().unwrap();
        HugePages { lock }
    }
}

impl Drop for HugePages {
    fn drop(&mut self) {
        let _ = self.lock.unlock();
        // Only the last run holding it puts the count back.
        if self.lock.try_lock().is_ok() {
            if let Ok(saved) = std::fs::read_to_string(HUGE_SAVED) {
                let _ = std::fs::write(HUGE_COUNT, saved.trim());
                let _ = std::fs::remove_file(HUGE_SAVED);
            }
            let _ = self.lock.unlock();
        }
    }
}

/// One worker's place to run tests: a namespace whose veth `IFACE` (MTU 1500) leads to
/// another namespace.
struct Place {
    ns: Netns,
    _peer: Netns,
    interface: String,
}

fn place(worker: usize) -> Place {
    let ns = Netns::create(&format!("roce-suite{worker}")).unwrap();
    let peer = Netns::create(&format!("roce-suitep{worker}")).unwrap();
    let interface = format!("rs{worker}");
    veth(
        (&ns, &interface, &format!("10.89.{worker}.1/24")),
        (
            &peer,
            &format!("rsp{worker}"),
            &format!("10.89.{worker}.2/24"),
        ),
        1500,
    )
    .unwrap();
    Place {
        ns,
        _peer: peer,
        interface,
    }
}

/// Runs one test alone in `place`.
fn run_one(tests: &Path, place: &Place, name: &str) -> (Outcome, Duration, Output) {
    let start = Instant::now();
    let output = Command::new("ip")
        .args(["netns", "exec", &place.ns.name, "timeout", "-k", "5", LIMIT])
        .args([
            env!("CARGO_BIN_EXE_roce"),
            "exec",
            "--",
            PYTHON,
            "run_tests.py",
        ])
        .args(["--dev", &place.interface, "--gid", "1", "-v"])
        .arg(format!("tests.{name}"))
        .current_dir(tests)
        .output()
        .unwrap();
    let said = text(&output);
    (
        verdict(output.status.code(), &said),
        start.elapsed(),
        output,
    )
}

#[test]
fn rdma_core_suite_meets_its_expectations() {
    let test = "rdma_core_suite_meets_its_expectations";
    let present = Path::new(SUITE).join("run_tests.py").exists()
        && Path::new(PYTHON).exists()
        && Path::new("/usr/lib/python3/dist-packages/pyverbs").exists();
    if !needs_root(test) || !prerequisite(test, "python3-pyverbs", present) {
        return;
    }
    build_libraries();
    let expected = expectations();
    let dir = tempfile::tempdir().unwrap();
    let tests = unpack(dir.path());
    let all = listed(&tests);
    let filter: Vec<String> = std::env::var("ROCE_SUITE")
        .map(|value| {
            value
                .split(',')
                .map(|part| part.trim().to_string())
                .collect()
        })
        .unwrap_or_default();
    let chosen: Vec<&String> = all
        .iter()
        .filter(|name| filter.is_empty() || filter.iter().any(|prefix| name.starts_with(prefix)))
        .collect();
    assert!(!chosen.is_empty(), "no test matches ROCE_SUITE={filter:?}");
    let mut problems: Vec<String> = Vec::new();
    if filter.is_empty() {
        for name in &all {
            if !expected.contains_key(name) {
                problems.push(format!("{name}: not in rdma_core_suite.expect"));
            }
        }
        for name in expected.keys() {
            if !all.contains(name) {
                problems.push(format!(
                    "{name}: in rdma_core_suite.expect, not in the suite"
                ));
            }
        }
    }

    let _huge = HugePages::grow();
    let jobs: usize = std::env::var("ROCE_SUITE_JOBS")
        .ok()
        .and_then(|jobs| jobs.parse().ok())
        .unwrap_or(2)
        .clamp(1, 8);
    let queue = Mutex::new(chosen.iter().copied());
    let results = Mutex::new(BTreeMap::new());
    let started = Instant::now();
    std::thread::scope(|scope| {
        for worker in 0..jobs {
            let (queue, results, tests) = (&queue, &results, &tests);
            scope.spawn(move || {
                let place = place(worker);
                loop {
                    let Some(name) = queue.lock().unwrap().next() else {
                        break;
                    };
                    let result = run_one(tests, &place, name);
                    results.lock().unwrap().insert(name.clone(), result);
                }
            });
        }
    });
    let results = results.into_inner().unwrap();

    let mut table = String::new();
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    let mut now_passing = Vec::new();
    for (name, (outcome, took, output)) in &results {
        *counts.entry(outcome.word()).or_default() += 1;
        let want = expected.get(name);
        let owner = match want {
            Some(Expected::Fails(owner, _)) => owner.as_str(),
            _ => "",
        };
        table.push_str(&format!(
            "{:<6} {:>5.1}s {:<58} {:<9} {}\n",
            outcome.word(),
            took.as_secs_f64(),
            name,
            owner,
            outcome.why()
        ));
        let problem = match (want, outcome) {
            (_, Outcome::Hang) => Some("hangs"),
            (None, _) => None, // already reported as unlisted
            (Some(Expected::Ok), Outcome::Ok) => None,
            (Some(Expected::Ok), _) => Some("should pass"),
            (Some(Expected::Skip(kind)), Outcome::Skip(why)) => {
                let words = SKIP_KINDS
                    .iter()
                    .find(|(known, _)| known == kind)
                    .unwrap()
                    .1;
                (!words.iter().any(|word| why.contains(word)))
                    .then_some("should be skipped for the kind the list gives")
            }
            (Some(Expected::Skip(_)), _) => Some("should be skipped for the kind the list gives"),
            (Some(Expected::Fails(..)), Outcome::Ok) => {
                now_passing.push(name.clone());
                None
            }
            (Some(Expected::Fails(..)), _) => None,
        };
        if let Some(problem) = problem {
            problems.push(format!(
                "{name}: {problem}, got {} {}\n{}",
                outcome.word(),
                outcome.why(),
                text(output)
            ));
        }
    }
    eprintln!(
        "rdma-core's suite: {} tests in {:.0} s ({jobs} at a time): {counts:?}\n{table}",
        results.len(),
        started.elapsed().as_secs_f64()
    );
    if !now_passing.is_empty() {
        eprintln!(
            "PASSED THIS RUN, listed as failing (once they pass every run, make them `ok` in \
             rdma_core_suite.expect):\n  {}",
            now_passing.join("\n  ")
        );
    }
    assert!(problems.is_empty(), "{}", problems.join("\n\n"));
}

#[test]
fn verdicts_are_read_as_unittest_prints_them() {
    let skipped = "test_a (tests.test_x.C.test_a)\nDoc ... skipped 'Device memory is not supported'\n\n---\nRan 1 test\n\nOK (skipped=1)\n";
    assert_eq!(
        verdict(Some(0), skipped),
        Outcome::Skip("Device memory is not supported".into())
    );
    let late = "test_b (tests.test_x.C.test_b) ... libibverbs (roce-xdp): busy\nPlayer active got: x\nERROR\n\n======================================================================\nERROR: test_b (tests.test_x.C.test_b)\n----------------------------------------------------------------------\nTraceback (most recent call last):\n  File \"x.py\", line 1, in f\nException: Exception in active/passive side occurred\n\n----------------------------------------------------------------------\nRan 1 test in 15.2s\n\nFAILED (errors=1)\n";
    assert_eq!(
        verdict(Some(1), late),
        Outcome::Error("Exception: Exception in active/passive side occurred".into())
    );
    let printed_first = "test_c (tests.test_fork.F.test_c) ... is_fork_initialized() = 2\nok\n";
    assert_eq!(verdict(Some(0), printed_first), Outcome::Ok);
    assert_eq!(verdict(Some(124), printed_first), Outcome::Hang);
    assert!(matches!(
        verdict(Some(-11), "test_d ... "),
        Outcome::Crash(_)
    ));
}

//! `roce conform` and `roce fuzz` against our own stack: `roce perf` servers looping in one
//! namespace, the tool in another, over a veth pair. Every scenario must PASS or DEVIATE
//! exactly as docs/conformance.md says ours does, none may break the target, and a bounded
//! fuzz run must find nothing. Needs root (CI is root; there a missing prerequisite fails
//! the test).

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use roce_provider::netns::{needs_root, veth, Netns};

use common::text;
use roce_tests::rxe_vm::vm;

/// A `while :; do roce perf ...; done` loop in a namespace (servers, or clients of
/// `--serve`; or `roce pingpong`), stopped (with the program it is running) on drop.
struct PerfLoop<'a> {
    ns: &'a Netns,
    shell: Child,
}

impl<'a> PerfLoop<'a> {
    fn start(ns: &'a Netns, command: &str) -> Self {
        let roce = env!("CARGO_BIN_EXE_roce");
        let script = format!("while :; do timeout 60 {roce} {command} >/dev/null 2>&1; done");
        let shell = Command::new("ip")
            .args(["netns", "exec", &ns.name, "sh", "-c", &script])
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        PerfLoop { ns, shell }
    }
}

impl Drop for PerfLoop<'_> {
    fn drop(&mut self) {
        let _ = self.shell.kill();
        let _ = self.shell.wait();
        // The server the loop had started: every process left in the test's namespace.
        if let Ok(output) = Command::new("ip")
            .args(["netns", "pids", &self.ns.name])
            .output()
        {
            for pid in String::from_utf8_lossy(&output.stdout).split_whitespace() {
                let _ = Command::new("kill").arg(pid).stderr(Stdio::null()).status();
            }
        }
    }
}

/// The table columns of docs/conformance.md with a verdict per scenario.
const OURS: usize = 4;
const RXE: usize = 5;

/// A target's verdict per scenario, from the tables in docs/conformance.md (its column
/// starts with PASS, DEVIATES or BROKE, possibly in bold and followed by a colon).
fn documented(column: usize) -> BTreeMap<String, String> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/conformance.md");
    let doc = std::fs::read_to_string(path).unwrap();
    doc.lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let name = cells.get(1)?.trim_matches('`');
            let verdict = cells.get(column)?.trim_start_matches('*');
            let verdict = verdict.split([' ', ':']).next()?;
            matches!(verdict, "PASS" | "DEVIATES" | "BROKE")
                .then(|| (name.to_string(), verdict.to_string()))
        })
        .collect()
}

/// Checks every result line in `out` against `documented`; returns the scenarios seen.
fn check_lines(out: &str, documented: &BTreeMap<String, String>) -> Vec<String> {
    let mut seen = Vec::new();
    for line in out.lines().filter(|l| l.contains(" expected=")) {
        let words: Vec<&str> = line.split(' ').collect();
        let (name, verdict) = (words[0], words[words.len() - 1]);
        assert_eq!(
            documented.get(name).map(String::as_str),
            Some(verdict),
            "{line}: docs/conformance.md says otherwise"
        );
        seen.push(name.to_string());
    }
    seen
}

#[test]
fn every_scenario_against_our_stack_passes_or_deviates_as_documented() {
    if !needs_root("every_scenario_against_our_stack") {
        return;
    }
    let documented = documented(OURS);
    let a = Netns::create("roce-conform-a").unwrap();
    let b = Netns::create("roce-conform-b").unwrap();
    veth((&a, "ca", "10.85.0.1/24"), (&b, "cb", "10.85.0.2/24"), 1500).unwrap();
    let pcap = tempfile::NamedTempFile::new().unwrap();
    let servers = [
        ("write", "perf write_bw -p 18515"),
        ("read", "perf read_bw -p 18516"),
        ("atomic", "perf atomic_bw -p 18517"),
        ("send", "perf send_bw -p 18518 -s 64 -n 5"),
        ("ud", "pingpong --ud -p 18519 -s 64 -n 1"),
    ];
    let mut seen = Vec::new();
    for (service, flags) in servers {
        // One server process owns the namespace's RoCE port at a time: one service per run.
        let server = PerfLoop::start(&b, flags);
        let mut args = vec!["--service", service, "10.85.0.2"];
        if service == "atomic" {
            args.extend(["--pcap", pcap.path().to_str().unwrap()]);
        }
        let output = Command::new("ip")
            .args(["netns", "exec", &a.name, "timeout", "300"])
            .arg(env!("CARGO_BIN_EXE_roce"))
            .arg("conform")
            .args(&args)
            .output()
            .unwrap();
        drop(server);
        let out = text(&output);
        assert!(output.status.success(), "{service}:\n{out}");
        let last = out.lines().rfind(|l| l.starts_with("scenarios=")).unwrap();
        assert!(last.ends_with(" broke=0"), "{service}: {last}\n{out}");
        seen.extend(check_lines(&out, &documented));
    }
    seen.sort();
    assert_eq!(
        seen,
        documented
            .keys()
            .filter(|name| !name.starts_with(REQUESTER))
            .cloned()
            .collect::<Vec<_>>(),
        "every documented scenario ran, once, and only those"
    );
    assert!(seen.len() >= 30);

    // The observations of the atomic run, as `roce dump` reads them.
    let dump = Command::new(env!("CARGO_BIN_EXE_roce"))
        .args(["dump", "--summary", pcap.path().to_str().unwrap()])
        .output()
        .unwrap();
    let summary = text(&dump);
    for opcode in ["RC_FETCH_ADD", "RC_COMPARE_SWAP", "RC_ATOMIC_ACKNOWLEDGE"] {
        assert!(summary.contains(opcode), "{summary}");
    }
}

/// The names of the requester scenarios (`roce conform --serve`).
const REQUESTER: &str = "requester_";

/// The perftest clients `--serve` wants, by service: one request at a time, five in all.
const CLIENTS: [(&str, &str); 4] = [
    ("write", "write_bw -s 64 -n 5 -t 1 -p 18515"),
    ("read", "read_bw -s 64 -n 5 -t 1 -p 18516"),
    ("atomic", "atomic_bw -n 5 -t 1 -p 18517"),
    ("send", "send_bw -s 64 -n 5 -t 1 -p 18518"),
];

#[test]
fn every_requester_scenario_against_our_stack_behaves_as_documented() {
    if !needs_root("every_requester_scenario_against_our_stack") {
        return;
    }
    let documented = documented(OURS);
    let a = Netns::create("roce-serve-a").unwrap();
    let b = Netns::create("roce-serve-b").unwrap();
    veth((&a, "sa", "10.84.0.1/24"), (&b, "sb", "10.84.0.2/24"), 1500).unwrap();
    let mut seen = Vec::new();
    for (service, flags) in CLIENTS {
        // Our perf clients in a connect to the tool serving in b, one service at a time.
        let clients = PerfLoop::start(&a, &format!("perf {flags} 10.84.0.2"));
        let output = Command::new("ip")
            .args(["netns", "exec", &b.name, "timeout", "300"])
            .arg(env!("CARGO_BIN_EXE_roce"))
            .args(["conform", "--serve", "--service", service, "10.84.0.1"])
            .output()
            .unwrap();
        drop(clients);
        let out = text(&output);
        assert!(output.status.success(), "{service}:\n{out}");
        let last = out.lines().rfind(|l| l.starts_with("scenarios=")).unwrap();
        assert!(last.ends_with(" broke=0"), "{service}: {last}\n{out}");
        seen.extend(check_lines(&out, &documented));
    }
    seen.sort();
    assert_eq!(
        seen,
        documented
            .keys()
            .filter(|name| name.starts_with(REQUESTER))
            .cloned()
            .collect::<Vec<_>>(),
        "every documented requester scenario ran, once, and only those"
    );
}

#[test]
fn fuzzing_our_stack_for_a_bounded_count_finds_nothing() {
    if !needs_root("fuzzing_our_stack") {
        return;
    }
    let a = Netns::create("roce-fuzz-a").unwrap();
    let b = Netns::create("roce-fuzz-b").unwrap();
    veth((&a, "fa", "10.86.0.1/24"), (&b, "fb", "10.86.0.2/24"), 1500).unwrap();
    let findings = tempfile::tempdir().unwrap();
    let servers = [
        ("write", "perf write_bw -p 18515"),
        ("read", "perf read_bw -p 18516"),
        ("atomic", "perf atomic_bw -p 18517"),
        ("send", "perf send_bw -p 18518 -s 64 -n 5"),
    ];
    for (service, flags) in servers {
        let server = PerfLoop::start(&b, flags);
        let output = Command::new("ip")
            .args(["netns", "exec", &a.name, "timeout", "300"])
            .arg(env!("CARGO_BIN_EXE_roce"))
            .args([
                "fuzz",
                "--service",
                service,
                "--seed",
                "15",
                "--packets",
                "150",
            ])
            .args([
                "--batch",
                "30",
                "--findings",
                findings.path().to_str().unwrap(),
            ])
            .arg("10.86.0.2")
            .output()
            .unwrap();
        drop(server);
        let out = text(&output);
        assert!(output.status.success(), "{service}:\n{out}");
        assert!(
            out.contains("packets=150 connections=5 findings=0 status=ok"),
            "{service}:\n{out}"
        );
    }
    assert_eq!(std::fs::read_dir(findings.path()).unwrap().count(), 0);
}

#[test]
fn every_scenario_against_rxe_behaves_as_documented_and_fuzzing_it_completes() {
    let Some(vm) = vm("every_scenario_against_rxe", "1500") else {
        return;
    };
    for server in [
        "ib_write_bw -x 1 -p 18515",
        "ib_read_bw -x 1 -p 18516",
        "ib_atomic_bw -x 1 -p 18517",
        "ib_send_bw -x 1 -p 18518 -s 64 -n 5",
        // A server whose message never came gives up, so the next connection finds one.
        "timeout 10 ibv_ud_pingpong -g 1 -p 18519 -s 64 -n 1",
    ] {
        let looping = format!("while :; do {server} -d rxe0 >/dev/null 2>&1; done");
        let spawned = vm.run(&["spawn", "1", "-t", "900", &looping]);
        assert!(spawned.status.success(), "{}", text(&spawned));
    }
    // The VM's kernel log must stay free of oopses and warnings.
    let check = format!(
        "bash {} exec 1 -t 30 '! dmesg | grep -E \"BUG|WARNING|Oops|general protection\"'",
        vm.script().display()
    );
    let roce = |args: &[&str]| {
        Command::new("ip")
            .args(["netns", "exec", "rxe-host", "timeout", "600"])
            .arg(env!("CARGO_BIN_EXE_roce"))
            .args(args)
            .args(["-d", "host0", "--patience", "20", "--check", &check])
            .arg("10.88.0.11")
            .output()
            .unwrap()
    };
    // pad_beyond_payload panics rxe's kernel (docs/conformance.md): everything else.
    let output = roce(&["conform", "--wait", "300", "--skip", "pad_beyond_payload"]);
    let out = text(&output);
    assert!(output.status.success(), "{out}");
    assert!(out.contains("scenarios=56 "), "{out}");
    assert!(out.contains(" broke=0"), "{out}");
    check_lines(&out, &documented(RXE));

    // The target as requester: the VM's perftest clients connect to `--serve` here.
    for (_, flags) in CLIENTS {
        let looping = format!(
            "while :; do timeout 10 ib_{flags} -d rxe0 -x 1 10.88.0.1 >/dev/null 2>&1; \
             sleep 0.2; done"
        );
        let spawned = vm.run(&["spawn", "1", "-t", "900", &looping]);
        assert!(spawned.status.success(), "{}", text(&spawned));
    }
    // These two break rxe's kernel (docs/conformance.md): everything else.
    let skip = "requester_read_truncated_aeth,requester_read_response_middle";
    let output = roce(&["conform", "--serve", "--wait", "300", "--skip", skip]);
    let out = text(&output);
    assert!(output.status.success(), "{out}");
    assert!(out.contains("scenarios=15 "), "{out}");
    assert!(out.contains(" broke=0"), "{out}");
    check_lines(&out, &documented(RXE));

    let findings = tempfile::tempdir().unwrap();
    let output = roce(&[
        "fuzz",
        "--seed",
        "1",
        "--packets",
        "300",
        "--wait",
        "30",
        "--findings",
        findings.path().to_str().unwrap(),
    ]);
    let out = text(&output);
    // The last line of stdout (progress lines go to stderr).
    let stdout = String::from_utf8_lossy(&output.stdout);
    let last = stdout.lines().last().unwrap_or_default();
    let saved = std::fs::read_dir(findings.path()).unwrap().count();
    // rxe may crash on what the fuzzer sends (docs/conformance.md): then it is a finding.
    match last.rsplit(' ').next() {
        Some("status=ok") => assert!(last.starts_with("packets=300 ") && saved == 0, "{out}"),
        Some("status=FOUND") => assert!(last.contains(" findings=1 ") && saved == 1, "{out}"),
        _ => panic!("{out}"),
    }
}

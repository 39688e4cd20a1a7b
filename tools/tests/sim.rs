//! `roce sim` as a user runs it: clean and faulty links, each operation alone, both MTU
//! extremes, several QPs, and the runs that must not say ok.

use std::collections::BTreeMap;
use std::process::{Command, Output};

/// Every fault at once, at the rates the issue asks the simulator to survive.
const FAULTS: [&str; 8] = [
    "--loss",
    "5",
    "--reorder",
    "5",
    "--dup",
    "1",
    "--corrupt",
    "1",
];

fn roce_sim(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_roce"))
        .arg("sim")
        .args(args)
        .output()
        .expect("run roce")
}

fn last_line(output: &Output) -> String {
    let stdout = String::from_utf8(output.stdout.clone()).unwrap();
    stdout.lines().last().unwrap_or_default().to_string()
}

/// The `key=value` fields of the last line, checked to be exactly the documented ones.
fn summary(output: &Output) -> BTreeMap<String, String> {
    let line = last_line(output);
    let fields: BTreeMap<String, String> = line
        .splitn(9, ' ')
        .map(|field| {
            let (key, value) = field.split_once('=').expect("key=value");
            (key.to_string(), value.to_string())
        })
        .collect();
    let keys: Vec<&str> = fields.keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        [
            "drops",
            "fairness",
            "lost",
            "naks",
            "ops",
            "retransmits",
            "status",
            "utilisation",
            "verified"
        ],
        "{line}"
    );
    fields
}

fn ratio(fields: &BTreeMap<String, String>, key: &str) -> f64 {
    fields[key].parse().unwrap()
}

fn number(fields: &BTreeMap<String, String>, key: &str) -> u64 {
    fields[key].parse().unwrap()
}

/// Runs `roce sim` and asserts that it verified `bytes` and said ok; returns the last line's
/// fields.
fn assert_ok(args: &[&str], bytes: u64) -> BTreeMap<String, String> {
    let output = roce_sim(args);
    let fields = summary(&output);
    assert_eq!(fields["status"], "ok", "{args:?}: {}", last_line(&output));
    assert_eq!(output.status.code(), Some(0), "{args:?}");
    assert_eq!(number(&fields, "verified"), bytes, "{args:?}");
    fields
}

fn with_faults<'a>(args: &[&'a str]) -> Vec<&'a str> {
    args.iter().copied().chain(FAULTS).collect()
}

#[test]
fn clean_link_moves_every_byte_without_retransmitting() {
    let fields = assert_ok(&["--bytes", "1M"], 1 << 20);
    assert_eq!(number(&fields, "retransmits"), 0);
    assert_eq!(number(&fields, "naks"), 0);
    assert_eq!(number(&fields, "drops"), 0);
    assert_eq!(number(&fields, "lost"), 0);
    assert_eq!(fields["utilisation"], "-", "no switch, no link speed");
    // 16 data messages of 64 KiB minus room for the interleaved atomics, plus the atomics.
    assert!(number(&fields, "ops") > 16);
}

#[test]
fn faulty_link_with_every_operation() {
    let fields = assert_ok(&with_faults(&["--bytes", "1M"]), 1 << 20);
    assert!(number(&fields, "retransmits") > 0, "{fields:?}");
    assert!(number(&fields, "naks") > 0, "{fields:?}");
}

#[test]
fn each_operation_alone_over_a_faulty_link() {
    for op in ["send", "write", "read"] {
        let fields = assert_ok(&with_faults(&["--ops", op, "--bytes", "512K"]), 512 << 10);
        assert_eq!(number(&fields, "ops"), 8, "{op}: 64 KiB messages");
        assert!(number(&fields, "retransmits") > 0, "{op}: {fields:?}");
    }
    let fields = assert_ok(&with_faults(&["--ops", "atomic", "--bytes", "4K"]), 4096);
    assert_eq!(number(&fields, "ops"), 512, "8 bytes per atomic");
}

#[test]
fn smallest_and_largest_mtu() {
    for mtu in ["256", "4096"] {
        let fields = assert_ok(
            &with_faults(&["--mtu", mtu, "--bytes", "512K", "--seed", "7"]),
            512 << 10,
        );
        assert!(number(&fields, "retransmits") > 0, "MTU {mtu}: {fields:?}");
    }
}

#[test]
fn two_qps_share_the_work() {
    let output = roce_sim(&with_faults(&["--qps", "2", "--bytes", "1M"]));
    let stdout = String::from_utf8(output.stdout.clone()).unwrap();
    let per_qp = stdout.lines().filter(|l| l.starts_with("qp ")).count();
    assert_eq!(per_qp, 2, "{stdout}");
    assert_eq!(summary(&output)["status"], "ok", "{stdout}");
    assert_eq!(number(&summary(&output), "verified"), 1 << 20);
    assert_eq!(output.status.code(), Some(0));
}

#[test]
fn odd_sizes_end_exactly() {
    assert_ok(&["--bytes", "100003"], 100_003);
    // The run ends on a READ of 5 bytes: an atomic would not fit.
    let fields = assert_ok(&["--ops", "atomic,read", "--bytes", "13"], 13);
    assert_eq!(number(&fields, "ops"), 2);
}

#[test]
fn same_seed_same_run() {
    let args = with_faults(&["--bytes", "256K", "--seed", "42"]);
    let (one, two) = (roce_sim(&args), roce_sim(&args));
    // Everything but the wall-clock line.
    let stable = |output: &Output| {
        String::from_utf8(output.stdout.clone())
            .unwrap()
            .lines()
            .filter(|line| !line.starts_with("simulated="))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    assert_eq!(stable(&one), stable(&two));
}

#[test]
fn a_dead_link_fails_the_run() {
    // Every frame lost: the requester exhausts its retries and the WR completes in error.
    let output = roce_sim(&["--loss", "100", "--bytes", "64K"]);
    assert_eq!(output.status.code(), Some(1));
    let line = last_line(&output);
    assert!(line.starts_with("verified=0 ops=0 retransmits="), "{line}");
    assert!(
        line.ends_with(
            " status=FAIL reason=\"QP 0x11 message 0 (SEND) completed with RetryExceeded\""
        ),
        "{line}"
    );
    assert!(line.contains(" naks=0 drops=0 utilisation=- "), "{line}");
    let retransmits = line.split(' ').nth(2).unwrap();
    assert_ne!(
        retransmits, "retransmits=0",
        "it tried again before giving up"
    );
}

#[test]
fn impossible_arguments_exit_2() {
    for args in [
        &["--mtu", "300"][..],
        &["--mtu", "8192"],
        &["--loss", "101"],
        &["--loss", "-1"],
        &["--bytes", "0"],
        &["--bytes", "1T"],
        &["--ops", "cas"],
        &["--qps", "0"],
        // Atomics move 8 bytes each, so 12 bytes of atomics cannot be moved.
        &["--ops", "atomic", "--bytes", "12"],
        &["--incast", "0"],
        &["--incast", "65"],
        &["--incast", "64", "--qps", "8"],
        &["--dcqcn", "maybe"],
        &["--dcqcn-param", "rp_ai_rate"],
        &["--dcqcn-param", "no_such_knob=1"],
        &["--dcqcn-param", "rp_min_dec_fac=101"],
        &["--incast", "2", "--kmin", "10K", "--kmax", "5K"],
        &["--incast", "2", "--pmax", "200"],
    ] {
        let output = roce_sim(args);
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        assert!(output.stdout.is_empty(), "{args:?}");
        assert!(!output.stderr.is_empty(), "{args:?}");
    }
}

/// The check: eight senders write to one receiver through the switch. With DCQCN
/// nothing is dropped, the port to the receiver stays busy and the eight share it fairly;
/// without it the same run overflows the queue and goes back N again and again.
#[test]
fn incast_of_eight_with_and_without_dcqcn() {
    let with = assert_ok(&["--incast", "8", "--bytes", "32M"], 32 << 20);
    assert_eq!(number(&with, "drops"), 0, "{with:?}");
    assert_eq!(number(&with, "retransmits"), 0, "{with:?}");
    assert!(ratio(&with, "utilisation") >= 0.9, "{with:?}");
    assert!(ratio(&with, "fairness") >= 0.95, "{with:?}");
    let output = roce_sim(&["--incast", "8", "--bytes", "32M", "--dcqcn", "off"]);
    let stdout = String::from_utf8(output.stdout.clone()).unwrap();
    let without = summary(&output);
    assert!(number(&without, "drops") > 1000, "{stdout}");
    assert!(
        number(&without, "retransmits") > number(&without, "drops"),
        "go-back-N resends more than was dropped: {stdout}"
    );
    // The receiver answered the marks with CNPs, which the senders ignored.
    let counters = stdout
        .lines()
        .find(|line| line.starts_with("congestion "))
        .unwrap();
    assert!(counters.contains(" rp_cnp_handled=0 "), "{counters}");
    assert!(!counters.contains(" rp_cnp_ignored=0 "), "{counters}");
    assert!(!counters.contains(" np_cnp_sent=0 "), "{counters}");
}

/// What the switch line and the trace say: the queue, marks and per-QP rates.
#[test]
fn incast_reports_the_switch_and_traces_dcqcn() {
    let output = roce_sim(&["--incast", "2", "--bytes", "4M", "--trace", "100"]);
    assert_eq!(output.status.code(), Some(0));
    let stdout = String::from_utf8(output.stdout.clone()).unwrap();
    let switch = stdout.lines().find(|l| l.starts_with("switch ")).unwrap();
    assert!(
        switch.starts_with(
            "switch senders=2 rate=10000Mb/s buffer=524288 kmin=5000 kmax=50000 pmax=50% dcqcn=on"
        ),
        "{switch}"
    );
    let lanes = stdout.lines().filter(|l| l.starts_with("qp ")).count();
    assert_eq!(lanes, 2, "{stdout}");
    let stderr = String::from_utf8(output.stderr.clone()).unwrap();
    let traced: Vec<&str> = stderr.lines().filter(|l| l.starts_with("t=")).collect();
    assert!(traced.len() > 3, "{stderr}");
    assert!(
        traced
            .iter()
            .any(|line| line.split(' ').skip(3).any(|qp| qp.contains('/'))),
        "some QP ran DCQCN: {stderr}"
    );
}

/// The other check: at 5 % loss, selective repeat between two of ours sends again
/// about what was lost (at most 1.3 times as many packets), where go-back-N sends again a
/// multiple of it.
#[test]
fn selective_repeat_sends_again_about_what_was_lost() {
    let args = ["--loss", "5", "--bytes", "4M"];
    let selective = assert_ok(&[&args[..], &["--selective-repeat"]].concat(), 4 << 20);
    let (again, lost) = (
        number(&selective, "retransmits"),
        number(&selective, "lost"),
    );
    assert!(lost > 100, "{selective:?}");
    assert!(
        again * 10 <= lost * 13,
        "{again} sent again for {lost} lost"
    );
    let go_back_n = assert_ok(&args, 4 << 20);
    let (again, lost) = (
        number(&go_back_n, "retransmits"),
        number(&go_back_n, "lost"),
    );
    assert!(
        again > 5 * lost,
        "go-back-N: {again} sent again for {lost} lost"
    );
    // The QP lines say which recovery each pair used.
    let output = roce_sim(&[&args[..], &["--selective-repeat"]].concat());
    let stdout = String::from_utf8(output.stdout).unwrap();
    let qp = stdout.lines().find(|l| l.starts_with("qp ")).unwrap();
    assert!(qp.ends_with(" selective_repeat=on"), "{qp}");
    let recovery = stdout.lines().find(|l| l.starts_with("recovery ")).unwrap();
    assert!(recovery.contains(" responses_resent="), "{recovery}");
}

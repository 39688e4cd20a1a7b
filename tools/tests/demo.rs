//! `roce demo` as a newcomer runs it (root): it succeeds, reports verified bytes, and leaves no
//! namespace behind, also when interrupted.

use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use roce_provider::netns::needs_root;

/// Namespaces of the demo process `pid` (their names carry it).
fn demo_namespaces(pid: u32) -> usize {
    let output = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns list");
    let tag = format!("-{pid}-");
    let text = String::from_utf8_lossy(&output.stdout);
    text.lines()
        .filter(|line| line.starts_with("roce-demo-") && line.contains(&tag))
        .count()
}

#[test]
fn demo_runs_verifies_and_cleans_up() {
    if !needs_root("demo_runs_verifies_and_cleans_up") {
        return;
    }
    let child = Command::new(env!("CARGO_BIN_EXE_roce"))
        .args(["demo", "--iters", "300", "--bytes", "4M"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run roce demo");
    let pid = child.id();
    let output = child.wait_with_output().expect("wait");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let last = stdout.lines().last().unwrap_or_default();
    let verified: u64 = last
        .strip_prefix("verified=")
        .and_then(|rest| rest.strip_suffix(" status=ok"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("last line: {last:?}"));
    assert!(verified >= 4 << 20, "{verified}");
    for row in [
        "half round trip",
        "RDMA READ",
        "RDMA WRITE 64 B message rate",
        "raw AF_XDP, 4096 B payload frames",
        "raw AF_XDP, 64 B payload frames",
        "raw AF_XDP, 15 slices between the RoCE runs' chunks",
    ] {
        assert!(stdout.contains(row), "no row {row:?}: {stdout}");
    }
    // Right before the last line: `ceiling write=R1 read=R2 rate64=R3`, each a finite ratio
    // with two decimals.
    let lines: Vec<&str> = stdout.lines().collect();
    let summary = lines[lines.len().saturating_sub(2)];
    let ratios: Vec<&str> = summary
        .strip_prefix("ceiling ")
        .unwrap_or_else(|| panic!("summary line: {summary:?}"))
        .split(' ')
        .collect();
    assert_eq!(ratios.len(), 3, "{summary:?}");
    for (ratio, key) in ratios.iter().zip(["write", "read", "rate64"]) {
        let value = ratio
            .strip_prefix(key)
            .and_then(|rest| rest.strip_prefix('='))
            .unwrap_or_else(|| panic!("{key} in {summary:?}"));
        let decimals = value.split_once('.').map(|(_, d)| d.len());
        let parsed: Option<f64> = value.parse().ok();
        assert!(
            decimals == Some(2) && parsed.is_some_and(|r| r.is_finite() && r > 0.0),
            "{key}={value} in {summary:?}"
        );
    }
    // Its stderr is a pipe: progress comes as whole lines, never rewritten in place.
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.lines().any(|line| line == "roce demo: WRITE 100%") && !stderr.contains('\r'),
        "{stderr}"
    );
    assert_eq!(demo_namespaces(pid), 0, "namespaces left behind");
    interrupted_demo_removes_its_namespaces();
}

/// Not a `#[test]` of its own: two demos at once would share two cores four busy-polling
/// threads deep. `demo_runs_verifies_and_cleans_up` calls it after its own run.
fn interrupted_demo_removes_its_namespaces() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_roce"))
        .args(["demo", "--iters", "100000000"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start roce demo");
    // Wait until its namespaces exist, then interrupt it.
    let deadline = Instant::now() + Duration::from_secs(20);
    let pid = child.id();
    while demo_namespaces(pid) < 2 && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(demo_namespaces(pid), 2, "the demo did not start");
    Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill -INT");
    let status = child.wait().expect("wait");
    assert_eq!(status.code(), Some(130));
    assert_eq!(
        demo_namespaces(pid),
        0,
        "namespaces left behind after Ctrl-C"
    );
}

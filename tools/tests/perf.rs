//! `roce perf` against itself between two network namespaces on a veth pair (MTU 9000, path
//! MTU 4096): all seven tests in both roles' output, with `--verify`, so that what one side
//! sent is checked byte for byte on the other, and the atomics against the target memory.
//! Over AF_XDP, and once over kernel UDP sockets. Needs root (CI is root).

mod common;

use roce_provider::netns::{needs_root, veth, Netns};

use common::{has_row, roce_in, text, wait_for_listener};

/// Test and flags, size in the rows, the check line the client / server must print.
type Run<'a> = (&'a [&'a str], &'a str, Option<&'a str>, Option<&'a str>);

/// As [`Run`], with the iterations the rows count (every QP's).
type SeveralQps<'a> = (
    &'a [&'a str],
    &'a str,
    &'a str,
    Option<&'a str>,
    Option<&'a str>,
);

#[test]
fn perf_against_itself_in_every_test() {
    if !needs_root("perf_against_itself_in_every_test") {
        return;
    }
    let a = Netns::create("roce-perf-a").unwrap();
    let b = Netns::create("roce-perf-b").unwrap();
    veth((&a, "fa", "10.83.0.1/24"), (&b, "fb", "10.83.0.2/24"), 9000).unwrap();
    let n = "300";
    let runs: [Run; 9] = [
        (
            &["write_bw", "-s", "65536"],
            "65536",
            None,
            Some("verified: every byte the peer wrote"),
        ),
        (
            &["write_bw", "-s", "100"],
            "100",
            None,
            Some("verified: every byte the peer wrote"),
        ),
        (
            &["read_bw", "-s", "10000"],
            "10000",
            Some("verified: every byte read"),
            None,
        ),
        (&["send_bw", "-s", "4096"], "4096", None, None),
        (
            &["atomic_bw"],
            "8",
            None,
            Some("verified: 300 atomics applied"),
        ),
        (
            &["atomic_bw", "-A", "CMP_AND_SWAP"],
            "8",
            None,
            Some("verified: 300 atomics applied"),
        ),
        (&["send_lat", "-s", "3000"], "3000", None, None),
        (&["write_lat"], "2", None, None),
        (
            &["read_lat", "-s", "64"],
            "64",
            Some("verified: every byte read"),
            None,
        ),
    ];
    for (flags, size, client_check, server_check) in runs {
        let mut args = flags.to_vec();
        args.extend(["-n", n, "--verify", "--report_gbits"]);
        let server = roce_in(&b, "perf", &args).spawn().unwrap();
        wait_for_listener(&b, 18515);
        let mut client_args = args.clone();
        client_args.push("10.83.0.2");
        let client = roce_in(&a, "perf", &client_args).output().unwrap();
        let server = server.wait_with_output().unwrap();
        let (client_text, server_text) = (text(&client), text(&server));
        let what = flags.join(" ");
        assert!(
            client.status.success() && server.status.success(),
            "{what}:\nclient:\n{client_text}\nserver:\n{server_text}"
        );
        assert!(has_row(&client_text, size, n), "{what}: {client_text}");
        if flags[0] != "read_lat" {
            assert!(has_row(&server_text, size, n), "{what}: {server_text}");
        }
        if let Some(line) = client_check {
            assert!(client_text.contains(line), "{what}: {client_text}");
        }
        if let Some(line) = server_check {
            assert!(server_text.contains(line), "{what}: {server_text}");
        }
    }
    // Several QPs (`-q`): each does `-n` iterations, rows count them all, checks cover each
    // QP's window.
    let several: [SeveralQps; 4] = [
        (
            &["write_bw", "-q", "3", "-s", "4096"],
            "4096",
            "900",
            None,
            Some("verified: every byte the peer wrote"),
        ),
        (
            &["read_bw", "-q", "2", "-s", "100"],
            "100",
            "600",
            Some("verified: every byte read"),
            None,
        ),
        (
            &["send_bw", "-q", "2", "-s", "2000"],
            "2000",
            "600",
            None,
            None,
        ),
        (
            &["atomic_bw", "-q", "4"],
            "8",
            "1200",
            None,
            Some("verified: 1200 atomics applied"),
        ),
    ];
    for (flags, size, rows, client_check, server_check) in several {
        let mut args = flags.to_vec();
        args.extend(["-n", n, "--verify"]);
        let server = roce_in(&b, "perf", &args).spawn().unwrap();
        wait_for_listener(&b, 18515);
        let client = roce_in(&a, "perf", &[&args[..], &["10.83.0.2"]].concat())
            .output()
            .unwrap();
        let server = server.wait_with_output().unwrap();
        let (client_text, server_text) = (text(&client), text(&server));
        let what = flags.join(" ");
        assert!(
            client.status.success() && server.status.success(),
            "{what}:\nclient:\n{client_text}\nserver:\n{server_text}"
        );
        assert!(has_row(&client_text, size, rows), "{what}: {client_text}");
        assert!(has_row(&server_text, size, rows), "{what}: {server_text}");
        if let Some(line) = client_check {
            assert!(client_text.contains(line), "{what}: {client_text}");
        }
        if let Some(line) = server_check {
            assert!(server_text.contains(line), "{what}: {server_text}");
        }
    }
    // Kernel UDP sockets instead of AF_XDP, same checks.
    let args = ["write_bw", "-s", "4096", "-n", n, "--verify", "--udp"];
    let server = roce_in(&b, "perf", &args).spawn().unwrap();
    wait_for_listener(&b, 18515);
    let client = roce_in(&a, "perf", &[&args[..], &["10.83.0.2"]].concat())
        .output()
        .unwrap();
    let server = server.wait_with_output().unwrap();
    assert!(client.status.success(), "{}", text(&client));
    assert!(
        text(&server).contains("verified: every byte the peer wrote"),
        "{}",
        text(&server)
    );
}

/// `roce ARGS...` outside any namespace, bounded: options it refuses must not reach the
/// network.
fn roce_bounded(args: &[&str]) -> std::process::Output {
    std::process::Command::new("timeout")
        .arg("20")
        .arg(env!("CARGO_BIN_EXE_roce"))
        .args(args)
        .output()
        .expect("run roce")
}

#[test]
fn options_that_cannot_run_are_refused_before_anything_waits() {
    let refused: [(&[&str], &str); 5] = [
        (
            &["-n", "0"],
            "Iteration count must be between 5 and 100000000",
        ),
        (
            &["-q", "0"],
            "the number of QPs must be between 1 and 16384",
        ),
        (
            &["-q", "99999"],
            "the number of QPs must be between 1 and 16384",
        ),
        (&["-t", "0"], "the TX depth (-t) must be at least 1"),
        (&["-i", "2"], "only port 1 exists"),
    ];
    for (flags, words) in refused {
        // As a server: with options it could run, it would wait for a client.
        let args = [&["perf", "write_bw"][..], flags].concat();
        let output = roce_bounded(&args);
        let said = text(&output);
        assert!(
            matches!(output.status.code(), Some(1 | 2)),
            "{flags:?} exited {:?}: {said}",
            output.status
        );
        assert!(said.contains(words), "{flags:?}: {said}");
    }
}

#[test]
fn a_silent_exchange_peer_times_out() {
    if !needs_root("a_silent_exchange_peer_times_out") {
        return;
    }
    let ns = Netns::create("roce-silent").unwrap();
    // A GID index the device does not have is refused before anything waits.
    let output = roce_in(&ns, "perf", &["write_bw", "--udp", "-d", "lo", "-x", "9"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1), "{}", text(&output));
    assert!(
        text(&output).contains("GID index 9 does not exist on lo"),
        "{}",
        text(&output)
    );

    let server = roce_in(
        &ns,
        "perf",
        &["write_bw", "--udp", "-d", "lo", "--exchange-timeout", "2"],
    )
    .spawn()
    .unwrap();
    wait_for_listener(&ns, 18515);
    // A client that connects and says nothing, holding the connection open until the
    // server has given up (bounded).
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let name = ns.name.clone();
    let silent = std::thread::spawn(move || {
        roce_provider::netns::enter(&name).unwrap();
        let stream = std::net::TcpStream::connect(("127.0.0.1", 18515)).unwrap();
        let _ = done_rx.recv_timeout(std::time::Duration::from_secs(60));
        drop(stream);
    });
    let server = server.wait_with_output().unwrap();
    let _ = done_tx.send(());
    silent.join().unwrap();
    let said = text(&server);
    assert_eq!(server.status.code(), Some(1), "{said}");
    assert!(
        said.contains("no sign of the peer while waiting for its perftest version"),
        "{said}"
    );
}

#[test]
fn a_run_stopped_by_sigterm_leaves_a_whole_capture() {
    if !needs_root("a_run_stopped_by_sigterm_leaves_a_whole_capture") {
        return;
    }
    let a = Netns::create("roce-term-a").unwrap();
    let b = Netns::create("roce-term-b").unwrap();
    veth((&a, "ta", "10.84.0.1/24"), (&b, "tb", "10.84.0.2/24"), 9000).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let pcap = dir.path().join("client.pcap");
    // Far more iterations than the run is given.
    let args = ["write_bw", "-s", "4096", "-n", "100000000"];
    let server = roce_in(&b, "perf", &args).spawn().unwrap();
    wait_for_listener(&b, 18515);
    let pcap_arg = pcap.to_str().unwrap();
    let client_args = [&args[..], &["--pcap", pcap_arg, "10.84.0.2"]].concat();
    let client = roce_in(&a, "perf", &client_args).spawn().unwrap();
    // Stop it once frames are on their way.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while std::fs::metadata(&pcap).map_or(0, |m| m.len()) < 1 << 20
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // To roce itself, `timeout`'s child: `timeout` would also signal its whole process
    // group, and a second signal ends roce at once (exit 130 without the normal path).
    std::process::Command::new("pkill")
        .args(["-TERM", "-P", &client.id().to_string()])
        .status()
        .unwrap();
    let client = client.wait_with_output().unwrap();
    let server = server.wait_with_output().unwrap();
    assert_eq!(
        client.status.code(),
        Some(130),
        "{:?}: {}",
        client.status,
        text(&client)
    );
    assert!(
        text(&client).contains("stopped by a signal"),
        "{}",
        text(&client)
    );
    assert!(!server.status.success(), "{}", text(&server));
    let dump = std::process::Command::new(env!("CARGO_BIN_EXE_roce"))
        .args(["dump", "--summary", pcap_arg])
        .output()
        .unwrap();
    assert_eq!(dump.status.code(), Some(0), "{}", text(&dump));
    assert!(
        text(&dump).contains("RC_RDMA_WRITE_ONLY"),
        "{}",
        text(&dump)
    );
}

#[test]
fn a_failed_qp_says_why_on_both_sides() {
    if !needs_root("a_failed_qp_says_why_on_both_sides") {
        return;
    }
    let a = Netns::create("roce-why-a").unwrap();
    let b = Netns::create("roce-why-b").unwrap();
    veth((&a, "wa", "10.85.0.1/24"), (&b, "wb", "10.85.0.2/24"), 9000).unwrap();
    let args = ["write_bw", "-s", "4096", "-n", "100"];
    let server = roce_in(&b, "perf", &args).spawn().unwrap();
    wait_for_listener(&b, 18515);
    let client = roce_in(
        &a,
        "perf",
        &[&args[..], &["--wrong-rkey", "10.85.0.2"]].concat(),
    )
    .output()
    .unwrap();
    let server = server.wait_with_output().unwrap();
    let (ours, theirs) = (text(&client), text(&server));
    assert_eq!(client.status.code(), Some(1), "{ours}");
    assert!(
        ours.contains("failed: IBV_WC_REM_ACCESS_ERR (remote access error")
            && ours.contains("is in the error state ("),
        "{ours}"
    );
    assert!(!server.status.success(), "{theirs}");
    assert!(
        theirs.contains("the peer closed the connection while waiting for its key message"),
        "{theirs}"
    );
}

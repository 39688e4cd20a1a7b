//! Several processes on one device, through its switch (`roce_provider::switch`), as rxe
//! users run them: a perftest server and client on one device (frames that never reach the
//! wire), four `ib_send_bw` pairs on two devices at once, and again with one server killed
//! halfway (the other three finish), `ibv_devinfo` while servers hold the device, two
//! `rping` servers on one device, a switch killed under its clients (who hear
//! `IBV_EVENT_DEVICE_FATAL` and never hang), a switch started on demand staying in its
//! starter's session (its scheduling autogroup), and two of our processes against two of
//! rdma-core's on Linux rxe at once, in both roles.
//!
//! Needs root (namespaces, AF_XDP), perftest, rdmacm-utils and ibverbs-utils (gcc and
//! libibverbs-dev for the C program); in CI a missing prerequisite fails the test.

mod common;

use std::process::{Child, Command, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use roce_provider::netns::{needs_root, prerequisite, veth, Netns};
use roce_tests::rxe_vm::vm;

use common::{
    build_libraries, can_compile_c, compile_c, exec_in, has_row, installed, roce_in, text,
    wait_for_listener, VERBS_H,
};

fn root_and(test: &str, programs: &[&str]) -> bool {
    needs_root(test)
        && prerequisite(
            test,
            &format!("{} installed", programs.join(", ")),
            programs.iter().all(|program| installed(program)),
        )
}

/// Two namespaces joined by a veth pair (`mpa0` 10.97.0.1, `mpb0` 10.97.0.2, MTU 9000).
fn two_namespaces() -> (Netns, Netns) {
    let a = Netns::create("roce-mp-a").unwrap();
    let b = Netns::create("roce-mp-b").unwrap();
    veth(
        (&a, "mpa0", "10.97.0.1/24"),
        (&b, "mpb0", "10.97.0.2/24"),
        9000,
    )
    .unwrap();
    (a, b)
}

/// `roce exec -- PROGRAM...` in `ns` with `ROCE_STATS=1`, started.
fn start(ns: &Netns, program: &[&str]) -> Child {
    exec_in(ns, program).env("ROCE_STATS", "1").spawn().unwrap()
}

/// A counter of the switch's part of a `ROCE_STATS` report (the last one printed).
fn switch_counter(said: &str, name: &str) -> Option<u64> {
    let report = said.rsplit("roce-xdp switch ").next()?;
    report.lines().find_map(|line| {
        let (key, value) = line.split_once(' ')?;
        (key == name).then(|| value.trim().parse().ok())?
    })
}

/// SIGKILLs the program `child` runs: `ip netns exec` became `timeout`, whose only child
/// is `roce exec`, which became the program.
fn kill_program(child: &Child) {
    let pid = child.id();
    let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap();
    let program: u32 = children.trim().parse().expect("one child");
    let killed = Command::new("kill")
        .args(["-KILL", &program.to_string()])
        .status()
        .unwrap();
    assert!(killed.success(), "kill {program}");
}

/// Stops a switch `roce_in` started: SIGTERM to `timeout`, which passes it on, then waits.
/// (`Child::kill` would SIGKILL `timeout` alone and leave the switch running, unbounded, in
/// a namespace about to go: each CI run left two behind.)
fn stop_switch(child: &mut Child) {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();
}

/// Whether perftest printed a result row for `size` with any count (a `-D` run).
fn has_timed_row(said: &str, size: &str) -> bool {
    said.lines().any(|line| {
        let mut words = line.split_whitespace();
        words.next() == Some(size) && words.next().and_then(|n| n.parse::<u64>().ok()) > Some(0)
    })
}

#[test]
fn a_perftest_server_and_client_share_one_device_and_nothing_reaches_the_wire() {
    let test = "a_perftest_server_and_client_share_one_device_and_nothing_reaches_the_wire";
    if !root_and(test, &["ib_write_bw"]) {
        return;
    }
    let (a, _b) = two_namespaces();
    // perftest's own pair: the server, then its client on the same device.
    let flags = ["-d", "mpa0", "-x", "1", "-F", "-s", "65536", "-n", "200"];
    let server = start(&a, &[&["ib_write_bw"][..], &flags].concat());
    wait_for_listener(&a, 18515);
    let client = start(&a, &[&["ib_write_bw"][..], &flags, &["10.97.0.1"]].concat())
        .wait_with_output()
        .unwrap();
    let server = server.wait_with_output().unwrap();
    for (side, output) in [("server", &server), ("client", &client)] {
        let said = text(output);
        assert!(
            output.status.success(),
            "{side} ({}): {said}",
            output.status
        );
        assert!(has_row(&said, "65536", "200"), "{side}: {said}");
    }
    // Both went through the switch (the client came second), which never sent a frame.
    let said = text(&client);
    let looped = switch_counter(&said, "looped").unwrap_or(0);
    assert!(looped > 200, "frames between the two: {said}");
    assert_eq!(switch_counter(&said, "wire_tx"), Some(0), "{said}");

    // perftest cannot check the bytes; `roce perf --verify` does, both sides on one device.
    let flags = [
        "-d", "mpa0", "-s", "65536", "-n", "100", "--verify", "-p", "18520",
    ];
    let server = roce_in(&a, "perf", &[&["write_bw"][..], &flags].concat())
        .spawn()
        .unwrap();
    wait_for_listener(&a, 18520);
    let client = roce_in(
        &a,
        "perf",
        &[&["write_bw"][..], &flags, &["10.97.0.1"]].concat(),
    )
    .output()
    .unwrap();
    let server = server.wait_with_output().unwrap();
    for (side, output) in [("server", &server), ("client", &client)] {
        let said = text(output);
        assert!(output.status.success(), "roce perf {side}: {said}");
        assert!(has_row(&said, "65536", "100"), "roce perf {side}: {said}");
    }
}

/// The process group and session of process `pid` (a number, or `self`), from
/// `/proc/PID/stat`: the fields after the command's name are state, parent, group, session.
fn group_and_session(pid: &str) -> Option<(i64, i64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    Some((fields.get(2)?.parse().ok()?, fields.get(3)?.parse().ok()?))
}

/// The on-demand switch serving interface `dev`, found by its command line, with its
/// process group, session and ignored signals (`/proc`); waits for it (bounded).
fn on_demand_switch(dev: &str) -> Option<(u32, i64, i64, u64)> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
                continue;
            };
            let args: Vec<&[u8]> = cmdline.split(|&byte| byte == 0).collect();
            if args.get(1..4) != Some(&[&b"switch"[..], dev.as_bytes(), b"--on-demand"][..]) {
                continue;
            }
            let (Some((group, session)), Ok(status)) = (
                group_and_session(&pid.to_string()),
                std::fs::read_to_string(format!("/proc/{pid}/status")),
            ) else {
                continue;
            };
            let ignored = status
                .lines()
                .find_map(|line| line.strip_prefix("SigIgn:"))?;
            return Some((
                pid,
                group,
                session,
                u64::from_str_radix(ignored.trim(), 16).ok()?,
            ));
        }
        thread::sleep(Duration::from_millis(50));
    }
    None
}

/// A switch started on demand stays in the session of the process that started it, so in
/// its scheduling autogroup: alone in an autogroup of its own (setsid), it sat runnable for
/// 440 ms at a time under two busy `ib_send_bw -s 64` pairs on two cores, and the pairs
/// ran out of retries in 5 of 12 runs. It leads a process group of its own (the program's
/// signals do not reach it) and ignores SIGHUP (its session's terminal may go).
#[test]
fn an_on_demand_switch_stays_in_its_starters_session_in_a_group_of_its_own() {
    let test = "an_on_demand_switch_stays_in_its_starters_session_in_a_group_of_its_own";
    if !needs_root(test) {
        return;
    }
    let a = Netns::create("roce-mp-s").unwrap();
    let b = Netns::create("roce-mp-s").unwrap();
    veth(
        (&a, "mpsa0", "10.96.0.1/24"),
        (&b, "mpsb0", "10.96.0.2/24"),
        9000,
    )
    .unwrap();
    // Long enough (a few seconds) for the switch to be found while it serves.
    let flags = ["-s", "64", "-n", "1000000", "-p", "18545"];
    let server = roce_in(
        &a,
        "perf",
        &[&["send_bw", "-d", "mpsa0"][..], &flags].concat(),
    )
    .spawn()
    .unwrap();
    wait_for_listener(&a, 18545);
    let client = roce_in(
        &b,
        "perf",
        &[&["send_bw", "-d", "mpsb0"][..], &flags, &["10.96.0.1"]].concat(),
    )
    .spawn()
    .unwrap();
    let found = on_demand_switch("mpsa0");
    let client = client.wait_with_output().unwrap();
    let server = server.wait_with_output().unwrap();
    assert!(server.status.success(), "server: {}", text(&server));
    assert!(client.status.success(), "client: {}", text(&client));
    let (pid, group, session, ignored) = found.expect("no switch started on demand");
    let (_, ours) = group_and_session("self").unwrap();
    assert_eq!(session, ours, "the switch left our session");
    assert_eq!(
        group,
        i64::from(pid),
        "the switch leads no process group of its own"
    );
    // SIGHUP is signal 1: bit 0 of the mask.
    assert_ne!(ignored & 1, 0, "SIGHUP not ignored: {ignored:x}");
}

#[test]
fn a_switch_run_by_hand_lends_its_device_again_once_its_processes_left() {
    let test = "a_switch_run_by_hand_lends_its_device_again_once_its_processes_left";
    if !root_and(test, &["ib_send_bw"]) {
        return;
    }
    build_libraries();
    let (a, b) = two_namespaces();
    let mut switch = roce_in(&a, "switch", &["mpa0"])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let flags = ["ib_send_bw", "-x", "1", "-F", "-n", "20"];
    let pair = |client_ns: &Netns, client_dev: &str| {
        let server = start(&a, &[&flags[..], &["-d", "mpa0"]].concat());
        wait_for_listener(&a, 18515);
        let client = start(
            client_ns,
            &[&flags[..], &["-d", client_dev, "10.97.0.1"]].concat(),
        )
        .wait_with_output()
        .unwrap();
        let server = server.wait_with_output().unwrap();
        assert!(client.status.success(), "client: {}", text(&client));
        assert!(server.status.success(), "server: {}", text(&server));
        text(&server)
    };
    // Two processes on the device: the switch took it back and looped their frames.
    let said = pair(&a, "mpa0");
    assert!(switch_counter(&said, "looped").unwrap_or(0) > 0, "{said}");
    // Both gone, the next process alone holds the device again: nothing steered to it.
    let said = pair(&b, "mpb0");
    assert_eq!(
        switch_counter(&said, "this_process_steered"),
        Some(0),
        "{said}"
    );
    stop_switch(&mut switch);
}

/// Four `ib_send_bw` servers on `a`'s device and four clients on `b`'s, at once, for
/// `seconds` (perftest's `-D`); `kill`: SIGKILL the first server after `kill` seconds of
/// traffic. Returns each pair's (client, server) output, and `ibv_devinfo`'s, run while the
/// servers waited.
fn four_pairs(kill: Option<Duration>, seconds: &str) -> (Vec<(Output, Output)>, Output) {
    let (a, b) = two_namespaces();
    let ports: Vec<String> = (0..4).map(|i| (18530 + i).to_string()).collect();
    let flags = |dev: &'static str, port: &str| -> Vec<String> {
        [
            "ib_send_bw",
            "-d",
            dev,
            "-x",
            "1",
            "-F",
            "-s",
            "4096",
            "-D",
            seconds,
            "-p",
            port,
        ]
        .map(String::from)
        .to_vec()
    };
    let mut servers: Vec<Child> = ports
        .iter()
        .map(|port| {
            let args = flags("mpa0", port);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            start(&a, &args)
        })
        .collect();
    for port in &ports {
        wait_for_listener(&a, port.parse().unwrap());
    }
    let devinfo = exec_in(&a, &["ibv_devinfo", "-d", "mpa0"])
        .output()
        .unwrap();
    let clients: Vec<Child> = ports
        .iter()
        .map(|port| {
            let mut args = flags("mpb0", port);
            args.push("10.97.0.1".into());
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            start(&b, &args)
        })
        .collect();
    if let Some(after) = kill {
        thread::sleep(after);
        kill_program(&servers[0]);
    }
    let clients: Vec<Output> = clients
        .into_iter()
        .map(|client| client.wait_with_output().unwrap())
        .collect();
    let servers: Vec<Output> = servers
        .drain(..)
        .map(|server| server.wait_with_output().unwrap())
        .collect();
    (clients.into_iter().zip(servers).collect(), devinfo)
}

#[test]
fn four_send_bw_pairs_share_two_devices_and_devinfo_answers_meanwhile() {
    let test = "four_send_bw_pairs_share_two_devices_and_devinfo_answers_meanwhile";
    if !root_and(test, &["ib_send_bw", "ibv_devinfo"]) {
        return;
    }
    let (pairs, devinfo) = four_pairs(None, "2");
    let said = text(&devinfo);
    assert!(devinfo.status.success(), "ibv_devinfo: {said}");
    assert!(
        said.contains("hca_id:\tmpa0") && said.contains("PORT_ACTIVE"),
        "{said}"
    );
    for (i, (client, server)) in pairs.iter().enumerate() {
        for (side, output) in [("client", client), ("server", server)] {
            let said = text(output);
            assert!(output.status.success(), "pair {i} {side}: {said}");
            assert!(has_timed_row(&said, "4096"), "pair {i} {side}: {said}");
        }
    }
    // Each side's four processes were the switch's clients, and it steered their frames.
    let said = text(&pairs[3].1);
    assert!(switch_counter(&said, "steered") > Some(1000), "{said}");
}

#[test]
fn a_server_killed_halfway_hurts_none_of_the_other_pairs() {
    let test = "a_server_killed_halfway_hurts_none_of_the_other_pairs";
    if !root_and(test, &["ib_send_bw"]) {
        return;
    }
    let started = Instant::now();
    let (pairs, _) = four_pairs(Some(Duration::from_millis(1500)), "3");
    let (client, server) = &pairs[0];
    assert!(
        !server.status.success(),
        "the killed server: {}",
        text(server)
    );
    assert!(
        !client.status.success(),
        "its client cannot finish: {}",
        text(client)
    );
    for (i, (client, server)) in pairs.iter().enumerate().skip(1) {
        for (side, output) in [("client", client), ("server", server)] {
            let said = text(output);
            assert!(output.status.success(), "pair {i} {side}: {said}");
            assert!(has_timed_row(&said, "4096"), "pair {i} {side}: {said}");
        }
    }
    // The switch noticed: the killed process's block was freed, and what its client kept
    // sending to it was dropped and counted.
    let said = text(&pairs[1].1);
    assert!(switch_counter(&said, "clients_lost") >= Some(1), "{said}");
    assert!(
        switch_counter(&said, "dropped_no_owner") > Some(0),
        "{said}"
    );
    // Nobody waited out the programs' own bound.
    assert!(started.elapsed() < Duration::from_secs(50));
}

#[test]
fn two_rping_servers_on_one_device_each_serve_their_client() {
    let test = "two_rping_servers_on_one_device_each_serve_their_client";
    if !root_and(test, &["rping"]) {
        return;
    }
    let (a, b) = two_namespaces();
    let servers: Vec<Child> = ["7471", "7472"]
        .map(|port| {
            let args = [
                "rping",
                "-s",
                "-v",
                "-V",
                "-C",
                "50",
                "-a",
                "10.97.0.2",
                "-p",
                port,
            ];
            exec_in(&b, &args).spawn().unwrap()
        })
        .into();
    let clients: Vec<thread::JoinHandle<Output>> = ["7471", "7472"]
        .map(|port| {
            let a_name = a.name.clone();
            thread::spawn(move || rping_client(&a_name, port))
        })
        .into();
    for ((port, client), server) in ["7471", "7472"].iter().zip(clients).zip(servers) {
        let client = client.join().unwrap();
        let server = server.wait_with_output().unwrap();
        for (side, output, prefix) in [
            ("client", &client, "ping data: rdma-ping-"),
            ("server", &server, "server ping data: rdma-ping-"),
        ] {
            let said = text(output);
            assert!(output.status.success(), "port {port} {side}: {said}");
            let pings = said.lines().filter(|line| line.starts_with(prefix)).count();
            assert_eq!(pings, 50, "port {port} {side}: {said}");
        }
    }
}

/// An rping client to port `port` in the namespace `ns`, again while its server is not
/// listening yet (rejected), a bounded number of times.
fn rping_client(ns: &str, port: &str) -> Output {
    let args = [
        "rping",
        "-c",
        "-v",
        "-V",
        "-C",
        "50",
        "-a",
        "10.97.0.2",
        "-p",
        port,
    ];
    let mut last = None;
    for _ in 0..50 {
        let output = Command::new("ip")
            .args(["netns", "exec", ns, "timeout", "60"])
            .args([env!("CARGO_BIN_EXE_roce"), "exec", "--"])
            .args(args)
            .output()
            .unwrap();
        let said = text(&output);
        if output.status.success() || !said.contains("RDMA_CM_EVENT_REJECTED") {
            return output;
        }
        last = Some(output);
        thread::sleep(Duration::from_millis(200));
    }
    last.expect("tried at least once")
}

#[test]
fn a_killed_switch_fails_its_clients_and_nobody_hangs() {
    let test = "a_killed_switch_fails_its_clients_and_nobody_hangs";
    if !root_and(test, &["ib_send_bw"]) || !can_compile_c(test, "gcc and libibverbs-dev", VERBS_H) {
        return;
    }
    // Built before the switches start: they run under a bound of their own.
    build_libraries();
    let (a, b) = two_namespaces();
    // A switch run by hand, which lends the device to nobody: the pair's frames go
    // through it from the first.
    let switch = |ns: &Netns, dev: &str| {
        roce_in(ns, "switch", &[dev, "--no-lend"])
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let mut switches = [switch(&a, "mpa0"), switch(&b, "mpb0")];
    let program = compile_c("switch_fatal", &["-libverbs"]);
    let mut lone = exec_in(&a, &[program.path(), "mpa0"]).spawn().unwrap();
    let flags = ["ib_send_bw", "-x", "1", "-F", "-s", "4096", "-D", "20"];
    let server = start(&a, &[&flags[..], &["-d", "mpa0"]].concat());
    wait_for_listener(&a, 18515);
    let client = start(&b, &[&flags[..], &["-d", "mpb0", "10.97.0.1"]].concat());
    // The C program is attached once it says so; the pair is moving after a second.
    let mut ready = String::new();
    let stdout = lone.stdout.as_mut().unwrap();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut ready).unwrap();
    assert_eq!(ready, "ready\n");
    thread::sleep(Duration::from_secs(1));
    let killed = Instant::now();
    kill_program(&switches[0]);
    let lone = lone.wait_with_output().unwrap();
    let server = server.wait_with_output().unwrap();
    let client = client.wait_with_output().unwrap();
    let said = text(&lone);
    assert!(lone.status.success(), "{said}");
    // rdma-core's name of IBV_EVENT_DEVICE_FATAL; the flushed receive came after.
    assert!(said.contains("event local catastrophic error"), "{said}");
    assert!(
        said.contains("completion 7 Work Request Flushed Error"),
        "{said}"
    );
    // Both ends of the pair fail, well before perftest's 20 seconds are up.
    assert!(!server.status.success(), "server: {}", text(&server));
    assert!(!client.status.success(), "client: {}", text(&client));
    assert!(
        killed.elapsed() < Duration::from_secs(15),
        "{:?}",
        killed.elapsed()
    );
    for switch in &mut switches {
        stop_switch(switch);
    }
}

#[test]
fn two_of_our_processes_talk_to_two_of_rxes_at_once_in_both_roles() {
    let test = "two_of_our_processes_talk_to_two_of_rxes_at_once_in_both_roles";
    if !root_and(test, &["ib_write_bw", "ib_send_bw"]) {
        return;
    }
    let Some(vm) = vm(test, "9000") else {
        return;
    };
    let ours = |args: &[&str]| {
        Command::new("ip")
            .args(["netns", "exec", "rxe-host", "timeout", "60"])
            .args([env!("CARGO_BIN_EXE_roce"), "exec", "--"])
            .args(args)
            .env("ROCE_STATS", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    // We serve ib_write_bw on 18515 (rxe's client connects) while rxe serves ib_send_bw
    // on 18516 (our client connects).
    let our_server = ours(&["ib_write_bw", "-d", "host0", "-x", "1", "-F", "-n", "50"]);
    let their_server = vm.spawn(60, "ib_send_bw -d rxe0 -x $(rxe-gid) -F -n 1000 -p 18516");
    let listens = "for i in $(seq 150); do ss -ltn | grep -q ':18516 ' && exit 0; sleep 0.1; done";
    vm.exec(30, listens);
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        let listening = Command::new("ip")
            .args(["netns", "exec", "rxe-host", "ss", "-Hltn", "sport = :18515"])
            .output()
            .unwrap();
        if !listening.stdout.is_empty() {
            break;
        }
        thread::sleep(Duration::from_millis(20));
    }
    // Our client first, and long (1000 messages, seconds in the VM): our server makes its
    // QP only once rxe's client has connected, then waits up to 2 s for the client to hand
    // the device back before it goes through the switch, so the client must still be
    // running by then.
    let our_client = ours(&[
        "ib_send_bw",
        "-d",
        "host0",
        "-x",
        "1",
        "-F",
        "-n",
        "1000",
        "-p",
        "18516",
        "10.88.0.11",
    ]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        let connected = Command::new("ip")
            .args(["netns", "exec", "rxe-host", "ss", "-Htn", "dport = :18516"])
            .output()
            .unwrap();
        if String::from_utf8_lossy(&connected.stdout).contains("ESTAB") {
            break;
        }
        thread::sleep(Duration::from_millis(20));
    }
    let their_client = vm.spawn(60, "ib_write_bw -d rxe0 -x $(rxe-gid) -F -n 50 10.88.0.1");
    let our_client = our_client.wait_with_output().unwrap();
    let our_server = our_server.wait_with_output().unwrap();
    let their_client = vm.wait(&their_client, 60);
    let their_server = vm.wait(&their_server, 60);
    for (who, output, iterations) in [
        ("our ib_write_bw server", &our_server, "50"),
        ("rxe's ib_write_bw client", &their_client, "50"),
        ("our ib_send_bw client", &our_client, "1000"),
        ("rxe's ib_send_bw server", &their_server, "1000"),
    ] {
        let said = text(output);
        assert!(output.status.success(), "{who}: {said}");
        assert!(has_row(&said, "65536", iterations), "{who}: {said}");
    }
    // The second of our processes went through the switch, which the first handed the
    // device to.
    let said = format!("{}{}", text(&our_client), text(&our_server));
    assert!(switch_counter(&said, "wire_rx") > Some(0), "{said}");
}

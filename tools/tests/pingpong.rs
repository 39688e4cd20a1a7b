//! `roce pingpong` against itself between two network namespaces on a veth pair: RC (polling
//! and `-e` events), UC and UD over AF_XDP, and RC over kernel UDP sockets. Each run checks
//! both sides' exit status and rdma-core's result lines; the tool itself checks every byte
//! of every message. Needs root (CI is root).

mod common;

use std::process::Output;

use roce_provider::netns::{needs_root, veth, Netns};

use common::{roce_in, wait_for_listener};

fn check(side: &str, output: &Output, iters: u32, size: u32) {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{side}: {stdout}\n{stderr}");
    let bytes = format!("{} bytes in ", u64::from(size) * u64::from(iters) * 2);
    let line = format!("{iters} iters in ");
    assert!(
        stdout.contains(&bytes) && stdout.contains(&line) && stdout.contains("usec/iter"),
        "{side}: {stdout}"
    );
    assert!(stdout.contains("remote address:"), "{side}: {stdout}");
}

#[test]
fn pingpong_against_itself_in_every_mode() {
    if !needs_root("pingpong_against_itself_in_every_mode") {
        return;
    }
    let a = Netns::create("roce-pp-a").unwrap();
    let b = Netns::create("roce-pp-b").unwrap();
    veth((&a, "pa", "10.81.0.1/24"), (&b, "pb", "10.81.0.2/24"), 9000).unwrap();
    let runs: [(&str, &[&str]); 6] = [
        ("rc", &["--rc", "-s", "4096", "--stats"]),
        ("rc events", &["--rc", "-e", "-s", "65536", "-m", "4096"]),
        ("uc", &["--uc", "-s", "1024"]),
        ("ud", &["--ud", "-s", "1024", "-m", "2048"]),
        ("rc udp", &["--rc", "--udp", "-s", "4096"]),
        ("rc 1 byte", &["-s", "1", "-g", "1"]),
    ];
    for (name, flags) in runs {
        let iters = 200;
        let size: u32 = flags
            .windows(2)
            .find(|pair| pair[0] == "-s")
            .map_or(4096, |pair| pair[1].parse().unwrap());
        let n = iters.to_string();
        let mut server_args = vec!["-n", &n];
        server_args.extend_from_slice(flags);
        let server = roce_in(&b, "pingpong", &server_args).spawn().unwrap();
        wait_for_listener(&b, 18515);
        let mut client_args = server_args.clone();
        client_args.push("10.81.0.2");
        let client = roce_in(&a, "pingpong", &client_args).output().unwrap();
        let server = server.wait_with_output().unwrap();
        check(&format!("{name} client"), &client, iters, size);
        check(&format!("{name} server"), &server, iters, size);
        if flags.contains(&"--stats") {
            for (side, output) in [("pa", &client), ("pb", &server)] {
                let stderr = String::from_utf8_lossy(&output.stderr);
                let heading = format!("roce-xdp hw_counters {side}\n");
                // Each side sends and receives `iters` messages.
                let exact = format!("rdma_sends {iters}\nrdma_recvs {iters}\n");
                assert!(
                    stderr.contains(&heading) && stderr.contains(&exact),
                    "{name} {side}: {stderr}"
                );
            }
        }
    }
}

#[test]
fn a_ud_message_larger_than_the_path_mtu_is_refused_in_words() {
    let output = std::process::Command::new("timeout")
        .arg("20")
        .arg(env!("CARGO_BIN_EXE_roce"))
        .args(["pingpong", "--ud", "-s", "9000"])
        .output()
        .expect("run roce");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("-s 9000 is larger than the largest path MTU (4096 bytes)"),
        "{stderr}"
    );
}

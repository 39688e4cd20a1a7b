//! Interoperability with Linux soft-RoCE: `roce pingpong` against rdma-core's
//! `ibv_rc_pingpong`, `ibv_uc_pingpong` and `ibv_ud_pingpong` running on rxe in a VM (../shared/rxe-peer), in both
//! roles, over AF_XDP and kernel UDP, at path MTU 1024 and (RC) 4096. Needs root and the rxe-peer tool (CI has
//! both; the VM build is cached in $RXE_DIR).

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::thread;
use std::time::Duration;

const ITERS: &str = "50";

fn rxe_peer() -> Option<PathBuf> {
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/rxe-peer/rxe-peer.sh");
    script.exists().then_some(script)
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout.starts_with(b"0\n"))
        .unwrap_or(false)
}

struct Vm(PathBuf);

impl Vm {
    fn run(&self, args: &[&str]) -> Output {
        Command::new("bash")
            .arg(&self.0)
            .args(args)
            .output()
            .expect("run rxe-peer.sh")
    }

    /// (Re)starts VM 1 with the given netdev MTU (9000 gives rxe path MTU 4096).
    fn start(&self, mtu: &str) {
        let _ = self.run(&["stop"]);
        let started = Command::new("bash")
            .arg(&self.0)
            .args(["start", "1"])
            .env("RXE_MTU", mtu)
            .output()
            .expect("run rxe-peer.sh start");
        assert!(
            started.status.success(),
            "rxe-peer start (MTU {mtu}):\n{}",
            text(&started)
        );
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        let _ = self.run(&["loss", "0"]);
        let _ = self.run(&["stop"]);
    }
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Our pingpong in the host namespace.
fn ours(args: &[&str]) -> Child {
    Command::new("ip")
        .args([
            "netns",
            "exec",
            "rxe-host",
            "timeout",
            "120",
            env!("CARGO_BIN_EXE_roce"),
            "pingpong",
            "-d",
            "host0",
            "-n",
            ITERS,
        ])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start roce pingpong")
}

fn check(what: &str, ours: Output, theirs: Output) {
    let (ours_text, theirs_text) = (text(&ours), text(&theirs));
    let done = format!("{ITERS} iters in");
    assert!(
        ours.status.success() && ours_text.contains(&done),
        "{what}: ours failed:\n{ours_text}\nrxe:\n{theirs_text}"
    );
    assert!(
        theirs.status.success() && theirs_text.contains(&done),
        "{what}: rxe failed:\n{theirs_text}\nours:\n{ours_text}"
    );
}

/// rdma-core's `program` serves, we connect.
fn rxe_server(vm: &Vm, program: &str, what: &str, our_args: &[&str]) {
    let command = format!("{program} -d rxe0 -g $(rxe-gid) -n {ITERS}");
    let job = vm.run(&["spawn", "1", "-t", "120", &command]);
    let job = String::from_utf8_lossy(&job.stdout).trim().to_string();
    thread::sleep(Duration::from_secs(2));
    let mut args = our_args.to_vec();
    args.push("10.88.0.11");
    let ours = ours(&args).wait_with_output().expect("our client");
    let theirs = vm.run(&["wait", "1", &job, "120"]);
    check(what, ours, theirs);
}

/// We serve, rdma-core's `program` connects.
fn rxe_client(vm: &Vm, program: &str, what: &str, our_args: &[&str]) {
    let server = ours(our_args);
    thread::sleep(Duration::from_secs(1));
    let command = format!("{program} -d rxe0 -g $(rxe-gid) -n {ITERS} 10.88.0.1");
    let theirs = vm.run(&["exec", "1", "-t", "120", &command]);
    let ours = server.wait_with_output().expect("our server");
    check(what, ours, theirs);
}

#[test]
fn pingpong_with_rxe_in_both_roles() {
    let Some(script) = rxe_peer().filter(|_| is_root()) else {
        eprintln!("SKIPPED pingpong_with_rxe_in_both_roles: needs root and ../shared/rxe-peer");
        return;
    };
    let vm = Vm(script);
    let built = vm.run(&["build"]);
    assert!(built.status.success(), "rxe-peer build:\n{}", text(&built));
    vm.start("1500");

    let rc = "ibv_rc_pingpong";
    rxe_server(&vm, rc, "RC, AF_XDP client", &[]);
    rxe_server(&vm, rc, "RC, UDP client", &["--udp"]);
    rxe_client(&vm, rc, "RC, AF_XDP server", &[]);
    rxe_client(&vm, rc, "RC, UDP server", &["--udp"]);
    let uc = "ibv_uc_pingpong";
    rxe_server(&vm, uc, "UC, AF_XDP client", &["--uc"]);
    rxe_client(&vm, uc, "UC, UDP server", &["--uc", "--udp"]);
    // UD messages must fit the path MTU (1024 here).
    let ud = "ibv_ud_pingpong -s 512";
    rxe_server(&vm, ud, "UD, AF_XDP client", &["--ud", "-s", "512"]);
    rxe_client(&vm, ud, "UD, UDP server", &["--ud", "-s", "512", "--udp"]);
    // Loss (`rxe-peer.sh loss 5`) is not checked here yet: with rdma-core's side under loss
    // the runs fail now and then without a message from it (see the session notes).
    // Path MTU 4096: our frames span two AF_XDP buffers.
    vm.start("9000");
    let big = "ibv_rc_pingpong -m 4096 -s 16384";
    let ours_big = ["-m", "4096", "-s", "16384"];
    rxe_server(&vm, big, "RC, path MTU 4096, AF_XDP client", &ours_big);
    let ours_big_udp = [&ours_big[..], &["--udp"]].concat();
    rxe_client(&vm, big, "RC, path MTU 4096, UDP server", &ours_big_udp);
}

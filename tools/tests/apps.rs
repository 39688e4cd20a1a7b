//! Applications as Debian ships them, unmodified, between two namespaces joined by a veth,
//! both sides over our `libibverbs.so.1`/`librdmacm.so.1` through `roce exec`: UCX's
//! `ucx_perftest` over `rc_verbs,ud_verbs,self` and `ud_verbs,self`, Open MPI 4.1 with the
//! UCX pml running an MPI program of ours whose every result is checked
//! (`tests/c/mpi_check.c`, one rank per namespace, launched by an agent that enters the
//! namespace), libfabric's `fi_pingpong` over `verbs` (msg) and `verbs;ofi_rxm` (rdm),
//! `qperf` over rdma_cm, and fio's `rdma` engine (RDMA WRITE and READ). Each test checks its
//! program's own success output and exit status on both sides, at MTU 1500 and 9000.
//!
//! `figures_against_tcp` (ignored; run it with `--ignored --nocapture`) runs each program
//! over ours and over TCP on the same veth in one run and prints the table of
//! `docs/applications.md`.
//!
//! Needs root (namespaces, AF_XDP) and Debian's `ucx-utils`, `openmpi-bin`,
//! `libopenmpi-dev`, `libfabric-bin`, `qperf` and `fio`; in CI a missing prerequisite fails
//! the test, elsewhere it is skipped.

mod common;

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use roce_provider::netns::{needs_root, prerequisite, veth, Netns};

use common::{build_libraries, built_dir, dynamic_symbols, installed, text};

/// Our side of the veth in namespace `a` (the clients) and in `b` (the servers).
const A: &str = "10.86.0.1";
const B: &str = "10.86.0.2";

/// One application test at a time: each runs two busy-polling programs beside our engine
/// threads, which is all two cores hold; two at once would measure the scheduler.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn one_at_a_time() -> MutexGuard<'static, ()> {
    ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Root, and the Debian `programs` (paths under /usr/bin or absolute).
fn root_and(test: &str, packages: &str, programs: &[&str]) -> bool {
    needs_root(test)
        && prerequisite(
            test,
            packages,
            programs.iter().all(|program| {
                if program.starts_with('/') {
                    Path::new(program).exists()
                } else {
                    installed(program)
                }
            }),
        )
}

/// Two namespaces joined by a veth pair, `a0` (10.86.0.1) in `a` and `b0` (10.86.0.2) in
/// `b`, MTU `mtu`: the interfaces are the devices `a0` and `b0`.
struct Pair {
    a: Netns,
    b: Netns,
}

fn pair(mtu: u32) -> Pair {
    let a = Netns::create("roce-apps-a").unwrap();
    let b = Netns::create("roce-apps-b").unwrap();
    veth(
        (&a, "a0", &format!("{A}/24")),
        (&b, "b0", &format!("{B}/24")),
        mtu,
    )
    .unwrap();
    // Programs that list interfaces (UCX's tcp) take only those up and running: wait for
    // the carrier, which follows the links' `up` by a moment.
    let deadline = Instant::now() + Duration::from_secs(5);
    for (ns, interface) in [(&a, "a0"), (&b, "b0")] {
        while !ns
            .ip(&["-o", "link", "show", interface])
            .is_ok_and(|shown| String::from_utf8_lossy(&shown.stdout).contains("state UP"))
        {
            assert!(Instant::now() < deadline, "{interface} never came up");
            thread::sleep(Duration::from_millis(20));
        }
    }
    Pair { a, b }
}

/// Whether a program runs over our libraries (`roce exec`) or as it is (a TCP baseline).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Via {
    Ours,
    Plain,
}

/// `PROGRAM ARGS...` in `ns` with `env`, sent SIGTERM after `secs` and SIGKILL 5 s later
/// (fio waits for its connection deaf to SIGTERM).
fn command(ns: &Netns, via: Via, env: &[(&str, &str)], program: &[&str], secs: u32) -> Command {
    let mut command = Command::new("ip");
    command
        .args(["netns", "exec", &ns.name, "timeout", "-k", "5"])
        .arg(secs.to_string());
    if via == Via::Ours {
        build_libraries();
        command.args([env!("CARGO_BIN_EXE_roce"), "exec", "--"]);
    }
    command
        .args(program)
        .envs(env.iter().copied())
        .stdin(Stdio::null());
    command
}

/// How to tell that a server is ready for its client.
enum Ready {
    /// It listens on this TCP port.
    Port(u16),
    /// Its output says this.
    Says(&'static str),
}

/// A program's exit status and everything it printed (stdout, then stderr).
struct Ran {
    status: ExitStatus,
    text: String,
}

impl From<Output> for Ran {
    fn from(output: Output) -> Ran {
        Ran {
            status: output.status,
            text: text(&output),
        }
    }
}

/// A server running in the background, its output going to files.
struct Server {
    child: Child,
    dir: tempfile::TempDir,
}

impl Server {
    fn spawn(mut command: Command) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let out = File::create(dir.path().join("out")).unwrap();
        let err = File::create(dir.path().join("err")).unwrap();
        let child = command.stdout(out).stderr(err).spawn().unwrap();
        Server { child, dir }
    }

    fn text(&self) -> String {
        let read = |name: &str| fs::read_to_string(self.dir.path().join(name)).unwrap_or_default();
        format!("{}{}", read("out"), read("err"))
    }

    /// Waits (at most 30 s) until it is `ready` in the namespace `ns`; panics with its
    /// output if it ends or never gets there.
    fn wait_ready(&mut self, ns: &str, ready: &Ready) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            let now = match ready {
                Ready::Port(port) => !Command::new("ip")
                    .args(["netns", "exec", ns, "ss", "-Hltn"])
                    .arg(format!("sport = :{port}"))
                    .output()
                    .unwrap()
                    .stdout
                    .is_empty(),
                Ready::Says(what) => self.text().contains(what),
            };
            if now {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "the server ended ({status}) before it was ready:\n{}",
                    self.text()
                );
            }
            thread::sleep(Duration::from_millis(20));
        }
        panic!("the server never got ready:\n{}", self.text());
    }

    /// Its end (it is bounded by its own `timeout`).
    fn finish(mut self) -> Ran {
        let status = self.child.wait().unwrap();
        Ran {
            status,
            text: self.text(),
        }
    }

    /// Ends a server that serves until stopped (qperf): SIGTERM to its `timeout`, which
    /// passes it on.
    fn stop(self) -> Ran {
        let _ = Command::new("kill")
            .arg(self.child.id().to_string())
            .status();
        self.finish()
    }
}

/// Runs `server` in `b` until it is `ready`, then `client` in `a`; both results.
fn serve_and_connect(
    pair: &Pair,
    server: Command,
    ready: Ready,
    mut client: Command,
) -> (Ran, Ran) {
    let mut server = Server::spawn(server);
    server.wait_ready(&pair.b.name, &ready);
    let client = Ran::from(client.output().unwrap());
    (server.finish(), client)
}

/// Both sides exited 0 and the client said each of `expected`.
fn check(what: &str, (server, client): &(Ran, Ran), expected: &[&str]) {
    let both = format!(
        "{what}\n--- server ({}):\n{}\n--- client ({}):\n{}",
        server.status, server.text, client.status, client.text
    );
    assert!(server.status.success() && client.status.success(), "{both}");
    for line in expected {
        assert!(client.text.contains(line), "no {line:?} in {both}");
    }
}

// ---------------------------------------------------------------------------- UCX

/// The six tests as ucx_perftest names them at the UCP layer (where `UCX_TLS`
/// chooses the transports; its `put_bw`, `get` and `am_lat` are UCT tests, bound to one
/// transport given with `-x`), with a message size.
const UCX_TESTS: [(&str, &str, &str); 6] = [
    ("tag_lat", "tag_lat", "8"),
    ("tag_bw", "tag_bw", "65536"),
    ("put_bw", "ucp_put_bw", "65536"),
    ("get_bw", "ucp_get", "65536"),
    ("am_lat", "ucp_am_lat", "8"),
    ("stream_bw", "stream_bw", "65536"),
];

/// The transport sets: RC beside UD (RC needs UD for its wire-up), and UD alone.
const UCX_VERBS: [&str; 2] = ["rc_verbs,ud_verbs,self", "ud_verbs,self"];

/// `ucx_perftest -t TEST -s SIZE -n ITERS` over `tls` (`tcp` for the baseline); the
/// server in `b`, the client in `a`.
fn ucx_perftest(pair: &Pair, tls: &str, test: &str, size: &str, iters: u32) -> (Ran, Ran) {
    let (via, dev_a, dev_b) = if tls == "tcp" {
        (Via::Plain, "a0", "b0")
    } else {
        (Via::Ours, "a0:1", "b0:1")
    };
    let iters = iters.to_string();
    let warmup = (iters.parse::<u32>().unwrap() / 10).max(1).to_string();
    let args = [
        "ucx_perftest",
        "-t",
        test,
        "-s",
        size,
        "-n",
        &iters,
        "-w",
        &warmup,
    ];
    let env = |dev| [("UCX_TLS", tls), ("UCX_NET_DEVICES", dev)];
    let server = command(&pair.b, via, &env(dev_b), &args, 60);
    let client_args: Vec<&str> = args.iter().copied().chain([B]).collect();
    let client = command(&pair.a, via, &env(dev_a), &client_args, 60);
    serve_and_connect(pair, server, Ready::Port(13337), client)
}

/// ucx_perftest's last line, `Final: ITERS ...`, with every iteration done.
fn check_ucx(what: &str, ran: &(Ran, Ran), iters: u32) {
    check(what, ran, &["Final:"]);
    let last = ran.1.text.lines().find(|line| line.starts_with("Final:"));
    let done = last.and_then(|line| line.split_whitespace().nth(1));
    assert_eq!(
        done,
        Some(iters.to_string().as_str()),
        "{what}: {}",
        ran.1.text
    );
}

fn ucx_installed(test: &str) -> bool {
    root_and(test, "ucx-utils", &["ucx_perftest"])
}

#[test]
fn ucx_perftest_over_rc_and_ud_verbs_between_namespaces() {
    let test = "ucx_perftest_over_rc_and_ud_verbs_between_namespaces";
    if !ucx_installed(test) {
        return;
    }
    let _one = one_at_a_time();
    let pair = pair(1500);
    for tls in UCX_VERBS {
        for (name, ucx_test, size) in UCX_TESTS {
            let iters = if size == "8" { 1000 } else { 200 };
            let ran = ucx_perftest(&pair, tls, ucx_test, size, iters);
            check_ucx(&format!("{name} ({ucx_test}) over {tls}"), &ran, iters);
        }
    }
}

#[test]
fn ucx_perftest_at_mtu_9000() {
    let test = "ucx_perftest_at_mtu_9000";
    if !ucx_installed(test) {
        return;
    }
    let _one = one_at_a_time();
    let pair = pair(9000);
    for tls in UCX_VERBS {
        for (name, ucx_test, size) in [UCX_TESTS[0], UCX_TESTS[1], UCX_TESTS[3]] {
            let iters = if size == "8" { 1000 } else { 200 };
            let ran = ucx_perftest(&pair, tls, ucx_test, size, iters);
            check_ucx(&format!("{name} ({ucx_test}) over {tls}"), &ran, iters);
        }
    }
}

/// UCX against Linux rxe in the VM (slow: emulated), `tag_lat` both ways: rxe as server
/// over `ud_verbs,self`, ours as server over `rc_verbs,ud_verbs,self`. rxe reports 0 in a UD
/// receive's `sl`, where UCX's ud_verbs looks for the RoCE packet type (mlx5 reports it),
/// so UCX on rxe reads an IPv4 datagram's GRH area as a wrong destination GID and drops
/// every datagram: between two rxe VMs, as between rxe and us, each side ends with "UD
/// endpoint ... unhandled timeout error" (docs/applications.md). With
/// `UCX_UD_VERBS_ETH_DGID_CHECK=n` on rxe's side it runs; ours reports the packet type and
/// needs nothing.
#[test]
fn ucx_perftest_against_rxe_in_the_vm() {
    let test = "ucx_perftest_against_rxe_in_the_vm";
    if !ucx_installed(test) {
        return;
    }
    let Some(vm) = roce_tests::rxe_vm::vm(test, "1500") else {
        return;
    };
    let _one = one_at_a_time();
    let args = ["ucx_perftest", "-t", "tag_lat", "-n", "100", "-w", "10"];
    let rxe_env =
        |tls: &str| format!("UCX_UD_VERBS_ETH_DGID_CHECK=n UCX_TLS={tls} UCX_NET_DEVICES=rxe0:1");
    let ours = |tls: &'static str, extra: &[&str]| {
        let all: Vec<&str> = args.iter().chain(extra).copied().collect();
        let env = [("UCX_TLS", tls), ("UCX_NET_DEVICES", "host0:1")];
        let mut ns = Command::new("ip");
        ns.args(["netns", "exec", "rxe-host", "timeout", "-k", "5", "90"])
            .args([env!("CARGO_BIN_EXE_roce"), "exec", "--"])
            .args(&all)
            .envs(env)
            .stdin(Stdio::null());
        build_libraries();
        ns
    };

    // rxe serves, we connect (retrying until its server listens).
    let tls = "ud_verbs,self";
    let job = vm.spawn(120, &format!("{} {}", rxe_env(tls), args.join(" ")));
    let deadline = Instant::now() + Duration::from_secs(60);
    let client = loop {
        let ran = Ran::from(ours(tls, &["10.88.0.11"]).output().unwrap());
        if ran.status.success()
            || !ran.text.contains("Connection refused")
            || Instant::now() > deadline
        {
            break ran;
        }
        thread::sleep(Duration::from_secs(1));
    };
    let server = Ran::from(vm.wait(&job, 120));
    check_ucx(&format!("rxe serving over {tls}"), &(server, client), 100);

    // We serve, rxe connects.
    let tls = "rc_verbs,ud_verbs,self";
    let mut server = Server::spawn(ours(tls, &[]));
    server.wait_ready("rxe-host", &Ready::Port(13337));
    let client = Ran::from(vm.exec(
        120,
        &format!("{} {} 10.88.0.1", rxe_env(tls), args.join(" ")),
    ));
    let ran = (server.finish(), client);
    check(
        "ours serving, rxe over rc_verbs,ud_verbs,self",
        &ran,
        &["Final:"],
    );
}

// ------------------------------------------------------------------------ Open MPI

/// How Open MPI runs the job: over the UCX pml (our libraries) or over its TCP BTL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mpi {
    Ucx,
    Tcp,
}

/// `tests/c/mpi_check.c`, built with Open MPI's `mpicc`.
fn mpi_check() -> common::CProgram {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/mpi_check.c");
    let dir = tempfile::tempdir().unwrap();
    let binary = dir.path().join("mpi_check");
    let built = Command::new("mpicc")
        .args(["-O2", "-o"])
        .arg(&binary)
        .arg(&source)
        .output()
        .expect("run mpicc");
    assert!(built.status.success(), "mpicc: {}", text(&built));
    common::CProgram { dir, binary }
}

/// Open MPI's `plm_rsh_agent`: Open MPI runs `AGENT HOST COMMAND...` as it would run
/// `ssh HOST COMMAND...`; this one runs COMMAND in HOST's namespace, over our libraries
/// when `via` says so, through a shell as ssh would.
fn launch_agent(dir: &Path, pair: &Pair, via: Via) -> PathBuf {
    let roce = match via {
        Via::Ours => format!("{} exec -- ", env!("CARGO_BIN_EXE_roce")),
        Via::Plain => String::new(),
    };
    let script = format!(
        "#!/bin/sh\n\
         # Open MPI's plm_rsh_agent: AGENT HOST COMMAND... runs COMMAND in HOST's namespace.\n\
         host=$1; shift\n\
         case $host in\n\
         {A}) ns={a} ;;\n\
         {B}) ns={b} ;;\n\
         *) echo \"agent: no namespace for $host\" >&2; exit 1 ;;\n\
         esac\n\
         exec ip netns exec \"$ns\" {roce}/bin/sh -c \"$*\"\n",
        a = pair.a.name,
        b = pair.b.name,
    );
    let agent = dir.join("agent");
    fs::write(&agent, script).unwrap();
    let chmod = Command::new("chmod")
        .arg("+x")
        .arg(&agent)
        .status()
        .unwrap();
    assert!(chmod.success());
    agent
}

/// `mpirun` in `a` with `per_namespace` ranks in each namespace (the first ones are
/// `mpirun`'s own children in `a`, the others reached through the agent in `b`), running
/// `mpi_check SCALE`.
fn mpirun(
    pair: &Pair,
    mpi: Mpi,
    program: &common::CProgram,
    scale: u32,
    per_namespace: u32,
) -> Ran {
    let via = match mpi {
        Mpi::Ucx => Via::Ours,
        Mpi::Tcp => Via::Plain,
    };
    build_libraries();
    let agent = launch_agent(program.dir.path(), pair, via);
    let hosts = format!("{A}:{per_namespace},{B}:{per_namespace}");
    let ranks = (2 * per_namespace).to_string();
    let scale = scale.to_string();
    let mut args = vec![
        "mpirun",
        "--mca",
        "plm_rsh_agent",
        agent.to_str().unwrap(),
        "--host",
        &hosts,
        "-np",
        &ranks,
    ];
    match mpi {
        // Only UCX's verbs transports: the ranks share a host name, so Open MPI would take
        // shared memory (vader, UCX's sm) if it could.
        Mpi::Ucx => args.extend([
            "--mca",
            "pml",
            "ucx",
            "--mca",
            "btl",
            "^vader,tcp,openib,uct",
            "-x",
            "UCX_TLS=rc_verbs,ud_verbs,self",
        ]),
        Mpi::Tcp => args.extend([
            "--mca",
            "pml",
            "ob1",
            "--mca",
            "btl",
            "tcp,self",
            "--mca",
            "btl_tcp_if_include",
            "10.86.0.0/24",
        ]),
    }
    args.extend([
        "-x",
        "PATH",
        "-x",
        "LD_LIBRARY_PATH",
        program.path(),
        &scale,
    ]);
    let env = [
        ("OMPI_ALLOW_RUN_AS_ROOT", "1"),
        ("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"),
    ];
    Ran::from(command(&pair.a, via, &env, &args, 240).output().unwrap())
}

fn check_mpi(what: &str, ran: &Ran, ranks: u32) {
    assert!(ran.status.success(), "{what}: {}\n{}", ran.status, ran.text);
    for rank in 0..ranks {
        let line = format!("rank {rank} of {ranks}");
        assert!(
            ran.text.contains(&line),
            "{what}: no {line:?} in\n{}",
            ran.text
        );
    }
    for line in [
        "pingpong        8 B",
        "pingpong  4194304 B",
        "allreduce 1048576 doubles (sum)",
        "alltoall 262144 B per rank pair",
        "transfer 64 MiB",
        "mpi_check: verified",
    ] {
        assert!(
            ran.text.contains(line),
            "{what}: no {line:?} in\n{}",
            ran.text
        );
    }
}

fn mpi_installed(test: &str) -> bool {
    root_and(
        test,
        "openmpi-bin, libopenmpi-dev and ucx-utils",
        &["mpirun", "mpicc", "ucx_perftest"],
    )
}

#[test]
fn mpi_job_over_the_ucx_pml_one_rank_per_namespace() {
    let test = "mpi_job_over_the_ucx_pml_one_rank_per_namespace";
    if !mpi_installed(test) {
        return;
    }
    let _one = one_at_a_time();
    let program = mpi_check();
    let pair = pair(9000);
    let ran = mpirun(&pair, Mpi::Ucx, &program, 10, 1);
    check_mpi("mpirun over the UCX pml", &ran, 2);
}

/// Two ranks in each namespace: ranks 0 and 1 (the pingpong's pair) share namespace `a`'s
/// device, as do ranks 2 and 3 `b`'s, so the collectives run between processes of one
/// device (through the switch) and across the veth at once.
#[test]
fn mpi_job_over_the_ucx_pml_two_ranks_per_namespace() {
    let test = "mpi_job_over_the_ucx_pml_two_ranks_per_namespace";
    if !mpi_installed(test) {
        return;
    }
    let _one = one_at_a_time();
    let program = mpi_check();
    let pair = pair(9000);
    let ran = mpirun(&pair, Mpi::Ucx, &program, 10, 2);
    check_mpi("mpirun over the UCX pml, two ranks per namespace", &ran, 4);
}

// ------------------------------------------------------------------------ libfabric

/// `fi_pingpong -p PROVIDER -e ENDPOINT` with its default sizes (64 B to 1 MiB, 10
/// iterations each).
fn fi_pingpong(pair: &Pair, via: Via, provider: &str, endpoint: &str) -> (Ran, Ran) {
    let args = ["fi_pingpong", "-p", provider, "-e", endpoint];
    let server = command(&pair.b, via, &[], &args, 60);
    let client_args: Vec<&str> = args.iter().copied().chain([B]).collect();
    let client = command(&pair.a, via, &[], &client_args, 60);
    // Its control connection is TCP 47592.
    serve_and_connect(pair, server, Ready::Port(47592), client)
}

/// A result row for each default size, every message acknowledged.
fn check_fi(what: &str, ran: &(Ran, Ran)) {
    check(what, ran, &["bytes   #sent   #ack"]);
    for size in ["64", "256", "1k", "4k", "64k", "1m"] {
        for side in [&ran.0, &ran.1] {
            let row = side.text.lines().find(|line| {
                let mut words = line.split_whitespace();
                words.next() == Some(size)
                    && words.next() == Some("10")
                    && words.next() == Some("=10")
            });
            assert!(row.is_some(), "{what}: no row for {size}:\n{}", side.text);
        }
    }
}

#[test]
fn fi_pingpong_over_verbs_msg_and_rxm_rdm() {
    let test = "fi_pingpong_over_verbs_msg_and_rxm_rdm";
    if !root_and(test, "libfabric-bin", &["fi_pingpong"]) {
        return;
    }
    let _one = one_at_a_time();
    for mtu in [1500, 9000] {
        let pair = pair(mtu);
        for (provider, endpoint) in [("verbs", "msg"), ("verbs;ofi_rxm", "rdm")] {
            let ran = fi_pingpong(&pair, Via::Ours, provider, endpoint);
            check_fi(
                &format!("fi_pingpong -p {provider:?} -e {endpoint}, MTU {mtu}"),
                &ran,
            );
        }
    }
}

// ---------------------------------------------------------------------------- qperf

/// qperf's RC tests over rdma_cm (`-cm1`) and what each prints.
const QPERF_RC: [(&str, &str); 4] = [
    ("rc_lat", "latency  ="),
    ("rc_bw", "bw  ="),
    ("rc_rdma_write_bw", "bw  ="),
    ("rc_rdma_read_lat", "latency  ="),
];

/// A qperf server in `b` (it serves until stopped), each of `tests` from `a`.
fn qperf(pair: &Pair, via: Via, options: &[&str], tests: &[&str]) -> (Ran, Vec<Ran>) {
    let mut server = Server::spawn(command(&pair.b, via, &[], &["qperf"], 120));
    server.wait_ready(&pair.b.name, &Ready::Port(19765));
    let clients = tests
        .iter()
        .map(|test| {
            let args: Vec<&str> = ["qperf"]
                .into_iter()
                .chain(options.iter().copied())
                .chain([B, *test])
                .collect();
            Ran::from(command(&pair.a, via, &[], &args, 60).output().unwrap())
        })
        .collect();
    (server.stop(), clients)
}

#[test]
fn qperf_rc_tests_over_rdma_cm() {
    let test = "qperf_rc_tests_over_rdma_cm";
    if !root_and(test, "qperf", &["qperf"]) {
        return;
    }
    let _one = one_at_a_time();
    for mtu in [1500, 9000] {
        let pair = pair(mtu);
        let tests: Vec<&str> = QPERF_RC.iter().map(|(test, _)| *test).collect();
        let (server, clients) = qperf(&pair, Via::Ours, &["-cm1", "-t", "1"], &tests);
        for ((test, says), client) in QPERF_RC.iter().zip(&clients) {
            let all = format!(
                "qperf -cm1 {test}, MTU {mtu}: {}\n{}\n--- server:\n{}",
                client.status, client.text, server.text
            );
            assert!(client.status.success(), "{all}");
            assert!(
                client.text.contains(&format!("{test}:")) && client.text.contains(says),
                "{all}"
            );
        }
    }
}

/// qperf 0.4.11 runs its UD tests without rdma_cm (`-cm1` is "set but not used") and
/// makes its address handle from the peer's LID, without a GRH: RoCE has no LIDs and
/// needs the GRH, so every RoCE device refuses it (the kernel's `rdma_check_ah_attr`,
/// EINVAL, which rxe runs too), and so do we, with the same words and exit status.
#[test]
fn qperf_ud_tests_fail_as_on_any_roce_device() {
    let test = "qperf_ud_tests_fail_as_on_any_roce_device";
    if !root_and(test, "qperf", &["qperf"]) {
        return;
    }
    let _one = one_at_a_time();
    let pair = pair(1500);
    let (server, clients) = qperf(&pair, Via::Ours, &["-cm1", "-t", "1"], &["ud_lat", "ud_bw"]);
    for (test, client) in ["ud_lat", "ud_bw"].iter().zip(&clients) {
        let all = format!(
            "qperf -cm1 {test}: {}\n{}\n--- server:\n{}",
            client.status, client.text, server.text
        );
        assert_eq!(client.status.code(), Some(1), "{all}");
        // Whichever side makes its address handle first fails with it; the client's then
        // says `server:` and the server's words are in the server's output.
        let refused = "failed to create address handle: Invalid argument";
        assert!(
            client
                .text
                .contains(&format!("warning: -cm1 set but not used in test {test}"))
                && (client.text.contains(refused) || server.text.contains(refused)),
            "{all}"
        );
    }
}

// ------------------------------------------------------------------------------ fio

/// fio's rdma engine: a server (`rw=read`, which makes it the passive side) in `b` and a
/// client (`rw=write`) in `a` doing RDMA `verb` (write or read) with 64 KiB blocks.
fn fio_rdma(pair: &Pair, verb: &str, size: &str) -> (Ran, Ran) {
    let common = ["--ioengine=rdma", "--port=5555", "--bs=64k", "--iodepth=16"];
    let size = format!("--size={size}");
    // The engine's own options (verb, hostname, port) come after `--ioengine`.
    let server_args: Vec<&str> = ["fio", "--name=server"]
        .into_iter()
        .chain(common)
        .chain(["--rw=read", &size])
        .collect();
    let verb = format!("--verb={verb}");
    let host = format!("--hostname={B}");
    let client_args: Vec<&str> = ["fio", "--name=client"]
        .into_iter()
        .chain(common)
        .chain(["--rw=write", &size, &verb, &host])
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let mut server = command(&pair.b, Via::Ours, &[], &server_args, 60);
    server.current_dir(dir.path());
    let mut client = command(&pair.a, Via::Ours, &[], &client_args, 60);
    client.current_dir(dir.path());
    serve_and_connect(pair, server, Ready::Says("waiting for connection"), client)
}

#[test]
fn fio_rdma_engine_writes_and_reads_64k_blocks() {
    let test = "fio_rdma_engine_writes_and_reads_64k_blocks";
    if !root_and(test, "fio", &["fio"]) {
        return;
    }
    let _one = one_at_a_time();
    for mtu in [1500, 9000] {
        let pair = pair(mtu);
        for verb in ["write", "read"] {
            let ran = fio_rdma(&pair, verb, "32m");
            check(
                &format!("fio rdma verb={verb}, MTU {mtu}"),
                &ran,
                &["client: (groupid=0, jobs=1): err= 0", "io=32.0MiB"],
            );
            assert!(ran.0.text.contains("err= 0"), "{}", ran.0.text);
        }
    }
}

// ------------------------------------------------------------------- what they need

/// qperf leaves its `ibv_get_cq_event` wait on its interval timer's SIGALRM (a handler
/// without `SA_RESTART`), as rdma-core's read(2) of the channel's fd ends with EINTR; a
/// handler with `SA_RESTART` lets the wait go on to its event (`tests/c/cq_event_signals.c`).
#[test]
fn ibv_get_cq_event_ends_on_a_signal_as_rdma_cores_read() {
    let test = "ibv_get_cq_event_ends_on_a_signal_as_rdma_cores_read";
    if !needs_root(test) || !common::can_compile_c(test, "libibverbs-dev", common::VERBS_H) {
        return;
    }
    let program = common::compile_c("cq_event_signals", &["-libverbs", "-lpthread"]);
    let pair = pair(1500);
    let ran = Ran::from(
        command(&pair.a, Via::Ours, &[], &[program.path(), "a0"], 30)
            .output()
            .unwrap(),
    );
    assert!(
        ran.status.success() && ran.text.contains("ok"),
        "{}: {}",
        ran.status,
        ran.text
    );
}

/// What libfabric's verbs provider asks of librdmacm (`tests/c/cm_for_libfabric.c`): a
/// listener bound to localhost with port 0, a synchronous id migrated to a channel, 0xFF
/// depths, the REP's private data on the active side's ESTABLISHED.
#[test]
fn rdma_cm_answers_libfabric_as_the_kernel_does() {
    let test = "rdma_cm_answers_libfabric_as_the_kernel_does";
    if !needs_root(test)
        || !common::can_compile_c(test, "librdmacm-dev", "/usr/include/rdma/rdma_cma.h")
    {
        return;
    }
    let program = common::compile_c("cm_for_libfabric", &["-lrdmacm", "-libverbs"]);
    let pair = pair(1500);
    let mut server = Server::spawn(command(
        &pair.b,
        Via::Ours,
        &[],
        &[program.path(), "server"],
        30,
    ));
    server.wait_ready(&pair.b.name, &Ready::Says("port "));
    let said = server.text();
    let port = said
        .lines()
        .find_map(|line| line.strip_prefix("port "))
        .expect("the server's port")
        .trim()
        .to_owned();
    let client = Ran::from(
        command(
            &pair.a,
            Via::Ours,
            &[],
            &[program.path(), "client", B, &port],
            30,
        )
        .output()
        .unwrap(),
    );
    let server = server.finish();
    let both = format!(
        "--- server ({}):\n{}\n--- client ({}):\n{}",
        server.status, server.text, client.status, client.text
    );
    assert!(
        server.status.success() && server.text.contains("ok"),
        "{both}"
    );
    assert!(
        client.status.success() && client.text.contains("ok"),
        "{both}"
    );
}

// ---------------------------------------------------------------------------- symbols

/// Every versioned libibverbs/librdmacm symbol these programs and their libraries import
/// (UCX's verbs and rdma_cm transports, libfabric, qperf, fio) is one we export.
#[test]
fn every_symbol_the_applications_import_is_exported() {
    let test = "every_symbol_the_applications_import_is_exported";
    let files = [
        "/usr/lib/x86_64-linux-gnu/ucx/libuct_ib.so.0",
        "/usr/lib/x86_64-linux-gnu/ucx/libuct_rdmacm.so.0",
        "/usr/lib/x86_64-linux-gnu/libfabric.so.1",
        "/usr/bin/qperf",
        "/usr/bin/fio",
    ];
    if !prerequisite(
        test,
        "ucx-utils, libfabric-bin, qperf and fio",
        files.iter().all(|file| Path::new(file).exists()),
    ) {
        return;
    }
    build_libraries();
    let ours: Vec<String> = ["libibverbs.so", "librdmacm.so"]
        .iter()
        .flat_map(|library| dynamic_symbols(&built_dir().join(library), true))
        .collect();
    let mut missing = Vec::new();
    let mut checked = 0;
    for file in files {
        for import in dynamic_symbols(Path::new(file), false) {
            if import.contains("@IBVERBS_") || import.contains("@RDMACM_") {
                checked += 1;
                if !ours.contains(&import) {
                    missing.push(format!("{import} (for {file})"));
                }
            }
        }
    }
    assert!(checked > 150, "only {checked} imports seen");
    assert!(missing.is_empty(), "not exported: {missing:#?}");
}

// ---------------------------------------------------------------------------- figures

/// The figure after `key` on the line of `text` that has it, with its unit, in µs for a
/// time and MB/s (10^6 bytes) for a rate: qperf's `latency  =  231 us`, `bw  =  1.2 GB/sec`,
/// fio's `bw=95.8MiB/s`.
fn figure_after(text: &str, key: &str) -> Option<f64> {
    let line = text.lines().find(|line| line.contains(key))?;
    let rest = line[line.find(key)? + key.len()..].trim_start();
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    let value: f64 = rest[..end].parse().ok()?;
    let unit = rest[end..].split_whitespace().next()?;
    let scale = match unit.trim_end_matches(',') {
        "ns" => 1e-3,
        "us" => 1.0,
        "ms" => 1e3,
        "sec" | "s" => 1e6,
        "KB/sec" | "kB/s" => 1e-3,
        "MB/sec" | "MB/s" => 1.0,
        "GB/sec" | "GB/s" => 1e3,
        "KiB/s" => 1.024e-3,
        "MiB/s" => 1.048_576,
        "GiB/s" => 1_073.741_824,
        _ => return None,
    };
    Some(value * scale)
}

/// ucx_perftest's `Final:` columns: typical latency (µs, the 50th percentile) and
/// average bandwidth (MB/s).
fn ucx_figures(client: &str) -> (f64, f64) {
    let line = client
        .lines()
        .find(|line| line.starts_with("Final:"))
        .unwrap_or_default();
    let words: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|word| word.parse().ok())
        .collect();
    (
        words.get(1).copied().unwrap_or(f64::NAN),
        words.get(4).copied().unwrap_or(f64::NAN),
    )
}

/// fi_pingpong's row for `size`: µs per transfer and MB/s.
fn fi_figures(client: &str, size: &str) -> (f64, f64) {
    let row = client
        .lines()
        .find(|line| line.split_whitespace().next() == Some(size))
        .unwrap_or_default();
    let words: Vec<&str> = row.split_whitespace().collect();
    let at = |index: usize| {
        words
            .get(index)
            .and_then(|word| word.parse().ok())
            .unwrap_or(f64::NAN)
    };
    (at(6), at(5))
}

/// One row: what, ours, TCP's, ours ÷ TCP's.
fn row(what: &str, unit: &str, ours: f64, tcp: f64) {
    println!(
        "| {what} | {ours:.1} {unit} | {tcp:.1} {unit} | {:.2} |",
        ours / tcp
    );
}

/// Each program over ours and over TCP on the same veth (MTU 9000) in one run, printed as
/// the table of docs/applications.md. Speed is never asserted; the programs' own success
/// is.
#[test]
#[ignore = "measures; run with --ignored --nocapture"]
fn figures_against_tcp() {
    let test = "figures_against_tcp";
    if !mpi_installed(test)
        || !root_and(
            test,
            "libfabric-bin, qperf, fio",
            &["fi_pingpong", "qperf", "fio"],
        )
    {
        return;
    }
    let _one = one_at_a_time();
    let pair = pair(9000);
    println!("| test | roce-xdp | TCP, same veth | ratio |");
    println!("|---|---|---|---|");
    for (name, ucx_test, size) in UCX_TESTS {
        let lat = size == "8";
        let iters = if lat { 10000 } else { 2000 };
        let tcp = ucx_perftest(&pair, "tcp", ucx_test, size, iters);
        check_ucx(&format!("{name} over tcp"), &tcp, iters);
        for tls in UCX_VERBS {
            let ours = ucx_perftest(&pair, tls, ucx_test, size, iters);
            check_ucx(&format!("{name} over {tls}"), &ours, iters);
            let (ours, tcp) = (ucx_figures(&ours.1.text), ucx_figures(&tcp.1.text));
            let what = format!("UCX {name} {size} B, {tls}");
            if lat {
                row(&what, "µs", ours.0, tcp.0);
            } else {
                row(&what, "MB/s", ours.1, tcp.1);
            }
        }
    }
    let program = mpi_check();
    let ucx = mpirun(&pair, Mpi::Ucx, &program, 1, 1);
    check_mpi("mpirun over the UCX pml", &ucx, 2);
    let tcp = mpirun(&pair, Mpi::Tcp, &program, 1, 1);
    check_mpi("mpirun over the TCP BTL", &tcp, 2);
    for (key, what, unit, column) in [
        (
            "pingpong        8 B",
            "MPI ping-pong 8 B, half round trip",
            "µs",
            0,
        ),
        (
            "pingpong    32768 B",
            "MPI ping-pong 32 KiB, half round trip",
            "µs",
            0,
        ),
        ("pingpong  4194304 B", "MPI ping-pong 4 MiB", "MB/s", 1),
        (
            "allreduce 1048576 doubles",
            "MPI allreduce of 1 Mi doubles",
            "ms",
            0,
        ),
        (
            "alltoall 262144 B",
            "MPI alltoall, 256 KiB per pair",
            "ms",
            0,
        ),
        ("transfer 64 MiB", "MPI 64 MiB transfer", "MB/s", 1),
    ] {
        let figure = |text: &str| {
            let line = text
                .lines()
                .find(|line| line.contains(key))
                .unwrap_or_default();
            let after = &line[key.len().min(line.len())..];
            let numbers: Vec<f64> = after
                .split_whitespace()
                .filter_map(|word| word.parse().ok())
                .collect();
            // ping-pong rows: iterations, µs, MB/s; the others: ms, MB/s.
            let skip = usize::from(key.starts_with("pingpong"));
            numbers.get(skip + column).copied().unwrap_or(f64::NAN)
        };
        row(what, unit, figure(&ucx.text), figure(&tcp.text));
    }
    for (provider, tcp_provider, endpoint) in [
        ("verbs", "tcp", "msg"),
        ("verbs;ofi_rxm", "tcp;ofi_rxm", "rdm"),
    ] {
        let ours = fi_pingpong(&pair, Via::Ours, provider, endpoint);
        check_fi(provider, &ours);
        let tcp = fi_pingpong(&pair, Via::Plain, tcp_provider, endpoint);
        check_fi(tcp_provider, &tcp);
        for size in ["64", "1m"] {
            let (ours, tcp) = (
                fi_figures(&ours.1.text, size),
                fi_figures(&tcp.1.text, size),
            );
            let what = format!("fi_pingpong -p {provider} -e {endpoint}, {size}");
            if size == "64" {
                row(&what, "µs", ours.0, tcp.0);
            } else {
                row(&what, "MB/s", ours.1, tcp.1);
            }
        }
    }
    let tests: Vec<&str> = QPERF_RC.iter().map(|(test, _)| *test).collect();
    let (_, ours) = qperf(&pair, Via::Ours, &["-cm1", "-t", "3"], &tests);
    let (_, tcp) = qperf(&pair, Via::Plain, &["-t", "3"], &["tcp_lat", "tcp_bw"]);
    let tcp_lat = figure_after(&tcp[0].text, "latency  =").unwrap_or(f64::NAN);
    let tcp_bw = figure_after(&tcp[1].text, "bw  =").unwrap_or(f64::NAN);
    for ((test, says), ran) in QPERF_RC.iter().zip(&ours) {
        let ours = figure_after(&ran.text, says).unwrap_or(f64::NAN);
        if says.starts_with("latency") {
            row(
                &format!("qperf -cm1 {test} (vs tcp_lat)"),
                "µs",
                ours,
                tcp_lat,
            );
        } else {
            row(
                &format!("qperf -cm1 {test} (vs tcp_bw)"),
                "MB/s",
                ours,
                tcp_bw,
            );
        }
    }
    for verb in ["write", "read"] {
        let ran = fio_rdma(&pair, verb, "512m");
        check(verb, &ran, &["err= 0"]);
        let bw = figure_after(&ran.1.text, "bw=").unwrap_or(f64::NAN);
        row(
            &format!("fio rdma verb={verb}, 64 KiB (vs qperf tcp_bw)"),
            "MB/s",
            bw,
            tcp_bw,
        );
    }
}

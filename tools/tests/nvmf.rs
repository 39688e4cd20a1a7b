//! `roce nvmf`: NVMe over RDMA with both ends ours between two namespaces (discovery, a
//! verified mixed workload on two I/O queues, in-capsule and keyed writes), a host that
//! vanishes (SIGKILL: its controller is ended by the keep alive timer and its queues
//! freed, and the next host is served), and against the Linux kernel in the rxe VM: its
//! host (`nvme discover`, `nvme connect -i 1` then `-i 4`, 32 MiB of random data written,
//! caches dropped, read back identical, a keep alive period idle) against our target,
//! and our host's verified workload against its `nvmet_rdma` target.
//!
//! Needs root (namespaces, AF_XDP) and, for the VM test, ../shared/rxe-peer; in CI a
//! missing prerequisite fails, elsewhere it is skipped.

mod common;

use std::process::{Child, Command, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use roce_provider::netns::{needs_root, veth, Netns};
use roce_tests::rxe_vm::vm;

use common::{roce_in, text};

const NQN: &str = "nqn.2026-12.io.roce-xdp:test";

/// Two namespaces joined by a veth pair (`na` 10.84.0.1, `nb` 10.84.0.2, MTU 9000).
fn two_namespaces(prefix: &str) -> (Netns, Netns) {
    let a = Netns::create(&format!("{prefix}-a")).unwrap();
    let b = Netns::create(&format!("{prefix}-b")).unwrap();
    veth((&a, "na", "10.84.0.1/24"), (&b, "nb", "10.84.0.2/24"), 9000).unwrap();
    (a, b)
}

/// `roce nvmf serve` in `ns`, its log in a file read by [`log`].
struct Server {
    child: Child,
    log: tempfile::NamedTempFile,
}

impl Server {
    fn start(ns: &str, args: &[&str]) -> Server {
        let log = tempfile::NamedTempFile::new().unwrap();
        // `ip netns exec` execs the program: the child is `roce` itself, which `Drop`
        // stops (a `timeout` in between would leave it running).
        let child = Command::new("ip")
            .args(["netns", "exec", ns])
            .arg(env!("CARGO_BIN_EXE_roce"))
            .args(["nvmf", "serve", "--nqn", NQN])
            .args(args)
            .stdout(Stdio::null())
            .stderr(log.reopen().unwrap())
            .spawn()
            .expect("start roce nvmf serve");
        let server = Server { child, log };
        server.wait_for("listening on", Duration::from_secs(20));
        server
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }

    /// Waits until the log has a line containing `what`.
    fn wait_for(&self, what: &str, limit: Duration) {
        let deadline = Instant::now() + limit;
        while !self.log().contains(what) {
            assert!(
                Instant::now() < deadline,
                "the target never said `{what}`:\n{}",
                self.log()
            );
            thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Server {
    /// SIGTERM (the target ends its controllers and exits), SIGKILL after 5 s.
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `roce nvmf perf` in `ns` against `addr`.
fn perf(ns: &Netns, addr: &str, args: &[&str]) -> Output {
    let mut all = vec![addr, "--nqn", NQN];
    all.extend(args);
    let mut command = roce_in(ns, "nvmf", &["perf"]);
    command.args(all).output().expect("run roce nvmf perf")
}

/// Whether a perf run ended well: exit 0 and the summary line says so.
fn verified(output: &Output) -> bool {
    let said = text(output);
    let last = String::from_utf8_lossy(&output.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .to_string();
    output.status.success()
        && last.starts_with("ios=")
        && last.ends_with("verified=ok status=ok")
        && !said.contains("MISMATCH")
}

#[test]
fn both_ends_ours_between_namespaces() {
    if !needs_root("both_ends_ours_between_namespaces") {
        return;
    }
    let (a, b) = two_namespaces("roce-nvmf");
    // Namespace 1 in RAM, namespace 2 a file (moved through staging buffers).
    let file = tempfile::NamedTempFile::new().unwrap();
    file.as_file().set_len(4 << 20).unwrap();
    let file_path = file.path().to_str().unwrap();
    let server = Server::start(
        &b.name,
        &["--ram", "32M", "--file", file_path, "--listen", "10.84.0.2"],
    );
    let discovered = roce_in(&a, "nvmf", &["discover", "10.84.0.2"])
        .output()
        .unwrap();
    let listed = text(&discovered);
    assert!(
        discovered.status.success() && listed.contains(NQN) && listed.contains("10.84.0.2"),
        "{listed}\n{}",
        server.log()
    );
    // 4 KiB writes go in the capsule, 64 KiB ones by keyed SGL; both directions verified.
    for bs in ["4k", "64k"] {
        let output = perf(
            &a,
            "10.84.0.2",
            &[
                "--rw",
                "randrw",
                "--bs",
                bs,
                "--queues",
                "2",
                "--iodepth",
                "16",
                "--ios",
                "3000",
                "--size",
                "8M",
                "--verify",
            ],
        );
        assert!(
            verified(&output),
            "bs {bs}:\n{}\n{}",
            text(&output),
            server.log()
        );
    }
    let output = perf(
        &a,
        "10.84.0.2",
        &[
            "--nsid",
            "2",
            "--rw",
            "randrw",
            "--bs",
            "16k",
            "--iodepth",
            "8",
            "--ios",
            "600",
            "--verify",
        ],
    );
    assert!(
        verified(&output),
        "file:\n{}\n{}",
        text(&output),
        server.log()
    );
    let stored = std::fs::read(file.path()).unwrap();
    assert!(
        stored.iter().any(|&byte| byte != 0),
        "nothing reached the file"
    );
    let log = server.log();
    assert!(log.contains("I/O queue 2, 16 entries"), "{log}");
    assert!(!log.contains("keep alive timeout"), "{log}");
}

#[test]
fn a_vanished_host_is_freed_and_the_next_one_served() {
    if !needs_root("a_vanished_host_is_freed_and_the_next_one_served") {
        return;
    }
    let (a, b) = two_namespaces("roce-nvmf-gone");
    let server = Server::start(&b.name, &["--ram", "8M", "--listen", "10.84.0.2"]);
    // `ip netns exec` execs the program: the child is `roce` itself, for SIGKILL.
    let mut doomed = Command::new("ip")
        .args(["netns", "exec", &a.name])
        .arg(env!("CARGO_BIN_EXE_roce"))
        .args([
            "nvmf",
            "perf",
            "10.84.0.2",
            "--nqn",
            NQN,
            "--kato",
            "2",
            "--queues",
            "2",
            "--time",
            "60s",
            "--size",
            "4M",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    server.wait_for("I/O queue 2", Duration::from_secs(20));
    doomed.kill().unwrap();
    doomed.wait().unwrap();
    let killed = Instant::now();
    // No DREQ came: the keep alive timer (2 s) ends the controller and frees its three
    // queues.
    server.wait_for(
        "keep alive timeout (2000 ms); 3 queue(s) freed",
        Duration::from_secs(20),
    );
    let freed_after = killed.elapsed();
    assert!(
        // (The timer counts from the host's last command, a moment before the kill.)
        freed_after >= Duration::from_millis(1500),
        "freed after {freed_after:?}"
    );
    let output = perf(
        &a,
        "10.84.0.2",
        &["--ios", "500", "--size", "1M", "--verify", "--queues", "2"],
    );
    assert!(verified(&output), "{}\n{}", text(&output), server.log());
}

/// Runs `command` in the VM, bounded to `seconds`; its output, failing the test if it
/// failed.
fn in_vm(
    vm: &roce_tests::rxe_vm::Vm,
    seconds: u32,
    command: &str,
    context: &dyn Fn() -> String,
) -> String {
    let output = vm.exec(seconds, command);
    let said = roce_tests::rxe_vm::text(&output);
    assert!(
        output.status.success(),
        "VM: {command}\n{said}\n{}",
        context()
    );
    said
}

#[test]
fn the_linux_kernel_host_and_target_interoperate() {
    let Some(vm) = vm("the_linux_kernel_host_and_target_interoperate", "1500") else {
        return;
    };
    // The kernel host against our target in the host namespace, every frame recorded.
    let pcap = tempfile::NamedTempFile::new().unwrap();
    let pcap_path = pcap.path().to_str().unwrap();
    let server = Server::start(
        "rxe-host",
        &[
            "--ram",
            "64M",
            "--listen",
            "10.88.0.1",
            "-d",
            "host0",
            "--pcap",
            pcap_path,
        ],
    );
    let log = || server.log();
    let connect = |queues: u32| {
        format!("nvme connect -t rdma -n {NQN} -a 10.88.0.1 -s 4420 -i {queues} && sleep 1 && test -b /dev/nvme0n1")
    };
    let disconnect = format!("nvme disconnect -n {NQN}");
    let said = in_vm(
        &vm,
        120,
        "modprobe nvme_rdma && nvme discover -t rdma -a 10.88.0.1 -s 4420",
        &log,
    );
    assert!(
        said.contains(NQN) && said.contains("traddr:  10.88.0.1"),
        "{said}"
    );
    // Random data written, caches dropped, read back: the same SHA-256.
    let round_trip = |mib: u32| {
        format!(
            "head -c {mib}M /dev/urandom > /tmp/x && dd if=/tmp/x of=/dev/nvme0n1 bs=1M conv=fsync 2>/dev/null \
             && echo 3 > /proc/sys/vm/drop_caches \
             && a=$(sha256sum < /tmp/x) && b=$(head -c {mib}M /dev/nvme0n1 | sha256sum) \
             && echo \"wrote $a read $b\" && test \"$a\" = \"$b\""
        )
    };
    // One I/O queue: a small round trip, then idle for more than two keep alive timeouts
    // (Linux's 5 s) and still served. Four I/O queues asked for (Linux makes as many as
    // the VM has CPUs): 32 MiB.
    in_vm(
        &vm,
        120,
        &format!(
            "{} && {} && sleep 12 && head -c 4096 /dev/nvme0n1 > /tmp/y \
             && head -c 4096 /tmp/x | cmp - /tmp/y && {disconnect}",
            connect(1),
            round_trip(1)
        ),
        &log,
    );
    let said = in_vm(
        &vm,
        240,
        &format!("{} && {} && {disconnect}", connect(4), round_trip(32)),
        &log,
    );
    assert!(said.contains("wrote"), "{said}");
    let target_log = server.log();
    assert_eq!(
        target_log
            .matches("connected to nqn.2014-08.org.nvmexpress.discovery")
            .count(),
        1,
        "{target_log}"
    );
    assert_eq!(
        target_log.matches(&format!("connected to {NQN}")).count(),
        2,
        "{target_log}"
    );
    assert!(!target_log.contains("keep alive timeout"), "{target_log}");
    drop(server);
    // Linux asks for remote invalidation (keyed SGL subtype 0xF): our responses were SEND
    // with Invalidate; its in-capsule writes and READs of its data were answered by SEND.
    let dump = Command::new(env!("CARGO_BIN_EXE_roce"))
        .args(["dump", "--summary", pcap_path])
        .output()
        .unwrap();
    let summary = text(&dump);
    let count = |name: &str| -> usize {
        summary
            .lines()
            .find_map(|line| line.strip_prefix(&format!("{name} ")))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    };
    assert!(count("RC_SEND_ONLY_WITH_INVALIDATE") > 100, "{summary}");
    assert!(count("RC_RDMA_READ_REQUEST") > 100, "{summary}");
    assert!(summary.contains("icrc_bad=0 malformed=0"), "{summary}");

    // Our host against the kernel's nvmet_rdma target on a RAM disk in the VM.
    let kernel_nqn = "nqn.2026-12.io.roce-xdp:ram0";
    in_vm(
        &vm,
        60,
        &format!(
            "modprobe brd rd_nr=1 rd_size=65536 && modprobe nvmet_rdma && cd /sys/kernel/config/nvmet \
             && mkdir -p subsystems/{kernel_nqn}/namespaces/1 ports/1 \
             && echo 1 > subsystems/{kernel_nqn}/attr_allow_any_host \
             && echo -n /dev/ram0 > subsystems/{kernel_nqn}/namespaces/1/device_path \
             && echo 1 > subsystems/{kernel_nqn}/namespaces/1/enable \
             && echo 10.88.0.11 > ports/1/addr_traddr && echo rdma > ports/1/addr_trtype \
             && echo 4420 > ports/1/addr_trsvcid && echo ipv4 > ports/1/addr_adrfam \
             && ln -s /sys/kernel/config/nvmet/subsystems/{kernel_nqn} ports/1/subsystems/{kernel_nqn}"
        ),
        &String::new,
    );
    let output = Command::new("ip")
        .args(["netns", "exec", "rxe-host", "timeout", "120"])
        .arg(env!("CARGO_BIN_EXE_roce"))
        .args([
            "nvmf",
            "perf",
            "10.88.0.11",
            "--nqn",
            kernel_nqn,
            "-d",
            "host0",
            "--rw",
            "randrw",
            "--bs",
            "4k",
            "--iodepth",
            "8",
            "--queues",
            "2",
            "--ios",
            "600",
            "--size",
            "2M",
            "--verify",
        ])
        .output()
        .unwrap();
    assert!(verified(&output), "{}", text(&output));
}

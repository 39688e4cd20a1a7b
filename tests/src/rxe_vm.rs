//! The rxe VM (../shared/rxe-peer): Linux soft-RoCE and rdma-core in QEMU, reached from the
//! `rxe-host` namespace (`host0`, 10.88.0.1); VM 1 is 10.88.0.11. Used by this crate's tests
//! and the tools' (one way to find, start and stop it).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, MutexGuard};

use roce_provider::netns::{is_root, prerequisite};

/// The rxe-peer script: `$RXE_PEER`, else ../shared/rxe-peer next to the repository.
fn rxe_peer() -> Option<PathBuf> {
    let script = std::env::var_os("RXE_PEER").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/rxe-peer/rxe-peer.sh"),
        PathBuf::from,
    );
    script.exists().then_some(script)
}

/// A program's exit status, stdout and stderr, for failure messages.
pub fn text(output: &Output) -> String {
    format!(
        "status {:?}\n{}{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// One test of a process at a time has the VM: a test binary runs its tests in parallel,
/// and they would restart one VM under each other.
static TURN: Mutex<()> = Mutex::new(());

/// The same between processes (test binaries of several checkouts, or a person's own use of
/// the script): an exclusive lock on this file, held while a test has the VM. The script's
/// namespaces and VM names are fixed, so two users would tear down each other's VM.
pub const LOCK_FILE: &str = "/tmp/roce-rxe-vm.lock";

/// VM 1, powered off (with its bridge's loss removed) when dropped, then handed to the
/// next test waiting for it.
pub struct Vm {
    script: PathBuf,
    // Dropped after `Drop::drop` has stopped the VM: the lock, then the turn.
    _lock: std::fs::File,
    _turn: MutexGuard<'static, ()>,
}

impl Vm {
    /// The rxe-peer script, for commands that run it themselves.
    pub fn script(&self) -> &Path {
        &self.script
    }

    /// `rxe-peer.sh ARGS...`.
    pub fn run(&self, args: &[&str]) -> Output {
        Command::new("bash")
            .arg(&self.script)
            .args(args)
            .output()
            .expect("run rxe-peer.sh")
    }

    /// (Re)starts VM 1 with the given netdev MTU (9000 gives rxe path MTU 4096).
    pub fn start(&self, mtu: &str) {
        let _ = self.run(&["stop"]);
        let started = Command::new("bash")
            .arg(&self.script)
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

    /// Starts `command` in the VM in the background, bounded to `seconds`; its job id.
    pub fn spawn(&self, seconds: u32, command: &str) -> String {
        let job = self.run(&["spawn", "1", "-t", &seconds.to_string(), command]);
        assert!(
            job.status.success(),
            "rxe-peer spawn {command}:\n{}",
            text(&job)
        );
        String::from_utf8_lossy(&job.stdout).trim().to_string()
    }

    /// What a job [`spawn`](Self::spawn)ed said, once it ended (or `seconds` passed).
    pub fn wait(&self, job: &str, seconds: u32) -> Output {
        self.run(&["wait", "1", job, &seconds.to_string()])
    }

    /// Runs `command` in the VM, bounded to `seconds`.
    pub fn exec(&self, seconds: u32, command: &str) -> Output {
        self.run(&["exec", "1", "-t", &seconds.to_string(), command])
    }

    /// [`spawn`](Self::spawn)s a server and returns its job once the VM shows it listening
    /// as `on` says: a client started then finds it, however slowly the VM runs. Panics,
    /// with what the server said, if it ends first or does not listen within
    /// [`LISTEN_PATIENCE`] seconds.
    pub fn spawn_server(&self, seconds: u32, command: &str, on: Listener) -> String {
        let job = self.spawn(seconds, command);
        let probe = match on {
            Listener::Tcp(port) => format!("ss -Hltn 'sport = :{port}' | grep -q ."),
            Listener::RdmaCm(port) => format!(
                "rdma resource show cm_id | grep -qE 'state LISTEN .*src-addr [^ ]*:{port}( |$)'"
            ),
        };
        let waited = self.exec(
            LISTEN_PATIENCE + 15,
            &format!(
                "end=$((SECONDS + {LISTEN_PATIENCE}))
                 while ((SECONDS < end)); do
                   {probe} && exit 0
                   if [ -e /host/cmd/{job}.rc ]; then
                     echo \"it ended (status $(cat /host/cmd/{job}.rc)) before listening:\"
                     cat /host/cmd/{job}.out; exit 2
                   fi
                   sleep 0.1
                 done
                 echo \"not listening after {LISTEN_PATIENCE} s ({on}):\"; cat /host/cmd/{job}.out; exit 1"
            ),
        );
        assert!(
            waited.status.success(),
            "the VM's server `{command}` ({on}):\n{}",
            text(&waited)
        );
        job
    }

    /// Copies `file` into VM 1's 9p share as `name`; its path in the guest. A program
    /// compiled here against libibverbs.so.1 runs there over rxe (the same Debian release).
    pub fn copy_in(&self, file: &Path, name: &str) -> String {
        let share = rxe_dir().join("run/vm1/share");
        std::fs::copy(file, share.join(name)).unwrap_or_else(|error| {
            panic!("copy {} into {}: {error}", file.display(), share.display())
        });
        format!("/host/{name}")
    }
}

/// Where rxe-peer.sh keeps its state: `$RXE_DIR`, else `${XDG_CACHE_HOME:-~/.cache}/rxe-peer`.
pub fn rxe_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("RXE_DIR") {
        return PathBuf::from(dir);
    }
    let cache = std::env::var_os("XDG_CACHE_HOME").map_or_else(
        || {
            let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
            PathBuf::from(home).join(".cache")
        },
        PathBuf::from,
    );
    cache.join("rxe-peer")
}

/// What a server in the VM listens on, as [`Vm::spawn_server`] waits for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    /// A TCP port: the exchange of perftest (without `-R`) and of the pingpongs.
    Tcp(u16),
    /// An rdma_cm port (`rdma resource show cm_id` says LISTEN): rping, udaddy, perftest
    /// `-R`'s first listener.
    RdmaCm(u16),
}

impl std::fmt::Display for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Listener::Tcp(port) => write!(f, "TCP port {port}"),
            Listener::RdmaCm(port) => write!(f, "rdma_cm port {port}"),
        }
    }
}

/// Seconds a VM server may take to listen (a program starts in a few seconds under
/// emulation, more on a loaded host).
pub const LISTEN_PATIENCE: u32 = 60;

impl Drop for Vm {
    fn drop(&mut self) {
        let _ = self.run(&["loss", "0"]);
        let _ = self.run(&["stop"]);
    }
}

/// The VM, built and started with netdev MTU `mtu`, or `None` (and a SKIPPED line) when
/// this is not root or the script is missing; in CI either is a failure.
pub fn vm(test: &str, mtu: &str) -> Option<Vm> {
    let script = rxe_peer().filter(|_| is_root());
    if !prerequisite(test, "root and ../shared/rxe-peer", script.is_some()) {
        return None;
    }
    let turn = TURN.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(LOCK_FILE)
        .expect("open the rxe VM's lock file");
    lock.lock().expect("lock the rxe VM's lock file");
    let vm = Vm {
        script: script?,
        _lock: lock,
        _turn: turn,
    };
    let built = vm.run(&["build"]);
    assert!(built.status.success(), "rxe-peer build:\n{}", text(&built));
    vm.start(mtu);
    Some(vm)
}

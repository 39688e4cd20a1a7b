//! Network namespaces that a test or the demo makes for itself (and always removes), joined by
//! veth pairs: the only places they send anything. Driven through ip(8).

use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

use rustix::thread::{move_into_link_name_space, LinkNameSpaceType};

/// Whether this process can create namespaces and load BPF (root).
pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Whether this run is CI's (`CI` set to anything but empty, `0` or `false`), where a test
/// whose prerequisites are missing must fail rather than pass without having run.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|value| !matches!(value.as_str(), "" | "0" | "false"))
}

/// Whether `test` can run, given whether `what` it needs is `available`. When it is not: in CI
/// this panics, naming what is missing; elsewhere it prints `SKIPPED test: needs what` and
/// returns false, and the test returns early.
pub fn prerequisite(test: &str, what: &str, available: bool) -> bool {
    if available {
        return true;
    }
    assert!(!in_ci(), "{test}: needs {what}, which CI must provide");
    eprintln!("SKIPPED {test}: needs {what}");
    false
}

/// [`prerequisite`] for root (namespaces, BPF, AF_XDP).
pub fn needs_root(test: &str) -> bool {
    prerequisite(test, "root", is_root())
}

/// A named network namespace, deleted on drop.
pub struct Netns {
    /// Its name under /var/run/netns.
    pub name: String,
}

static NEXT: AtomicU32 = AtomicU32::new(0);

/// Runs ip(8) and fails, with its message, unless it succeeds.
fn ip(args: &[&str]) -> io::Result<Output> {
    let output = Command::new("ip").args(args).output()?;
    if output.status.success() {
        Ok(output)
    } else {
        let why = String::from_utf8_lossy(&output.stderr);
        Err(io::Error::other(format!(
            "ip {}: {}",
            args.join(" "),
            why.trim()
        )))
    }
}

impl Netns {
    /// Creates a namespace whose name starts with `prefix` and is unique to this process,
    /// with its loopback up.
    pub fn create(prefix: &str) -> io::Result<Netns> {
        let serial = NEXT.fetch_add(1, Ordering::Relaxed);
        let name = format!("{prefix}-{}-{serial}", std::process::id());
        ip(&["netns", "add", &name])?;
        let ns = Netns { name };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// Runs `ip -n NAME ARGS...`.
    pub fn ip(&self, args: &[&str]) -> io::Result<Output> {
        let mut all = vec!["-n", &self.name];
        all.extend_from_slice(args);
        ip(&all)
    }

    /// Runs a command inside the namespace (its exit status is the caller's to judge).
    pub fn run(&self, command: &[&str]) -> io::Result<Output> {
        Command::new("ip")
            .args(["netns", "exec", &self.name])
            .args(command)
            .output()
    }

    /// The `ip -o link show` line of `interface`.
    fn link(&self, interface: &str) -> io::Result<String> {
        link_in(&self.name, interface)
    }

    /// The ifindex of `interface` in this namespace.
    pub fn ifindex(&self, interface: &str) -> io::Result<u32> {
        let line = self.link(interface)?;
        let index = line.split(':').next().and_then(|n| n.trim().parse().ok());
        index.ok_or_else(|| io::Error::other(format!("no ifindex in {line:?}")))
    }

    /// The MAC address of `interface` in this namespace.
    pub fn mac(&self, interface: &str) -> io::Result<[u8; 6]> {
        mac_in(&self.name, interface)
    }

    /// Whether an XDP program is attached to `interface`.
    pub fn has_xdp(&self, interface: &str) -> io::Result<bool> {
        Ok(self.link(interface)?.contains("prog/xdp"))
    }

    /// Moves the calling thread into this namespace (a thread's network namespace is its own).
    pub fn enter(&self) -> io::Result<()> {
        enter(&self.name)
    }
}

/// The `ip -o link show` line of `interface` in the namespace `name`.
fn link_in(name: &str, interface: &str) -> io::Result<String> {
    let output = ip(&["-n", name, "-o", "link", "show", interface])?;
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The MAC address of `interface` in the namespace `name`.
pub fn mac_in(name: &str, interface: &str) -> io::Result<[u8; 6]> {
    let line = link_in(name, interface)?;
    let bad = || io::Error::other(format!("no MAC in {line:?}"));
    let after = line.split("link/ether ").nth(1).ok_or_else(bad)?;
    let mut mac = [0u8; 6];
    let mut parts = after.split(':');
    for byte in &mut mac {
        let hex = parts
            .next()
            .and_then(|part| part.get(..2))
            .ok_or_else(bad)?;
        *byte = u8::from_str_radix(hex, 16).map_err(|_| bad())?;
    }
    Ok(mac)
}

/// Moves the calling thread into the namespace `name`.
pub fn enter(name: &str) -> io::Result<()> {
    let file = File::open(format!("/var/run/netns/{name}"))?;
    move_into_link_name_space(file.as_fd(), Some(LinkNameSpaceType::Network))?;
    Ok(())
}

impl Drop for Netns {
    fn drop(&mut self) {
        delete(&self.name);
    }
}

/// Deletes the namespace `name` (and the veth end in it, which takes its peer along).
pub fn delete(name: &str) {
    let _ = ip(&["netns", "del", name]);
}

/// Joins `a` and `b` with a veth pair `a_if`/`b_if` carrying the given CIDR addresses, MTU
/// `mtu`, both ends up.
pub fn veth(a: (&Netns, &str, &str), b: (&Netns, &str, &str), mtu: u32) -> io::Result<()> {
    veth_with_queues(a, b, mtu, 1)
}

/// [`veth`] with `queues` receive and transmit queues on each end (as a multi-queue NIC).
pub fn veth_with_queues(
    (a, a_if, a_addr): (&Netns, &str, &str),
    (b, b_if, b_addr): (&Netns, &str, &str),
    mtu: u32,
    queues: u32,
) -> io::Result<()> {
    let mtu = mtu.to_string();
    let queues = queues.to_string();
    let q = ["numtxqueues", &queues, "numrxqueues", &queues];
    ip(&[
        &["link", "add", a_if, "netns", &a.name, "mtu", &mtu][..],
        &q,
        &[
            "type", "veth", "peer", "name", b_if, "netns", &b.name, "mtu", &mtu,
        ],
        &q,
    ]
    .concat())?;
    for (ns, interface, address) in [(a, a_if, a_addr), (b, b_if, b_addr)] {
        ns.ip(&["addr", "add", address, "dev", interface])?;
        ns.ip(&["link", "set", interface, "up"])?;
    }
    Ok(())
}

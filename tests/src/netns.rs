//! Network namespaces a test makes for itself (and always removes): the only place network
//! tests may send anything.

use std::fs::File;
use std::os::fd::AsFd;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

use rustix::thread::{move_into_link_name_space, LinkNameSpaceType};

/// Whether this process can create namespaces and load BPF (root).
pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// A named network namespace, deleted on drop.
pub struct Netns {
    /// Its name under /var/run/netns.
    pub name: String,
}

static NEXT: AtomicU32 = AtomicU32::new(0);

fn ip(args: &[&str]) -> Output {
    Command::new("ip").args(args).output().expect("run ip(8)")
}

fn check(output: Output, what: &str) -> Output {
    assert!(
        output.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

impl Netns {
    /// Creates a namespace whose name starts with `prefix` and is unique to this process.
    pub fn create(prefix: &str) -> Netns {
        let name = format!(
            "{prefix}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        check(ip(&["netns", "add", &name]), "ip netns add");
        let ns = Netns { name };
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    /// Runs `ip -n NAME ARGS...`, panicking if it fails.
    pub fn ip(&self, args: &[&str]) -> Output {
        let mut all = vec!["-n", &self.name];
        all.extend_from_slice(args);
        check(ip(&all), &format!("ip {}", all.join(" ")))
    }

    /// Runs a command inside the namespace.
    pub fn run(&self, command: &[&str]) -> Output {
        Command::new("ip")
            .args(["netns", "exec", &self.name])
            .args(command)
            .output()
            .expect("ip netns exec")
    }

    /// The ifindex of `interface` in this namespace.
    pub fn ifindex(&self, interface: &str) -> u32 {
        let output = self.ip(&["-o", "link", "show", interface]);
        let text = String::from_utf8_lossy(&output.stdout);
        text.split(':')
            .next()
            .and_then(|n| n.trim().parse().ok())
            .expect("ifindex")
    }

    /// The MAC address of `interface` in this namespace.
    pub fn mac(&self, interface: &str) -> [u8; 6] {
        let output = self.ip(&["-o", "link", "show", interface]);
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        let after = text
            .split("link/ether ")
            .nth(1)
            .expect("an Ethernet interface");
        let mut mac = [0u8; 6];
        for (byte, hex) in mac.iter_mut().zip(after.split(':')) {
            *byte = u8::from_str_radix(&hex[..2], 16).expect("hex MAC");
        }
        mac
    }

    /// Moves the calling thread into this namespace (a thread's network namespace is its own).
    pub fn enter(&self) {
        let file = File::open(format!("/var/run/netns/{}", self.name)).expect("namespace file");
        move_into_link_name_space(file.as_fd(), Some(LinkNameSpaceType::Network)).expect("setns");
    }
}

impl Netns {
    /// Enters the namespace without deleting it when this handle goes (for a thread that
    /// borrows a namespace another handle owns).
    pub fn enter_and_forget(self) {
        self.enter();
        std::mem::forget(self);
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.name]);
    }
}

/// Joins `a` and `b` with a veth pair `a_if`/`b_if` carrying the given CIDR addresses, MTU
/// `mtu`, both ends up.
pub fn veth(a: &Netns, a_if: &str, a_addr: &str, b: &Netns, b_if: &str, b_addr: &str, mtu: u32) {
    let mtu = mtu.to_string();
    let link = [
        "link", "add", a_if, "netns", &a.name, "mtu", &mtu, "type", "veth", "peer", "name", b_if,
        "netns", &b.name, "mtu", &mtu,
    ];
    check(ip(&link), "ip link add veth");
    for (ns, interface, address) in [(a, a_if, a_addr), (b, b_if, b_addr)] {
        ns.ip(&["addr", "add", address, "dev", interface]);
        ns.ip(&["link", "set", interface, "up"]);
    }
}

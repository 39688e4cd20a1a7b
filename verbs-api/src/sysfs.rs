//! What the kernel shows in sysfs and `/dev` for a soft-RoCE (rxe) device on an interface,
//! rendered for our devices: [`tree`] turns the devices a program sees into the list of
//! directories, files, links and device nodes to create (pure: `roce exec` creates them in
//! the program's private mount namespace; see there).
//!
//! The shape is Linux 6.1's rxe (dumped from the rxe VM: `tools/tests/device_view.rs` compares
//! the two file by file), with the values our verbs report:
//!
//! ```text
//! /sys/class/infiniband/DEV -> ../../devices/virtual/infiniband/DEV
//! /sys/class/infiniband_verbs/{abi_version, uverbsN -> ../../devices/virtual/infiniband_verbs/uverbsN}
//! /sys/devices/virtual/infiniband/DEV/{node_type, node_guid, sys_image_guid, fw_ver, node_desc,
//!     parent, uevent, subsystem, device, ports/1/...}
//! /sys/devices/virtual/infiniband_verbs/uverbsN/{ibdev, abi_version, dev, uevent, subsystem}
//! /dev/infiniband/uverbsN (character device 231:192+N, as the kernel numbers them)
//! ```
//!
//! `DEV` is the interface's name (our device names are the interfaces'). Beyond rxe: a
//! `device` link to a parent directory holding `net/IFACE` (the netdev), `infiniband/DEV` and
//! `infiniband_verbs/uverbsN`, where a PCI HCA's parent device has them, because programs
//! find a device's netdev there (rdma-core's Python tests list `device/net/`). Left out: what
//! only the kernel's machinery has (`power/`, the kernel CM's `cm_*` MAD counters) and the
//! table entries rxe cannot read either (a GID type or netdev of an empty GID slot reads
//! `EINVAL` there; such files are absent here).
//!
//! `hw_counters/*` hold rxe's counters ([`hw_counter_files`]); `lifespan` says how many
//! milliseconds a value may be old, as in the kernel. The drop-in libibverbs rewrites them
//! from a device's live counters while a program has it open ([`COUNTERS_LIFESPAN_MS`]).

use std::fmt::Write as _;

use roce_transport::Counters;

use crate::device::{Device, PortState};

/// One thing to create, by absolute path; a directory comes before what is inside it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Where: under one of [`ROOTS`].
    pub path: String,
    /// Permission bits (`0o444` for a read-only sysfs attribute).
    pub mode: u32,
    /// What.
    pub kind: Kind,
}

/// The kind of an [`Entry`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// A directory.
    Dir,
    /// A file with these contents.
    File(String),
    /// A symbolic link to this (relative, as sysfs makes them) target.
    Link(String),
    /// A character device node.
    CharDevice {
        /// The major number.
        major: u32,
        /// The minor number.
        minor: u32,
    },
}

/// The directories whose contents the tree adds to; everything else stays as it is.
pub const ROOTS: [&str; 3] = ["/sys/class", "/sys/devices/virtual", "/dev"];

/// The names the tree puts directly in each of [`ROOTS`] (replacing any the host has there).
pub const TOP_LEVEL: [&str; 5] = [
    "/sys/class/infiniband",
    "/sys/class/infiniband_verbs",
    "/sys/devices/virtual/infiniband",
    "/sys/devices/virtual/infiniband_verbs",
    "/dev/infiniband",
];

/// How old, at most, a value in `hw_counters/` is: the period at which the drop-in library
/// rewrites them (`hw_counters/lifespan`, as the kernel's cache period there).
pub const COUNTERS_LIFESPAN_MS: u64 = 100;

/// The character devices' major number and first minor (`IB_UVERBS_MAJOR`,
/// `IB_UVERBS_BASE_MINOR`: fixed in the kernel, so the same on every machine).
const UVERBS_MAJOR: u32 = 231;
const UVERBS_BASE_MINOR: u32 = 192;

/// The kernel's uverbs ABI (`/sys/class/infiniband_verbs/abi_version`) and rxe's driver ABI
/// (`uverbsN/abi_version`).
const KERNEL_ABI: u32 = 6;
const RXE_ABI: u32 = 2;

/// Where the tree hangs the parent directory of each device (see the module's docs).
const PARENTS: &str = "/sys/devices/virtual/roce-xdp";

/// The tree for `devices`, which are the devices in `ibv_get_device_list`'s order (the
/// N of `uverbsN` is the position in it).
pub fn tree(devices: &[Device]) -> Vec<Entry> {
    let mut out = Tree::default();
    out.dir("/sys/class/infiniband");
    out.dir("/sys/class/infiniband_verbs");
    out.file(
        "/sys/class/infiniband_verbs/abi_version",
        format!("{KERNEL_ABI}\n"),
    );
    out.dir("/sys/devices/virtual/infiniband");
    out.dir("/sys/devices/virtual/infiniband_verbs");
    out.dir("/dev/infiniband");
    if !devices.is_empty() {
        out.dir(PARENTS);
    }
    for (index, device) in devices.iter().enumerate() {
        out.device(index, device);
    }
    out.0
}

/// The directory of a device's `hw_counters` files (as programs reach it, through the class).
pub fn hw_counters_dir(device: &str) -> String {
    format!("/sys/class/infiniband/{device}/ports/1/hw_counters")
}

/// The files of `hw_counters/`: each counter as rxe names it ([`hw_counter_text`]), then
/// `lifespan`.
pub fn hw_counter_files(counters: &Counters) -> Vec<(&'static str, String)> {
    counters
        .iter()
        .map(|(name, value)| (name, hw_counter_text(value)))
        .chain([("lifespan", format!("{COUNTERS_LIFESPAN_MS}\n"))])
        .collect()
}

/// A counter's file: decimal, with a newline.
pub fn hw_counter_text(value: u64) -> String {
    format!("{value}\n")
}

/// A GUID as sysfs prints it: four groups of four hex digits (`5054:00ff:fe88:000b`).
pub fn guid_text(guid: u64) -> String {
    let b = guid.to_be_bytes();
    format!(
        "{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}",
        b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]
    )
}

/// A GID as sysfs prints it (`%pI6`: eight groups of four hex digits, nothing elided).
pub fn gid_text(gid: &[u8; 16]) -> String {
    let mut text = String::with_capacity(40);
    for (at, pair) in gid.chunks(2).enumerate() {
        if at > 0 {
            text.push(':');
        }
        let _ = write!(text, "{:02x}{:02x}", pair[0], pair[1]);
    }
    text
}

#[derive(Default)]
struct Tree(Vec<Entry>);

impl Tree {
    fn push(&mut self, path: String, mode: u32, kind: Kind) {
        self.0.push(Entry { path, mode, kind });
    }

    fn dir(&mut self, path: impl Into<String>) {
        self.push(path.into(), 0o755, Kind::Dir);
    }

    /// A read-only attribute.
    fn file(&mut self, path: impl Into<String>, contents: String) {
        self.push(path.into(), 0o444, Kind::File(contents));
    }

    /// An attribute root may write in sysfs (`node_desc`, `uevent`, `lifespan`).
    fn writable(&mut self, path: impl Into<String>, contents: String) {
        self.push(path.into(), 0o644, Kind::File(contents));
    }

    fn link(&mut self, path: impl Into<String>, target: impl Into<String>) {
        self.push(path.into(), 0o777, Kind::Link(target.into()));
    }

    fn device(&mut self, index: usize, device: &Device) {
        let name = &device.name;
        let uverbs = format!("uverbs{index}");
        let minor = UVERBS_BASE_MINOR + index as u32;
        let guid = guid_text(device.query().node_guid);

        self.link(
            format!("/sys/class/infiniband/{name}"),
            format!("../../devices/virtual/infiniband/{name}"),
        );
        self.link(
            format!("/sys/class/infiniband_verbs/{uverbs}"),
            format!("../../devices/virtual/infiniband_verbs/{uverbs}"),
        );

        let dev = format!("/sys/devices/virtual/infiniband/{name}");
        self.dir(&dev);
        self.file(format!("{dev}/node_type"), "1: CA\n".into());
        self.file(format!("{dev}/node_guid"), format!("{guid}\n"));
        self.file(format!("{dev}/sys_image_guid"), format!("{guid}\n"));
        self.file(format!("{dev}/fw_ver"), "\n".into());
        self.writable(format!("{dev}/node_desc"), "roce-xdp\n".into());
        self.file(format!("{dev}/parent"), format!("{name}\n"));
        self.writable(format!("{dev}/uevent"), format!("NAME={name}\n"));
        self.link(format!("{dev}/subsystem"), "../../../../class/infiniband");
        self.link(format!("{dev}/device"), format!("../../roce-xdp/{name}"));
        self.port(&dev, device);

        let parent = format!("{PARENTS}/{name}");
        self.dir(&parent);
        self.dir(format!("{parent}/net"));
        // Through the class link, wherever the netdev's own directory is.
        self.link(
            format!("{parent}/net/{name}"),
            format!("../../../../../class/net/{name}"),
        );
        self.dir(format!("{parent}/infiniband"));
        self.link(
            format!("{parent}/infiniband/{name}"),
            format!("../../../infiniband/{name}"),
        );
        self.dir(format!("{parent}/infiniband_verbs"));
        self.link(
            format!("{parent}/infiniband_verbs/{uverbs}"),
            format!("../../../infiniband_verbs/{uverbs}"),
        );

        let verbs = format!("/sys/devices/virtual/infiniband_verbs/{uverbs}");
        self.dir(&verbs);
        self.file(format!("{verbs}/ibdev"), format!("{name}\n"));
        self.file(format!("{verbs}/abi_version"), format!("{RXE_ABI}\n"));
        self.file(format!("{verbs}/dev"), format!("{UVERBS_MAJOR}:{minor}\n"));
        self.writable(
            format!("{verbs}/uevent"),
            format!(
                "MAJOR={UVERBS_MAJOR}\nMINOR={minor}\nDEVNAME=infiniband/{uverbs}\nDEVMODE=0666\n"
            ),
        );
        self.link(
            format!("{verbs}/subsystem"),
            "../../../../class/infiniband_verbs",
        );

        self.push(
            format!("/dev/infiniband/{uverbs}"),
            0o666,
            Kind::CharDevice {
                major: UVERBS_MAJOR,
                minor,
            },
        );
    }

    /// `ports/1`, with what `ibv_query_port` reports for it.
    fn port(&mut self, dev: &str, device: &Device) {
        let attr = device.query_port();
        let port = format!("{dev}/ports/1");
        self.dir(format!("{dev}/ports"));
        self.dir(&port);
        let (state, phys_state) = match attr.state {
            PortState::Active => ("4: ACTIVE", "5: LinkUp"),
            PortState::Down => ("1: DOWN", "3: Disabled"),
        };
        self.file(format!("{port}/state"), format!("{state}\n"));
        self.file(format!("{port}/phys_state"), format!("{phys_state}\n"));
        self.file(format!("{port}/link_layer"), "Ethernet\n".into());
        // rxe's port_cap_flags; width 1X and speed SDR, as rxe reports a link of unknown speed.
        self.file(format!("{port}/cap_mask"), "0x00010000\n".into());
        self.file(format!("{port}/rate"), "2.5 Gb/sec (1X SDR)\n".into());
        self.file(format!("{port}/lid"), "0x0\n".into());
        self.file(format!("{port}/sm_lid"), "0x0\n".into());
        self.file(format!("{port}/lid_mask_count"), "0\n".into());
        self.file(format!("{port}/sm_sl"), "0\n".into());

        self.dir(format!("{port}/gids"));
        for index in 0..attr.gid_tbl_len {
            let gid = device.gid(index).unwrap_or_default();
            self.file(
                format!("{port}/gids/{index}"),
                format!("{}\n", gid_text(&gid)),
            );
        }
        self.dir(format!("{port}/gid_attrs"));
        for (what, contents) in [("types", "RoCE v2"), ("ndevs", device.name.as_str())] {
            self.dir(format!("{port}/gid_attrs/{what}"));
            for index in (0..attr.gid_tbl_len).filter(|&at| device.gid(at).is_some()) {
                self.file(
                    format!("{port}/gid_attrs/{what}/{index}"),
                    format!("{contents}\n"),
                );
            }
        }
        self.dir(format!("{port}/pkeys"));
        self.file(format!("{port}/pkeys/0"), "0xffff\n".into());

        self.dir(format!("{port}/hw_counters"));
        for (name, contents) in hw_counter_files(&Counters::default()) {
            if name == "lifespan" {
                self.writable(format!("{port}/hw_counters/{name}"), contents);
            } else {
                self.file(format!("{port}/hw_counters/{name}"), contents);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn veth(name: &str) -> Device {
        Device {
            name: name.into(),
            ifindex: 7,
            mac: [0x52, 0x54, 0, 0x88, 0, 0x0b],
            netdev_mtu: 1500,
            up: true,
            gids: vec![
                crate::device::link_local_gid([0x52, 0x54, 0, 0x88, 0, 0x0b]),
                std::net::Ipv4Addr::new(10, 88, 0, 11)
                    .to_ipv6_mapped()
                    .octets(),
            ],
        }
    }

    fn contents<'a>(tree: &'a [Entry], path: &str) -> Option<&'a Kind> {
        tree.iter()
            .find(|entry| entry.path == path)
            .map(|entry| &entry.kind)
    }

    #[test]
    fn values_are_the_ones_rxe_prints_for_the_same_interface() {
        // What Linux 6.1 printed for rxe0 on eth0 of the rxe VM (MAC 52:54:00:88:00:0b,
        // 10.88.0.11): the same MAC and address give the same GUIDs and GIDs.
        let tree = tree(&[veth("eth0")]);
        let file = |path: &str| match contents(&tree, path) {
            Some(Kind::File(text)) => text.clone(),
            other => panic!("{path}: {other:?}"),
        };
        let dev = "/sys/devices/virtual/infiniband/eth0";
        assert_eq!(file(&format!("{dev}/node_guid")), "5054:00ff:fe88:000b\n");
        assert_eq!(file(&format!("{dev}/node_type")), "1: CA\n");
        assert_eq!(
            file(&format!("{dev}/ports/1/gids/0")),
            "fe80:0000:0000:0000:5054:00ff:fe88:000b\n"
        );
        assert_eq!(
            file(&format!("{dev}/ports/1/gids/1")),
            "0000:0000:0000:0000:0000:ffff:0a58:000b\n"
        );
        assert_eq!(
            file(&format!("{dev}/ports/1/gid_attrs/types/1")),
            "RoCE v2\n"
        );
        assert_eq!(file(&format!("{dev}/ports/1/gid_attrs/ndevs/0")), "eth0\n");
        assert_eq!(file(&format!("{dev}/ports/1/state")), "4: ACTIVE\n");
        assert_eq!(file(&format!("{dev}/ports/1/pkeys/0")), "0xffff\n");
        assert_eq!(
            file("/sys/devices/virtual/infiniband_verbs/uverbs0/dev"),
            "231:192\n"
        );
        assert_eq!(
            contents(&tree, "/dev/infiniband/uverbs0"),
            Some(&Kind::CharDevice {
                major: 231,
                minor: 192
            })
        );
    }

    #[test]
    fn every_entry_has_its_parent_before_it_and_lies_under_a_root() {
        let devices = [veth("a0"), veth("b0")];
        let tree = tree(&devices);
        let mut seen: Vec<&str> = ROOTS.to_vec();
        for entry in &tree {
            let parent = entry.path.rsplit_once('/').unwrap().0;
            assert!(seen.contains(&parent), "{} before its parent", entry.path);
            assert!(!seen.contains(&entry.path.as_str()), "{} twice", entry.path);
            if entry.kind == Kind::Dir {
                seen.push(&entry.path);
            }
        }
        // Each device its own uverbs number, in list order.
        assert_eq!(
            contents(&tree, "/sys/devices/virtual/infiniband_verbs/uverbs1/ibdev"),
            Some(&Kind::File("b0\n".into()))
        );
        // Links resolve inside the tree (or to the netdev's class entry).
        for entry in &tree {
            if let Kind::Link(target) = &entry.kind {
                let mut path: Vec<&str> = entry.path.split('/').collect();
                path.pop();
                for part in target.split('/') {
                    if part == ".." {
                        path.pop();
                    } else {
                        path.push(part);
                    }
                }
                let resolved = path.join("/");
                let inside = tree.iter().any(|other| other.path == resolved)
                    || ROOTS.contains(&resolved.as_str())
                    || resolved.starts_with("/sys/class/net/");
                assert!(inside, "{} -> {target} ({resolved})", entry.path);
            }
        }
    }

    #[test]
    fn empty_gid_slots_read_as_zero_and_have_no_attributes() {
        let mut device = veth("a0");
        device.gids.truncate(1);
        let tree = tree(&[device]);
        let port = "/sys/devices/virtual/infiniband/a0/ports/1";
        assert!(contents(&tree, &format!("{port}/gid_attrs/types/0")).is_some());
        assert!(contents(&tree, &format!("{port}/gid_attrs/types/1")).is_none());
        // rxe's 1024 slots, the empty ones zero.
        let zero = Kind::File("0000:0000:0000:0000:0000:0000:0000:0000\n".into());
        assert_eq!(contents(&tree, &format!("{port}/gids/1")), Some(&zero));
        assert_eq!(contents(&tree, &format!("{port}/gids/1023")), Some(&zero));
        assert!(contents(&tree, &format!("{port}/gids/1024")).is_none());
    }

    #[test]
    fn counters_are_rxes_in_decimal() {
        let mut counters = Counters::default();
        counters.sent_pkts = 12;
        let files = hw_counter_files(&counters);
        assert_eq!(files.len(), Counters::NAMES.len() + 1);
        assert!(files.contains(&("sent_pkts", "12\n".into())));
        assert!(files.contains(&("lifespan", "100\n".into())));
        assert_eq!(guid_text(0x5054_00ff_fe88_000b), "5054:00ff:fe88:000b");
    }
}

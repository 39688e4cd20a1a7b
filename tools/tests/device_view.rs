//! `roce exec`'s device view: under it, each of our devices is in sysfs and `/dev` as the
//! kernel shows an rxe device (`roce_verbs::sysfs`), for the program alone. The tree is
//! compared file by file with the rxe VM's own; what it says agrees with what the verbs
//! say (through rdma-core's pyverbs); counters read live; UCX finds its transports; and
//! nothing changes outside the program's mount namespace.
//!
//! Needs root (namespaces, mounts); pyverbs (python3-pyverbs), ucx-utils, gcc and
//! libibverbs-dev for the tests that run them; the rxe VM for the comparison. In CI a
//! missing prerequisite fails the test, elsewhere it is skipped with a message.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use roce_provider::netns::{needs_root, prerequisite, veth, Netns};
use roce_tests::rxe_vm::vm;

use common::{can_compile_c, compile_c, exec_in, text, VERBS_H};

/// Prints every entry under the device view's directories, one a line:
/// `KIND<TAB>MODE<TAB>PATH<TAB>DATA`, KIND as find's `%y` (d, f, l, c), DATA a file's
/// contents (newlines as `\n`; `!` if reading fails), a link's target or a device's
/// `major:minor`. Only bash builtins per entry, so it is quick even in the emulated VM
/// (which has no /dev/fd, so no process substitution); GID slots from 10 on are left out
/// (rxe has 1024, all but the first few empty: they would take a minute to read there).
const DUMP: &str = r#"
err=$(mktemp)
for root in /sys/class/infiniband /sys/class/infiniband_verbs /sys/devices/virtual/infiniband \
            /sys/devices/virtual/infiniband_verbs /dev/infiniband; do
  find "$root" -regextype posix-extended ! -regex '.*/(gids|types|ndevs)/[0-9]{2,}' \
       -printf '%y\t%m\t%p\t%l\n' | while IFS=$'\t' read -r kind mode path target; do
    case $kind in
      f) data=; { IFS= read -r -d '' data < "$path"; } 2>"$err"
         if [ -s "$err" ]; then data='!'; else data=${data//$'\n'/\\n}; fi ;;
      l) data=$target ;;
      c) data=$(stat -c '%Hr:%Lr' "$path") ;;
      *) data= ;;
    esac
    printf '%s\t%s\t%s\t%s\n' "$kind" "$mode" "$path" "$data"
  done
done
rm -f "$err"
"#;

/// One entry of a dump.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Node {
    kind: String,
    mode: String,
    data: String,
}

/// A dump by path, with each name in `names` replaced by `DEV`, so that rxe's `rxe0` on
/// `eth0` and our `dvw0` (device and interface alike) read the same.
fn parse(dump: &str, names: &[&str]) -> BTreeMap<String, Node> {
    let same = |text: &str| {
        names
            .iter()
            .fold(text.to_string(), |text, name| text.replace(name, "DEV"))
    };
    dump.lines()
        .map(|line| {
            let mut parts = line.splitn(4, '\t');
            let (Some(kind), Some(mode), Some(path), Some(data)) =
                (parts.next(), parts.next(), parts.next(), parts.next())
            else {
                panic!("not a line of the dump: {line:?}");
            };
            (
                same(path),
                Node {
                    kind: kind.into(),
                    mode: mode.into(),
                    data: same(data),
                },
            )
        })
        .collect()
}

/// Two namespaces joined by a veth pair: `dvw0` 10.86.0.1 in the first, `dvw1` 10.86.0.2 in
/// the second (MTU 1500).
fn two_namespaces() -> (Netns, Netns) {
    let a = Netns::create("roce-dv-a").unwrap();
    let b = Netns::create("roce-dv-b").unwrap();
    veth(
        (&a, "dvw0", "10.86.0.1/24"),
        (&b, "dvw1", "10.86.0.2/24"),
        1500,
    )
    .unwrap();
    (a, b)
}

/// `roce exec -- bash -c SCRIPT` in `ns`: its stdout (it must succeed).
fn bash_in_view(ns: &Netns, script: &str) -> String {
    let output = exec_in(ns, &["bash", "-c", script]).output().unwrap();
    assert!(output.status.success(), "{script}:\n{}", text(&output));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// What the host shows: its mounts (but the network namespaces' handles, which others on
/// the machine come and go with) and the directories the view covers.
fn host_state() -> String {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let mut state: String = mounts
        .lines()
        .filter(|line| !line.contains(" /run/netns/"))
        .map(|line| format!("{line}\n"))
        .collect();
    for dir in ["/sys/class", "/sys/devices/virtual", "/dev"] {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        state.push_str(&format!("{dir}: {}\n", names.join(" ")));
    }
    state
}

/// The link-local GID and the node GUID sysfs shows for a MAC, worked out by hand here (the
/// modified EUI-64: the universal/local bit flipped, ff:fe in the middle).
fn expected_guid_and_gid0(mac: [u8; 6]) -> (String, String) {
    let m = mac;
    let guid = format!(
        "{:02x}{:02x}:{:02x}ff:fe{:02x}:{:02x}{:02x}",
        m[0] ^ 2,
        m[1],
        m[2],
        m[3],
        m[4],
        m[5]
    );
    (guid.clone(), format!("fe80:0000:0000:0000:{guid}"))
}

#[test]
fn each_device_is_in_sysfs_and_dev_for_the_program_alone() {
    let test = "each_device_is_in_sysfs_and_dev_for_the_program_alone";
    if !needs_root(test) {
        return;
    }
    // Two devices in one namespace (both ends of a veth pair), so two uverbs numbers.
    let ns = Netns::create("roce-dv").unwrap();
    ns.ip(&[
        "link", "add", "dvw0", "type", "veth", "peer", "name", "dvw1",
    ])
    .unwrap();
    for (interface, address) in [("dvw0", "10.86.1.1/24"), ("dvw1", "10.86.1.2/24")] {
        ns.ip(&["addr", "add", address, "dev", interface]).unwrap();
        ns.ip(&["link", "set", interface, "up"]).unwrap();
    }
    let before = host_state();
    let tree = parse(&bash_in_view(&ns, DUMP), &[]);
    let listing = bash_in_view(
        &ns,
        "ls /sys/class/infiniband/dvw1/device/net/; ls /sys/class/net; echo x > /dev/null && echo null; \
         cat /sys/class/infiniband/dvw0/ports/1/gid_attrs/types/1",
    );
    assert_eq!(
        host_state(),
        before,
        "the host's mounts or directories changed"
    );

    let file = |path: &str| match tree.get(path) {
        Some(node) if node.kind == "f" => node.data.clone(),
        other => panic!("{path}: {other:?}"),
    };
    let link = |path: &str| match tree.get(path) {
        Some(node) if node.kind == "l" => node.data.clone(),
        other => panic!("{path}: {other:?}"),
    };
    for (index, (name, address)) in [("dvw0", "0a56:0101"), ("dvw1", "0a56:0102")]
        .into_iter()
        .enumerate()
    {
        let (guid, gid0) = expected_guid_and_gid0(ns.mac(name).unwrap());
        let dev = format!("/sys/devices/virtual/infiniband/{name}");
        assert_eq!(
            link(&format!("/sys/class/infiniband/{name}")),
            format!("../../devices/virtual/infiniband/{name}")
        );
        assert_eq!(file(&format!("{dev}/node_guid")), format!("{guid}\\n"));
        assert_eq!(file(&format!("{dev}/node_type")), "1: CA\\n");
        assert_eq!(file(&format!("{dev}/parent")), format!("{name}\\n"));
        let port = format!("{dev}/ports/1");
        assert_eq!(file(&format!("{port}/state")), "4: ACTIVE\\n");
        assert_eq!(file(&format!("{port}/gids/0")), format!("{gid0}\\n"));
        assert_eq!(
            file(&format!("{port}/gids/1")),
            format!("0000:0000:0000:0000:0000:ffff:{address}\\n")
        );
        for gid in ["0", "1"] {
            assert_eq!(file(&format!("{port}/gid_attrs/types/{gid}")), "RoCE v2\\n");
            assert_eq!(
                file(&format!("{port}/gid_attrs/ndevs/{gid}")),
                format!("{name}\\n")
            );
        }
        let uverbs = format!("/sys/devices/virtual/infiniband_verbs/uverbs{index}");
        assert_eq!(file(&format!("{uverbs}/ibdev")), format!("{name}\\n"));
        assert_eq!(
            file(&format!("{uverbs}/dev")),
            format!("231:{}\\n", 192 + index)
        );
        let node = &tree[&format!("/dev/infiniband/uverbs{index}")];
        assert_eq!(
            (node.kind.as_str(), node.mode.as_str(), node.data.as_str()),
            ("c", "666", format!("231:{}", 192 + index).as_str())
        );
    }
    assert_eq!(
        listing, "dvw1\ndvw0\ndvw1\nlo\nnull\nRoCE v2\n",
        "device/net, the namespace's own netdevs, /dev and the GID type through the view"
    );
}

#[test]
fn sysfs_says_what_the_verbs_say() {
    let test = "sysfs_says_what_the_verbs_say";
    let pyverbs = Path::new("/usr/lib/python3/dist-packages/pyverbs").exists();
    if !needs_root(test) || !prerequisite(test, "python3-pyverbs", pyverbs) {
        return;
    }
    let (a, _b) = two_namespaces();
    // rdma-core's own Python bindings over our libibverbs, against the files.
    let script = r#"
import sys
import pyverbs.device as d
import pyverbs.enums as e
name = sys.argv[1]
root = f'/sys/class/infiniband/{name}/'
def read(path):
    with open(root + path) as f:
        return f.read()
def guid(value):
    raw = value.to_bytes(8, 'little').hex()
    return ':'.join(raw[i:i + 4] for i in range(0, 16, 4)) + '\n'
ctx = d.Context(name=name)
dev = ctx.query_device()
port = ctx.query_port(1)
checks = [
    (read('node_guid'), guid(dev.node_guid)),
    (read('sys_image_guid'), guid(dev.sys_image_guid)),
    (read('fw_ver'), dev.fw_version + '\n'),
    (read('ports/1/state').split(':')[0], str(port.state)),
    (read('ports/1/phys_state').split(':')[0], str(port.phys_state)),
    (read('ports/1/link_layer'), {e.IBV_LINK_LAYER_ETHERNET: 'Ethernet\n'}[port.link_layer]),
    (int(read('ports/1/cap_mask'), 16), port.port_cap_flags),
    (int(read('ports/1/lid'), 16), port.lid),
    (int(read('ports/1/sm_lid'), 16), port.sm_lid),
    (int(read('ports/1/lid_mask_count')), port.lmc),
    (int(read('ports/1/sm_sl')), port.sm_sl),
    # active_width 1 (1X), active_speed 1 (SDR, 2.5 Gb/s per lane).
    ((port.active_width, port.active_speed), (1, 1)),
    (read('ports/1/rate'), '2.5 Gb/sec (1X SDR)\n'),
    (int(read('ports/1/pkeys/0'), 16), ctx.query_pkey(1, 0)),
    (len(__import__('os').listdir(root + 'ports/1/gids')), port.gid_tbl_len),
]
empty = ':'.join(['0000'] * 8)
for index in range(port.gid_tbl_len):
    gid = ctx.query_gid(1, index).gid
    checks.append((read(f'ports/1/gids/{index}'), gid + '\n'))
    # An empty slot of rxe's 1024 has no attributes to read.
    if gid != empty:
        kind = {e.IBV_GID_TYPE_SYSFS_ROCE_V2: 'RoCE v2\n'}[ctx.query_gid_type(1, index)]
        checks.append((read(f'ports/1/gid_attrs/types/{index}'), kind))
bad = [(said, want) for said, want in checks if said != want]
print('agree' if not bad else f'disagree: {bad}', len(checks))
"#;
    let output = exec_in(&a, &["/usr/bin/python3", "-c", script, "dvw0"])
        .output()
        .unwrap();
    let said = text(&output);
    assert!(
        // 15 files, each of the 1024 GID slots, the types of the two GIDs (link-local, IPv4).
        output.status.success() && said.starts_with("agree 1041"),
        "{said}"
    );
}

#[test]
fn counters_read_live_and_count_for_the_device() {
    let test = "counters_read_live_and_count_for_the_device";
    if !needs_root(test) || !can_compile_c(test, "gcc and libibverbs-dev", VERBS_H) {
        return;
    }
    let program = compile_c("counters_live", &["-libverbs"]);
    let (a, _b) = two_namespaces();
    // Two programs one after the other on the device, then the files once both are gone.
    let script = format!(
        "export ROCE_STATS=1; {0} dvw0 10 && {0} dvw0 5 && \
         cat /sys/class/infiniband/dvw0/ports/1/hw_counters/{{sent_pkts,rdma_sends,lifespan}}",
        program.path()
    );
    let output = exec_in(&a, &["bash", "-c", &script]).output().unwrap();
    let said = text(&output);
    assert!(output.status.success(), "{said}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    // Each read its own sends while it had the device open, on top of the earlier ones.
    assert!(
        stdout.starts_with("sent_pkts 0 -> 10\nsent_pkts 10 -> 15\n"),
        "{said}"
    );
    // ROCE_STATS printed each program's own counters at close; the files add them up.
    let stderr = String::from_utf8_lossy(&output.stderr);
    let reported = |name: &str| -> u64 {
        stderr
            .lines()
            .filter_map(|line| line.strip_prefix(name)?.trim().parse::<u64>().ok())
            .sum()
    };
    let files: Vec<&str> = stdout.lines().skip(2).collect();
    assert_eq!(
        files,
        [
            reported("sent_pkts ").to_string(),
            reported("rdma_sends ").to_string(),
            "100".to_string()
        ],
        "{said}"
    );
    assert_eq!(reported("sent_pkts "), 15, "{said}");
}

#[test]
fn ucx_finds_rc_verbs_and_ud_verbs_on_each_device() {
    let test = "ucx_finds_rc_verbs_and_ud_verbs_on_each_device";
    if !needs_root(test) || !prerequisite(test, "ucx-utils", common::installed("ucx_info")) {
        return;
    }
    let (a, _b) = two_namespaces();
    let output = exec_in(&a, &["ucx_info", "-d"]).output().unwrap();
    let said = text(&output);
    assert!(output.status.success(), "{said}");
    // "#      Transport: rc_verbs" then "#         Device: dvw0:1".
    let transports: Vec<(String, String)> = said
        .lines()
        .zip(said.lines().skip(1))
        .filter_map(|(first, second)| {
            let transport = first.split("Transport: ").nth(1)?;
            let device = second.split("Device: ").nth(1)?;
            Some((transport.trim().to_string(), device.trim().to_string()))
        })
        .collect();
    for wanted in ["rc_verbs", "ud_verbs"] {
        assert!(
            transports.contains(&(wanted.to_string(), "dvw0:1".to_string())),
            "{wanted} on dvw0:1 in {transports:?}"
        );
    }
}

/// Why an entry rxe has is not in ours (`None`: it must be).
fn left_out(path: &str, rxe: &Node) -> Option<&'static str> {
    if path.contains("/power") {
        Some("the kernel device model's runtime power management")
    } else if path.contains("/ports/1/cm_") {
        Some("the kernel CM's MAD counters (ib_cm), which no program over us uses")
    } else if ["/dev/infiniband/umad0", "/dev/infiniband/issm0"].contains(&path) {
        Some("MAD devices: our rdma_cm runs in the program")
    } else if path == "/dev/infiniband/rdma_cm" {
        Some("rdma_ucm's node, whose minor the kernel picks at load time; our librdmacm runs in the program")
    } else if path.contains("/gid_attrs/") && rxe.data == "!" {
        Some("the attributes of an empty GID slot, which rxe cannot read either (EINVAL)")
    } else {
        None
    }
}

/// Why an entry of ours is not in rxe's (`None`: it must not be there).
fn added(path: &str) -> Option<&'static str> {
    if path.ends_with("/infiniband/DEV/device") || path.starts_with("/sys/devices/virtual/roce-xdp")
    {
        return Some("the link to the netdev, device/net/IFACE, where rdma-core's tests look");
    }
    let counter = path.split_once("/hw_counters/").map(|(_, name)| name);
    counter
        .is_some_and(|name| roce_transport::counters::Counters::NAMES.contains(&name))
        .then_some("congestion control's counters, under mlx5's names: rxe has none")
}

/// Whether `data` is a line of `groups` groups of four hex digits (a GUID or a GID).
fn hex_groups(data: &str, groups: usize) -> bool {
    data.strip_suffix("\\n").is_some_and(|line| {
        let parts: Vec<&str> = line.split(':').collect();
        parts.len() == groups
            && parts
                .iter()
                .all(|part| part.len() == 4 && part.bytes().all(|b| b.is_ascii_hexdigit()))
    })
}

/// Whether two files of the same path say the same, by value or, where the values must
/// differ (GUIDs, GIDs, counters, descriptions), by shape.
fn same_file(path: &str, rxe: &str, ours: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or_default();
    let decimal = |data: &str| {
        data.strip_suffix("\\n")
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    if name == "node_guid" || name == "sys_image_guid" {
        hex_groups(rxe, 4) && hex_groups(ours, 4)
    } else if path.contains("/gids/") {
        hex_groups(rxe, 8) && hex_groups(ours, 8)
    } else if path.contains("/hw_counters/") {
        decimal(rxe) && decimal(ours)
    } else if name == "node_desc" {
        let line = |data: &str| data.ends_with("\\n") && data.matches("\\n").count() == 1;
        line(rxe) && line(ours) && ours.len() > 2
    } else {
        rxe == ours
    }
}

#[test]
fn the_tree_is_rxes_file_by_file() {
    let test = "the_tree_is_rxes_file_by_file";
    if !needs_root(test) {
        return;
    }
    let (a, _b) = two_namespaces();
    let ours = parse(&bash_in_view(&a, DUMP), &["dvw0"]);
    let rxe = {
        let Some(vm) = vm(test, "1500") else { return };
        let output = vm.exec(120, DUMP);
        assert!(output.status.success(), "{}", text(&output));
        parse(&String::from_utf8_lossy(&output.stdout), &["rxe0", "eth0"])
    };
    assert!(
        rxe.contains_key("/sys/devices/virtual/infiniband/DEV/ports/1/gids/0"),
        "the VM's dump has no rxe0: {rxe:?}"
    );
    let mut problems = Vec::new();
    for (path, theirs) in &rxe {
        match ours.get(path) {
            None if left_out(path, theirs).is_some() => {}
            None => problems.push(format!("missing {path} ({theirs:?})")),
            Some(node) if node.kind != theirs.kind || node.mode != theirs.mode => {
                problems.push(format!("{path}: ours {node:?}, rxe {theirs:?}"))
            }
            Some(node) if node.kind == "f" && !same_file(path, &theirs.data, &node.data) => {
                problems.push(format!(
                    "{path}: ours {:?}, rxe {:?}",
                    node.data, theirs.data
                ))
            }
            Some(node) if node.kind != "f" && node.data != theirs.data => {
                problems.push(format!("{path}: ours {node:?}, rxe {theirs:?}"))
            }
            Some(_) => {}
        }
    }
    for path in ours.keys() {
        if !rxe.contains_key(path) && added(path).is_none() {
            problems.push(format!("extra {path}"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

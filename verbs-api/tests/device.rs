//! `devices()` and `Device::by_name` inside a namespace the test makes, against what ip(8)
//! reports there: ifindex, MAC, MTU, state, and the GID table from the IPv4 addresses and
//! the IPv6 ones in the kernel's order. Needs root (CI is root).

use std::net::{Ipv4Addr, Ipv6Addr};
use std::thread;
use std::time::{Duration, Instant};

use roce_provider::netns::{needs_root, veth, Netns};
use roce_verbs::device::link_local_gid;
use roce_verbs::{devices, Device, Gid};

/// What ip(8) says about `interface` in `ns`, as a `Device`.
fn device_per_ip(ns: &Netns, interface: &str) -> Device {
    let stdout = |args: &[&str]| {
        let output = ns.ip(args).unwrap();
        String::from_utf8(output.stdout).unwrap()
    };
    let link = stdout(&["-o", "link", "show", "dev", interface]);
    let words: Vec<&str> = link.split_whitespace().collect();
    let after = |key: &str| words[words.iter().position(|word| *word == key).unwrap() + 1];
    let ifindex = link.split(':').next().unwrap().trim().parse().unwrap();
    let mac = roce_verbs::device::parse_mac(after("link/ether")).unwrap();
    let netdev_mtu = after("mtu").parse().unwrap();
    let up = matches!(after("state"), "UP" | "UNKNOWN");
    let addresses = |family: &str, key: &str| -> Vec<String> {
        stdout(&["-o", family, "addr", "show", "dev", interface])
            .lines()
            .map(|line| {
                let mut words = line.split_whitespace().skip_while(|word| *word != key);
                words.nth(1).unwrap().split('/').next().unwrap().to_owned()
            })
            .collect()
    };
    let mut gids: Vec<Gid> = vec![link_local_gid(mac)];
    for ip in addresses("-4", "inet") {
        gids.push(ip.parse::<Ipv4Addr>().unwrap().to_ipv6_mapped().octets());
    }
    let ipv6 = addresses("-6", "inet6");
    assert!(ipv6.len() >= 5, "the IPv6 addresses: {ipv6:?}");
    for ip in ipv6 {
        let gid = ip.parse::<Ipv6Addr>().unwrap().octets();
        if !gids.contains(&gid) {
            gids.push(gid);
        }
    }
    Device {
        name: interface.to_owned(),
        ifindex,
        mac,
        netdev_mtu,
        up,
        gids,
    }
}

/// [`device_per_ip`] once `settled` says it is (bounded): the kernel applies a carrier change
/// to the state ip(8) shows asynchronously (linkwatch), up to a second later.
fn device_per_ip_once(ns: &Netns, interface: &str, settled: fn(&Device) -> bool) -> Device {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let device = device_per_ip(ns, interface);
        if settled(&device) || Instant::now() > deadline {
            return device;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// `devices()` and `Device::by_name(interface)` from a thread inside `ns`.
fn devices_in(ns: &Netns, interface: &str) -> (Vec<Device>, Device) {
    let name = ns.name.clone();
    let interface = interface.to_owned();
    thread::spawn(move || {
        roce_provider::netns::enter(&name).unwrap();
        let missing = Device::by_name("no-such-if").unwrap_err();
        assert!(missing.to_string().contains("does not exist"), "{missing}");
        (devices().unwrap(), Device::by_name(&interface).unwrap())
    })
    .join()
    .unwrap()
}

#[test]
fn devices_match_what_ip_reports_in_the_namespace() {
    if !needs_root("devices_match_what_ip_reports_in_the_namespace") {
        return;
    }
    let a = Netns::create("roce-dev-a").unwrap();
    let b = Netns::create("roce-dev-b").unwrap();
    veth((&a, "dv", "10.83.0.1/24"), (&b, "dw", "10.83.0.2/24"), 1400).unwrap();
    let setup: &[&[&str]] = &[
        &["link", "set", "dv", "address", "02:83:00:00:00:0a"],
        &["addr", "add", "10.83.1.1/24", "dev", "dv", "label", "dv:1"],
        // Two scopes, added out of order: the kernel's order is not the order of adding.
        &["addr", "add", "fd83::1/64", "dev", "dv", "nodad"],
        &["addr", "add", "fe80::83/64", "dev", "dv", "nodad"],
        &["addr", "add", "fd83::2/64", "dev", "dv", "nodad"],
        &["addr", "add", "2001:db8:83::3/64", "dev", "dv", "nodad"],
    ];
    for args in setup {
        a.ip(args).unwrap();
    }
    let expected = device_per_ip_once(&a, "dv", |device| device.up);
    assert!(expected.up, "dv down with its peer up");
    let (list, device) = devices_in(&a, "dv");
    assert_eq!(device, expected);
    assert_eq!(list, vec![expected], "the one non-loopback interface");

    // The peer down: dv stays administratively up but its state is LOWERLAYERDOWN.
    b.ip(&["link", "set", "dw", "down"]).unwrap();
    let expected = device_per_ip_once(&a, "dv", |device| !device.up);
    assert!(!expected.up, "dv still up with its peer down");
    let (_, device) = devices_in(&a, "dv");
    assert_eq!(device, expected);
}

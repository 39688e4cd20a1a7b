//! No epoll holds a socket that nobody sleeps on. An epoll holding an AF_XDP socket runs a
//! callback for every frame the kernel hands that socket, whether or not anybody waits: a
//! lone process's socket once sat in two nested epolls for good, which cost the 64 B WRITE
//! rate a third. Its own test binary, so no other test's engine thread (asleep on its
//! sockets, as it may be) is in the process. Needs root (CI is root).

use std::thread;
use std::time::{Duration, Instant};

use roce_provider::netns::{self, needs_root, veth, Netns};
use roce_verbs::{
    devices, BackendChoice, BackendKind, Context, OpenOptions, Progress, QpCaps, QpInitAttr, QpType,
};

/// The sockets some epoll of this process holds (`/proc/self/fdinfo`), as "epoll fd ->
/// socket fd".
fn sockets_held_by_epolls() -> Vec<String> {
    let mut held = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        let fd = entry.file_name().to_string_lossy().into_owned();
        let Ok(info) = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")) else {
            continue;
        };
        // An epoll's targets: "tfd:        7 events:       19 data: ...".
        for target in info.lines().filter_map(|line| line.strip_prefix("tfd:")) {
            let target = target.split_whitespace().next().unwrap_or_default();
            let what = std::fs::read_link(format!("/proc/self/fd/{target}")).unwrap_or_default();
            if what.to_string_lossy().starts_with("socket:") {
                held.push(format!("{fd} -> {target}"));
            }
        }
    }
    held
}

#[test]
fn no_epoll_holds_a_socket_while_the_program_drives_the_engine() {
    if !needs_root("no_epoll_holds_a_socket_while_the_program_drives_the_engine") {
        return;
    }
    let a = Netns::create("roce-ep-a").unwrap();
    let b = Netns::create("roce-ep-b").unwrap();
    veth((&a, "ea", "10.86.0.1/24"), (&b, "eb", "10.86.0.2/24"), 9000).unwrap();
    let name = a.name.clone();
    let held = thread::spawn(move || {
        netns::enter(&name).unwrap();
        let list = devices().unwrap();
        let options = OpenOptions {
            backend: BackendChoice::Auto,
            progress: Progress::Caller,
            ..OpenOptions::default()
        };
        let ctx = Context::open(&list[0], options).unwrap();
        let cq = ctx.create_cq(16, None).unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let attr = QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: &cq,
            recv_cq: &cq,
            caps: QpCaps::default(),
            sq_sig_all: false,
        };
        // A QP attaches the process to the device's switch, which lends it the device.
        let _qp = pd.create_qp(&attr).unwrap();
        // The device's sockets are ours: opened by us, or lent by the device's switch (a
        // round notices, soon after the switch started).
        let deadline = Instant::now() + Duration::from_secs(10);
        let ours = || match ctx.backend_kind() {
            BackendKind::AfXdp(_) => true,
            BackendKind::Switch(link) => link.is_direct(),
            _ => false,
        };
        while !ours() && Instant::now() < deadline {
            cq.poll(16).unwrap();
            thread::sleep(Duration::from_millis(10));
        }
        assert!(ours(), "{:?}", ctx.backend_kind());
        // Rounds, as a polling program runs them, and a blocking wait for frames.
        for _ in 0..100 {
            cq.poll(16).unwrap();
        }
        ctx.progress().unwrap();
        let waited = ctx.get_async_event(Some(Duration::from_millis(20)));
        assert!(waited.is_err(), "no event comes: {waited:?}");
        sockets_held_by_epolls()
    })
    .join()
    .unwrap();
    assert_eq!(held, Vec::<String>::new());
}

//! Our XDP program on a veth in a namespace: it loads, attaches in native and generic mode,
//! lets ARP and ping through, and is gone once its owner drops it. Needs root (CI is root).

use std::sync::mpsc;
use std::thread;

use roce_provider::xdp::{XdpMode, XdpProgram};
use roce_tests::netns::{is_root, veth, Netns};

fn attached(ns: &Netns, interface: &str) -> bool {
    let output = ns.ip(&["link", "show", interface]);
    String::from_utf8_lossy(&output.stdout).contains("prog/xdp")
}

#[test]
fn xdp_program_passes_other_traffic_and_detaches() {
    if !is_root() {
        eprintln!("SKIPPED xdp_program_passes_other_traffic_and_detaches: needs root");
        return;
    }
    let a = Netns::create("roce-xdp-a");
    let b = Netns::create("roce-xdp-b");
    veth(&a, "va", "10.77.0.1/24", &b, "vb", "10.77.0.2/24", 9000);
    for mode in [XdpMode::Native, XdpMode::Generic] {
        let (attached_tx, attached_rx) = mpsc::channel();
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let ifindex = a.ifindex("va");
        let name = a.name.clone();
        let owner = thread::spawn(move || {
            Netns { name }.enter_and_forget();
            let mut program = XdpProgram::load(1, true).expect("load");
            program.attach(ifindex, mode).expect("attach");
            attached_tx.send(()).unwrap();
            let _ = release_rx.recv();
            drop(program);
        });
        attached_rx.recv().expect("the program attached");
        assert!(attached(&a, "va"), "{mode:?}: not attached");
        let ping = b.run(&["ping", "-c", "2", "-W", "2", "10.77.0.1"]);
        assert!(
            ping.status.success(),
            "{mode:?}: ping through the program failed: {}",
            String::from_utf8_lossy(&ping.stdout)
        );
        release_tx.send(()).unwrap();
        owner.join().unwrap();
        assert!(!attached(&a, "va"), "{mode:?}: still attached after drop");
    }
}

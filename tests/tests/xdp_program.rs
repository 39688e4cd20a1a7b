//! Our XDP program on a veth in a namespace: it loads, attaches in native and generic mode,
//! lets ARP and other UDP through, and is gone once its owner drops it. Needs root (CI is root).

use std::sync::mpsc;
use std::thread;

use roce_provider::netns::{self, needs_root, veth, Netns};
use roce_provider::xdp::{XdpMode, XdpProgram};
use roce_tests::netcheck::kernel_echoes_udp;

#[test]
fn xdp_program_passes_other_traffic_and_detaches() {
    if !needs_root("xdp_program_passes_other_traffic_and_detaches") {
        return;
    }
    let a = Netns::create("roce-xdp-a").unwrap();
    let b = Netns::create("roce-xdp-b").unwrap();
    veth((&a, "va", "10.77.0.1/24"), (&b, "vb", "10.77.0.2/24"), 9000).unwrap();
    for mode in [XdpMode::Native, XdpMode::Generic] {
        let (attached_tx, attached_rx) = mpsc::channel();
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let ifindex = a.ifindex("va").unwrap();
        let name = a.name.clone();
        let owner = thread::spawn(move || {
            netns::enter(&name).unwrap();
            let mut program = XdpProgram::load(1, true).expect("load");
            program.attach(ifindex, mode).expect("attach");
            attached_tx.send(()).unwrap();
            let _ = release_rx.recv();
            drop(program);
        });
        attached_rx.recv().expect("the program attached");
        assert!(a.has_xdp("va").unwrap(), "{mode:?}: not attached");
        if let Err(error) = kernel_echoes_udp(&a, "10.77.0.1", &b) {
            panic!("{mode:?}: UDP through the program failed: {error}");
        }
        release_tx.send(()).unwrap();
        owner.join().unwrap();
        assert!(
            !a.has_xdp("va").unwrap(),
            "{mode:?}: still attached after drop"
        );
    }
}

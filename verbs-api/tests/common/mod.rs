//! What the verbs API tests over the in-memory wire share.

use std::collections::HashMap;
use std::net::Ipv4Addr;

use roce_provider::memory::MemoryBackend;
use roce_verbs::{Addressing, BackendChoice, Context, Device, OpenOptions, Progress};

/// A context of station `me` (10.0.0.`me`) on `wire`, which reaches station `peer`, with an
/// engine thread (events progress) and randomness seeded by `me`.
pub fn context(wire: MemoryBackend, me: u8, peer: u8) -> Context {
    let mac = |n| [2, 0, 0, 0, 0, n];
    let ip = |n| Ipv4Addr::new(10, 0, 0, n);
    let addressing = Addressing {
        mac: mac(me),
        ip: ip(me),
        neighbours: HashMap::from([(ip(peer), mac(peer))]),
    };
    let device = Device::in_memory(mac(me), ip(me));
    let options = OpenOptions {
        backend: BackendChoice::Custom(Box::new(wire), addressing),
        progress: Progress::Events,
        seed: Some([me; 32]),
        ..OpenOptions::default()
    };
    Context::open(&device, options).expect("open")
}

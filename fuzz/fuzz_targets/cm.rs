//! Two communication managers under a fuzzer-chosen script: what each application calls and
//! when, which MADs arrive, are lost or come back with a byte changed, and how much time
//! passes. Nothing may panic, the tables stay within their bounds, and each connection's
//! events follow the rdma_cm life cycle: nothing after Rejected, Unreachable, SidrResolved,
//! SidrRejected or TimewaitExit, and TimewaitExit only after Disconnected.
#![no_main]

use std::collections::HashMap;
use std::time::{Duration, Instant};

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use roce_transport::cm::{
    AcceptParams, Cm, CmConfig, CmEvent, ConnId, ConnectParams, Gid, SidrReply,
};
use roce_transport::qp_state::PathMtu;
use roce_wire::cm::req::ServiceType;
use roce_wire::cm::sidr_rep::SidrStatus;
use roce_wire::cm::{PortSpace, ServiceId};
use roce_wire::mad;

const MAX_CONNECTIONS: usize = 16;
const KEPT: usize = 16;

#[derive(Arbitrary, Debug)]
enum Action {
    Listen {
        side: bool,
        udp: bool,
        backlog: u8,
    },
    StopListening {
        side: bool,
        udp: bool,
    },
    Connect {
        side: bool,
        private_len: u8,
    },
    Resolve {
        side: bool,
    },
    /// Answers (accept, reject, establish, reply, disconnect or destroy) the `pick`-th
    /// connection the side knows.
    Answer {
        side: bool,
        pick: u8,
        how: u8,
    },
    /// The next MAD one side sends: delivered or lost.
    Step {
        side: bool,
        deliver: bool,
    },
    /// A MAD seen before, with one byte changed, to either side.
    Replay {
        to: bool,
        pick: u8,
        offset: u8,
        value: u8,
    },
    Wait {
        millis: u32,
    },
}

fn gid(side: usize) -> Gid {
    let mut gid = [0; 16];
    gid[10] = 0xff;
    gid[11] = 0xff;
    gid[12..].copy_from_slice(&[10, 0, 0, side as u8 + 1]);
    gid
}

fn service(udp: bool) -> ServiceId {
    ServiceId::rdma_ip(if udp { PortSpace::Udp } else { PortSpace::Tcp }, 7174)
}

#[derive(Default)]
struct Lifecycle {
    finished: bool,
    disconnected: bool,
}

struct World {
    cms: [Cm; 2],
    now: Instant,
    queues: [Vec<[u8; mad::MAD_LEN]>; 2],
    kept: Vec<[u8; mad::MAD_LEN]>,
    known: [Vec<ConnId>; 2],
    lives: [HashMap<ConnId, Lifecycle>; 2],
}

impl World {
    fn pump(&mut self) {
        for side in 0..2 {
            while let Some(transmit) = self.cms[side].poll_transmit() {
                assert_eq!(transmit.local_gid, gid(side));
                self.queues[side].push(transmit.mad);
                if self.kept.len() < KEPT {
                    self.kept.push(transmit.mad);
                }
            }
            while let Some(event) = self.cms[side].poll_event() {
                self.check(side, event);
            }
            assert!(self.cms[side].connection_count() <= MAX_CONNECTIONS);
        }
    }

    fn check(&mut self, side: usize, event: CmEvent) {
        let (conn, finishes, disconnects, needs_disconnect) = match event {
            CmEvent::ConnectRequest { conn, .. } | CmEvent::SidrRequest { conn, .. } => {
                self.known[side].push(conn);
                (conn, false, false, false)
            }
            CmEvent::ConnectResponse { conn, .. } | CmEvent::Established { conn } => {
                (conn, false, false, false)
            }
            CmEvent::Disconnected { conn } => (conn, false, true, false),
            CmEvent::TimewaitExit { conn } => (conn, true, false, true),
            CmEvent::Rejected { conn, .. }
            | CmEvent::Unreachable { conn }
            | CmEvent::SidrResolved { conn, .. }
            | CmEvent::SidrRejected { conn, .. } => (conn, true, false, false),
            _ => return,
        };
        let life = self.lives[side].entry(conn).or_default();
        assert!(!life.finished, "{event:?} after the end of {conn:?}");
        assert!(
            !needs_disconnect || life.disconnected,
            "{event:?} without Disconnected"
        );
        assert!(
            !(disconnects && life.disconnected),
            "two Disconnected for {conn:?}"
        );
        life.finished |= finishes;
        life.disconnected |= disconnects;
    }

    fn answer(&mut self, side: usize, pick: u8, how: u8) {
        if self.known[side].is_empty() {
            return;
        }
        let conn = self.known[side][usize::from(pick) % self.known[side].len()];
        let now = self.now;
        let cm = &mut self.cms[side];
        // Refusals (wrong state, unknown connection) are part of the test: they must not panic.
        let _ = match how % 7 {
            0 => cm
                .accept(
                    now,
                    conn,
                    &AcceptParams {
                        qpn: 0x20 + side as u32,
                        sgid_index: 1,
                        responder_resources: how,
                        initiator_depth: how / 2,
                        rnr_retry_count: how,
                        srq: false,
                        flow_control: true,
                    },
                    &[how; 8],
                )
                .map(drop),
            1 => cm.reject(now, conn, &[how; 4]),
            2 => cm.establish(conn),
            3 => cm.disconnect(now, conn, &[]),
            4 => {
                let reply = SidrReply {
                    status: SidrStatus(how & 3),
                    qpn: 0x42,
                    qkey: 0x0123_4567,
                };
                cm.sidr_reply(now, conn, &reply, &[])
            }
            5 => {
                cm.notify_comm_established(conn);
                Ok(())
            }
            _ => {
                cm.destroy(conn);
                Ok(())
            }
        };
    }

    fn deliver(&mut self, to: usize, mad: &[u8]) {
        let now = self.now;
        self.cms[to].handle_mad(now, gid(to), gid(1 - to), mad);
    }
}

fuzz_target!(|actions: Vec<Action>| {
    let start = Instant::now();
    let config = |side: u8| CmConfig {
        local_ca_guid: 0x100 + u64::from(side),
        seed: [side; 32],
        max_connections: MAX_CONNECTIONS,
        ..CmConfig::default()
    };
    let mut world = World {
        cms: [Cm::new(config(0)), Cm::new(config(1))],
        now: start,
        queues: [Vec::new(), Vec::new()],
        kept: Vec::new(),
        known: [Vec::new(), Vec::new()],
        lives: [HashMap::new(), HashMap::new()],
    };
    for action in actions.into_iter().take(256) {
        match action {
            Action::Listen { side, udp, backlog } => {
                let _ = world.cms[usize::from(side)].listen(service(udp), usize::from(backlog % 8));
            }
            Action::StopListening { side, udp } => {
                world.cms[usize::from(side)].stop_listening(service(udp))
            }
            Action::Connect { side, private_len } => {
                let side = usize::from(side);
                let params = ConnectParams {
                    service_id: service(false),
                    local_gid: gid(side),
                    sgid_index: 1,
                    remote_gid: gid(1 - side),
                    qpn: 0x10 + side as u32,
                    service_type: ServiceType::Rc,
                    path_mtu: PathMtu::Mtu1024,
                    responder_resources: 1,
                    initiator_depth: 1,
                    retry_count: 7,
                    rnr_retry_count: 7,
                    srq: false,
                    flow_control: true,
                    traffic_class: 0,
                    hop_limit: 64,
                    flow_label: 0,
                };
                let private = vec![0x5A; usize::from(private_len)];
                let now = world.now;
                if let Ok(conn) = world.cms[side].connect(now, &params, &private) {
                    world.known[side].push(conn);
                }
            }
            Action::Resolve { side } => {
                let side = usize::from(side);
                let now = world.now;
                if let Ok(conn) = world.cms[side].resolve_service(
                    now,
                    service(true),
                    gid(side),
                    gid(1 - side),
                    &[],
                ) {
                    world.known[side].push(conn);
                }
            }
            Action::Answer { side, pick, how } => world.answer(usize::from(side), pick, how),
            Action::Step { side, deliver } => {
                let side = usize::from(side);
                if !world.queues[side].is_empty() {
                    let mad = world.queues[side].remove(0);
                    if deliver {
                        world.deliver(1 - side, &mad);
                    }
                }
            }
            Action::Replay {
                to,
                pick,
                offset,
                value,
            } => {
                if !world.kept.is_empty() {
                    let mut mad = world.kept[usize::from(pick) % world.kept.len()];
                    mad[usize::from(offset)] = value;
                    world.deliver(usize::from(to), &mad);
                }
            }
            Action::Wait { millis } => {
                world.now += Duration::from_millis(u64::from(millis % 200_000));
                let now = world.now;
                for cm in &mut world.cms {
                    cm.handle_timeout(now);
                }
            }
        }
        world.pump();
    }
});

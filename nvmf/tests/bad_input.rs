//! Our target against a host that sends what a host should not: every malformed command
//! is answered with the NVMe status Linux's target gives it, the connection's private
//! data is checked before a QP is given, a host not on the allowed list is refused, and a
//! malformed capsule ends that controller only — the target keeps serving. Between two
//! network namespaces (root; in CI a missing prerequisite fails, elsewhere it skips).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use roce_nvmf::host::{self, Controller, Error, HostConfig, Transfer};
use roce_nvmf::target::{
    Backing, Event, HostAccess, Limits, SubsystemConfig, Target, TargetConfig,
};
use roce_nvmf::wire::cm::{parse_reject, CmRequest, RejectStatus};
use roce_nvmf::wire::fabrics::{property, Connect, ConnectData, Fabrics};
use roce_nvmf::wire::log::{ErrorEntry, LID_ERROR};
use roce_nvmf::wire::{admin, io, DataPointer, Sqe, Status};
use roce_provider::netns::{self, needs_root, veth, Netns};
use roce_verbs::{
    CmEventKind, ConnParam, Context, Device, OpenOptions, QpCaps, QpInitAttr, QpType,
};

const NQN: &str = "nqn.2026-12.io.roce-xdp:bad-input";
const HOST: &str = "nqn.2014-08.io.roce-xdp:friend";
const TARGET: &str = "10.86.0.2:4420";

/// Our target in `ns` on `interface`, until `stop`; its events.
fn start_target(
    ns: &Netns,
    stop: Arc<AtomicBool>,
) -> (thread::JoinHandle<()>, Arc<Mutex<Vec<Event>>>) {
    let events = Arc::new(Mutex::new(Vec::new()));
    let (ready, started) = mpsc::channel();
    let name = ns.name.clone();
    let log = Arc::clone(&events);
    let handle = thread::spawn(move || {
        netns::enter(&name).expect("enter the target's namespace");
        let device = Device::by_name("nb").expect("nb");
        let ctx = Context::open(&device, OpenOptions::default()).expect("open nb");
        let config = TargetConfig {
            listen: TARGET.parse().unwrap(),
            subsystems: vec![SubsystemConfig {
                nqn: NQN.into(),
                namespaces: vec![Backing::Ram(1 << 20)],
                hosts: HostAccess::Only(vec![HOST.into()]),
            }],
            limits: Limits {
                max_io_queues: 2,
                max_queue_depth: 32,
                in_capsule: 4096,
            },
            spin: Duration::ZERO,
        };
        let mut target = Target::new(ctx, config).expect("target");
        ready.send(()).unwrap();
        target
            .run(
                || stop.load(Ordering::Relaxed),
                |event| log.lock().unwrap().push(event.clone()),
            )
            .expect("run");
    });
    started
        .recv_timeout(Duration::from_secs(20))
        .expect("the target started");
    (handle, events)
}

fn host_config(hostnqn: &str) -> HostConfig {
    HostConfig {
        hostnqn: hostnqn.into(),
        io_queues: 1,
        queue_depth: 8,
        max_io: 64 << 10,
        ..HostConfig::default()
    }
}

/// The status of a command, its flags (DNR) included, More left out.
fn status(controller: &mut Controller, queue: usize, sqe: Sqe, transfer: Transfer) -> Status {
    let status = controller
        .raw_command(queue, sqe, transfer, &[0; 4096])
        .expect("a completion")
        .status;
    Status::from_raw(status.raw() & !0x2000)
}

fn read(nsid: u32, lba: u64, blocks: u32) -> Sqe {
    host::rw_command(false, nsid, lba, blocks)
}

fn write(lba: u64, blocks: u32) -> Sqe {
    host::rw_command(true, 1, lba, blocks)
}

#[test]
fn malformed_commands_get_status_codes_and_the_target_keeps_serving() {
    let test = "malformed_commands_get_status_codes_and_the_target_keeps_serving";
    if !needs_root(test) {
        return;
    }
    let a = Netns::create("roce-nvmf-a").unwrap();
    let b = Netns::create("roce-nvmf-b").unwrap();
    veth((&a, "na", "10.86.0.1/24"), (&b, "nb", "10.86.0.2/24"), 9000).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let (target, events) = start_target(&b, Arc::clone(&stop));
    let host_ns = a.name.clone();
    let checked = thread::spawn(move || {
        netns::enter(&host_ns).expect("enter the host's namespace");
        let device = Device::by_name("na").expect("na");
        let ctx = Context::open(&device, OpenOptions::default()).expect("open na");
        host_side(&ctx)
    })
    .join();
    stop.store(true, Ordering::Relaxed);
    target.join().expect("the target thread");
    let checked = checked.expect("the host thread");
    let events = events.lock().unwrap();
    let log: Vec<String> = events.iter().map(ToString::to_string).collect();
    assert!(checked.is_ok(), "{checked:?}\ntarget:\n{}", log.join("\n"));
    // The short capsule ended its controller (both its queues), nothing else.
    assert!(
        events.iter().any(|event| matches!(
            event,
            Event::ControllerGone { queues: 2, why, .. } if why.contains("capsule of 32 bytes")
        )),
        "{}",
        log.join("\n")
    );
}

fn host_side(ctx: &Context) -> Result<(), String> {
    let addr: SocketAddr = TARGET.parse().unwrap();
    let fail = |what: &str, error: Error| format!("{what}: {error}");

    // The connection's private data, checked before anything is given.
    let refused = raw_cm_request(
        ctx,
        addr,
        CmRequest {
            recfmt: 0,
            qid: 0,
            hrqsize: 100,
            hsqsize: 99,
            cntlid: 0,
        },
    )?;
    assert_eq!(refused, Some(RejectStatus::InvalidHsqsize));
    let refused = raw_cm_request(
        ctx,
        addr,
        CmRequest {
            recfmt: 1,
            qid: 0,
            hrqsize: 32,
            hsqsize: 31,
            cntlid: 0,
        },
    )?;
    assert_eq!(refused, Some(RejectStatus::InvalidRecfmt));
    let refused = raw_cm_request(
        ctx,
        addr,
        CmRequest {
            recfmt: 0,
            qid: 3,
            hrqsize: 32,
            hsqsize: 31,
            cntlid: 0,
        },
    )?;
    assert_eq!(refused, Some(RejectStatus::InvalidQid));

    // A host not on the list: the Connect fails with "invalid host".
    match Controller::connect(
        ctx,
        addr,
        NQN,
        &host_config("nqn.2014-08.io.roce-xdp:stranger"),
    ) {
        Err(Error::Command { status, .. }) => {
            assert_eq!(
                status.code_and_type(),
                Status::CONNECT_INVALID_HOST.code_and_type()
            )
        }
        other => {
            return Err(format!(
                "a stranger connected: {:?}",
                other.map(|c| c.cntlid)
            ))
        }
    }
    // Discovery lists the subsystem only to hosts it allows.
    let listed = host::discover(ctx, addr, &host_config(HOST)).map_err(|e| fail("discover", e))?;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].subnqn, NQN);
    assert_eq!(listed[0].traddr, "10.86.0.2");
    let stranger = host::discover(ctx, addr, &host_config("nqn.2014-08.io.roce-xdp:stranger"))
        .map_err(|e| fail("discover as a stranger", e))?;
    assert!(stranger.is_empty());

    let mut c =
        Controller::connect(ctx, addr, NQN, &host_config(HOST)).map_err(|e| fail("connect", e))?;
    let dnr = |status: Status| status.dnr();
    let errors = std::cell::Cell::new(0u64);
    let expect = |c: &mut Controller, queue, sqe, transfer, want: Status, what: &str| {
        let got = status(c, queue, sqe, transfer);
        assert_eq!(got, want, "{what}");
        errors.set(errors.get() + 1);
    };

    // Admin queue.
    expect(
        &mut c,
        0,
        Sqe::new(0x7E, 0),
        Transfer::None,
        dnr(Status::INVALID_OPCODE),
        "unknown admin opcode",
    );
    let mut identify = Sqe::new(admin::IDENTIFY, 0);
    identify.set_dword(10, 1);
    expect(
        &mut c,
        0,
        identify,
        Transfer::FromController(512),
        dnr(Status::SGL_INVALID_DATA),
        "Identify into 512 bytes",
    );
    identify.set_dword(10, 0x42);
    expect(
        &mut c,
        0,
        identify,
        Transfer::FromController(4096),
        dnr(Status::INVALID_FIELD),
        "unknown CNS",
    );
    let mut fused = Sqe::new(admin::KEEP_ALIVE, 0);
    fused.0[1] |= 1;
    expect(
        &mut c,
        0,
        fused,
        Transfer::None,
        dnr(Status::INVALID_FIELD),
        "a fused command",
    );
    let mut segment = Sqe::new(admin::KEEP_ALIVE, 0);
    segment.0[39] = 0x20;
    expect(
        &mut c,
        0,
        segment,
        Transfer::AsIs,
        dnr(Status::SGL_INVALID_TYPE),
        "an SGL segment descriptor",
    );
    let connect = Fabrics::Connect(Connect {
        recfmt: 0,
        qid: 0,
        sqsize: 31,
        cattr: 0,
        kato: 0,
    });
    let data = ConnectData {
        hostid: [0; 16],
        cntlid: 0xFFFF,
        subnqn: NQN.into(),
        hostnqn: HOST.into(),
    }
    .emit();
    let got = c
        .raw_command(0, connect.emit(0), Transfer::ToController(1024), &data)
        .map_err(|e| fail("a second Connect", e))?;
    assert_eq!(
        got.status.code_and_type(),
        Status::COMMAND_SEQUENCE.code_and_type(),
        "a second Connect"
    );
    errors.set(errors.get() + 1);
    expect(
        &mut c,
        0,
        Fabrics::Disconnect { recfmt: 0 }.emit(0),
        Transfer::None,
        dnr(Status::INVALID_QUEUE_TYPE),
        "Disconnect on the admin queue",
    );
    expect(
        &mut c,
        0,
        Fabrics::PropertyGet {
            offset: 0x40,
            wide: false,
        }
        .emit(0),
        Transfer::None,
        dnr(Status::INVALID_FIELD),
        "an unknown property",
    );
    expect(
        &mut c,
        0,
        Fabrics::PropertyGet {
            offset: property::CAP,
            wide: false,
        }
        .emit(0),
        Transfer::None,
        dnr(Status::INVALID_FIELD),
        "CAP read 4 bytes wide",
    );
    expect(
        &mut c,
        0,
        Fabrics::Other(0x7F).emit(0),
        Transfer::None,
        dnr(Status::INVALID_OPCODE),
        "an unknown Fabrics type",
    );

    // I/O queue: 1 MiB namespace, 2048 blocks; in-capsule data up to 4096 bytes.
    expect(
        &mut c,
        1,
        read(1, 2047, 2),
        Transfer::FromController(1024),
        dnr(Status::LBA_RANGE),
        "a read past the end",
    );
    expect(
        &mut c,
        1,
        read(1, u64::MAX, 1),
        Transfer::FromController(512),
        dnr(Status::LBA_RANGE),
        "an LBA that wraps",
    );
    expect(
        &mut c,
        1,
        read(2, 0, 1),
        Transfer::FromController(512),
        dnr(Status::INVALID_NS),
        "a namespace that does not exist",
    );
    expect(
        &mut c,
        1,
        read(1, 0, 8),
        Transfer::FromController(512),
        dnr(Status::SGL_INVALID_DATA),
        "an SGL shorter than the read",
    );
    expect(
        &mut c,
        1,
        read(1, 0, 512),
        Transfer::FromController(256 << 10),
        dnr(Status::INVALID_FIELD),
        "a read beyond MDTS",
    );
    // (Linux's target looks the namespace up first, then the opcode.)
    let mut unknown = Sqe::new(0x7D, 0);
    unknown.set_nsid(1);
    expect(
        &mut c,
        1,
        unknown,
        Transfer::None,
        dnr(Status::INVALID_OPCODE),
        "an unknown I/O opcode",
    );
    let mut beyond = write(0, 16);
    beyond.set_data(&DataPointer::InCapsule {
        offset: 0,
        len: 8192,
    });
    expect(
        &mut c,
        1,
        beyond,
        Transfer::AsIs,
        dnr(Status::SGL_INVALID_OFFSET),
        "in-capsule data beyond its size",
    );
    let mut missing = write(0, 8);
    missing.set_data(&DataPointer::InCapsule {
        offset: 0,
        len: 4096,
    });
    expect(
        &mut c,
        1,
        missing,
        Transfer::AsIs,
        dnr(Status::SGL_INVALID_DATA),
        "in-capsule data that did not come",
    );
    let mut read_in_capsule = read(1, 0, 1);
    read_in_capsule.set_data(&DataPointer::InCapsule {
        offset: 0,
        len: 512,
    });
    expect(
        &mut c,
        1,
        read_in_capsule,
        Transfer::AsIs,
        dnr(Status::INVALID_FIELD),
        "a read into the capsule",
    );
    let mut bad_subtype = write(0, 1);
    bad_subtype.0[39] = 0x4A;
    expect(
        &mut c,
        1,
        bad_subtype,
        Transfer::AsIs,
        dnr(Status::INVALID_FIELD),
        "a keyed descriptor of subtype 0xA",
    );
    let mut ranges = Sqe::new(io::DATASET_MANAGEMENT, 0);
    ranges.set_nsid(1);
    let mut range = [0u8; 16];
    range[4..8].copy_from_slice(&16u32.to_le_bytes());
    range[8..16].copy_from_slice(&2040u64.to_le_bytes());
    let got = c
        .raw_command(1, ranges, Transfer::ToController(16), &range)
        .map_err(|e| fail("Dataset Management", e))?;
    assert_eq!(
        got.status.code_and_type(),
        Status::LBA_RANGE.code_and_type(),
        "a range past the end"
    );
    errors.set(errors.get() + 1);

    // The controller logged each failure, newest first.
    let log = c
        .log_page(LID_ERROR, 0, 0, 64)
        .map_err(|e| fail("error log", e))?;
    let newest = ErrorEntry::parse(&log).unwrap();
    assert_eq!(newest.count, errors.get());
    assert_eq!(newest.sqid, 1);

    // Still serving: a write and its read-back, in the capsule and by keyed SGL.
    // (4 KiB fits the capsule; 32 KiB goes by keyed SGL.)
    for blocks in [8u32, 64] {
        let bytes: Vec<u8> = (0..blocks * 512).map(|i| (i * 7 + blocks) as u8).collect();
        let transfer = Transfer::ToController(bytes.len() as u32);
        let done = c
            .raw_command(1, write(100, blocks), transfer, &bytes)
            .map_err(|e| fail("write", e))?;
        assert!(done.status.is_success(), "write: {}", done.status);
        let mut back = vec![0u8; bytes.len()];
        let slot = c.take_slot(1).ok_or("no slot")?;
        c.submit(
            1,
            slot,
            read(1, 100, blocks),
            Transfer::FromController(bytes.len() as u32),
        )
        .map_err(|e| fail("read", e))?;
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut completions = Vec::new();
        while completions.is_empty() && Instant::now() < deadline {
            c.poll(&mut completions).map_err(|e| fail("poll", e))?;
        }
        let completed = completions.first().ok_or("no read completion")?;
        assert!(completed.cqe.status.is_success());
        c.read_buffer(1, slot, &mut back)
            .map_err(|e| fail("buffer", e))?;
        c.release(1, slot);
        assert_eq!(back, bytes, "{blocks} blocks read back");
    }

    // A capsule shorter than a command ends the controller: its queues are closed.
    c.raw_capsule(1, &[0xAB; 32])
        .map_err(|e| fail("short capsule", e))?;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut completions = Vec::new();
    loop {
        match c.poll(&mut completions) {
            Err(Error::Connection(_)) => break,
            Err(error) => return Err(format!("after a short capsule: {error}")),
            Ok(_) if Instant::now() > deadline => return Err("a short capsule was taken".into()),
            Ok(_) => thread::sleep(Duration::from_millis(10)),
        }
    }
    drop(c);
    // The target serves the next host.
    let again = Controller::connect(ctx, addr, NQN, &host_config(HOST))
        .map_err(|e| fail("reconnect", e))?;
    again.shutdown().map_err(|e| fail("shutdown", e))?;
    Ok(())
}

/// Sends a connect request with `request` as its private data; the REJ's status, `None`
/// if it was accepted.
fn raw_cm_request(
    ctx: &Context,
    addr: SocketAddr,
    request: CmRequest,
) -> Result<Option<RejectStatus>, String> {
    let channel = ctx.create_event_channel().map_err(|e| e.to_string())?;
    let id = ctx.create_id(&channel).map_err(|e| e.to_string())?;
    let next = || {
        channel
            .get_cm_event(Some(Duration::from_secs(10)))
            .map_err(|e| e.to_string())
    };
    id.resolve_addr(addr).map_err(|e| e.to_string())?;
    next()?;
    id.resolve_route().map_err(|e| e.to_string())?;
    next()?;
    let pd = ctx.alloc_pd().map_err(|e| e.to_string())?;
    let cq = ctx.create_cq(16, None).map_err(|e| e.to_string())?;
    let qp = id
        .create_qp(
            &pd,
            &QpInitAttr {
                qp_type: QpType::Rc,
                send_cq: &cq,
                recv_cq: &cq,
                caps: QpCaps::default(),
                sq_sig_all: false,
            },
        )
        .map_err(|e| e.to_string())?;
    id.connect(
        &qp,
        &ConnParam {
            private_data: request.emit().to_vec(),
            responder_resources: 4,
            ..ConnParam::default()
        },
    )
    .map_err(|e| e.to_string())?;
    match next()?.kind {
        CmEventKind::Rejected { private_data, .. } => Ok(parse_reject(&private_data)),
        CmEventKind::Established => Ok(None),
        other => Err(format!("rdma_cm event {}", other.code())),
    }
}

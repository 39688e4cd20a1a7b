//! The wire formats against the Linux kernel's NVMe over RDMA host (10.88.0.12) and target
//! (10.88.0.11) on the wire (`tests/captures/nvmf_rdma_kernel.pcap`): the CM private data,
//! the admin and I/O queues' Connect capsules and data, property and admin commands, the
//! target's Identify data, log pages and completions, byte for byte where we emit the same
//! structure.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::Path;

use roce_nvmf::wire::cm::{CmReply, CmRequest, PRIVATE_LEN};
use roce_nvmf::wire::fabrics::{
    property, Connect, ConnectData, Fabrics, CNTLID_DYNAMIC, VERSION_1_3,
};
use roce_nvmf::wire::identify::{
    parse_descriptors, parse_namespace_list, IdentifyController, IdentifyNamespace, NIDT_CSI,
    NIDT_NGUID, NIDT_UUID, SGLS_KEYED, SGLS_OFFSETS,
};
use roce_nvmf::wire::log::{GetLogPage, Smart, LID_EFFECTS, LID_SMART};
use roce_nvmf::wire::{admin, feature, Cqe, DataPointer, Sqe, Status};
use roce_wire::cm::{cma, Message};
use roce_wire::frame::IpRepr;
use roce_wire::opcode::Opcode;
use roce_wire::{mad, Frame, FrameRepr};

const HOST: Ipv4Addr = Ipv4Addr::new(10, 88, 0, 12);
const SUBNQN: &str = "nqn.2026-12.io.roce-xdp:ram0";
const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000000";

/// What the capture holds, reassembled: the CM messages in order; capsules each way (the
/// host's commands, the target's responses with the R_Key they invalidated, if any); the
/// target's RDMA WRITEs of data by the R_Key they wrote; the host's READ response data.
#[derive(Default)]
struct Conversation {
    cm: Vec<Message>,
    commands: Vec<Vec<u8>>,
    responses: Vec<(Vec<u8>, Option<u32>)>,
    writes: BTreeMap<u32, Vec<u8>>,
    read_responses: Vec<Vec<u8>>,
}

fn conversation() -> Conversation {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/captures/nvmf_rdma_kernel.pcap");
    let frames = roce_provider::capture::read_frames(&path).expect("read the capture");
    let mut talk = Conversation::default();
    let mut sends: BTreeMap<u32, Vec<u8>> = BTreeMap::new();
    let mut write_key: BTreeMap<u32, u32> = BTreeMap::new();
    for captured in frames {
        let frame = Frame::new_checked(&captured.data[..]).expect("a RoCEv2 frame");
        frame.check_icrc().expect("ICRC");
        let repr = FrameRepr::parse(&frame).expect("parse");
        let IpRepr::V4(ip) = repr.ip else {
            panic!("IPv4 only")
        };
        let qpn = repr.bth.dest_qpn;
        let payload = repr.payload;
        match repr.bth.opcode {
            Opcode::UdSendOnly => {
                let packet = mad::Packet::new_checked(payload).expect("a MAD");
                let cm = roce_wire::cm::Repr::parse(&packet).expect("a CM MAD");
                talk.cm.push(cm.message);
            }
            Opcode::RcSendFirst | Opcode::RcSendMiddle => {
                sends.entry(qpn).or_default().extend_from_slice(payload)
            }
            Opcode::RcSendLast | Opcode::RcSendOnly | Opcode::RcSendOnlyWithInvalidate => {
                let mut message = sends.remove(&qpn).unwrap_or_default();
                message.extend_from_slice(payload);
                if ip.src == HOST {
                    talk.commands.push(message);
                } else {
                    talk.responses
                        .push((message, repr.ext.ieth.map(|ieth| ieth.rkey)));
                }
            }
            Opcode::RcRdmaWriteFirst | Opcode::RcRdmaWriteOnly => {
                let reth = repr.ext.reth.expect("RETH");
                write_key.insert(qpn, reth.rkey);
                talk.writes.insert(reth.rkey, payload.to_vec());
            }
            Opcode::RcRdmaWriteMiddle | Opcode::RcRdmaWriteLast => {
                let key = write_key[&qpn];
                talk.writes
                    .get_mut(&key)
                    .expect("a WRITE in progress")
                    .extend_from_slice(payload);
            }
            Opcode::RcRdmaReadResponseOnly => talk.read_responses.push(payload.to_vec()),
            _ => {}
        }
    }
    talk
}

/// The command whose identifier is `cid`.
fn command(talk: &Conversation, cid: u16) -> Sqe {
    talk.commands
        .iter()
        .map(|capsule| Sqe::parse(capsule).expect("64 bytes"))
        .find(|sqe| sqe.cid() == cid)
        .expect("the command")
}

/// The completion of command `cid` on queue `sq_id`, and the key it invalidated.
fn response(talk: &Conversation, sq_id: u16, cid: u16) -> (Cqe, Option<u32>) {
    talk.responses
        .iter()
        .filter_map(|(capsule, key)| Some((Cqe::parse(capsule)?, *key)))
        .find(|(cqe, _)| cqe.cid == cid && cqe.sq_id == sq_id)
        .expect("the response")
}

/// The data the target wrote for command `cid` (into its keyed SGL's key).
fn data_of(talk: &Conversation, cid: u16) -> &[u8] {
    let Ok(DataPointer::Keyed { key, .. }) = command(talk, cid).data() else {
        panic!("a keyed SGL")
    };
    &talk.writes[&key]
}

#[test]
fn cm_private_data_is_linux_hosts_and_targets() {
    let talk = conversation();
    let [Message::Req(req), Message::Rep(rep), ..] = talk.cm[..] else {
        panic!("REQ, REP first")
    };
    let nvme = &req.private_data[cma::HEADER_LEN..];
    let parsed = CmRequest::parse(nvme).unwrap();
    assert_eq!(
        parsed,
        CmRequest {
            recfmt: 0,
            qid: 0,
            hrqsize: 32,
            hsqsize: 31,
            cntlid: 0
        }
    );
    assert_eq!(parsed.emit()[..], nvme[..PRIVATE_LEN]);
    let reply = CmReply::parse(&rep.private_data).unwrap();
    assert_eq!(reply.crqsize, 32);
    assert_eq!(reply.emit()[..], rep.private_data[..PRIVATE_LEN]);
    // The I/O queue's connection: qid 1, as deep as the admin queue (`-Q 32`).
    let io = talk
        .cm
        .iter()
        .filter_map(|message| match message {
            Message::Req(req) => CmRequest::parse(&req.private_data[cma::HEADER_LEN..]).ok(),
            _ => None,
        })
        .nth(1)
        .unwrap();
    assert_eq!((io.qid, io.hrqsize, io.hsqsize), (1, 32, 31));
}

#[test]
fn admin_connect_capsule_and_keyed_data() {
    let talk = conversation();
    let sqe = Sqe::parse(&talk.commands[0]).unwrap();
    let connect = Connect {
        recfmt: 0,
        qid: 0,
        sqsize: 31,
        cattr: 0,
        kato: 5000,
    };
    assert_eq!(Fabrics::parse(&sqe), Fabrics::Connect(connect));
    let pointer = DataPointer::Keyed {
        addr: 0xffff_8880_2db6_1000,
        len: 1024,
        key: 0xe810,
        invalidate: true,
    };
    assert_eq!(sqe.data(), Ok(pointer));
    assert!(sqe.is_host_to_controller() && sqe.check_flags().is_ok());
    // Our emitter builds the very same 64 bytes.
    let mut ours = Fabrics::Connect(connect).emit(sqe.cid());
    ours.set_data(&pointer);
    assert_eq!(ours, sqe);
    // The target READ the 1024 bytes of data; the host's READ response carries them.
    let data = ConnectData::parse(&talk.read_responses[0]).unwrap();
    assert_eq!(data.cntlid, CNTLID_DYNAMIC);
    assert_eq!(data.subnqn, SUBNQN);
    assert_eq!(data.hostnqn, HOSTNQN);
    assert_eq!(data.emit()[..], talk.read_responses[0][..]);
    // Controller 1, with the host's key invalidated by the response (SEND with Invalidate).
    let (cqe, invalidated) = response(&talk, 0, sqe.cid());
    assert_eq!(
        (cqe.result, cqe.status, cqe.sq_head),
        (1, Status::SUCCESS, 1)
    );
    assert_eq!(invalidated, Some(0xe810));
    assert_eq!(cqe.emit()[..], talk.responses[0].0[..]);
}

#[test]
fn io_connect_carries_its_data_in_the_capsule() {
    let talk = conversation();
    let capsule = talk
        .commands
        .iter()
        .find(|capsule| capsule.len() > 64)
        .unwrap();
    assert_eq!(capsule.len(), 64 + 1024);
    let sqe = Sqe::parse(capsule).unwrap();
    assert_eq!(
        sqe.data(),
        Ok(DataPointer::InCapsule {
            offset: 0,
            len: 1024
        })
    );
    let Fabrics::Connect(connect) = Fabrics::parse(&sqe) else {
        panic!("Connect")
    };
    assert_eq!((connect.qid, connect.sqsize, connect.kato), (1, 31, 0));
    let data = ConnectData::parse(&capsule[64..]).unwrap();
    assert_eq!(data.cntlid, 1);
    // Answered with plain SEND: nothing to invalidate.
    let (cqe, invalidated) = response(&talk, 1, sqe.cid());
    assert_eq!((cqe.result, cqe.status), (1, Status::SUCCESS));
    assert_eq!(invalidated, None);
}

#[test]
fn properties_as_linux_reads_and_writes_them() {
    let talk = conversation();
    let mut seen = Vec::new();
    for capsule in &talk.commands {
        let sqe = Sqe::parse(capsule).unwrap();
        if !sqe.is_fabrics() {
            continue;
        }
        let parsed = Fabrics::parse(&sqe);
        if !matches!(parsed, Fabrics::Connect(_)) {
            // Data-less: a keyed descriptor of length 0, and our emitter agrees.
            assert_eq!(sqe.data(), Ok(DataPointer::NONE));
            assert_eq!(parsed.emit(sqe.cid()), sqe);
        }
        seen.push((parsed, response(&talk, 0, sqe.cid()).0.result));
    }
    let cap = seen
        .iter()
        .find(|(command, _)| {
            *command
                == Fabrics::PropertyGet {
                    offset: property::CAP,
                    wide: true,
                }
        })
        .unwrap()
        .1;
    assert_eq!(cap & 0xFFFF, 127, "MQES: 128 entries");
    assert_eq!(cap >> 24 & 0xFF, 15, "CAP.TO: 7.5 s");
    assert_eq!(cap >> 37 & 1, 1, "the NVM command set");
    let vs = seen
        .iter()
        .find(|(command, _)| {
            *command
                == Fabrics::PropertyGet {
                    offset: property::VS,
                    wide: false,
                }
        })
        .unwrap()
        .1;
    assert_eq!(vs, u64::from(VERSION_1_3));
    // Enabled, then a normal shutdown whose completion CSTS reports.
    assert!(seen.iter().any(|(command, _)| matches!(
        command,
        Fabrics::PropertySet { offset: property::CC, value, .. } if value & 1 == 1
    )));
    assert_eq!(seen.last().unwrap().1, 0x8, "CSTS.SHST: shutdown complete");
}

#[test]
fn identify_data_from_linux_target_parses() {
    let talk = conversation();
    let by_cns = |cns: u32, nsid: u32| {
        talk.commands
            .iter()
            .map(|capsule| Sqe::parse(capsule).unwrap())
            .find(|sqe| {
                sqe.opcode() == admin::IDENTIFY && sqe.dword(10) == cns && sqe.nsid() == nsid
            })
            .expect("the Identify")
            .cid()
    };
    let controller = IdentifyController::parse(data_of(&talk, by_cns(1, 0))).unwrap();
    assert_eq!(controller.subnqn, SUBNQN);
    assert_eq!(controller.cntlid, 1);
    assert_eq!(controller.ver, VERSION_1_3);
    assert_eq!(controller.mdts, 8);
    assert_eq!(controller.kas, 10);
    assert_eq!(controller.maxcmd, 1024);
    assert_eq!((controller.sqes, controller.cqes), (0x66, 0x44));
    assert_eq!(
        controller.sgls & (SGLS_KEYED | SGLS_OFFSETS),
        SGLS_KEYED | SGLS_OFFSETS
    );
    assert_eq!(controller.in_capsule_len(), 4096);
    assert_eq!(controller.iorcsz, 1);
    // What we model survives our emitter.
    assert_eq!(
        IdentifyController::parse(&controller.emit()),
        Some(controller)
    );

    let namespace = IdentifyNamespace::parse(data_of(&talk, by_cns(0, 1))).unwrap();
    assert_eq!(namespace.nsze, 64 << 20 >> 9);
    assert_eq!(namespace.lba_shift, 9);
    assert_eq!(
        IdentifyNamespace::parse(&namespace.emit()),
        Some(namespace.clone())
    );

    assert_eq!(parse_namespace_list(data_of(&talk, by_cns(2, 0))), [1]);
    let descriptors = parse_descriptors(data_of(&talk, by_cns(3, 1)));
    let kinds: Vec<u8> = descriptors.iter().map(|(kind, _)| *kind).collect();
    // A RAM disk has no NGUID: Linux lists only its generated UUID and the command set.
    assert_eq!(kinds, [NIDT_UUID, NIDT_CSI]);
    assert_eq!(namespace.nguid, [0; 16]);
    assert!(!kinds.contains(&NIDT_NGUID));
    assert_eq!(descriptors[1].1, [0]);
}

#[test]
fn log_pages_and_features_as_linux_asks_for_them() {
    let talk = conversation();
    let logs: Vec<(Sqe, GetLogPage)> = talk
        .commands
        .iter()
        .map(|capsule| Sqe::parse(capsule).unwrap())
        .filter(|sqe| sqe.opcode() == admin::GET_LOG_PAGE)
        .map(|sqe| (sqe, GetLogPage::parse(&sqe)))
        .collect();
    let (effects, page) = logs.iter().find(|(_, log)| log.lid == LID_EFFECTS).unwrap();
    assert_eq!((page.len, page.offset), (4096, 0));
    assert_eq!(data_of(&talk, effects.cid()).len(), 4096);
    let (smart, page) = logs.iter().find(|(_, log)| log.lid == LID_SMART).unwrap();
    assert_eq!((smart.nsid(), page.len), (0xFFFF_FFFF, 512));
    assert!(Smart::parse(data_of(&talk, smart.cid())).is_some());
    // Number of Queues: 128 each way, 0's based.
    let set_queues = talk
        .commands
        .iter()
        .map(|capsule| Sqe::parse(capsule).unwrap())
        .find(|sqe| {
            sqe.opcode() == admin::SET_FEATURES && sqe.dword(10) as u8 == feature::NUMBER_OF_QUEUES
        })
        .unwrap();
    assert_eq!(response(&talk, 0, set_queues.cid()).0.result, 0x007f_007f);
    // The asynchronous event request is held: no response in the capture.
    let aer = command(&talk, 31);
    assert_eq!(aer.opcode(), admin::ASYNC_EVENT);
    assert!(talk
        .responses
        .iter()
        .filter_map(|(capsule, _)| Cqe::parse(capsule))
        .all(|cqe| !(cqe.cid == 31 && cqe.sq_id == 0)));
}

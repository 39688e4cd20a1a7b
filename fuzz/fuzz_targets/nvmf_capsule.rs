//! Proves the NVMe over Fabrics parsers a target runs on what a host sends never panic,
//! and that what they keep survives emit → parse: a command capsule (the SQE, its SGL
//! descriptor, a Fabrics command, Get Log Page's fields, Connect data in the capsule), the
//! connection's private data, and the data a controller returns (completion, Identify,
//! discovery log) as a host parses it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roce_nvmf::wire::cm::{parse_reject, CmReply, CmRequest};
use roce_nvmf::wire::fabrics::{ConnectData, Fabrics, CONNECT_DATA_LEN};
use roce_nvmf::wire::identify::{
    parse_descriptors, parse_namespace_list, IdentifyController, IdentifyNamespace,
};
use roce_nvmf::wire::log::{DiscoveryEntry, GetLogPage};
use roce_nvmf::wire::{Cqe, DataPointer, Sqe, SQE_LEN};

fuzz_target!(|data: &[u8]| {
    // Private data, as a connect request, reply or reject carries it.
    if let Ok(request) = CmRequest::parse(data) {
        assert_eq!(CmRequest::parse(&request.emit()), Ok(request));
    }
    if let Some(reply) = CmReply::parse(data) {
        assert_eq!(CmReply::parse(&reply.emit()), Some(reply));
    }
    let _ = parse_reject(data);

    let Ok(sqe) = Sqe::parse(data) else {
        return;
    };
    let _ = sqe.check_flags();
    let _ = sqe.is_host_to_controller();
    if let Ok(pointer) = sqe.data() {
        assert_eq!(DataPointer::parse(&pointer.emit()), Ok(pointer));
        // In-capsule data as the target takes it: within what arrived, never beyond.
        if let DataPointer::InCapsule { offset, len } = pointer {
            let in_capsule = &data[SQE_LEN..];
            let end = offset.checked_add(u64::from(len));
            if let Some(bytes) = end
                .filter(|&end| end <= in_capsule.len() as u64)
                .map(|end| &in_capsule[offset as usize..end as usize])
            {
                if len as usize == CONNECT_DATA_LEN {
                    if let Ok(connect) = ConnectData::parse(bytes) {
                        assert_eq!(ConnectData::parse(&connect.emit()), Ok(connect));
                    }
                }
            }
        }
    }
    if sqe.is_fabrics() {
        let command = Fabrics::parse(&sqe);
        assert_eq!(Fabrics::parse(&command.emit(sqe.cid())), command);
    }
    let log = GetLogPage::parse(&sqe);
    let mut again = Sqe::new(sqe.opcode(), sqe.cid());
    log.emit(&mut again);
    assert_eq!(GetLogPage::parse(&again), log);

    // What a host parses of a controller's answers.
    if let Some(cqe) = Cqe::parse(data) {
        assert_eq!(Cqe::parse(&cqe.emit()), Some(cqe));
    }
    if let Some(controller) = IdentifyController::parse(data) {
        let _ = controller.max_transfer();
        let _ = controller.in_capsule_len();
    }
    let _ = IdentifyNamespace::parse(data);
    let _ = parse_namespace_list(data);
    let _ = parse_descriptors(data);
    let _ = DiscoveryEntry::parse(data);
});

//! A congested switch port for tests and benchmarks on hosts whose kernel has no `red` qdisc:
//! a tc program on an interface's egress (tcx) that keeps a virtual queue and marks CE
//! (`bpf_skb_ecn_set_ce`, ECN-capable packets only) while it is above a threshold.
//!
//! The virtual queue is the bytes that arrived minus what a link of the given rate would
//! have sent since (`bpf_ktime_get_ns`), floored at zero: the queue a shaper of that rate
//! (`tbf` below it) builds, seen when a packet is enqueued, as a switch marks. Its state is
//! one entry of an array map; two CPUs may update it at once and lose an update, which
//! only blurs a figure a benchmark reads. ~35 instructions, assembled with [`crate::bpf`].

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use crate::bpf::{
    load_program, Assembler, BpfAttr, Insn, ALU64_ADD_IMM, ALU64_ADD_REG, ALU64_DIV_IMM,
    ALU64_MOV_IMM, ALU64_MOV_REG, ALU64_MUL_REG, ALU64_SUB_REG, BPF_LINK_CREATE, BPF_MAP_CREATE,
    BPF_MAP_LOOKUP_ELEM, BPF_MAP_UPDATE_ELEM, JMP_CALL, JMP_EXIT, JMP_JA, JMP_JEQ_IMM, JMP_JGT_IMM,
    JMP_JLE_REG, LDX_DW, LDX_W, STX_DW, ST_W,
};

const BPF_MAP_TYPE_ARRAY: u32 = 2;
const BPF_PROG_TYPE_SCHED_CLS: u32 = 3;
const BPF_TCX_EGRESS: u32 = 47;
const BPF_FUNC_MAP_LOOKUP_ELEM: i32 = 1;
const BPF_FUNC_KTIME_GET_NS: i32 = 5;
const BPF_FUNC_SKB_ECN_SET_CE: i32 = 97;
const TC_ACT_OK: i32 = 0;
const NS_PER_SEC: i32 = 1_000_000_000;

/// The map entry's fields (u64 each), by byte offset.
const QUEUE: i16 = 0;
const LAST_NS: i16 = 8;
const RATE: i16 = 16;
const THRESHOLD: i16 = 24;
const MARKED: i16 = 32;
const PACKETS: i16 = 40;
const ENTRY: usize = 48;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Label {
    Out,
    Clamp,
    Drain,
    Empty,
    Add,
}

/// The program, with `map_fd` (the one-entry array) baked in.
fn program(map_fd: i32) -> Vec<Insn> {
    let mut a = Assembler::default();
    // r6 = skb; r7 = skb->len; r8 = the entry.
    a.op(ALU64_MOV_REG, 6, 1, 0, 0).load(LDX_W, 7, 6, 0);
    a.op(ST_W, 10, 0, -4, 0)
        .op(ALU64_MOV_REG, 2, 10, 0, 0)
        .op(ALU64_ADD_IMM, 2, 0, 0, -4)
        .load_map(1, map_fd)
        .op(JMP_CALL, 0, 0, 0, BPF_FUNC_MAP_LOOKUP_ELEM)
        .jump(JMP_JEQ_IMM, 0, 0, 0, Label::Out)
        .op(ALU64_MOV_REG, 8, 0, 0, 0);
    // r0 = ns since the last packet (at most a second: the queue is empty by then).
    a.op(JMP_CALL, 0, 0, 0, BPF_FUNC_KTIME_GET_NS)
        .load(LDX_DW, 1, 8, LAST_NS)
        .store(STX_DW, 8, LAST_NS, 0)
        .op(ALU64_SUB_REG, 0, 1, 0, 0)
        .jump(JMP_JGT_IMM, 0, 0, NS_PER_SEC, Label::Clamp)
        .jump(JMP_JA, 0, 0, 0, Label::Drain);
    a.label(Label::Clamp).op(ALU64_MOV_IMM, 0, 0, 0, NS_PER_SEC);
    // r0 = bytes the link sent meanwhile; r2 = the queue after them and this packet.
    a.label(Label::Drain)
        .load(LDX_DW, 1, 8, RATE)
        .op(ALU64_MUL_REG, 0, 1, 0, 0)
        .op(ALU64_DIV_IMM, 0, 0, 0, NS_PER_SEC)
        .load(LDX_DW, 2, 8, QUEUE)
        .jump(JMP_JLE_REG, 2, 0, 0, Label::Empty)
        .op(ALU64_SUB_REG, 2, 0, 0, 0)
        .jump(JMP_JA, 0, 0, 0, Label::Add);
    a.label(Label::Empty).op(ALU64_MOV_IMM, 2, 0, 0, 0);
    a.label(Label::Add)
        .op(ALU64_ADD_REG, 2, 7, 0, 0)
        .store(STX_DW, 8, QUEUE, 2)
        .load(LDX_DW, 1, 8, PACKETS)
        .op(ALU64_ADD_IMM, 1, 0, 0, 1)
        .store(STX_DW, 8, PACKETS, 1);
    // Above the threshold: mark CE (1 if it did: the packet was ECN-capable) and count.
    a.load(LDX_DW, 1, 8, THRESHOLD)
        .jump(JMP_JLE_REG, 2, 1, 0, Label::Out)
        .op(ALU64_MOV_REG, 1, 6, 0, 0)
        .op(JMP_CALL, 0, 0, 0, BPF_FUNC_SKB_ECN_SET_CE)
        .load(LDX_DW, 1, 8, MARKED)
        .op(ALU64_ADD_REG, 1, 0, 0, 0)
        .store(STX_DW, 8, MARKED, 1);
    a.label(Label::Out)
        .op(ALU64_MOV_IMM, 0, 0, 0, TC_ACT_OK)
        .op(JMP_EXIT, 0, 0, 0, 0);
    a.finish()
}

/// What the marker saw so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MarkerStats {
    /// Packets that left through the port.
    pub packets: u64,
    /// Of them, marked CE.
    pub marked: u64,
    /// The virtual queue at the last packet, in bytes.
    pub queue: u64,
}

/// The marker, attached to an interface's egress until dropped (or the process ends).
pub struct EcnMarker {
    map: OwnedFd,
    _program: OwnedFd,
    _link: OwnedFd,
}

impl EcnMarker {
    /// Marks what leaves `ifindex` while the virtual queue of a link of `rate` bytes per
    /// second holds more than `threshold` bytes. Needs root and a kernel with tcx (6.6).
    pub fn attach(ifindex: u32, rate: u64, threshold: u64) -> io::Result<EcnMarker> {
        let map = BpfAttr::new()
            .u32_at(0, BPF_MAP_TYPE_ARRAY)
            .u32_at(4, 4)
            .u32_at(8, ENTRY as u32)
            .u32_at(12, 1)
            .call_for_fd(BPF_MAP_CREATE)?;
        let mut entry = [0u8; ENTRY];
        entry[RATE as usize..][..8].copy_from_slice(&rate.to_ne_bytes());
        entry[THRESHOLD as usize..][..8].copy_from_slice(&threshold.to_ne_bytes());
        let key = 0u32;
        BpfAttr::new()
            .u32_at(0, map.as_raw_fd() as u32)
            .u64_at(8, &key as *const u32 as u64)
            .u64_at(16, entry.as_ptr() as u64)
            .call(BPF_MAP_UPDATE_ELEM)?;
        let program = load_program(
            "ECN marker",
            BPF_PROG_TYPE_SCHED_CLS,
            &program(map.as_raw_fd()),
            0,
            0,
        )?;
        let link = BpfAttr::new()
            .u32_at(0, program.as_raw_fd() as u32)
            .u32_at(4, ifindex)
            .u32_at(8, BPF_TCX_EGRESS)
            .call_for_fd(BPF_LINK_CREATE)?;
        Ok(EcnMarker {
            map,
            _program: program,
            _link: link,
        })
    }

    /// The counts so far.
    pub fn stats(&self) -> io::Result<MarkerStats> {
        let key = 0u32;
        let mut entry = [0u8; ENTRY];
        BpfAttr::new()
            .u32_at(0, self.map.as_raw_fd() as u32)
            .u64_at(8, &key as *const u32 as u64)
            .u64_at(16, entry.as_mut_ptr() as u64)
            .call(BPF_MAP_LOOKUP_ELEM)?;
        let field = |at: i16| {
            let mut bytes = [0u8; 8];
            bytes.copy_from_slice(&entry[at as usize..][..8]);
            u64::from_ne_bytes(bytes)
        };
        Ok(MarkerStats {
            packets: field(PACKETS),
            marked: field(MARKED),
            queue: field(QUEUE),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_jump_lands_inside_the_program_and_it_ends_in_exit() {
        crate::bpf::check_jumps(&program(5));
    }
}

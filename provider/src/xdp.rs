//! Our own XDP program: UDP to port 4791 (IPv4 without options or IPv6, with or without one
//! 802.1Q tag) goes to the AF_XDP socket of its queue, whatever its destination MAC and IP
//! (multicast datagrams to our groups too: the engine and the transport sort them out);
//! everything else (ARP, ICMP, IGMP and MLD, the TCP connection setup of the tools) goes on
//! to the kernel. No clang: ~35 instructions
//! assembled here and loaded with bpf(2). Attached through a bpf_link, so it disappears when
//! the process dies (the old netlink attach, as libxdp does, outlives a crash).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

use crate::bpf::{
    load_program, Assembler, BpfAttr, Insn, ALU64_ADD_IMM, ALU64_MOV_IMM, ALU64_MOV_REG,
    BPF_LINK_CREATE, BPF_MAP_CREATE, BPF_MAP_UPDATE_ELEM, JMP_CALL, JMP_EXIT, JMP_JA, JMP_JEQ_IMM,
    JMP_JNE_IMM, LDX_B, LDX_H, LDX_W,
};

/// How the program is attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XdpMode {
    /// In the driver (veth and real NICs that support it).
    Native,
    /// After the driver, for any interface (slower).
    Generic,
}

// bpf(2) types and flags of XDP (linux/bpf.h, linux/if_link.h).
const BPF_MAP_TYPE_XSKMAP: u32 = 17;
const BPF_PROG_TYPE_XDP: u32 = 6;
const BPF_XDP: u32 = 37;
const BPF_F_XDP_HAS_FRAGS: u32 = 1 << 5;
const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;
const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;
const BPF_FUNC_REDIRECT_MAP: i32 = 51;
const XDP_PASS: i32 = 2;

/// A jump target in the program being assembled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Label {
    Pass,
    NoVlan,
    Ipv4,
    Ipv6,
    Redirect,
}

/// The program, with `map_fd` (an XSKMAP) baked into its redirect.
fn program(map_fd: i32) -> Vec<Insn> {
    // Loads of 16-bit fields happen in host (little-endian) order: the constants are the
    // network-order values byte-swapped.
    const ETH_P_8021Q: i32 = 0x0081;
    const ETH_P_IPV4: i32 = 0x0008;
    const ETH_P_IPV6: i32 = 0xdd86;
    const ROCEV2_PORT: i32 = 0xb712;
    const IPPROTO_UDP: i32 = 17;
    let mut a = Assembler::default();
    // r6 = ctx; r2 = data; r3 = data_end.
    a.op(ALU64_MOV_REG, 6, 1, 0, 0)
        .load(LDX_W, 2, 1, 0)
        .load(LDX_W, 3, 1, 4);
    a.need(14, Label::Pass).load(LDX_H, 5, 2, 12).jump(
        JMP_JNE_IMM,
        5,
        0,
        ETH_P_8021Q,
        Label::NoVlan,
    );
    // One 802.1Q tag: step r2 over it so the offsets below stay those of an untagged frame.
    a.need(18, Label::Pass)
        .load(LDX_H, 5, 2, 16)
        .op(ALU64_ADD_IMM, 2, 0, 0, 4);
    a.label(Label::NoVlan)
        .jump(JMP_JEQ_IMM, 5, 0, ETH_P_IPV4, Label::Ipv4)
        .jump(JMP_JEQ_IMM, 5, 0, ETH_P_IPV6, Label::Ipv6)
        .jump(JMP_JA, 0, 0, 0, Label::Pass);
    // IPv4 without options (RoCEv2 never sends them), UDP, destination port 4791.
    a.label(Label::Ipv4).need(14 + 20 + 8, Label::Pass);
    a.load(LDX_B, 5, 2, 14)
        .jump(JMP_JNE_IMM, 5, 0, 0x45, Label::Pass);
    a.load(LDX_B, 5, 2, 14 + 9)
        .jump(JMP_JNE_IMM, 5, 0, IPPROTO_UDP, Label::Pass);
    a.load(LDX_H, 5, 2, 14 + 20 + 2)
        .jump(JMP_JNE_IMM, 5, 0, ROCEV2_PORT, Label::Pass);
    a.jump(JMP_JA, 0, 0, 0, Label::Redirect);
    // IPv6 with UDP as the next header, destination port 4791.
    a.label(Label::Ipv6).need(14 + 40 + 8, Label::Pass);
    a.load(LDX_B, 5, 2, 14 + 6)
        .jump(JMP_JNE_IMM, 5, 0, IPPROTO_UDP, Label::Pass);
    a.load(LDX_H, 5, 2, 14 + 40 + 2)
        .jump(JMP_JNE_IMM, 5, 0, ROCEV2_PORT, Label::Pass);
    // bpf_redirect_map(map, ctx->rx_queue_index, XDP_PASS): no socket on the queue → pass.
    a.label(Label::Redirect)
        .load(LDX_W, 2, 6, 16)
        .load_map(1, map_fd)
        .op(ALU64_MOV_IMM, 3, 0, 0, XDP_PASS)
        .op(JMP_CALL, 0, 0, 0, BPF_FUNC_REDIRECT_MAP)
        .op(JMP_EXIT, 0, 0, 0, 0);
    a.label(Label::Pass)
        .op(ALU64_MOV_IMM, 0, 0, 0, XDP_PASS)
        .op(JMP_EXIT, 0, 0, 0, 0);
    a.finish()
}

/// The loaded program and its XSKMAP; attached to an interface by [`attach`](Self::attach).
pub struct XdpProgram {
    map: OwnedFd,
    program: OwnedFd,
    link: Option<OwnedFd>,
}

impl XdpProgram {
    /// Loads the program with room for `queues` AF_XDP sockets. With `frags`, it accepts
    /// multi-buffer frames (needed in native mode at MTU 9000).
    pub fn load(queues: u32, frags: bool) -> io::Result<Self> {
        let map = BpfAttr::new()
            .u32_at(0, BPF_MAP_TYPE_XSKMAP)
            .u32_at(4, 4) // key: queue index
            .u32_at(8, 4) // value: socket fd
            .u32_at(12, queues.max(1))
            .call_for_fd(BPF_MAP_CREATE)?;
        let program = load_program(
            "XDP program",
            BPF_PROG_TYPE_XDP,
            &program(map.as_raw_fd()),
            if frags { BPF_F_XDP_HAS_FRAGS } else { 0 },
            BPF_XDP,
        )?;
        Ok(XdpProgram {
            map,
            program,
            link: None,
        })
    }

    /// Attaches to the interface `ifindex` through a bpf_link.
    pub fn attach(&mut self, ifindex: u32, mode: XdpMode) -> io::Result<()> {
        let flags = match mode {
            XdpMode::Native => XDP_FLAGS_DRV_MODE,
            XdpMode::Generic => XDP_FLAGS_SKB_MODE,
        };
        let link = BpfAttr::new()
            .u32_at(0, self.program.as_raw_fd() as u32)
            .u32_at(4, ifindex)
            .u32_at(8, BPF_XDP)
            .u32_at(12, flags)
            .call_for_fd(BPF_LINK_CREATE)?;
        self.link = Some(link);
        Ok(())
    }

    /// Detaches from the interface (also done when dropped, or when the process dies).
    pub fn detach(&mut self) {
        self.link = None;
    }

    /// Sends the frames of receive queue `queue` to the AF_XDP socket `socket`.
    pub fn register_socket(&self, queue: u32, socket: BorrowedFd<'_>) -> io::Result<()> {
        let key = queue;
        let value = socket.as_raw_fd() as u32;
        BpfAttr::new()
            .u32_at(0, self.map.as_raw_fd() as u32)
            .u64_at(8, &key as *const u32 as u64)
            .u64_at(16, &value as *const u32 as u64)
            .call(BPF_MAP_UPDATE_ELEM)
            .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bpf::{BPF_PSEUDO_MAP_FD, LD_IMM64};

    #[test]
    fn every_jump_lands_inside_the_program_and_it_ends_in_exit() {
        let insns = program(7);
        crate::bpf::check_jumps(&insns);
        let map_load = insns.iter().position(|insn| insn.code == LD_IMM64).unwrap();
        assert_eq!(
            (insns[map_load].src, insns[map_load].imm),
            (BPF_PSEUDO_MAP_FD, 7)
        );
    }
}

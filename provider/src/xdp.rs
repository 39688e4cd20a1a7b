//! Our own XDP program: UDP to port 4791 (IPv4 without options or IPv6, with or without one
//! 802.1Q tag) goes to the AF_XDP socket of its queue, whatever its destination MAC and IP
//! (multicast datagrams to our groups too: the engine and the transport sort them out);
//! everything else (ARP, ICMP, IGMP and MLD, the TCP connection setup of the tools) goes on
//! to the kernel. No clang: ~35 instructions
//! assembled here and loaded with bpf(2). Attached through a bpf_link, so it disappears when
//! the process dies (the old netlink attach, as libxdp does, outlives a crash).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// How the program is attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XdpMode {
    /// In the driver (veth and real NICs that support it).
    Native,
    /// After the driver, for any interface (slower).
    Generic,
}

// bpf(2) commands, types and flags (linux/bpf.h, linux/if_link.h).
const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_MAP_TYPE_XSKMAP: u32 = 17;
const BPF_PROG_TYPE_XDP: u32 = 6;
const BPF_XDP: u32 = 37;
const BPF_F_XDP_HAS_FRAGS: u32 = 1 << 5;
const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;
const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;
const BPF_FUNC_REDIRECT_MAP: i32 = 51;
const XDP_PASS: i32 = 2;
/// Size of `union bpf_attr` in the headers this was written against; the kernel accepts a
/// shorter or equal size as long as the unused tail is zero.
const BPF_ATTR_SIZE: usize = 144;

/// One eBPF instruction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Insn {
    code: u8,
    dst: u8,
    src: u8,
    off: i16,
    imm: i32,
}

impl Insn {
    fn encode(self) -> u64 {
        u64::from(self.code)
            | u64::from(self.dst & 0xF | (self.src & 0xF) << 4) << 8
            | u64::from(self.off as u16) << 16
            | u64::from(self.imm as u32) << 32
    }
}

/// A jump target in the program being assembled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Label {
    Pass,
    NoVlan,
    Ipv4,
    Ipv6,
    Redirect,
}

/// Assembles instructions with symbolic jump targets.
#[derive(Default)]
struct Assembler {
    insns: Vec<Insn>,
    jumps: Vec<(usize, Label)>,
    labels: Vec<(Label, usize)>,
}

// Opcodes: class | size/op | source.
const ALU64_MOV_REG: u8 = 0xbf;
const ALU64_MOV_IMM: u8 = 0xb7;
const ALU64_ADD_IMM: u8 = 0x07;
const LDX_W: u8 = 0x61;
const LDX_H: u8 = 0x69;
const LDX_B: u8 = 0x71;
const JMP_JA: u8 = 0x05;
const JMP_JEQ_IMM: u8 = 0x15;
const JMP_JNE_IMM: u8 = 0x55;
const JMP_JGT_REG: u8 = 0x2d;
const JMP_CALL: u8 = 0x85;
const JMP_EXIT: u8 = 0x95;
const LD_IMM64: u8 = 0x18;
const BPF_PSEUDO_MAP_FD: u8 = 1;

impl Assembler {
    fn op(&mut self, code: u8, dst: u8, src: u8, off: i16, imm: i32) -> &mut Self {
        self.insns.push(Insn {
            code,
            dst,
            src,
            off,
            imm,
        });
        self
    }

    fn jump(&mut self, code: u8, dst: u8, src: u8, imm: i32, to: Label) -> &mut Self {
        self.jumps.push((self.insns.len(), to));
        self.op(code, dst, src, 0, imm)
    }

    fn label(&mut self, label: Label) -> &mut Self {
        self.labels.push((label, self.insns.len()));
        self
    }

    /// `dst = *(size *)(src + off)`.
    fn load(&mut self, code: u8, dst: u8, src: u8, off: i16) -> &mut Self {
        self.op(code, dst, src, off, 0)
    }

    /// Jumps to `Pass` unless `r2 + len <= data_end (r3)`: the verifier's bounds proof.
    fn need(&mut self, len: i32) -> &mut Self {
        self.op(ALU64_MOV_REG, 4, 2, 0, 0)
            .op(ALU64_ADD_IMM, 4, 0, 0, len)
            .jump(JMP_JGT_REG, 4, 3, 0, Label::Pass)
    }

    fn finish(mut self) -> Vec<Insn> {
        for &(at, to) in &self.jumps {
            let target = self
                .labels
                .iter()
                .find(|(label, _)| *label == to)
                .map(|&(_, pc)| pc);
            let target = target.expect("every label is placed");
            self.insns[at].off = (target as i64 - at as i64 - 1) as i16;
        }
        self.insns
    }
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
    a.need(14)
        .load(LDX_H, 5, 2, 12)
        .jump(JMP_JNE_IMM, 5, 0, ETH_P_8021Q, Label::NoVlan);
    // One 802.1Q tag: step r2 over it so the offsets below stay those of an untagged frame.
    a.need(18)
        .load(LDX_H, 5, 2, 16)
        .op(ALU64_ADD_IMM, 2, 0, 0, 4);
    a.label(Label::NoVlan)
        .jump(JMP_JEQ_IMM, 5, 0, ETH_P_IPV4, Label::Ipv4)
        .jump(JMP_JEQ_IMM, 5, 0, ETH_P_IPV6, Label::Ipv6)
        .jump(JMP_JA, 0, 0, 0, Label::Pass);
    // IPv4 without options (RoCEv2 never sends them), UDP, destination port 4791.
    a.label(Label::Ipv4).need(14 + 20 + 8);
    a.load(LDX_B, 5, 2, 14)
        .jump(JMP_JNE_IMM, 5, 0, 0x45, Label::Pass);
    a.load(LDX_B, 5, 2, 14 + 9)
        .jump(JMP_JNE_IMM, 5, 0, IPPROTO_UDP, Label::Pass);
    a.load(LDX_H, 5, 2, 14 + 20 + 2)
        .jump(JMP_JNE_IMM, 5, 0, ROCEV2_PORT, Label::Pass);
    a.jump(JMP_JA, 0, 0, 0, Label::Redirect);
    // IPv6 with UDP as the next header, destination port 4791.
    a.label(Label::Ipv6).need(14 + 40 + 8);
    a.load(LDX_B, 5, 2, 14 + 6)
        .jump(JMP_JNE_IMM, 5, 0, IPPROTO_UDP, Label::Pass);
    a.load(LDX_H, 5, 2, 14 + 40 + 2)
        .jump(JMP_JNE_IMM, 5, 0, ROCEV2_PORT, Label::Pass);
    // bpf_redirect_map(map, ctx->rx_queue_index, XDP_PASS): no socket on the queue → pass.
    a.label(Label::Redirect)
        .load(LDX_W, 2, 6, 16)
        .op(LD_IMM64, 1, BPF_PSEUDO_MAP_FD, 0, map_fd)
        .op(0, 0, 0, 0, 0)
        .op(ALU64_MOV_IMM, 3, 0, 0, XDP_PASS)
        .op(JMP_CALL, 0, 0, 0, BPF_FUNC_REDIRECT_MAP)
        .op(JMP_EXIT, 0, 0, 0, 0);
    a.label(Label::Pass)
        .op(ALU64_MOV_IMM, 0, 0, 0, XDP_PASS)
        .op(JMP_EXIT, 0, 0, 0, 0);
    a.finish()
}

/// A `union bpf_attr`, zeroed, with fields written at their offsets.
struct BpfAttr([u8; BPF_ATTR_SIZE]);

impl BpfAttr {
    fn new() -> Self {
        BpfAttr([0; BPF_ATTR_SIZE])
    }

    fn u32_at(mut self, offset: usize, value: u32) -> Self {
        self.0[offset..offset + 4].copy_from_slice(&value.to_ne_bytes());
        self
    }

    fn u64_at(mut self, offset: usize, value: u64) -> Self {
        self.0[offset..offset + 8].copy_from_slice(&value.to_ne_bytes());
        self
    }

    /// Runs the bpf(2) command and returns the new file descriptor it gives.
    fn call_for_fd(&mut self, command: libc::c_long) -> io::Result<OwnedFd> {
        let result = self.call(command)?;
        // SAFETY: the commands used with this return a new file descriptor that nothing else
        // owns.
        #[allow(unsafe_code)]
        Ok(unsafe { OwnedFd::from_raw_fd(result as i32) })
    }

    fn call(&mut self, command: libc::c_long) -> io::Result<libc::c_long> {
        // SAFETY: `self.0` is a zero-initialised `union bpf_attr` of the size passed, and every
        // pointer written into it (instructions, license, log, key, value) points to memory
        // that outlives the call.
        #[allow(unsafe_code)]
        let result =
            unsafe { libc::syscall(libc::SYS_bpf, command, self.0.as_mut_ptr(), BPF_ATTR_SIZE) };
        if result < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(result)
        }
    }
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
        let insns: Vec<u64> = program(map.as_raw_fd())
            .into_iter()
            .map(Insn::encode)
            .collect();
        let license = c"GPL";
        let mut log = vec![0u8; 64 * 1024];
        let load = |log_level: u32, log: &mut [u8]| {
            BpfAttr::new()
                .u32_at(0, BPF_PROG_TYPE_XDP)
                .u32_at(4, insns.len() as u32)
                .u64_at(8, insns.as_ptr() as u64)
                .u64_at(16, license.as_ptr() as u64)
                .u32_at(24, log_level)
                .u32_at(28, if log_level > 0 { log.len() as u32 } else { 0 })
                .u64_at(
                    32,
                    if log_level > 0 {
                        log.as_mut_ptr() as u64
                    } else {
                        0
                    },
                )
                .u32_at(44, if frags { BPF_F_XDP_HAS_FRAGS } else { 0 })
                .u32_at(68, BPF_XDP)
                .call_for_fd(BPF_PROG_LOAD)
        };
        let program = match load(0, &mut log) {
            Ok(program) => program,
            Err(first) => {
                // Load again with the verifier's log, to say why.
                let _ = load(1, &mut log);
                let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
                let why = String::from_utf8_lossy(&log[..end]);
                return Err(io::Error::new(
                    first.kind(),
                    format!("loading the XDP program: {first}\n{why}"),
                ));
            }
        };
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

    #[test]
    fn instructions_encode_as_the_kernel_reads_them() {
        // r1 = r6 (mov64 reg): code 0xbf, dst 1, src 6.
        let insn = Insn {
            code: ALU64_MOV_REG,
            dst: 1,
            src: 6,
            off: 0,
            imm: 0,
        };
        assert_eq!(insn.encode().to_le_bytes(), [0xbf, 0x61, 0, 0, 0, 0, 0, 0]);
        let jump = Insn {
            code: JMP_JNE_IMM,
            dst: 5,
            src: 0,
            off: -2,
            imm: 0xb712,
        };
        assert_eq!(
            jump.encode().to_le_bytes(),
            [0x55, 0x05, 0xfe, 0xff, 0x12, 0xb7, 0, 0]
        );
    }

    #[test]
    fn every_jump_lands_inside_the_program_and_it_ends_in_exit() {
        let insns = program(7);
        let jumps = [JMP_JA, JMP_JEQ_IMM, JMP_JNE_IMM, JMP_JGT_REG];
        for (pc, insn) in insns.iter().enumerate() {
            if jumps.contains(&insn.code) {
                let target = pc as i64 + 1 + i64::from(insn.off);
                assert!(
                    target > pc as i64 && (target as usize) < insns.len(),
                    "pc {pc}"
                );
            }
        }
        assert_eq!(insns.last().map(|insn| insn.code), Some(JMP_EXIT));
        let map_load = insns.iter().position(|insn| insn.code == LD_IMM64).unwrap();
        assert_eq!(
            (insns[map_load].src, insns[map_load].imm),
            (BPF_PSEUDO_MAP_FD, 7)
        );
    }
}

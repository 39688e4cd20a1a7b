//! What our two eBPF programs share: a small assembler with symbolic jump targets (no clang,
//! no object files), the bpf(2) call with a `union bpf_attr` written field by field, and a
//! program load that returns the verifier's log when it refuses.
//!
//! The programs: [`xdp`](crate::xdp) (frames to the AF_XDP sockets) and
//! [`ecn_marker`](crate::ecn_marker) (a virtual queue marking CE on a port).

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};

// bpf(2) commands (linux/bpf.h).
pub(crate) const BPF_MAP_CREATE: libc::c_long = 0;
pub(crate) const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
pub(crate) const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
pub(crate) const BPF_PROG_LOAD: libc::c_long = 5;
pub(crate) const BPF_LINK_CREATE: libc::c_long = 28;
/// Size of `union bpf_attr` in the headers this was written against; the kernel accepts a
/// shorter or equal size as long as the unused tail is zero.
const BPF_ATTR_SIZE: usize = 144;

/// One eBPF instruction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Insn {
    pub code: u8,
    pub dst: u8,
    pub src: u8,
    pub off: i16,
    pub imm: i32,
}

impl Insn {
    pub fn encode(self) -> u64 {
        u64::from(self.code)
            | u64::from(self.dst & 0xF | (self.src & 0xF) << 4) << 8
            | u64::from(self.off as u16) << 16
            | u64::from(self.imm as u32) << 32
    }
}

// Opcodes: class | size/op | source.
pub(crate) const ALU64_MOV_REG: u8 = 0xbf;
pub(crate) const ALU64_MOV_IMM: u8 = 0xb7;
pub(crate) const ALU64_ADD_IMM: u8 = 0x07;
pub(crate) const ALU64_ADD_REG: u8 = 0x0f;
pub(crate) const ALU64_SUB_REG: u8 = 0x1f;
pub(crate) const ALU64_MUL_REG: u8 = 0x2f;
pub(crate) const ALU64_DIV_IMM: u8 = 0x37;
pub(crate) const LDX_W: u8 = 0x61;
pub(crate) const LDX_H: u8 = 0x69;
pub(crate) const LDX_B: u8 = 0x71;
pub(crate) const LDX_DW: u8 = 0x79;
pub(crate) const STX_DW: u8 = 0x7b;
pub(crate) const ST_W: u8 = 0x62;
pub(crate) const JMP_JA: u8 = 0x05;
pub(crate) const JMP_JEQ_IMM: u8 = 0x15;
pub(crate) const JMP_JNE_IMM: u8 = 0x55;
pub(crate) const JMP_JGT_IMM: u8 = 0x25;
pub(crate) const JMP_JGT_REG: u8 = 0x2d;
pub(crate) const JMP_JLE_REG: u8 = 0xbd;
pub(crate) const JMP_CALL: u8 = 0x85;
pub(crate) const JMP_EXIT: u8 = 0x95;
pub(crate) const LD_IMM64: u8 = 0x18;
pub(crate) const BPF_PSEUDO_MAP_FD: u8 = 1;

/// Assembles instructions with symbolic jump targets of type `L`.
pub(crate) struct Assembler<L> {
    insns: Vec<Insn>,
    jumps: Vec<(usize, L)>,
    labels: Vec<(L, usize)>,
}

impl<L> Default for Assembler<L> {
    fn default() -> Self {
        Assembler {
            insns: Vec::new(),
            jumps: Vec::new(),
            labels: Vec::new(),
        }
    }
}

impl<L: Copy + PartialEq> Assembler<L> {
    pub fn op(&mut self, code: u8, dst: u8, src: u8, off: i16, imm: i32) -> &mut Self {
        self.insns.push(Insn {
            code,
            dst,
            src,
            off,
            imm,
        });
        self
    }

    pub fn jump(&mut self, code: u8, dst: u8, src: u8, imm: i32, to: L) -> &mut Self {
        self.jumps.push((self.insns.len(), to));
        self.op(code, dst, src, 0, imm)
    }

    pub fn label(&mut self, label: L) -> &mut Self {
        self.labels.push((label, self.insns.len()));
        self
    }

    /// `dst = *(size *)(src + off)`.
    pub fn load(&mut self, code: u8, dst: u8, src: u8, off: i16) -> &mut Self {
        self.op(code, dst, src, off, 0)
    }

    /// `*(size *)(dst + off) = src`.
    pub fn store(&mut self, code: u8, dst: u8, off: i16, src: u8) -> &mut Self {
        self.op(code, dst, src, off, 0)
    }

    /// `dst = map_fd`, as the kernel rewrites it to the map (a two-slot instruction).
    pub fn load_map(&mut self, dst: u8, map_fd: i32) -> &mut Self {
        self.op(LD_IMM64, dst, BPF_PSEUDO_MAP_FD, 0, map_fd)
            .op(0, 0, 0, 0, 0)
    }

    /// Jumps to `fail` unless `r2 + len <= data_end (r3)`: the verifier's bounds proof.
    pub fn need(&mut self, len: i32, fail: L) -> &mut Self {
        self.op(ALU64_MOV_REG, 4, 2, 0, 0)
            .op(ALU64_ADD_IMM, 4, 0, 0, len)
            .jump(JMP_JGT_REG, 4, 3, 0, fail)
    }

    pub fn finish(mut self) -> Vec<Insn> {
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

/// A `union bpf_attr`, zeroed, with fields written at their offsets.
pub(crate) struct BpfAttr([u8; BPF_ATTR_SIZE]);

impl BpfAttr {
    pub fn new() -> Self {
        BpfAttr([0; BPF_ATTR_SIZE])
    }

    pub fn u32_at(mut self, offset: usize, value: u32) -> Self {
        self.0[offset..offset + 4].copy_from_slice(&value.to_ne_bytes());
        self
    }

    pub fn u64_at(mut self, offset: usize, value: u64) -> Self {
        self.0[offset..offset + 8].copy_from_slice(&value.to_ne_bytes());
        self
    }

    /// Runs the bpf(2) command and returns the new file descriptor it gives.
    pub fn call_for_fd(&mut self, command: libc::c_long) -> io::Result<OwnedFd> {
        let result = self.call(command)?;
        // SAFETY: the commands used with this return a new file descriptor that nothing else
        // owns.
        #[allow(unsafe_code)]
        Ok(unsafe { OwnedFd::from_raw_fd(result as i32) })
    }

    pub fn call(&mut self, command: libc::c_long) -> io::Result<libc::c_long> {
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

/// Loads a GPL program of `prog_type` (with `flags` and `expected_attach_type`); when the
/// verifier refuses it, loads it again with the log and returns that in the error.
pub(crate) fn load_program(
    what: &str,
    prog_type: u32,
    insns: &[Insn],
    flags: u32,
    expected_attach_type: u32,
) -> io::Result<OwnedFd> {
    let insns: Vec<u64> = insns.iter().map(|insn| insn.encode()).collect();
    let license = c"GPL";
    let mut log = vec![0u8; 64 * 1024];
    let load = |log_level: u32, log: &mut [u8]| {
        BpfAttr::new()
            .u32_at(0, prog_type)
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
            .u32_at(44, flags)
            .u32_at(68, expected_attach_type)
            .call_for_fd(BPF_PROG_LOAD)
    };
    load(0, &mut log).map_err(|first| {
        // Load again with the verifier's log, to say why.
        let _ = load(1, &mut log);
        let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
        let why = String::from_utf8_lossy(&log[..end]);
        io::Error::new(first.kind(), format!("loading the {what}: {first}\n{why}"))
    })
}

/// Every jump of `insns` lands inside it, after itself, and it ends in `exit`.
#[cfg(test)]
pub(crate) fn check_jumps(insns: &[Insn]) {
    let jumps = [
        JMP_JA,
        JMP_JEQ_IMM,
        JMP_JNE_IMM,
        JMP_JGT_IMM,
        JMP_JGT_REG,
        JMP_JLE_REG,
    ];
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
}

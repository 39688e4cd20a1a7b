//! Tag-matching header (TMH): the 16 bytes at the start of a SEND's payload that a receiver
//! with a tag-matching SRQ (`IBV_SRQT_TM`) matches against its posted tags (rdma-core's
//! `struct ibv_tmh` in `infiniband/tm_types.h`). It is payload, not a transport header: the
//! BTH and the opcode table know nothing of it; only a responder on a tag-matching SRQ reads
//! it. A rendezvous request (opcode [`TmOpcode::Rndv`]) carries a rendezvous header right
//! after it ([`rvh`](crate::rvh)).

use core::fmt;

use crate::{Error, Result};

mod field {
    use crate::Field;

    pub const OPCODE: usize = 0;
    /// Three bytes the format says must be zero; receivers ignore them (rdma-core's own
    /// tests send whatever the buffer held there).
    pub const RESERVED: Field = 1..4;
    pub const APP_CTX: Field = 4..8;
    pub const TAG: Field = 8..16;
}

fixed_header_packet! {
    16;
    /// A read/write view of a TMH.
}

/// What a tagged message is (`enum ibv_tmh_op`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum TmOpcode {
    /// Not tagged: goes to an ordinary receive (`IBV_TMH_NO_TAG`).
    NoTag = 0,
    /// A rendezvous request: the receiver reads the data itself (`IBV_TMH_RNDV`).
    Rndv = 1,
    /// The receiver's word that it read a rendezvous sender's data (`IBV_TMH_FIN`).
    Fin = 2,
    /// The data follows the header (`IBV_TMH_EAGER`).
    Eager = 3,
}

impl TmOpcode {
    /// The opcode of the byte's value; the values rdma-core does not define are an error.
    pub fn from_u8(value: u8) -> Result<TmOpcode> {
        Ok(match value {
            0 => TmOpcode::NoTag,
            1 => TmOpcode::Rndv,
            2 => TmOpcode::Fin,
            3 => TmOpcode::Eager,
            _ => return Err(Error),
        })
    }
}

field_accessors! {
    /// The raw opcode byte.
    opcode_byte / set_opcode_byte: u8 @ OPCODE;
    /// The sender's opaque value, reported with the tag on a match.
    app_ctx / set_app_ctx: u32 @ APP_CTX;
    /// The tag matched against the receiver's.
    tag / set_tag: u64 @ TAG;
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// The opcode; a value rdma-core does not define is an error.
    pub fn opcode(&self) -> Result<TmOpcode> {
        TmOpcode::from_u8(self.opcode_byte())
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the opcode and zeroes the reserved bytes after it.
    pub fn set_opcode(&mut self, value: TmOpcode) {
        let buffer = self.buffer.as_mut();
        buffer[field::OPCODE] = value as u8;
        buffer[field::RESERVED].fill(0);
    }
}

header_repr! {
    /// A parsed TMH.
    parse: "Parses a TMH; an opcode rdma-core does not define is an error, the reserved bytes are ignored.";
    emit: "Writes the header, zeroing the reserved bytes.";
    /// What the message is.
    opcode: TmOpcode = [opcode?] / set_opcode,
    /// The sender's opaque value.
    app_ctx: u32 = [app_ctx] / set_app_ctx,
    /// The tag.
    tag: u64 = [tag] / set_tag,
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "tmh({:?} app_ctx={:#010x} tag={:#x})",
            self.opcode, self.app_ctx, self.tag
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An eager header as UCX's rc_mlx5 builds it (`uct_rc_mlx5_fill_tmh`).
    static HEADER_BYTES: [u8; 16] = [
        0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x2a, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x12,
        0x34,
    ];

    const REPR: Repr = Repr {
        opcode: TmOpcode::Eager,
        app_ctx: 42,
        tag: 0x1234,
    };

    #[test]
    fn deconstruct() {
        let packet = Packet::new_checked(&HEADER_BYTES[..]).unwrap();
        assert_eq!(packet.opcode(), Ok(TmOpcode::Eager));
        assert_eq!(packet.app_ctx(), 42);
        assert_eq!(packet.tag(), 0x1234);
    }

    #[test]
    fn construct() {
        let mut bytes = [0xA5; 16];
        let mut packet = Packet::new_unchecked(&mut bytes[..]);
        packet.set_opcode(TmOpcode::Eager);
        packet.set_app_ctx(42);
        packet.set_tag(0x1234);
        assert_eq!(bytes, HEADER_BYTES);
    }

    parse_emit_tests!(HEADER_BYTES, REPR);

    /// rdma-core's test_tag_matching writes only the opcode and the tag over a buffer of
    /// 'c's: the reserved bytes are whatever was there.
    #[test]
    fn reserved_bytes_are_ignored() {
        let mut bytes = HEADER_BYTES;
        bytes[1..4].copy_from_slice(b"ccc");
        assert_eq!(
            Repr::parse(&Packet::new_checked(&bytes[..]).unwrap()),
            Ok(REPR)
        );
    }

    #[test]
    fn undefined_opcodes_and_short_buffers_are_rejected() {
        for opcode in [4, 0x80, 0xFF] {
            let mut bytes = HEADER_BYTES;
            bytes[0] = opcode;
            assert_eq!(
                Repr::parse(&Packet::new_checked(&bytes[..]).unwrap()),
                Err(Error)
            );
        }
        assert!(Packet::new_checked(&HEADER_BYTES[..15]).is_err());
    }
}

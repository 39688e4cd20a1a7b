//! RDMA extended transport header: where an RDMA WRITE, READ, FLUSH or ATOMIC WRITE goes.

use core::fmt;

mod field {
    use crate::Field;

    pub const VIRTUAL_ADDRESS: Field = 0..8;
    pub const RKEY: Field = 8..12;
    pub const DMA_LENGTH: Field = 12..16;
}

fixed_header_packet! {
    16;
    /// A read/write view of a RETH.
}

remote_address_accessors!("Remote virtual address of the first byte.");

field_accessors! {
    /// Length of the whole operation in bytes.
    dma_length / set_dma_length: u32 @ DMA_LENGTH;
}

header_repr! {
    /// A parsed RETH.
    parse: "Parses a RETH (every bit pattern is valid).";
    emit: "Writes the header.";
    /// Remote virtual address.
    virtual_address: u64 = [virtual_address] / set_virtual_address,
    /// Remote key.
    rkey: u32 = [rkey] / set_rkey,
    /// Length of the whole operation.
    dma_length: u32 = [dma_length] / set_dma_length,
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "reth(va={:#x} rkey={:#010x} len={})",
            self.virtual_address, self.rkey, self.dma_length
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The RETH of an RC_RDMA_WRITE_FIRST in write_bw.pcap.
    static HEADER_BYTES: [u8; 16] = [
        0x00, 0x00, 0x55, 0x58, 0xd4, 0x3d, 0xd0, 0x00, 0x00, 0x00, 0x04, 0x48, 0x00, 0x00, 0x10,
        0x00,
    ];

    const REPR: Repr = Repr {
        virtual_address: 0x5558_d43d_d000,
        rkey: 0x448,
        dma_length: 4096,
    };

    #[test]
    fn deconstruct() {
        let packet = Packet::new_checked(&HEADER_BYTES[..]).unwrap();
        assert_eq!(packet.virtual_address(), 0x5558_d43d_d000);
        assert_eq!(packet.rkey(), 0x448);
        assert_eq!(packet.dma_length(), 4096);
    }

    #[test]
    fn construct() {
        let mut bytes = [0xA5; 16];
        let mut packet = Packet::new_unchecked(&mut bytes[..]);
        packet.set_virtual_address(0x5558_d43d_d000);
        packet.set_rkey(0x448);
        packet.set_dma_length(4096);
        assert_eq!(bytes, HEADER_BYTES);
    }

    parse_emit_tests!(HEADER_BYTES, REPR);

    #[test]
    fn short_buffer_is_rejected() {
        assert!(Packet::new_checked(&HEADER_BYTES[..15]).is_err());
    }
}

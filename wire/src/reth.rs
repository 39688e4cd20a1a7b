//! RDMA extended transport header: where an RDMA WRITE, READ, FLUSH or ATOMIC WRITE goes.

use core::fmt;

use crate::{read_u32, Result};

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

impl<T: AsRef<[u8]>> Packet<T> {
    /// Length of the whole operation in bytes.
    pub fn dma_length(&self) -> u32 {
        read_u32(&self.buffer.as_ref()[field::DMA_LENGTH])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the DMA length.
    pub fn set_dma_length(&mut self, length: u32) {
        self.buffer.as_mut()[field::DMA_LENGTH].copy_from_slice(&length.to_be_bytes());
    }
}

/// A parsed RETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    /// Remote virtual address.
    pub virtual_address: u64,
    /// Remote key.
    pub rkey: u32,
    /// Length of the whole operation.
    pub dma_length: u32,
}

fixed_len_repr!();

impl Repr {
    /// Parses a RETH (every bit pattern is valid).
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        Ok(Repr {
            virtual_address: packet.virtual_address(),
            rkey: packet.rkey(),
            dma_length: packet.dma_length(),
        })
    }

    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_virtual_address(self.virtual_address);
        packet.set_rkey(self.rkey);
        packet.set_dma_length(self.dma_length);
    }
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

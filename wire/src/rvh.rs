//! Rendezvous header (RVH): where a rendezvous sender's data lies, right after the
//! [TMH](crate::tmh) of a rendezvous request (rdma-core's `struct ibv_rvh`: virtual address,
//! R_Key, length, big-endian). It is laid out byte for byte as a [RETH](crate::reth), and its
//! receiver uses it as one, reading the data with an RDMA READ: the RETH's view and `Repr`
//! are the RVH's.

pub use crate::reth::{Packet, Repr, HEADER_LEN};

#[cfg(test)]
mod tests {
    use super::*;

    /// The header UCX's rc_mlx5 writes (`uct_rc_mlx5_fill_rvh`) for 4096 bytes at
    /// 0x7f00_1234_5000 under R_Key 0x1f2e.
    #[test]
    fn fields_are_those_of_struct_ibv_rvh() {
        let bytes = [
            0x00, 0x00, 0x7f, 0x00, 0x12, 0x34, 0x50, 0x00, 0x00, 0x00, 0x1f, 0x2e, 0x00, 0x00,
            0x10, 0x00,
        ];
        let rvh = Repr::parse(&Packet::new_checked(&bytes[..]).unwrap()).unwrap();
        assert_eq!(rvh.virtual_address, 0x7f00_1234_5000);
        assert_eq!(rvh.rkey, 0x1f2e);
        assert_eq!(rvh.dma_length, 4096);
        assert_eq!(HEADER_LEN, 16);
    }
}

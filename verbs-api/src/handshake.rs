//! The typed handshake that connects two QPs: what one side tells the other, and how the
//! connection is set up.

use roce_transport::qp_state::{PathMtu, RetryConfig, CONNECT_RD_ATOMIC};
use roce_wire::Psn;

use crate::device::Gid;
use crate::error::Error;

/// What one side tells the other to connect (rc_pingpong's `LID:QPN:PSN:GID`), as a type:
/// send it with [`to_bytes`](Self::to_bytes) over any channel, connect with what comes back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpEndpoint {
    /// The QP number.
    pub qpn: u32,
    /// The PSN of its first request.
    pub psn: Psn,
    /// Its GID (IPv4-mapped on RoCEv2 over IPv4).
    pub gid: Gid,
}

impl QpEndpoint {
    /// Bytes on the wire of [`to_bytes`](Self::to_bytes).
    pub const LEN: usize = 24;

    /// QPN and PSN as big-endian `u32`s, then the GID.
    pub fn to_bytes(&self) -> [u8; Self::LEN] {
        let mut bytes = [0u8; Self::LEN];
        bytes[0..4].copy_from_slice(&self.qpn.to_be_bytes());
        bytes[4..8].copy_from_slice(&self.psn.value().to_be_bytes());
        bytes[8..24].copy_from_slice(&self.gid);
        bytes
    }

    /// The inverse of [`to_bytes`](Self::to_bytes); checks the QPN and PSN are 24-bit.
    pub fn from_bytes(bytes: &[u8]) -> Result<QpEndpoint, Error> {
        let bytes: &[u8; Self::LEN] = bytes
            .try_into()
            .map_err(|_| Error::InvalidArgument("a QP endpoint is 24 bytes"))?;
        let word = |at: usize| {
            u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
        };
        let (qpn, psn) = (word(0), word(4));
        if qpn > 0xFF_FFFF || psn > 0xFF_FFFF {
            return Err(Error::InvalidArgument("QPN and PSN are 24-bit"));
        }
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&bytes[8..24]);
        Ok(QpEndpoint {
            qpn,
            psn: Psn::new(psn),
            gid,
        })
    }
}

/// How [`Qp::connect`](crate::Qp::connect) sets the connection up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectOptions {
    /// Path MTU (both sides must agree).
    pub mtu: PathMtu,
    /// ACK timeout, retries, RNR behaviour.
    pub retry: RetryConfig,
    /// Our GID index, which must name the IPv4-mapped GID of the device's address.
    pub sgid_index: u8,
    /// IPv4 TTL of our packets.
    pub hop_limit: u8,
    /// READs and atomics we keep outstanding towards the peer (at most what it offers).
    pub max_rd_atomic: u8,
    /// READs and atomics of the peer we hold state for.
    pub max_dest_rd_atomic: u8,
}

impl Default for ConnectOptions {
    /// rc_pingpong's: path MTU 1024, its timers, GID index 1, TTL 64.
    fn default() -> Self {
        ConnectOptions {
            mtu: PathMtu::Mtu1024,
            retry: RetryConfig::RC_PINGPONG,
            sgid_index: 1,
            hop_limit: 64,
            max_rd_atomic: CONNECT_RD_ATOMIC,
            max_dest_rd_atomic: CONNECT_RD_ATOMIC,
        }
    }
}

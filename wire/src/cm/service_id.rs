//! Service IDs as rdma_cm forms them: IBTA Annex A11 "RDMA IP CM Service",
//! `0x0000000001` in bits 63..24, the IP protocol in bits 23..16, the port in bits 15..0
//! (the kernel's `rdma_get_service_id`: `(port space << 16) + port`).

use core::fmt;

/// An rdma_cm port space (`enum rdma_ucm_port_space`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PortSpace {
    /// IPoIB (`RDMA_PS_IPOIB`).
    Ipoib = 0x0002,
    /// Reliable connected, the TCP-like space (`RDMA_PS_TCP`).
    Tcp = 0x0106,
    /// Unreliable datagram, the UDP-like space (`RDMA_PS_UDP`).
    Udp = 0x0111,
    /// Native IB service IDs (`RDMA_PS_IB`).
    Ib = 0x013F,
}

impl PortSpace {
    const ALL: [PortSpace; 4] = [
        PortSpace::Ipoib,
        PortSpace::Tcp,
        PortSpace::Udp,
        PortSpace::Ib,
    ];
}

/// A 64-bit CM service ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ServiceId(pub u64);

impl ServiceId {
    /// The service ID rdma_cm listens on and connects to for `port` in `space`.
    pub const fn rdma_ip(space: PortSpace, port: u16) -> ServiceId {
        ServiceId(((space as u64) << 16) | port as u64)
    }

    /// The port space, when this is an rdma_cm service ID.
    pub fn port_space(self) -> Option<PortSpace> {
        if self.0 >> 32 != 0 {
            return None;
        }
        let space = (self.0 >> 16) as u16;
        PortSpace::ALL
            .into_iter()
            .find(|&known| known as u16 == space)
    }

    /// The port in the low 16 bits.
    pub const fn port(self) -> u16 {
        self.0 as u16
    }
}

impl fmt::Display for ServiceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.port_space() {
            Some(PortSpace::Tcp) => write!(f, "tcp:{}", self.port()),
            Some(PortSpace::Udp) => write!(f, "udp:{}", self.port()),
            _ => write!(f, "{:#018x}", self.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rping_service_id() {
        // rping's default port 7174 in the REQ of rping_rdmacm.pcap.
        let id = ServiceId(0x0000_0000_0106_1c06);
        assert_eq!(id, ServiceId::rdma_ip(PortSpace::Tcp, 7174));
        assert_eq!(id.port_space(), Some(PortSpace::Tcp));
        assert_eq!(id.port(), 7174);
    }

    #[test]
    fn udp_space_and_foreign_ids() {
        assert_eq!(ServiceId::rdma_ip(PortSpace::Udp, 1).0, 0x0111_0001);
        assert_eq!(ServiceId(0x1_0106_0001).port_space(), None);
        assert_eq!(ServiceId(0x0200_0001).port_space(), None);
    }
}

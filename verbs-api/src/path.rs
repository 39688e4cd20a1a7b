//! Destinations: whether packets can go from one of our GIDs to a peer's, and learning the
//! peer's MAC (from the kernel's table, or as the caller gave it).

use std::net::Ipv6Addr;

use roce_wire::multicast::is_multicast_gid;

use crate::backend::Neighbours;
use crate::error::Error;
use crate::neighbour;
use crate::shared::Shared;

impl Shared {
    /// Whether packets can go from the GID at `index` to `dgid`.
    pub(crate) fn check_path(&self, index: u8, dgid: [u8; 16]) -> Result<(), Error> {
        let gid = self
            .device
            .gid(usize::from(index))
            .ok_or(Error::NoGid(index))?;
        let v4 = |gid: [u8; 16]| Ipv6Addr::from(gid).to_ipv4_mapped().is_some();
        if v4(gid) != v4(dgid) {
            return Err(Error::InvalidArgument(
                "source and destination GIDs of different families (IPv4-mapped and IPv6)",
            ));
        }
        match Ipv6Addr::from(gid).to_ipv4_mapped() {
            // IPv4 leaves from the first address only.
            Some(ip) if Some(ip) == self.device.ipv4() => Ok(()),
            Some(_) => Err(Error::Unsupported(
                "source GIDs other than the IPv4-mapped GID of the first address",
            )),
            None if self.neighbours == Neighbours::NotNeeded => Err(Error::Unsupported(
                "IPv6 GIDs over kernel UDP sockets (use AF_XDP)",
            )),
            None => Ok(()),
        }
    }

    /// Makes sure the engine can reach `dgid`: its MAC is known, it is one of our own
    /// GIDs (the engine loops those packets back without the wire, as rxe does), or it is a
    /// multicast group (whose MAC is the group's).
    pub(crate) fn resolve(&self, dgid: [u8; 16]) -> Result<(), Error> {
        if self.device.gids.contains(&dgid) || is_multicast_gid(&dgid) {
            return Ok(());
        }
        let Some(ip) = Ipv6Addr::from(dgid).to_ipv4_mapped() else {
            return self.resolve6(Ipv6Addr::from(dgid));
        };
        match self.neighbours {
            Neighbours::NotNeeded => {
                // The engine still wants an entry; the kernel picks the real MAC.
                self.lock()?.engine.add_neighbour(ip, [0; 6]);
                Ok(())
            }
            Neighbours::Static => {
                let known = self
                    .lock()?
                    .engine
                    .addressing()
                    .neighbours
                    .contains_key(&ip);
                known.then_some(()).ok_or(Error::NoNeighbour(ip))
            }
            Neighbours::Kernel => {
                // Outside the lock: resolving may take a few hundred milliseconds.
                let mac = neighbour::resolve(ip, &self.device.name)?;
                self.lock()?.engine.add_neighbour(ip, mac);
                Ok(())
            }
        }
    }

    fn resolve6(&self, ip: Ipv6Addr) -> Result<(), Error> {
        match self.neighbours {
            Neighbours::NotNeeded => Err(Error::Unsupported(
                "IPv6 GIDs over kernel UDP sockets (use AF_XDP)",
            )),
            Neighbours::Static => {
                let known = self.lock()?.engine.knows_neighbour6(&ip);
                known.then_some(()).ok_or(Error::NoNeighbour6(ip))
            }
            Neighbours::Kernel => {
                let device = &self.device;
                let mac = neighbour::resolve6(ip, &device.name, device.ifindex)?;
                self.lock()?.engine.add_neighbour6(ip, mac);
                Ok(())
            }
        }
    }

    /// Learns an IPv6 neighbour's MAC (for contexts over a caller's backend, whose
    /// neighbours are static).
    pub(crate) fn add_neighbour6(&self, ip: Ipv6Addr, mac: [u8; 6]) -> Result<(), Error> {
        self.lock()?.engine.add_neighbour6(ip, mac);
        Ok(())
    }
}

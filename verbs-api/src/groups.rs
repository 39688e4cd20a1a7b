//! What a context holds of multicast, beside the endpoint's groups: each QP's attachments
//! as uverbs names them, the interface's MAC filter and the host's IP membership of groups,
//! as the kernel keeps them for rxe. It lives in the core, beside the endpoint it keeps in
//! step with, so every change happens under the one lock.
//!
//! - A QP's attachments are named by GID and multicast LID, as uverbs keeps them: attaching
//!   the same pair twice is no change, detaching a pair never attached is `EINVAL`, and a QP
//!   with attachments left refuses `ibv_destroy_qp` (`EBUSY`). The LID means nothing on RoCE
//!   (IBTA A17.5.6): the endpoint's groups are by GID alone.
//! - The interface accepts a group's MAC while a QP of this context is attached to the
//!   group (rxe's `dev_mc_add` on a group's first QP, `dev_mc_del` after its last). rxe adds
//!   the IPv6 mapping of the GID's last four bytes even for an IPv4-mapped group
//!   (`33:33:e0:…`), a MAC IPv4 frames never carry; we add the MAC the group's frames do
//!   carry (`01:00:5e:…` for IPv4), so a filtering NIC lets them through.
//! - The host's IP membership of an IPv4 group (rdma_cm's full-member join): a kernel socket
//!   joined to it, so the kernel sends the IGMP reports and the leave; while it lasts the
//!   endpoint loops our own datagrams to the group back to our attached QPs.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::Ipv4Addr;

use roce_provider::multicast::{IpGroup, MacFilter};
use roce_transport::Endpoint;
use roce_wire::multicast::multicast_mac;

use crate::backend::BackendKind;
use crate::device::{Device, Gid};
use crate::error::Error;

/// A context's multicast state (see the module's docs).
#[derive(Default)]
pub(crate) struct Memberships {
    /// The interface's MAC filter; `None` for a backend without one: a caller's backend
    /// (no kernel interface: membership is ours alone), or kernel UDP sockets.
    filter: Option<MacFilter>,
    /// Whether attaching is refused (kernel UDP sockets receive no group's datagrams).
    refused: bool,
    /// The MACs this context added to the filter.
    macs: BTreeSet<[u8; 6]>,
    /// Each QP's attachments (GID, LID), by QP number (never reused).
    attachments: BTreeMap<u32, Vec<(Gid, u16)>>,
    /// The IPv4 groups the host is joined to for us (the socket, none for a caller's
    /// backend), with how many joins hold each.
    ip_groups: HashMap<Ipv4Addr, (Option<IpGroup>, usize)>,
    /// The interface, for joins.
    ifindex: u32,
}

impl Memberships {
    /// The state of a context on `device` over `kind`, made in the opener's namespace.
    pub(crate) fn new(device: &Device, kind: &BackendKind) -> std::io::Result<Memberships> {
        let filter = match kind {
            BackendKind::AfXdp(_) | BackendKind::Switch(_) => Some(MacFilter::new(device.ifindex)?),
            _ => None,
        };
        Ok(Memberships {
            filter,
            refused: matches!(kind, BackendKind::Udp { .. }),
            macs: BTreeSet::new(),
            attachments: BTreeMap::new(),
            ip_groups: HashMap::new(),
            ifindex: device.ifindex,
        })
    }

    /// `ibv_attach_mcast` of the QP `qpn`, the attachment named by `gid` and `lid`.
    pub(crate) fn attach(
        &mut self,
        endpoint: &mut Endpoint,
        qpn: u32,
        gid: Gid,
        lid: u16,
    ) -> Result<(), Error> {
        if self.refused {
            return Err(Error::Unsupported(
                "multicast over kernel UDP sockets (use AF_XDP)",
            ));
        }
        if self
            .attachments
            .get(&qpn)
            .is_some_and(|attached| attached.contains(&(gid, lid)))
        {
            return Ok(());
        }
        if endpoint.attach_mcast(qpn, gid)? {
            if let Err(error) = self.refresh_filter(endpoint) {
                // As rxe, whose group is not made when its MAC cannot be added.
                let _ = endpoint.detach_mcast(qpn, gid);
                return Err(error);
            }
        }
        self.attachments.entry(qpn).or_default().push((gid, lid));
        Ok(())
    }

    /// `ibv_detach_mcast`: `EINVAL` unless the QP has the attachment `gid` and `lid`.
    pub(crate) fn detach(
        &mut self,
        endpoint: &mut Endpoint,
        qpn: u32,
        gid: Gid,
        lid: u16,
    ) -> Result<(), Error> {
        let attached = self.attachments.entry(qpn).or_default();
        let Some(at) = attached.iter().position(|&pair| pair == (gid, lid)) else {
            return Err(Error::InvalidArgument("the QP has no such attachment"));
        };
        attached.remove(at);
        if endpoint.detach_mcast(qpn, gid)? {
            self.refresh_filter(endpoint)?;
        }
        Ok(())
    }

    /// How many attachments the QP `qpn` has.
    pub(crate) fn attachments(&self, qpn: u32) -> usize {
        self.attachments.get(&qpn).map_or(0, Vec::len)
    }

    /// After the QP `qpn` was destroyed (and left its groups in `endpoint`): forgets its
    /// attachments and takes the MACs of groups that went with it out of the filter.
    pub(crate) fn forget_qp(&mut self, endpoint: &Endpoint, qpn: u32) {
        if self.attachments.remove(&qpn).is_some() {
            let _ = self.refresh_filter(endpoint);
        }
    }

    /// Brings the interface's filter in line with `endpoint`'s groups: a MAC is added when
    /// a group needs it, removed when none does.
    fn refresh_filter(&mut self, endpoint: &Endpoint) -> Result<(), Error> {
        let Some(filter) = &self.filter else {
            return Ok(());
        };
        let wanted: BTreeSet<[u8; 6]> = endpoint.mcast_groups().filter_map(multicast_mac).collect();
        for &mac in self.macs.difference(&wanted) {
            // As rxe ignores `dev_mc_del`'s answer: the group is gone either way.
            let _ = filter.remove(mac);
        }
        self.macs.retain(|mac| wanted.contains(mac));
        for &mac in &wanted {
            if !self.macs.contains(&mac) {
                filter.add(mac)?;
                self.macs.insert(mac);
            }
        }
        Ok(())
    }

    /// Joins the host to the IPv4 group `group` on the interface (IGMP), or counts one more
    /// join of it; our own datagrams to it loop back from now on.
    pub(crate) fn join_ip(
        &mut self,
        endpoint: &mut Endpoint,
        group: Ipv4Addr,
    ) -> Result<(), Error> {
        if let Some((_, count)) = self.ip_groups.get_mut(&group) {
            *count += 1;
            return Ok(());
        }
        let membership = match self.filter {
            None => None,
            Some(_) => Some(IpGroup::join(group, self.ifindex)?),
        };
        self.ip_groups.insert(group, (membership, 1));
        endpoint.set_mcast_loopback(group.to_ipv6_mapped().octets(), true);
        Ok(())
    }

    /// Undoes one [`join_ip`](Self::join_ip); the last leaves the group (the kernel sends
    /// the leave) and stops the loopback.
    pub(crate) fn leave_ip(&mut self, endpoint: &mut Endpoint, group: Ipv4Addr) {
        let Some((_, count)) = self.ip_groups.get_mut(&group) else {
            return;
        };
        *count -= 1;
        if *count == 0 {
            self.ip_groups.remove(&group);
            endpoint.set_mcast_loopback(group.to_ipv6_mapped().octets(), false);
        }
    }
}

impl Drop for Memberships {
    fn drop(&mut self) {
        if let Some(filter) = &self.filter {
            for mac in std::mem::take(&mut self.macs) {
                let _ = filter.remove(mac);
            }
        }
    }
}

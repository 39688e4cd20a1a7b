//! UD multicast (`ibv_attach_mcast`, `ibv_detach_mcast`) and the interface's part in it, as
//! the kernel plays it for rxe:
//!
//! - A QP's attachments are named by GID and multicast LID, as uverbs keeps them: attaching
//!   the same pair twice is no change, detaching a pair never attached is `EINVAL`, and a QP
//!   with attachments left refuses `ibv_destroy_qp` (`EBUSY`; [`Qp::mcast_attachments`]).
//!   The LID means nothing on RoCE (IBTA A17.5.6): the transport's groups are by GID alone.
//! - The interface accepts a group's MAC while a QP of this context is attached to the
//!   group (rxe's `dev_mc_add` on a group's first QP, `dev_mc_del` after its last). rxe
//!   adds the IPv6 mapping of the GID's last four bytes even for an IPv4-mapped group
//!   (`33:33:e0:…`), a MAC IPv4 frames never carry; we add the MAC the group's frames do
//!   carry (`01:00:5e:…` for IPv4), so a filtering NIC lets them through.
//! - The host's IP membership of a group ([`Shared::join_ip_group`], rdma_cm's full-member
//!   join): a kernel socket joined to it (the kernel sends the IGMP reports and the leave),
//!   and the endpoint loops our own datagrams to it back to our attached QPs.
//!
//! Lock order: these memberships, then the device's core.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::Ipv4Addr;
use std::sync::MutexGuard;

use roce_provider::multicast::{IpGroup, MacFilter};
use roce_wire::multicast::multicast_mac;

use crate::backend::BackendKind;
use crate::device::{Device, Gid};
use crate::error::Error;
use crate::qp::Qp;
use crate::shared::Shared;

/// What a context holds of the interface's multicast state.
pub(crate) struct Memberships {
    /// The interface's MAC filter; `None` for a backend without one: a caller's backend
    /// (nothing to filter), or kernel UDP sockets (refused: they receive no group's
    /// datagrams).
    filter: Option<MacFilter>,
    /// Whether attaching is refused (kernel UDP sockets).
    refused: bool,
    /// The MACs this context added to the filter.
    macs: BTreeSet<[u8; 6]>,
    /// Each QP's attachments (GID, LID), by QP number (never reused).
    attachments: BTreeMap<u32, Vec<(Gid, u16)>>,
    /// The IPv4 groups the host is joined to for us, with how many joins hold each.
    ip_groups: HashMap<Ipv4Addr, (Option<IpGroup>, usize)>,
    /// The interface, for joins.
    ifindex: u32,
}

impl Memberships {
    /// The state of a context on `device` over `kind`, made in the opener's namespace.
    pub(crate) fn new(device: &Device, kind: &BackendKind) -> std::io::Result<Memberships> {
        let filter = match kind {
            BackendKind::AfXdp(_) => Some(MacFilter::new(&device.name)?),
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

impl Shared {
    fn memberships(&self) -> Result<MutexGuard<'_, Memberships>, Error> {
        self.multicast.lock().map_err(|_| Error::Poisoned)
    }

    /// Brings the interface's filter in line with the endpoint's groups: a MAC is added when
    /// a group needs it, removed when none does. Called with the memberships held.
    fn refresh_filter(&self, members: &mut Memberships) -> Result<(), Error> {
        let wanted: BTreeSet<[u8; 6]> = {
            let mut core = self.lock()?;
            core.endpoint()
                .mcast_groups()
                .filter_map(multicast_mac)
                .collect()
        };
        let Some(filter) = &members.filter else {
            return Ok(());
        };
        for &mac in members.macs.difference(&wanted) {
            // As rxe ignores `dev_mc_del`'s answer: the group is gone either way.
            let _ = filter.remove(mac);
        }
        members.macs.retain(|mac| wanted.contains(mac));
        for &mac in &wanted {
            if !members.macs.contains(&mac) {
                filter.add(mac)?;
                members.macs.insert(mac);
            }
        }
        Ok(())
    }

    /// Joins the host to the IPv4 group `group` on the device's interface (IGMP), or counts
    /// one more join of it; our own datagrams to it loop back from now on.
    pub(crate) fn join_ip_group(&self, group: Ipv4Addr) -> Result<(), Error> {
        let mut members = self.memberships()?;
        let ifindex = members.ifindex;
        let first = !members.ip_groups.contains_key(&group);
        if first {
            let membership = match members.filter {
                // A caller's backend has no kernel interface: membership is ours alone.
                None => None,
                Some(_) => Some(IpGroup::join(group, ifindex)?),
            };
            members.ip_groups.insert(group, (membership, 0));
        }
        if let Some((_, count)) = members.ip_groups.get_mut(&group) {
            *count += 1;
        }
        if first {
            let mgid = group.to_ipv6_mapped().octets();
            self.lock()?.endpoint().set_mcast_loopback(mgid, true);
        }
        Ok(())
    }

    /// Undoes one [`join_ip_group`](Self::join_ip_group); the last leaves the group (the
    /// kernel sends the leave) and stops the loopback.
    pub(crate) fn leave_ip_group(&self, group: Ipv4Addr) -> Result<(), Error> {
        let mut members = self.memberships()?;
        let Some((_, count)) = members.ip_groups.get_mut(&group) else {
            return Ok(());
        };
        *count -= 1;
        if *count == 0 {
            members.ip_groups.remove(&group);
            drop(members);
            let mgid = group.to_ipv6_mapped().octets();
            self.lock()?.endpoint().set_mcast_loopback(mgid, false);
        }
        Ok(())
    }
}

impl Qp {
    /// Attaches this UD QP to the multicast group `gid` (`ibv_attach_mcast`): datagrams to
    /// the group reach it from now on (those from our own QPs only while the host is a
    /// member of the group). `lid` is ignored on RoCE but names the attachment with `gid`.
    pub fn attach_mcast(&self, gid: Gid, lid: u16) -> Result<(), Error> {
        let shared = self.shared();
        let mut members = shared.memberships()?;
        if members.refused {
            return Err(Error::Unsupported(
                "multicast over kernel UDP sockets (use AF_XDP)",
            ));
        }
        let qpn = self.qp_num();
        if members
            .attachments
            .get(&qpn)
            .is_some_and(|attached| attached.contains(&(gid, lid)))
        {
            return Ok(());
        }
        let made_group = shared.lock()?.endpoint().attach_mcast(qpn, gid)?;
        if made_group {
            if let Err(error) = shared.refresh_filter(&mut members) {
                // As rxe, whose group is not made when its MAC cannot be added.
                let _ = shared.lock()?.endpoint().detach_mcast(qpn, gid);
                return Err(error);
            }
        }
        members.attachments.entry(qpn).or_default().push((gid, lid));
        Ok(())
    }

    /// Detaches this QP from the group `gid` (`ibv_detach_mcast`), the attachment named by
    /// `gid` and `lid`: `EINVAL` if there is none.
    pub fn detach_mcast(&self, gid: Gid, lid: u16) -> Result<(), Error> {
        let shared = self.shared();
        let mut members = shared.memberships()?;
        let qpn = self.qp_num();
        let attached = members.attachments.entry(qpn).or_default();
        let Some(at) = attached.iter().position(|&pair| pair == (gid, lid)) else {
            return Err(Error::InvalidArgument("the QP has no such attachment"));
        };
        attached.remove(at);
        let group_gone = shared.lock()?.endpoint().detach_mcast(qpn, gid)?;
        if group_gone {
            shared.refresh_filter(&mut members)?;
        }
        Ok(())
    }

    /// How many attachments the QP has (`ibv_destroy_qp` refuses a QP with any).
    pub fn mcast_attachments(&self) -> usize {
        let Ok(members) = self.shared().memberships() else {
            return 0;
        };
        members.attachments.get(&self.qp_num()).map_or(0, Vec::len)
    }
}

/// After a QP was destroyed (and left its groups in the endpoint): forgets its attachments
/// and takes the MACs of groups that went with it out of the filter.
pub(crate) fn forget_qp(shared: &Shared, qpn: u32) {
    let Ok(mut members) = shared.memberships() else {
        return;
    };
    if members.attachments.remove(&qpn).is_some() {
        let _ = shared.refresh_filter(&mut members);
    }
}

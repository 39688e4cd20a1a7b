//! Multicast groups (`ibv_attach_mcast`, `ibv_detach_mcast`): which UD QPs a datagram to
//! each group reaches, within the device's limits and with rxe's errno (`rxe_mcast.c`), and
//! which groups the host is a member of at the IP level, whose datagrams we send come back
//! to our own attached QPs (the kernel loops a multicast send back to its sender only
//! then: `ip_mc_output` needs the route's `RTCF_LOCAL`, which membership gives).
//!
//! A group exists while a QP is attached to it; attaching a QP twice is no change, as in
//! rxe. Every entry is made by a verbs call and bounded by a limit, so no packet can grow
//! the table.

use std::collections::{BTreeMap, BTreeSet};

use crate::errno;
use crate::limits::LIMITS;

/// A multicast group's GID (its IP multicast address as a GID).
pub type Mgid = [u8; 16];

/// Why attaching a QP to a group, or detaching it, failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum McastError {
    /// The GID is not a multicast group's (neither `ff00::/8` nor an IPv4-mapped
    /// 224.0.0.0/4).
    #[error("not a multicast GID")]
    NotMulticast,
    /// Only UD QPs join groups.
    #[error("only UD QPs attach to multicast groups")]
    NotUd,
    /// No QP with that number.
    #[error("no such QP")]
    UnknownQp,
    /// Detaching a QP that is not attached to the group (or a group nobody joined).
    #[error("the QP is not attached to that group")]
    NotAttached,
    /// `max_mcast_grp` groups exist already.
    #[error("max_mcast_grp groups exist already")]
    TooManyGroups,
    /// `max_mcast_qp_attach` QPs are attached to the group already.
    #[error("max_mcast_qp_attach QPs are attached to the group already")]
    GroupFull,
    /// `max_total_mcast_qp_attach` attachments exist already.
    #[error("max_total_mcast_qp_attach attachments exist already")]
    TooManyAttachments,
}

impl McastError {
    /// The errno `ibv_attach_mcast`/`ibv_detach_mcast` return (ib_core's checks and rxe's).
    pub fn errno(&self) -> i32 {
        match self {
            McastError::NotMulticast
            | McastError::NotUd
            | McastError::UnknownQp
            | McastError::NotAttached => errno::EINVAL,
            McastError::TooManyGroups | McastError::GroupFull | McastError::TooManyAttachments => {
                errno::ENOMEM
            }
        }
    }
}

/// The groups and their QPs.
#[derive(Debug, Default)]
pub(crate) struct McastTable {
    /// Each group's QPs, in the order they were attached.
    groups: BTreeMap<Mgid, Vec<u32>>,
    /// Attachments over all groups.
    attached: usize,
    /// Groups the host has joined at the IP level: what we send to them loops back.
    looped: BTreeSet<Mgid>,
}

impl McastTable {
    /// Attaches `qpn` to `mgid`; `true` when that made the group (the first QP).
    pub(crate) fn attach(&mut self, qpn: u32, mgid: Mgid) -> Result<bool, McastError> {
        let new = match self.groups.get(&mgid) {
            Some(qps) if qps.contains(&qpn) => return Ok(false),
            Some(_) => false,
            None if self.groups.len() >= LIMITS.max_mcast_grp as usize => {
                return Err(McastError::TooManyGroups)
            }
            None => true,
        };
        if self.attached >= LIMITS.max_total_mcast_qp_attach as usize {
            return Err(McastError::TooManyAttachments);
        }
        let qps = self.groups.entry(mgid).or_default();
        if qps.len() >= LIMITS.max_mcast_qp_attach as usize {
            return Err(McastError::GroupFull);
        }
        qps.push(qpn);
        self.attached += 1;
        Ok(new)
    }

    /// Detaches `qpn` from `mgid`; `true` when the group is gone with it (its last QP).
    pub(crate) fn detach(&mut self, qpn: u32, mgid: Mgid) -> Result<bool, McastError> {
        let qps = self.groups.get_mut(&mgid).ok_or(McastError::NotAttached)?;
        let at = qps
            .iter()
            .position(|&q| q == qpn)
            .ok_or(McastError::NotAttached)?;
        qps.remove(at);
        self.attached -= 1;
        let gone = qps.is_empty();
        if gone {
            self.groups.remove(&mgid);
        }
        Ok(gone)
    }

    /// Detaches a QP that is being destroyed from every group.
    pub(crate) fn remove_qp(&mut self, qpn: u32) {
        let before = self.attached;
        let mut removed = 0;
        self.groups.retain(|_, qps| {
            let len = qps.len();
            qps.retain(|&q| q != qpn);
            removed += len - qps.len();
            !qps.is_empty()
        });
        self.attached = before - removed;
    }

    /// The QPs attached to `mgid`, in attach order (none for a group nobody joined).
    pub(crate) fn members(&self, mgid: &Mgid) -> &[u32] {
        self.groups.get(mgid).map_or(&[], Vec::as_slice)
    }

    /// The groups with a QP attached.
    pub(crate) fn groups(&self) -> impl Iterator<Item = &Mgid> {
        self.groups.keys()
    }

    /// Records whether the host is a member of `mgid` at the IP level.
    pub(crate) fn set_looped(&mut self, mgid: Mgid, looped: bool) {
        if looped {
            self.looped.insert(mgid);
        } else {
            self.looped.remove(&mgid);
        }
    }

    /// Whether a datagram we send to `mgid` comes back to our own attached QPs.
    pub(crate) fn is_looped(&self, mgid: &Mgid) -> bool {
        self.looped.contains(mgid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(n: u32) -> Mgid {
        let mut mgid = [0u8; 16];
        mgid[0] = 0xFF;
        mgid[1] = 0x12;
        mgid[12..].copy_from_slice(&n.to_be_bytes());
        mgid
    }

    #[test]
    fn attaching_twice_is_no_change_and_the_last_detach_ends_the_group() {
        let mut table = McastTable::default();
        assert_eq!(table.attach(0x11, group(1)), Ok(true));
        assert_eq!(table.attach(0x11, group(1)), Ok(false));
        assert_eq!(table.attach(0x12, group(1)), Ok(false));
        assert_eq!(table.members(&group(1)), [0x11, 0x12]);
        assert_eq!(table.detach(0x11, group(1)), Ok(false));
        assert_eq!(table.detach(0x11, group(1)), Err(McastError::NotAttached));
        assert_eq!(table.detach(0x12, group(2)), Err(McastError::NotAttached));
        assert_eq!(table.detach(0x12, group(1)), Ok(true));
        assert_eq!(table.groups().count(), 0);
        assert!(table.members(&group(1)).is_empty());
        assert_eq!(table.attached, 0);
    }

    #[test]
    fn the_limits_are_rxes_and_refusals_are_enomem() {
        let mut table = McastTable::default();
        let per_group = LIMITS.max_mcast_qp_attach;
        for qpn in 0..per_group {
            table.attach(0x100 + qpn, group(0)).unwrap();
        }
        let full = table.attach(0x100 + per_group, group(0)).unwrap_err();
        assert_eq!((full, full.errno()), (McastError::GroupFull, errno::ENOMEM));
        for n in 1..LIMITS.max_mcast_grp {
            table.attach(0x11, group(n)).unwrap();
        }
        let error = table.attach(0x11, group(LIMITS.max_mcast_grp)).unwrap_err();
        assert_eq!(error, McastError::TooManyGroups);
        assert_eq!(error.errno(), errno::ENOMEM);
        // A group that exists still takes QPs up to the total.
        table.attach(0x12, group(1)).unwrap();
        assert_eq!(
            table.attached,
            (per_group + LIMITS.max_mcast_grp - 1 + 1) as usize
        );
    }

    #[test]
    fn the_total_of_attachments_is_bounded() {
        let mut table = McastTable::default();
        let groups = LIMITS.max_mcast_grp;
        let per_group = LIMITS.max_mcast_qp_attach;
        let total = LIMITS.max_total_mcast_qp_attach;
        'fill: for n in 0..groups {
            for qpn in 0..per_group {
                if table.attached == total as usize {
                    break 'fill;
                }
                table.attach(0x100 + qpn, group(n)).unwrap();
            }
        }
        assert_eq!(table.attached, total as usize);
        // Checked before the group's own limit, as rxe checks them.
        let error = table.attach(0x999, group(0)).unwrap_err();
        assert_eq!(error, McastError::TooManyAttachments);
        assert_eq!(table.attach(0x100, group(0)), Ok(false));
    }

    #[test]
    fn a_destroyed_qp_leaves_every_group() {
        let mut table = McastTable::default();
        table.attach(0x11, group(1)).unwrap();
        table.attach(0x11, group(2)).unwrap();
        table.attach(0x12, group(2)).unwrap();
        table.remove_qp(0x11);
        assert_eq!(table.groups().collect::<Vec<_>>(), [&group(2)]);
        assert_eq!(table.members(&group(2)), [0x12]);
        assert_eq!(table.attached, 1);
    }
}

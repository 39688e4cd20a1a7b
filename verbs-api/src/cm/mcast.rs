//! Multicast on UD ids (`rdma_join_multicast`, `rdma_leave_multicast`), as the kernel's
//! rdma_cm does it on RoCE (`cma_iboe_join_multicast`): there is no SA, so a join is local.
//! The group's GID is its address (IPv4-mapped); a full member's join also joins the host
//! to the group at the IP level (the kernel's `cma_igmp_send`: IGMP reports, and our own
//! datagrams to the group loop back), a send-only member's does not; then
//! [`CmEventKind::MulticastJoin`](super::CmEventKind::MulticastJoin) says how to send to
//! the group: the group's GID from ours, hop limit 64, QPN 0xFFFFFF and the id's Q_Key. As
//! in librdmacm, the program (or the C face) attaches its QP to the group on that event,
//! and detaches it before leaving.
//!
//! The kernel refuses an IPv6 group on RoCEv2 (`-ENOTSUPP`, errno 524) and so do we.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use roce_wire::multicast::MULTICAST_QPN;

use super::{CmId, IdState, HOP_LIMIT, RDMA_UDP_QKEY};
use crate::cm_routes::What;
use crate::error::Error;
use crate::AddressVector;

/// The kernel's `ENOTSUPP` (not a userspace errno, but what a program sees).
const ENOTSUPP: i32 = 524;

/// A joined group, as [`CmEventKind::MulticastJoin`](super::CmEventKind::MulticastJoin)
/// reports it (`struct rdma_ud_param` of `RDMA_CM_EVENT_MULTICAST_JOIN`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McastJoin {
    /// Which join of the id this is (what [`CmId::join_multicast`] returned).
    pub join: u64,
    /// The group's address, as given.
    pub addr: SocketAddr,
    /// How a UD QP reaches the group (`ah_attr`): the group's GID, from the id's GID.
    pub ah: AddressVector,
    /// The destination QP of the group's datagrams, 0xFFFFFF.
    pub qp_num: u32,
    /// The Q_Key of the group's datagrams, the id's ([`RDMA_UDP_QKEY`]).
    pub qkey: u32,
    /// A send-only member: its QP is not attached to the group.
    pub send_only: bool,
}

/// A join an id holds.
#[derive(Debug)]
pub(super) struct Joined {
    join: u64,
    addr: SocketAddr,
    /// The IPv4 group the host joined for it (a full member's).
    ip_group: Option<std::net::Ipv4Addr>,
    /// Cleared on leave: an event not yet taken is then dropped, as the kernel's
    /// `ucma_leave_multicast` drops the group's pending events.
    live: Arc<AtomicBool>,
}

impl CmId {
    /// Joins the multicast group at `addr` (`rdma_join_multicast`, or `_ex` with
    /// `send_only` for `RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER`) on a UD id whose address is
    /// bound or resolved (not yet routed, connected or listening); returns which join this
    /// is. [`CmEventKind::MulticastJoin`](super::CmEventKind::MulticastJoin) follows.
    pub fn join_multicast(&self, addr: SocketAddr, send_only: bool) -> Result<u64, Error> {
        let mut state = self.state()?;
        let bound = state.src.is_some_and(|src| !src.ip().is_unspecified());
        let busy = state.route_resolved || state.conn.is_some() || state.listening.is_some();
        let Some(sgid_index) = state.sgid_index.filter(|_| state.ud && bound && !busy) else {
            return Err(Error::InvalidArgument(
                "a join needs a UD id with its own address, not yet routed or connected",
            ));
        };
        let group = match addr.ip() {
            ip if ip.is_unspecified() => {
                return Err(Error::InvalidArgument(
                    "the group's address is the wildcard",
                ))
            }
            IpAddr::V6(_) => return Err(std::io::Error::from_raw_os_error(ENOTSUPP).into()),
            IpAddr::V4(ip) => ip,
        };
        // As the kernel, whose IGMP join is of a multicast address only (a unicast one
        // fails at the attach its event leads to).
        let ip_group = (!send_only && group.is_multicast()).then_some(group);
        let mut core = self.shared.lock()?;
        if let Some(group) = ip_group {
            let core = &mut *core;
            core.multicast.join_ip(core.engine.endpoint(), group)?;
        }
        let join = core.cm.new_id();
        drop(core);
        let live = Arc::new(AtomicBool::new(true));
        state.joins.push(Joined {
            join,
            addr,
            ip_group,
            live: Arc::clone(&live),
        });
        drop(state);
        let event = McastJoin {
            join,
            addr,
            ah: AddressVector {
                dgid: group.to_ipv6_mapped().octets(),
                sgid_index: u8::try_from(sgid_index).unwrap_or(0),
                // IPV6_DEFAULT_HOPLIMIT, the kernel's for an IPv4 group on RoCEv2.
                hop_limit: HOP_LIMIT,
                traffic_class: 0,
                flow_label: 0,
            },
            qp_num: MULTICAST_QPN,
            qkey: RDMA_UDP_QKEY,
            send_only,
        };
        self.tell(What::MulticastJoin {
            join: Box::new(event),
            live,
        });
        Ok(join)
    }

    /// Leaves the group `join` (`rdma_leave_multicast`): a full member's IP membership is
    /// dropped (the kernel sends the leave once no other join holds it) and its join event,
    /// if not yet taken, is dropped too. The QP must be detached first, as librdmacm does.
    pub fn leave_multicast(&self, join: u64) -> Result<(), Error> {
        let mut state = self.state()?;
        let at = state
            .joins
            .iter()
            .position(|joined| joined.join == join)
            .ok_or(Error::InvalidArgument("no such join on this id"))?;
        let joined = state.joins.remove(at);
        drop(state);
        leave(self, &joined)
    }

    /// The address of each group the id is joined to, with its join.
    pub fn multicast_joins(&self) -> Vec<(u64, SocketAddr)> {
        self.state().map_or_else(
            |_| Vec::new(),
            |state| {
                state
                    .joins
                    .iter()
                    .map(|joined| (joined.join, joined.addr))
                    .collect()
            },
        )
    }
}

/// Leaves every group `state` holds (`rdma_destroy_id`).
pub(super) fn leave_all(id: &CmId, state: &mut IdState) {
    for joined in std::mem::take(&mut state.joins) {
        let _ = leave(id, &joined);
    }
}

fn leave(id: &CmId, joined: &Joined) -> Result<(), Error> {
    joined.live.store(false, Ordering::Release);
    if let Some(group) = joined.ip_group {
        let mut core = id.shared.lock()?;
        let core = &mut *core;
        core.multicast.leave_ip(core.engine.endpoint(), group);
    }
    Ok(())
}

/// Whether a join's event still stands (its group not left since).
pub(crate) fn still_joined(live: &AtomicBool) -> bool {
    live.load(Ordering::Acquire)
}

//! UD multicast on a QP (`ibv_attach_mcast`, `ibv_detach_mcast`): the context's
//! [`Memberships`](crate::groups::Memberships) keep the attachments, the interface's filter
//! and the endpoint's groups in step.

use crate::core::Core;
use crate::device::Gid;
use crate::error::Error;
use crate::qp::Qp;

impl Qp {
    /// Attaches this UD QP to the multicast group `gid` (`ibv_attach_mcast`): datagrams to
    /// the group reach it from now on (those from our own QPs only while the host is a
    /// member of the group, as after rdma_cm's full-member join). `lid` is ignored on RoCE
    /// but names the attachment with `gid`, as uverbs names it: attaching the same pair
    /// twice is no change.
    pub fn attach_mcast(&self, gid: Gid, lid: u16) -> Result<(), Error> {
        let mut core = self.shared().lock()?;
        let Core {
            engine, multicast, ..
        } = &mut *core;
        multicast.attach(engine.endpoint(), self.qp_num(), gid, lid)
    }

    /// Detaches this QP from the group `gid` (`ibv_detach_mcast`), the attachment named by
    /// `gid` and `lid`: `EINVAL` if there is none.
    pub fn detach_mcast(&self, gid: Gid, lid: u16) -> Result<(), Error> {
        let mut core = self.shared().lock()?;
        let Core {
            engine, multicast, ..
        } = &mut *core;
        multicast.detach(engine.endpoint(), self.qp_num(), gid, lid)
    }

    /// How many attachments the QP has (`ibv_destroy_qp` refuses a QP with any, `EBUSY`).
    pub fn mcast_attachments(&self) -> usize {
        self.shared()
            .lock()
            .map_or(0, |core| core.multicast.attachments(self.qp_num()))
    }
}

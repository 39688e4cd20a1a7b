//! Ending a connection: DREQ/DREP from either side, REJ in any state, and `destroy`.

use std::time::Instant;

use roce_wire::cm::rej::RejectReason;
use roce_wire::cm::{drep, dreq, rej, Message, MessageKind};
use roce_wire::mad;

use super::common::{private_data, Common};
use super::connection::{ConnState, Connection};
use super::event::{CmError, CmEvent};
use super::ids::{ConnId, Gid};

impl Common {
    pub(super) fn disconnect(
        &mut self,
        now: Instant,
        conn: ConnId,
        private: &[u8],
    ) -> Result<(), CmError> {
        let private_data = private_data(private)?;
        let tid = self.new_tid(conn.0);
        let timeout =
            Self::ms(self.config.packet_life_time) * 2 + Self::ms(self.config.cm_response_timeout);
        let retries = self.config.max_cm_retries;
        let c = self.connection(conn)?;
        match c.state {
            ConnState::Established | ConnState::RepSent => {}
            ConnState::DreqSent | ConnState::TimeWait => return Ok(()),
            state => return Err(CmError::InvalidState(state)),
        }
        let mad = Self::emit(
            tid,
            Message::Dreq(dreq::Repr {
                local_comm_id: conn.0,
                remote_comm_id: c.remote_comm_id,
                remote_qpn: c.remote_qpn,
                private_data,
            }),
        );
        c.transaction_id = tid;
        c.state = ConnState::DreqSent;
        c.send_reliably(now, mad, retries, timeout);
        self.send_on(conn.0, mad);
        Ok(())
    }

    pub(super) fn destroy(&mut self, conn: ConnId) {
        let Some(c) = self.conns.get(&conn.0) else {
            return;
        };
        // As the kernel's cm_destroy_id.
        let message = match c.state {
            ConnState::ReqSent => Some(Self::rej_for(
                conn.0,
                c,
                RejectReason::TIMEOUT,
                [0; rej::PRIVATE_DATA_LEN],
            )),
            ConnState::ReqReceived
            | ConnState::MraReqSent
            | ConnState::RepSent
            | ConnState::RepReceived => Some(Self::rej_for(
                conn.0,
                c,
                RejectReason::CONSUMER_DEFINED,
                [0; rej::PRIVATE_DATA_LEN],
            )),
            ConnState::Established => Some(Message::Dreq(dreq::Repr {
                local_comm_id: conn.0,
                remote_comm_id: c.remote_comm_id,
                remote_qpn: c.remote_qpn,
                private_data: [0; dreq::PRIVATE_DATA_LEN],
            })),
            _ => None,
        };
        if let Some(message) = message {
            let mad = Self::emit(c.transaction_id, message);
            self.send_on(conn.0, mad);
        }
        self.remove(conn.0);
    }

    /// A REJ for connection `id` in its current state, laid out as the kernel's
    /// cm_format_rej does: before the application answered a REQ our ID is not given.
    pub(super) fn rej_for(
        id: u32,
        c: &Connection,
        reason: RejectReason,
        private_data: [u8; rej::PRIVATE_DATA_LEN],
    ) -> Message {
        let (local_comm_id, message_rejected) = match c.state {
            ConnState::ReqReceived => (0, MessageKind::Req),
            ConnState::MraReqSent => (id, MessageKind::Req),
            ConnState::RepReceived => (id, MessageKind::Rep),
            _ => (id, MessageKind::Other),
        };
        Message::Rej(rej::Repr {
            local_comm_id,
            remote_comm_id: c.remote_comm_id,
            message_rejected,
            reason,
            ari_length: 0,
            ari: [0; rej::ARI_LEN],
            private_data,
        })
    }

    pub(super) fn on_rej(&mut self, now: Instant, m: rej::Repr) {
        let id = m.remote_comm_id;
        let Some(state) = self.matching(id, m.local_comm_id).map(|c| c.state) else {
            self.stats.unexpected += 1;
            return;
        };
        match state {
            ConnState::ReqSent if self.retry_unlistened(now, id, &m) => {}
            ConnState::ReqSent
            | ConnState::RepSent
            | ConnState::MraReqSent
            | ConnState::RepReceived => {
                self.remove(id);
                self.events.push_back(CmEvent::Rejected {
                    conn: ConnId(id),
                    reason: m.reason,
                    private_data: m.private_data,
                });
            }
            ConnState::Established | ConnState::DreqSent => {
                let wait = self.timewait(self.conns.get(&id).map_or(0, |c| c.ack_timeout));
                if let Some(c) = self.conns.get_mut(&id) {
                    c.enter_timewait(now, wait, true);
                }
                self.events
                    .push_back(CmEvent::Disconnected { conn: ConnId(id) });
            }
            _ => self.stats.unexpected += 1,
        }
    }

    pub(super) fn drep_for(tid: u64, dreq: &dreq::Repr) -> [u8; mad::MAD_LEN] {
        Self::emit(
            tid,
            Message::Drep(drep::Repr {
                local_comm_id: dreq.remote_comm_id,
                remote_comm_id: dreq.local_comm_id,
                private_data: [0; drep::PRIVATE_DATA_LEN],
            }),
        )
    }

    pub(super) fn on_dreq(
        &mut self,
        now: Instant,
        local_gid: Gid,
        remote_gid: Gid,
        tid: u64,
        m: dreq::Repr,
    ) {
        let id = m.remote_comm_id;
        let drep = Self::drep_for(tid, &m);
        let Some(c) = self.matching(id, m.local_comm_id) else {
            // As the kernel: a DREQ for a connection we forgot still gets its DREP.
            self.stats.unexpected += 1;
            self.send(local_gid, remote_gid, drep);
            return;
        };
        match c.state {
            ConnState::Established
            | ConnState::RepSent
            | ConnState::DreqSent
            | ConnState::RepReceived => {
                let wait = self.timewait(c.ack_timeout);
                if let Some(c) = self.conns.get_mut(&id) {
                    c.last_reply = Some(drep);
                    c.enter_timewait(now, wait, true);
                }
                self.send_on(id, drep);
                self.events
                    .push_back(CmEvent::Disconnected { conn: ConnId(id) });
            }
            ConnState::TimeWait => {
                self.stats.duplicates += 1;
                self.send_on(id, drep);
            }
            _ => self.stats.unexpected += 1,
        }
    }

    pub(super) fn on_drep(&mut self, now: Instant, m: drep::Repr) {
        let id = m.remote_comm_id;
        match self
            .matching(id, m.local_comm_id)
            .map(|c| (c.state, c.ack_timeout))
        {
            Some((ConnState::DreqSent, ack_timeout)) => {
                let wait = self.timewait(ack_timeout);
                if let Some(c) = self.conns.get_mut(&id) {
                    c.enter_timewait(now, wait, true);
                }
                self.events
                    .push_back(CmEvent::Disconnected { conn: ConnId(id) });
            }
            Some((ConnState::TimeWait, _)) => self.stats.duplicates += 1,
            _ => self.stats.unexpected += 1,
        }
    }
}

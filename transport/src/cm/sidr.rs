//! Service ID resolution for UD: SIDR_REQ and SIDR_REP.

use std::time::{Duration, Instant};

use roce_wire::cm::sidr_rep::SidrStatus;
use roce_wire::cm::{sidr_rep, sidr_req, Message, ServiceId};
use roce_wire::mad;

use super::common::{private_data, Common};
use super::connection::{ConnState, Connection, RemoteKey};
use super::event::{CmError, CmEvent};
use super::ids::{ConnId, Gid};
use super::params::SidrReply;

impl Common {
    /// How long an answered SIDR_REQ is remembered: past the requester's next resend.
    pub(super) fn sidr_linger(&self) -> Duration {
        Self::ms(self.config.cm_response_timeout) * 2
    }

    pub(super) fn resolve_service(
        &mut self,
        now: Instant,
        service_id: ServiceId,
        local_gid: Gid,
        remote_gid: Gid,
        private: &[u8],
    ) -> Result<ConnId, CmError> {
        let private_data = private_data(private)?;
        let id = self.alloc_id()?;
        let tid = self.new_tid(id);
        let mad = Self::emit(
            tid,
            Message::SidrReq(sidr_req::Repr {
                request_id: id,
                pkey: mad::DEFAULT_PKEY,
                service_id,
                private_data,
            }),
        );
        let mut c = Connection::new(ConnState::SidrReqSent, local_gid, remote_gid, service_id);
        c.transaction_id = tid;
        c.send_reliably(
            now,
            mad,
            self.config.max_cm_retries,
            Self::ms(self.config.cm_response_timeout),
        );
        self.conns.insert(id, c);
        self.send_on(id, mad);
        Ok(ConnId(id))
    }

    pub(super) fn sidr_reply(
        &mut self,
        now: Instant,
        conn: ConnId,
        reply: &SidrReply,
        private: &[u8],
    ) -> Result<(), CmError> {
        let private_data = private_data(private)?;
        let wait = self.sidr_linger();
        let c = self.connection(conn)?;
        if c.state != ConnState::SidrReqReceived {
            return Err(CmError::InvalidState(c.state));
        }
        let mad = Self::emit(
            c.transaction_id,
            Message::SidrRep(sidr_rep::Repr {
                request_id: c.remote_comm_id,
                status: reply.status,
                info_length: 0,
                qpn: reply.qpn & 0xFF_FFFF,
                service_id: c.service_id,
                qkey: reply.qkey,
                info: [0; sidr_rep::INFO_LEN],
                private_data,
            }),
        );
        c.last_reply = Some(mad);
        // A SIDR_REP is not resent, but a repeated SIDR_REQ gets it again until the wait ends.
        c.enter_timewait(now, wait, false);
        self.release_listener_slot(conn.0);
        self.send_on(conn.0, mad);
        Ok(())
    }

    pub(super) fn on_sidr_req(
        &mut self,
        now: Instant,
        local_gid: Gid,
        remote_gid: Gid,
        tid: u64,
        m: sidr_req::Repr,
    ) {
        let key = RemoteKey::Sidr {
            gid: remote_gid,
            request_id: m.request_id,
        };
        if let Some(&id) = self.remotes.get(&key) {
            let linger = self.sidr_linger();
            match self.conns.get_mut(&id) {
                Some(c) if c.state == ConnState::TimeWait => {
                    // Our reply was lost: send it again and stay for the next resend.
                    c.deadline = Some(now + linger);
                    self.resend_last_reply(id);
                }
                _ => self.stats.duplicates += 1,
            }
            return;
        }
        let Some(listener) = self.listeners.get(&m.service_id).copied() else {
            self.stats.no_listener += 1;
            let mad = Self::emit(
                tid,
                Message::SidrRep(sidr_rep::Repr {
                    request_id: m.request_id,
                    status: SidrStatus::UNSUPPORTED,
                    info_length: 0,
                    qpn: 0,
                    service_id: m.service_id,
                    qkey: 0,
                    info: [0; sidr_rep::INFO_LEN],
                    private_data: [0; sidr_rep::PRIVATE_DATA_LEN],
                }),
            );
            self.send(local_gid, remote_gid, mad);
            return;
        };
        let c = Connection::new(
            ConnState::SidrReqReceived,
            local_gid,
            remote_gid,
            m.service_id,
        );
        let Some(id) = self.admit(listener, c, key, m.request_id, tid) else {
            return;
        };
        self.events.push_back(CmEvent::SidrRequest {
            conn: ConnId(id),
            service_id: m.service_id,
            local_gid,
            remote_gid,
            private_data: m.private_data,
        });
    }

    pub(super) fn on_sidr_rep(&mut self, m: sidr_rep::Repr) {
        let id = m.request_id;
        if self.conns.get(&id).map(|c| c.state) != Some(ConnState::SidrReqSent) {
            self.stats.unexpected += 1;
            return;
        }
        self.remove(id);
        let conn = ConnId(id);
        self.events.push_back(if m.status == SidrStatus::SUCCESS {
            CmEvent::SidrResolved {
                conn,
                qpn: m.qpn,
                qkey: m.qkey,
                private_data: m.private_data,
            }
        } else {
            CmEvent::SidrRejected {
                conn,
                status: m.status,
            }
        });
    }
}

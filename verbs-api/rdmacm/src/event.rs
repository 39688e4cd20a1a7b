//! Events (`rdma_get_cm_event`, `rdma_ack_cm_event`): a `roce_verbs` event as the
//! `rdma_cm_event` C reads, with the new id of a connect request made here; and the wait of
//! a synchronous id's call for its event.

use core::ffi::c_int;
use std::sync::Arc;

use roce_cabi::set_errno;
use roce_verbs::{CmEvent, CmEventKind, ConnectRequest};

use crate::abi::*;
use crate::channel::{Channel, Taken};
use crate::id::{Id, Request};
use crate::joins;
use crate::qp_attr;

const EINVAL: c_int = 22;
const ECONNREFUSED: c_int = 111;
const ETIMEDOUT: c_int = 110;

/// Our `rdma_cm_event`, the private data it points to, and its place in its id's count of
/// events not acked (given back when it is dropped: acked).
#[repr(C)]
pub(crate) struct Event {
    raw: rdma_cm_event,
    private_data: Vec<u8>,
    taken: Option<Taken>,
}

impl Event {
    /// `RDMA_CM_EVENT_*`, and the status.
    pub(crate) fn what(&self) -> (c_int, c_int) {
        (self.raw.event, self.raw.status)
    }

    /// The id it is for (a new id for a connect request).
    pub(crate) fn id(&self) -> *mut rdma_cm_id {
        self.raw.id
    }
}

/// The next event on the channel at `channel` as C sees it: waits unless the fd is
/// non-blocking (then `EAGAIN`); events of ids destroyed meanwhile are skipped. Destroyed
/// while this waits, the channel is not touched again, and this waits on as rdma-core's
/// read(2) on a closed channel does.
///
/// # Safety
/// `channel` is ours and not destroyed when this is called.
pub(crate) unsafe fn next(channel: *const Channel) -> Result<Box<Event>, c_int> {
    // SAFETY: live now (the caller's promise); past this only `state` is used until `open`
    // says the channel still is.
    let (state, nonblocking) = unsafe { (Arc::clone(&(*channel).state), (*channel).nonblocking()) };
    loop {
        let event = state.next_event(nonblocking)?;
        let open = state.open.read().map_err(|_| EINVAL)?;
        if !*open {
            continue;
        }
        let Some((key, taken)) = state.take_event_of(event.id) else {
            continue;
        };
        // SAFETY: registered when taken, and `rdma_destroy_id` frees it only once `taken`
        // is dropped (the event acked).
        let Some(id) = (unsafe { (key as *const Id).as_ref() }) else {
            continue;
        };
        // SAFETY: open, and it stays so while `open` is held (destroying waits for it).
        let mut converted = convert(unsafe { &*channel }, id, event);
        converted.taken = Some(taken);
        return Ok(converted);
    }
}

/// For a synchronous id, waits for the event its call brings: `expected`, else the errno
/// rdma-core gives (`ECONNREFUSED` for a reject, `ETIMEDOUT` when unreachable).
pub(crate) fn complete(id: &Id, expected: c_int) -> Result<(), c_int> {
    let Some(channel) = id.own_channel()? else {
        return Ok(());
    };
    // SAFETY: a synchronous id's own channel lives as long as the id, which the caller holds.
    match unsafe { next(channel) }?.what() {
        (code, _) if code == expected => Ok(()),
        (8, _) => Err(ECONNREFUSED),
        (7, _) => Err(ETIMEDOUT),
        (_, status) if status < 0 => Err(-status),
        _ => Err(EINVAL),
    }
}

/// The C event of `event` for `id` (on `channel`).
fn convert(channel: &Channel, id: &Id, event: CmEvent) -> Box<Event> {
    let mut out = Box::new(Event {
        raw: rdma_cm_event {
            id: id.as_raw(),
            listen_id: core::ptr::null_mut(),
            event: event.kind.code() as c_int,
            status: 0,
            param: EventParam {
                ud: ud_param(0, 0, &[], ibv_ah_attr::default()),
            },
        },
        private_data: Vec::new(),
        taken: None,
    });
    let mut conn = rdma_conn_param {
        private_data: core::ptr::null(),
        private_data_len: 0,
        responder_resources: 0,
        initiator_depth: 0,
        flow_control: 0,
        retry_count: 0,
        rnr_retry_count: 0,
        srq: 0,
        qp_num: 0,
    };
    match event.kind {
        CmEventKind::AddrError(status) | CmEventKind::RouteError(status) => {
            out.raw.status = status;
        }
        CmEventKind::Unreachable => out.raw.status = -ETIMEDOUT,
        CmEventKind::ConnectError => out.raw.status = -EINVAL,
        CmEventKind::UdUnreachable(status) => out.raw.status = c_int::from(status),
        CmEventKind::Rejected {
            reason,
            private_data,
        } => {
            out.raw.status = c_int::from(reason);
            out.private_data = private_data;
        }
        CmEventKind::UdEstablished(param) => {
            out.private_data = param.private_data;
            let ah = id.ud_address().as_ref().map(qp_attr::ah_attr);
            out.raw.param = EventParam {
                ud: ud_param(
                    param.qp_num,
                    param.qkey,
                    &out.private_data,
                    ah.unwrap_or_default(),
                ),
            };
            return out;
        }
        CmEventKind::ConnectRequest(request) if request.id.is_ud() => {
            out.private_data = request.private_data;
            out.raw.listen_id = id.as_raw();
            out.raw.id = Id::from_request(id, channel, request.id, Request::default());
            out.raw.param = EventParam {
                ud: ud_param(0, 0, &out.private_data, ibv_ah_attr::default()),
            };
            return out;
        }
        CmEventKind::ConnectRequest(request) => {
            conn = connect_request(&mut out, channel, id, *request);
        }
        CmEventKind::MulticastJoin(join) => {
            let joined = match id.lock() {
                Ok(mut inner) => {
                    let qp = id.raw(&mut inner).qp;
                    joins::joined(&mut inner.joins, qp, &join)
                }
                Err(_) => joins::joined(&mut [], core::ptr::null_mut(), &join),
            };
            (out.raw.event, out.raw.status) = (joined.event, joined.status);
            out.raw.param = EventParam { ud: joined.param };
            return out;
        }
        _ => {}
    }
    // The active side's CONNECT_RESPONSE and ESTABLISHED carry the REP, as the kernel's
    // (`cma_set_rep_event_data`).
    if let Some(reply) = event.reply {
        out.private_data = reply.private_data;
        conn.responder_resources = reply.responder_resources;
        conn.initiator_depth = reply.initiator_depth;
        conn.flow_control = 1;
        conn.rnr_retry_count = reply.rnr_retry_count;
        conn.qp_num = reply.qp_num;
    }
    if !out.private_data.is_empty() {
        conn.private_data = out.private_data.as_ptr().cast();
        conn.private_data_len = u8::try_from(out.private_data.len()).unwrap_or(u8::MAX);
    }
    out.raw.param = EventParam { conn };
    out
}

/// An RC connect request on the listener `id`: its new id, and what it asks as the kernel
/// reports it, from the listener's side (the requester's initiator depth is our responder
/// resources and the other way round).
fn connect_request(
    out: &mut Event,
    channel: &Channel,
    id: &Id,
    request: ConnectRequest,
) -> rdma_conn_param {
    let wanted = Request {
        responder_resources: request.initiator_depth,
        initiator_depth: request.responder_resources,
    };
    out.private_data = request.private_data;
    out.raw.listen_id = id.as_raw();
    out.raw.id = Id::from_request(id, channel, request.id, wanted);
    rdma_conn_param {
        private_data: core::ptr::null(),
        private_data_len: 0,
        responder_resources: wanted.responder_resources,
        initiator_depth: wanted.initiator_depth,
        flow_control: 1,
        retry_count: 0,
        rnr_retry_count: 0,
        srq: 0,
        qp_num: request.remote_qpn,
    }
}

/// `struct rdma_ud_param` pointing at `private_data`.
fn ud_param(qp_num: u32, qkey: u32, private_data: &[u8], ah_attr: ibv_ah_attr) -> rdma_ud_param {
    rdma_ud_param {
        private_data: if private_data.is_empty() {
            core::ptr::null()
        } else {
            private_data.as_ptr().cast()
        },
        private_data_len: u8::try_from(private_data.len()).unwrap_or(u8::MAX),
        ah_attr,
        qp_num,
        qkey,
    }
}

/// `rdma_get_cm_event`.
pub unsafe extern "C" fn get_cm_event(
    channel: *mut rdma_event_channel,
    event: *mut *mut rdma_cm_event,
) -> c_int {
    if channel.is_null() || event.is_null() {
        set_errno(EINVAL);
        return -1;
    }
    // SAFETY: the caller passes a live channel of ours (`raw` is our Channel's first field);
    // another thread may destroy it while this waits, which `next` allows for.
    match unsafe { next(channel.cast::<Channel>()) } {
        Ok(taken) => {
            // SAFETY: checked not null; the caller's out pointer.
            unsafe { *event = Box::into_raw(taken).cast() };
            0
        }
        Err(errno) => {
            set_errno(errno);
            -1
        }
    }
}

/// `rdma_ack_cm_event`.
pub unsafe extern "C" fn ack_cm_event(event: *mut rdma_cm_event) -> c_int {
    if event.is_null() {
        set_errno(EINVAL);
        return -1;
    }
    // SAFETY: an event `rdma_get_cm_event` handed out, acknowledged once.
    drop(unsafe { Box::from_raw(event.cast::<Event>()) });
    0
}

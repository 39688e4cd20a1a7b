//! Event channels (`rdma_create_event_channel`) and events (`rdma_get_cm_event`,
//! `rdma_ack_cm_event`).
//!
//! The fd a program sees is an epoll fd watching the channel's eventfd: it polls readable
//! while events wait, and its `O_NONBLOCK` flag is the program's own (the eventfd behind it
//! is always non-blocking), so `rdma_get_cm_event` blocks or fails with `EAGAIN` as the
//! program set it.

use core::ffi::c_int;
use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Mutex;

use roce_cabi::set_errno;
use roce_verbs::{CmEvent, CmEventKind, EventChannel};
use rustix::event::epoll;
use rustix::fs::{fcntl_getfl, OFlags};

use crate::abi::*;
use crate::id::{Id, Request};

const EINVAL: c_int = 22;
const EAGAIN: c_int = 11;
const ENODEV: c_int = 19;
const ETIMEDOUT: c_int = 110;

/// Our `rdma_event_channel`.
#[repr(C)]
pub(crate) struct Channel {
    raw: rdma_event_channel,
    pub(crate) channel: EventChannel,
    epoll: OwnedFd,
    /// Its ids, by the handle their events carry (each a `*mut Id`).
    pub(crate) ids: Mutex<HashMap<u64, usize>>,
}

impl Channel {
    pub(crate) fn new() -> Result<Box<Channel>, c_int> {
        let channel = EventChannel::new()
            .map_err(|error| crate::fail("rdma_create_event_channel", &error))?;
        let epoll =
            epoll::create(epoll::CreateFlags::CLOEXEC).map_err(|error| error.raw_os_error())?;
        epoll::add(
            &epoll,
            channel.as_fd(),
            epoll::EventData::new_u64(0),
            epoll::EventFlags::IN,
        )
        .map_err(|error| error.raw_os_error())?;
        Ok(Box::new(Channel {
            raw: rdma_event_channel {
                fd: epoll.as_raw_fd(),
            },
            channel,
            epoll,
            ids: Mutex::new(HashMap::new()),
        }))
    }

    /// The channel behind an `rdma_event_channel` we handed out.
    ///
    /// # Safety
    /// `channel` is NULL or came from [`create_event_channel`] and is not destroyed.
    pub(crate) unsafe fn from_raw<'a>(channel: *mut rdma_event_channel) -> Option<&'a Channel> {
        // SAFETY: `raw` is the first field of our `#[repr(C)]` Channel.
        unsafe { channel.cast::<Channel>().as_ref() }
    }

    pub(crate) fn as_raw(&self) -> *mut rdma_event_channel {
        core::ptr::from_ref(&self.raw).cast_mut()
    }

    pub(crate) fn register(&self, handle: u64, id: *const Id) {
        if let Ok(mut ids) = self.ids.lock() {
            ids.insert(handle, id as usize);
        }
    }

    pub(crate) fn unregister(&self, handle: u64) {
        if let Ok(mut ids) = self.ids.lock() {
            ids.remove(&handle);
        }
    }

    fn id(&self, handle: u64) -> Option<&Id> {
        let id = *self.ids.lock().ok()?.get(&handle)?;
        // SAFETY: registered ids are live until `rdma_destroy_id` unregisters them.
        unsafe { (id as *const Id).as_ref() }
    }

    /// The next event as C sees it: waits unless the fd is non-blocking (then `EAGAIN`).
    pub(crate) fn next(&self) -> Result<Box<Event>, c_int> {
        let nonblocking =
            fcntl_getfl(&self.epoll).is_ok_and(|flags| flags.contains(OFlags::NONBLOCK));
        loop {
            let event = if nonblocking {
                self.channel.try_get_cm_event()
            } else {
                self.channel.get_cm_event(None).map(Some)
            };
            match event {
                Ok(Some(event)) => {
                    if let Some(event) = self.convert(event) {
                        return Ok(event);
                    }
                }
                Ok(None) => return Err(EAGAIN),
                Err(error) => return Err(crate::fail("rdma_get_cm_event", &error)),
            }
        }
    }

    /// The C event of `event`; none for an id destroyed meanwhile.
    fn convert(&self, event: CmEvent) -> Option<Box<Event>> {
        let id = self.id(event.id)?;
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
            CmEventKind::Rejected {
                reason,
                private_data,
            } => {
                out.raw.status = c_int::from(reason);
                out.private_data = private_data;
            }
            CmEventKind::UdUnreachable(status) => out.raw.status = c_int::from(status),
            CmEventKind::UdEstablished(param) => {
                out.private_data = param.private_data;
                out.raw.param = EventParam {
                    ud: id.ud_param(param.qp_num, param.qkey, &out.private_data),
                };
                return Some(out);
            }
            CmEventKind::ConnectRequest(request) if request.id.is_ud() => {
                out.private_data = request.private_data;
                let child = Id::from_request(id, self, request.id, Request::default());
                out.raw.listen_id = id.as_raw();
                out.raw.id = child;
                out.raw.param = EventParam {
                    ud: ud_param(0, 0, &out.private_data, ibv_ah_attr::default()),
                };
                return Some(out);
            }
            CmEventKind::ConnectRequest(request) => {
                // As the kernel reports it: from the listener's side, so the requester's
                // initiator depth is our responder resources and the other way round.
                let wanted = Request {
                    responder_resources: request.initiator_depth,
                    initiator_depth: request.responder_resources,
                };
                conn.responder_resources = wanted.responder_resources;
                conn.initiator_depth = wanted.initiator_depth;
                conn.qp_num = request.remote_qpn;
                conn.flow_control = 1;
                out.private_data = request.private_data;
                let child = Id::from_request(id, self, request.id, wanted);
                out.raw.listen_id = id.as_raw();
                out.raw.id = child;
            }
            _ => {}
        }
        if !out.private_data.is_empty() {
            conn.private_data = out.private_data.as_ptr().cast();
            conn.private_data_len = u8::try_from(out.private_data.len()).unwrap_or(u8::MAX);
        }
        out.raw.param = EventParam { conn };
        Some(out)
    }
}

/// `struct rdma_ud_param` pointing at `private_data`.
pub(crate) fn ud_param(
    qp_num: u32,
    qkey: u32,
    private_data: &[u8],
    ah_attr: ibv_ah_attr,
) -> rdma_ud_param {
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

/// Our `rdma_cm_event` and the private data it points to.
#[repr(C)]
pub(crate) struct Event {
    raw: rdma_cm_event,
    private_data: Vec<u8>,
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

/// `rdma_create_event_channel`.
pub(crate) extern "C" fn create_event_channel() -> *mut rdma_event_channel {
    if !crate::verbs::any_device() {
        set_errno(ENODEV);
        return core::ptr::null_mut();
    }
    match Channel::new() {
        Ok(channel) => Box::leak(channel).as_raw(),
        Err(errno) => {
            set_errno(errno);
            core::ptr::null_mut()
        }
    }
}

/// `rdma_destroy_event_channel`.
pub(crate) unsafe extern "C" fn destroy_event_channel(channel: *mut rdma_event_channel) {
    if !channel.is_null() {
        // SAFETY: the caller passes a channel of ours, destroyed once, after its ids.
        drop(unsafe { Box::from_raw(channel.cast::<Channel>()) });
    }
}

/// `rdma_get_cm_event`.
pub(crate) unsafe extern "C" fn get_cm_event(
    channel: *mut rdma_event_channel,
    event: *mut *mut rdma_cm_event,
) -> c_int {
    // SAFETY: the caller passes a channel of ours.
    let Some(ours) = (unsafe { Channel::from_raw(channel) }) else {
        set_errno(EINVAL);
        return -1;
    };
    if event.is_null() {
        set_errno(EINVAL);
        return -1;
    }
    match ours.next() {
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
pub(crate) unsafe extern "C" fn ack_cm_event(event: *mut rdma_cm_event) -> c_int {
    if event.is_null() {
        set_errno(EINVAL);
        return -1;
    }
    // SAFETY: an event `rdma_get_cm_event` handed out, acknowledged once.
    drop(unsafe { Box::from_raw(event.cast::<Event>()) });
    0
}

/// `rdma_event_str`.
pub(crate) extern "C" fn event_str(event: c_int) -> *const core::ffi::c_char {
    let name: &'static core::ffi::CStr = match event {
        0 => c"RDMA_CM_EVENT_ADDR_RESOLVED",
        1 => c"RDMA_CM_EVENT_ADDR_ERROR",
        2 => c"RDMA_CM_EVENT_ROUTE_RESOLVED",
        3 => c"RDMA_CM_EVENT_ROUTE_ERROR",
        4 => c"RDMA_CM_EVENT_CONNECT_REQUEST",
        5 => c"RDMA_CM_EVENT_CONNECT_RESPONSE",
        6 => c"RDMA_CM_EVENT_CONNECT_ERROR",
        7 => c"RDMA_CM_EVENT_UNREACHABLE",
        8 => c"RDMA_CM_EVENT_REJECTED",
        9 => c"RDMA_CM_EVENT_ESTABLISHED",
        10 => c"RDMA_CM_EVENT_DISCONNECTED",
        11 => c"RDMA_CM_EVENT_DEVICE_REMOVAL",
        12 => c"RDMA_CM_EVENT_MULTICAST_JOIN",
        13 => c"RDMA_CM_EVENT_MULTICAST_ERROR",
        14 => c"RDMA_CM_EVENT_ADDR_CHANGE",
        15 => c"RDMA_CM_EVENT_TIMEWAIT_EXIT",
        _ => c"UNKNOWN EVENT",
    };
    name.as_ptr()
}

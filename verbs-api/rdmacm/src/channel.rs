//! Event channels (`rdma_create_event_channel`): the fd, and the ids whose events come
//! there (by address: the ids are `id`'s, which builds on this module).
//!
//! The fd a program sees is an epoll fd watching the channel's eventfd: it polls readable
//! while events wait, and its `O_NONBLOCK` flag is the program's own (the eventfd behind it
//! is always non-blocking), so `rdma_get_cm_event` blocks or fails with `EAGAIN` as the
//! program set it.
//!
//! Programs destroy a channel while another thread of theirs still waits on it (rping's
//! main does, its CM thread blocked in `rdma_get_cm_event`). rdma-core's waiter then stays
//! blocked in read(2) until the process ends; ours must not touch the freed channel
//! either, so what a waiter needs lives in a shared [`State`] it holds while it waits, and
//! the channel is freed only between two event conversions (`State::open`).

use core::ffi::c_int;
use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::{Arc, Condvar, Mutex, RwLock};

use roce_cabi::set_errno;
use roce_verbs::{CmEvent, EventChannel};
use rustix::event::epoll;
use rustix::fs::{fcntl_getfl, OFlags};

use crate::abi::*;

const EAGAIN: c_int = 11;
const ENODEV: c_int = 19;

/// Our `rdma_event_channel`.
#[repr(C)]
pub(crate) struct Channel {
    raw: rdma_event_channel,
    epoll: OwnedFd,
    pub(crate) state: Arc<State>,
}

/// What a thread waiting on a channel uses, kept alive by it past the channel's destruction.
pub(crate) struct State {
    events: EventChannel,
    /// Its ids, by the handle their events carry.
    ids: Mutex<HashMap<u64, IdKey>>,
    /// Whether the channel is not destroyed yet: read-locked while an event is turned into
    /// the C event (which reaches into the channel), write-locked to destroy it.
    pub(crate) open: RwLock<bool>,
}

/// How a channel knows an id: its address (a `*const Id`) and its count of events taken
/// and not acked.
#[derive(Clone)]
pub(crate) struct IdKey {
    pub(crate) addr: usize,
    pub(crate) unacked: Arc<Unacked>,
}

/// The events of one id that the program took (or a conversion is making) and has not
/// acked: `rdma_destroy_id` waits until there are none, as rdma-core's waits for
/// `events_completed` to reach the events reported, since each points into the id.
#[derive(Default)]
pub(crate) struct Unacked {
    count: Mutex<usize>,
    acked: Condvar,
}

impl Unacked {
    /// Waits until every event taken has been acked.
    pub(crate) fn wait_all_acked(&self) {
        let Ok(mut count) = self.count.lock() else {
            return;
        };
        while *count > 0 {
            match self.acked.wait(count) {
                Ok(guard) => count = guard,
                Err(_) => return,
            }
        }
    }
}

/// One event taken for an id, acked when dropped.
pub(crate) struct Taken(Arc<Unacked>);

impl Drop for Taken {
    fn drop(&mut self) {
        if let Ok(mut count) = self.0.count.lock() {
            *count -= 1;
            self.0.acked.notify_all();
        }
    }
}

impl State {
    /// The id registered as `handle` (its address), with one more of its events taken:
    /// counted under the lock `rdma_destroy_id` unregisters it under, so a destruction
    /// that comes after waits for this event's ack.
    pub(crate) fn take_event_of(&self, handle: u64) -> Option<(usize, Taken)> {
        let ids = self.ids.lock().ok()?;
        let key = ids.get(&handle)?;
        *key.unacked.count.lock().ok()? += 1;
        Some((key.addr, Taken(Arc::clone(&key.unacked))))
    }

    /// The next event: waits unless `nonblocking` (then `EAGAIN`).
    pub(crate) fn next_event(&self, nonblocking: bool) -> Result<CmEvent, c_int> {
        let event = if nonblocking {
            self.events.try_get_cm_event()
        } else {
            self.events.get_cm_event(None).map(Some)
        };
        match event {
            Ok(Some(event)) => Ok(event),
            Ok(None) => Err(EAGAIN),
            Err(error) => Err(crate::errors::fail("rdma_get_cm_event", &error)),
        }
    }
}

impl Channel {
    pub(crate) fn new() -> Result<Box<Channel>, c_int> {
        let channel = EventChannel::new()
            .map_err(|error| crate::errors::fail("rdma_create_event_channel", &error))?;
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
            epoll,
            state: Arc::new(State {
                events: channel,
                ids: Mutex::new(HashMap::new()),
                open: RwLock::new(true),
            }),
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

    /// The roce-verbs channel behind it.
    pub(crate) fn events(&self) -> &EventChannel {
        &self.state.events
    }

    /// Remembers the id whose events carry `handle`.
    pub(crate) fn register(&self, handle: u64, id: IdKey) {
        if let Ok(mut ids) = self.state.ids.lock() {
            ids.insert(handle, id);
        }
    }

    pub(crate) fn unregister(&self, handle: u64) {
        if let Ok(mut ids) = self.state.ids.lock() {
            ids.remove(&handle);
        }
    }

    /// Whether the program made its fd non-blocking.
    pub(crate) fn nonblocking(&self) -> bool {
        fcntl_getfl(&self.epoll).is_ok_and(|flags| flags.contains(OFlags::NONBLOCK))
    }
}

/// `rdma_create_event_channel`.
pub extern "C" fn create_event_channel() -> *mut rdma_event_channel {
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
pub unsafe extern "C" fn destroy_event_channel(channel: *mut rdma_event_channel) {
    if !channel.is_null() {
        // SAFETY: the caller passes a channel of ours, destroyed once, after its ids.
        let ours = unsafe { Box::from_raw(channel.cast::<Channel>()) };
        // No conversion is under way once this is taken, and none starts after it.
        if let Ok(mut open) = ours.state.open.write() {
            *open = false;
        }
        drop(ours);
    }
}

/// `rdma_event_str`.
pub extern "C" fn event_str(event: c_int) -> *const core::ffi::c_char {
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

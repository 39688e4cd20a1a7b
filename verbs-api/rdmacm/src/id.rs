//! CM ids (`rdma_create_id`, `rdma_destroy_id`): an `rdma_cm_id` the program reads
//! (`verbs`, `qp`, `route`, `port_num`, `context`) in front of a `roce_verbs::CmId`, made
//! on the device the id's address belongs to once it has one (`rdma_bind_addr`,
//! `rdma_resolve_addr`), as rdma-core binds an id to a device only then. What the calls on
//! an id do is in `calls`, its QP in `qp`, its events in `event`.

use core::cell::UnsafeCell;
use core::ffi::{c_int, c_void};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::sync::{Arc, Mutex, MutexGuard};

use roce_cabi::set_errno;
use roce_verbs::CmId;

use crate::abi::*;
use crate::channel::{Channel, IdKey, Unacked};
use crate::qp_attr;
use crate::verbs::{self, Opened};

const EINVAL: c_int = 22;
const EOPNOTSUPP: c_int = 95;

/// What a connect request asked, from the listener's side: `rdma_accept(id, NULL)` grants it.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Request {
    pub(crate) responder_resources: u8,
    pub(crate) initiator_depth: u8,
}

/// Our `rdma_cm_id`.
#[repr(C)]
pub(crate) struct Id {
    raw: UnsafeCell<rdma_cm_id>,
    inner: Mutex<Inner>,
    /// Its events the program has not acked yet; it is freed only once there are none.
    unacked: Arc<Unacked>,
}

// SAFETY: `raw` is written only under `inner`'s lock (the program reads it as it reads
// rdma-core's); everything else is Sync.
unsafe impl Sync for Id {}

#[derive(Default)]
pub(crate) struct Inner {
    pub(crate) cm: Option<CmId>,
    pub(crate) device: Option<Opened>,
    pub(crate) request: Option<Request>,
    /// CQs and channels `rdma_create_qp` made, which `rdma_destroy_qp` destroys.
    pub(crate) made: Vec<(unsafe extern "C" fn(*mut c_void) -> c_int, *mut c_void)>,
    /// A synchronous id's own channel (`rdma_create_id` with none): its calls wait for
    /// their event.
    pub(crate) own_channel: Option<Box<Channel>>,
    /// `RDMA_OPTION_ID_TOS`, kept until the `CmId` exists.
    pub(crate) tos: Option<u8>,
    /// What `rdma_create_ep` gave a passive endpoint for the QPs of its requests.
    pub(crate) ep_qp: Option<(*mut c_void, ibv_qp_init_attr)>,
    /// What `id->route.path_rec` points to once the route is known.
    pub(crate) path: Option<Box<ibv_sa_path_rec>>,
    /// The multicast groups joined through it.
    pub(crate) joins: Vec<crate::joins::Join>,
}

impl Id {
    pub(crate) fn new(channel: &Channel, context: *mut c_void, ps: c_int) -> Box<Id> {
        // SAFETY: all-zero is a valid rdma_cm_id (null pointers, zero numbers).
        let mut raw: rdma_cm_id = unsafe { core::mem::zeroed() };
        raw.channel = channel.as_raw();
        raw.context = context;
        raw.ps = ps;
        raw.qp_type = if ps == RDMA_PS_UDP {
            IBV_QPT_UD
        } else {
            IBV_QPT_RC
        } as c_int;
        Box::new(Id {
            raw: UnsafeCell::new(raw),
            inner: Mutex::new(Inner::default()),
            unacked: Arc::default(),
        })
    }

    /// The id behind an `rdma_cm_id` we handed out.
    ///
    /// # Safety
    /// `id` is NULL or came from this library and is not destroyed.
    pub(crate) unsafe fn from_raw<'a>(id: *mut rdma_cm_id) -> Option<&'a Id> {
        // SAFETY: `raw` is the first field of our `#[repr(C)]` Id.
        unsafe { id.cast::<Id>().as_ref() }
    }

    pub(crate) fn as_raw(&self) -> *mut rdma_cm_id {
        self.raw.get()
    }

    /// What its channel registers it as.
    pub(crate) fn key(&self) -> IdKey {
        IdKey {
            addr: core::ptr::from_ref(self) as usize,
            unacked: Arc::clone(&self.unacked),
        }
    }

    /// A synchronous id's own channel.
    pub(crate) fn own_channel(&self) -> Result<Option<&Channel>, c_int> {
        let inner = self.lock()?;
        let channel = inner
            .own_channel
            .as_deref()
            .map(core::ptr::from_ref::<Channel>);
        // SAFETY: the id's own channel lives as long as the id, which the caller holds.
        Ok(channel.map(|channel| unsafe { &*channel }))
    }

    /// Where a UD id's peer is (`rdma_ud_param.ah_attr`).
    pub(crate) fn ud_address(&self) -> Option<roce_verbs::AddressVector> {
        self.lock().ok()?.cm.as_ref()?.ud_address()
    }

    pub(crate) fn lock(&self) -> Result<MutexGuard<'_, Inner>, c_int> {
        self.inner.lock().map_err(|_| EINVAL)
    }

    /// The fields the program sees; only under `inner`'s lock (`_inner` proves it).
    #[allow(clippy::mut_from_ref)]
    pub(crate) fn raw(&self, _inner: &mut MutexGuard<'_, Inner>) -> &mut rdma_cm_id {
        // SAFETY: writers hold `inner`'s lock, which the caller holds.
        unsafe { &mut *self.raw.get() }
    }

    pub(crate) fn channel(&self, inner: &mut MutexGuard<'_, Inner>) -> Result<&Channel, c_int> {
        let channel = self.raw(inner).channel;
        // SAFETY: an id's channel outlives it (rdma-core's rule for programs).
        unsafe { Channel::from_raw(channel) }.ok_or(EINVAL)
    }

    /// The passive id of a connect request on `listener`, registered on `channel`.
    pub(crate) fn from_request(
        listener: &Id,
        channel: &Channel,
        cm: CmId,
        request: Request,
    ) -> *mut rdma_cm_id {
        let (context, ps, device) = match listener.lock() {
            Ok(mut inner) => {
                let raw = listener.raw(&mut inner);
                (raw.context, raw.ps, inner.device)
            }
            Err(_) => (core::ptr::null_mut(), RDMA_PS_TCP, None),
        };
        let id = Box::leak(Id::new(channel, context, ps));
        channel.register(cm.handle(), id.key());
        if let Ok(mut inner) = id.lock() {
            inner.request = Some(request);
            inner.device = device;
            if let Some(device) = device {
                id.raw(&mut inner).verbs = device.ibv;
                id.raw(&mut inner).pd = device.pd;
                id.raw(&mut inner).port_num = 1;
            }
            id.describe(&mut inner, &cm);
            inner.cm = Some(cm);
        }
        id.as_raw()
    }

    /// Writes the id's addresses and GIDs where the program reads them.
    pub(crate) fn describe(&self, inner: &mut MutexGuard<'_, Inner>, cm: &CmId) {
        let raw = self.raw(inner);
        if let Some(local) = cm.local_addr() {
            raw.route.addr.src_addr = to_storage(local);
        }
        if let Some(peer) = cm.peer_addr() {
            raw.route.addr.dst_addr = to_storage(peer);
        }
        if let Some((sgid, dgid)) = cm.gids() {
            raw.route.addr.ibaddr.sgid = sgid;
            raw.route.addr.ibaddr.dgid = dgid;
            raw.route.addr.ibaddr.pkey = 0xFFFF;
        }
        if let Some(path) = cm.path_record() {
            let path = inner.path.insert(Box::new(qp_attr::path_rec(&path)));
            let path = core::ptr::from_mut::<ibv_sa_path_rec>(path).cast();
            let raw = self.raw(inner);
            raw.route.path_rec = path;
            raw.route.num_paths = 1;
        }
    }

    /// [`describe`](Self::describe) with the id's own `CmId`.
    pub(crate) fn describe_now(&self, inner: &mut MutexGuard<'_, Inner>) -> Result<(), c_int> {
        let cm = inner.cm.take().ok_or(EINVAL)?;
        self.describe(inner, &cm);
        inner.cm = Some(cm);
        Ok(())
    }

    /// The id's `roce_verbs::CmId`, made on the device of `ip` if it has none yet.
    pub(crate) fn attach<'a>(
        &self,
        inner: &'a mut MutexGuard<'_, Inner>,
        ip: IpAddr,
    ) -> Result<&'a CmId, c_int> {
        if inner.cm.is_none() {
            let device = verbs::device_for(ip)?;
            let channel = self.channel(inner)?;
            let cm = if self.raw(inner).ps == RDMA_PS_UDP {
                device.verbs.create_ud_id(channel.events())
            } else {
                device.verbs.create_id(channel.events())
            };
            let cm = cm.map_err(|error| crate::errors::fail("rdma_create_id", &error))?;
            channel.register(cm.handle(), self.key());
            if let Some(tos) = inner.tos {
                cm.set_tos(tos)
                    .map_err(|error| crate::errors::fail("rdma_set_option", &error))?;
            }
            inner.device = Some(device);
            inner.cm = Some(cm);
        }
        inner.cm.as_ref().ok_or(EINVAL)
    }

    /// Shows the program the device the id is on (`id->verbs`, `id->port_num`): once it is
    /// bound to one of the device's addresses or has resolved a peer. An id bound to the
    /// wildcard or a loopback address shows none, as the kernel's (`cma_any_addr`).
    pub(crate) fn show_device(&self, inner: &mut MutexGuard<'_, Inner>) {
        if let Some(device) = inner.device {
            let raw = self.raw(inner);
            raw.verbs = device.ibv;
            raw.pd = device.pd;
            raw.port_num = 1;
        }
    }

    pub(crate) fn cm<'a>(inner: &'a MutexGuard<'_, Inner>) -> Result<&'a CmId, c_int> {
        inner.cm.as_ref().ok_or(EINVAL)
    }

    /// Makes the id synchronous: its own channel, its events moved there.
    pub(crate) fn make_synchronous(&self) -> Result<(), c_int> {
        let channel = Channel::new()?;
        let mut inner = self.lock()?;
        let old = self.channel(&mut inner)?;
        if let Some(cm) = &inner.cm {
            cm.migrate(channel.events())
                .map_err(|error| crate::errors::fail("rdma_migrate_id", &error))?;
            old.unregister(cm.handle());
            channel.register(cm.handle(), self.key());
        }
        self.raw(&mut inner).channel = channel.as_raw();
        inner.own_channel = Some(channel);
        Ok(())
    }
}

/// Reads a `sockaddr` the program passes.
///
/// # Safety
/// `addr` is NULL or points to a `sockaddr_in` or `sockaddr_in6` (as its family says).
pub(crate) unsafe fn from_sockaddr(addr: *const libc::sockaddr) -> Option<SocketAddr> {
    // SAFETY: the caller passes NULL or a sockaddr.
    let family = c_int::from(unsafe { addr.as_ref() }?.sa_family);
    match family {
        libc::AF_INET => {
            // SAFETY: its family says it is a sockaddr_in.
            let v4 = unsafe { addr.cast::<libc::sockaddr_in>().read_unaligned() };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(v4.sin_addr.s_addr)),
                u16::from_be(v4.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: its family says it is a sockaddr_in6.
            let v6 = unsafe { addr.cast::<libc::sockaddr_in6>().read_unaligned() };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(v6.sin6_addr.s6_addr),
                u16::from_be(v6.sin6_port),
                v6.sin6_flowinfo,
                v6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// `addr` as a `sockaddr_storage`.
pub(crate) fn to_storage(addr: SocketAddr) -> libc::sockaddr_storage {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut storage: libc::sockaddr_storage = unsafe { core::mem::zeroed() };
    match addr {
        SocketAddr::V4(v4) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from(*v4.ip()).to_be(),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: a sockaddr_in fits in a sockaddr_storage.
            unsafe {
                core::ptr::from_mut(&mut storage)
                    .cast::<libc::sockaddr_in>()
                    .write(sin)
            };
        }
        SocketAddr::V6(v6) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: v6.port().to_be(),
                sin6_flowinfo: v6.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: v6.ip().octets(),
                },
                sin6_scope_id: v6.scope_id(),
            };
            // SAFETY: a sockaddr_in6 fits in a sockaddr_storage.
            unsafe {
                core::ptr::from_mut(&mut storage)
                    .cast::<libc::sockaddr_in6>()
                    .write(sin6)
            };
        }
    }
    storage
}

/// The port of a `sockaddr_storage`, in network order (0 for no address).
pub(crate) fn port_of(storage: &libc::sockaddr_storage) -> u16 {
    // SAFETY: a sockaddr_storage holds a sockaddr of its family (or zeros).
    match unsafe { from_sockaddr(core::ptr::from_ref(storage).cast()) } {
        Some(addr) => addr.port().to_be(),
        None => 0,
    }
}

/// Runs `f` on the id, turning an errno into -1 with errno set.
pub(crate) fn with_id(id: *mut rdma_cm_id, f: impl FnOnce(&Id) -> Result<(), c_int>) -> c_int {
    // SAFETY: the caller passes an id of ours.
    let Some(ours) = (unsafe { Id::from_raw(id) }) else {
        set_errno(EINVAL);
        return -1;
    };
    match f(ours) {
        Ok(()) => 0,
        Err(errno) => {
            set_errno(errno);
            -1
        }
    }
}

/// `rdma_create_id`: RC ids (`RDMA_PS_TCP`) and UD ids (`RDMA_PS_UDP`). With no channel
/// the id is synchronous: its calls wait for their event, as rdma-core's do.
pub unsafe extern "C" fn create_id(
    channel: *mut rdma_event_channel,
    id: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: c_int,
) -> c_int {
    if id.is_null() {
        set_errno(EINVAL);
        return -1;
    }
    if ps != RDMA_PS_TCP && ps != RDMA_PS_UDP {
        crate::errors::log_failure(
            "rdma_create_id",
            &"only RDMA_PS_TCP and RDMA_PS_UDP ids are offered",
        );
        set_errno(EOPNOTSUPP);
        return -1;
    }
    // SAFETY: the caller passes NULL or a channel of ours.
    let made = match unsafe { Channel::from_raw(channel) } {
        Some(channel) => Box::leak(Id::new(channel, context, ps)),
        None => match Channel::new() {
            Ok(own) => {
                let made = Box::leak(Id::new(&own, context, ps));
                if let Ok(mut inner) = made.lock() {
                    inner.own_channel = Some(own);
                }
                made
            }
            Err(errno) => {
                set_errno(errno);
                return -1;
            }
        },
    };
    // SAFETY: checked not null; the caller's out pointer.
    unsafe { *id = made.as_raw() };
    0
}

/// `rdma_destroy_id`: a connection still up is disconnected, a request not answered
/// rejected, a listener stops. Returns once every event of the id the program took is acked
/// (as rdma-core's), so that no event, nor a conversion under way, points into it.
pub unsafe extern "C" fn destroy_id(id: *mut rdma_cm_id) -> c_int {
    let destroyed = with_id(id, |ours| {
        let mut inner = ours.lock()?;
        if let Some(cm) = inner.cm.take() {
            ours.channel(&mut inner)?.unregister(cm.handle());
        }
        drop(inner);
        // Unregistered: no new event counts on it, so this ends once the program acks.
        ours.unacked.wait_all_acked();
        Ok(())
    });
    if destroyed == 0 {
        // SAFETY: an id of ours, destroyed once; unregistered and all its events acked
        // above, so nothing points into it.
        drop(unsafe { Box::from_raw(id.cast::<Id>()) });
    }
    destroyed
}

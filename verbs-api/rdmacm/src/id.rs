//! CM ids (`rdma_create_id` … `rdma_destroy_id`): an `rdma_cm_id` the program reads
//! (`verbs`, `qp`, `route`, `port_num`, `context`) in front of a `roce_verbs::CmId`, made
//! on the device the id's address belongs to once it has one (`rdma_bind_addr`,
//! `rdma_resolve_addr`), as rdma-core binds an id to a device only then.

use core::cell::UnsafeCell;
use core::ffi::{c_int, c_void};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::sync::{Mutex, MutexGuard};

use roce_cabi::set_errno;
use roce_verbs::{CmId, ConnParam, QpState};

use crate::abi::*;
use crate::channel::Channel;
use crate::qp_attr;
use crate::verbs::{self, Opened};

const EINVAL: c_int = 22;
const EOPNOTSUPP: c_int = 95;
const ECONNREFUSED: c_int = 111;
const ETIMEDOUT: c_int = 110;

/// Depth of the CQs `rdma_create_qp` makes when the caller gives none.
const DEFAULT_CQ_DEPTH: c_int = 64;

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
}

// SAFETY: `raw` is written only under `inner`'s lock (the program reads it as it reads
// rdma-core's); everything else is Sync.
unsafe impl Sync for Id {}

#[derive(Default)]
struct Inner {
    cm: Option<CmId>,
    device: Option<Opened>,
    request: Option<Request>,
    /// CQs and channels `rdma_create_qp` made, which `rdma_destroy_qp` destroys.
    made: Vec<(unsafe extern "C" fn(*mut c_void) -> c_int, *mut c_void)>,
    /// A synchronous id's own channel (`rdma_create_id` with none): its calls wait for
    /// their event.
    own_channel: Option<Box<Channel>>,
    /// What `rdma_create_ep` gave a passive endpoint for the QPs of its requests.
    ep_qp: Option<(*mut c_void, ibv_qp_init_attr)>,
    /// What `id->route.path_rec` points to once the route is known.
    path: Option<Box<ibv_sa_path_rec>>,
}

impl Id {
    fn new(channel: &Channel, context: *mut c_void, ps: c_int) -> Box<Id> {
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

    fn lock(&self) -> Result<MutexGuard<'_, Inner>, c_int> {
        self.inner.lock().map_err(|_| EINVAL)
    }

    /// The fields the program sees; only under `inner`'s lock (`_inner` proves it).
    #[allow(clippy::mut_from_ref)]
    fn raw(&self, _inner: &mut MutexGuard<'_, Inner>) -> &mut rdma_cm_id {
        // SAFETY: writers hold `inner`'s lock, which the caller holds.
        unsafe { &mut *self.raw.get() }
    }

    fn channel(&self, inner: &mut MutexGuard<'_, Inner>) -> Result<&Channel, c_int> {
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
        channel.register(cm.handle(), id);
        if let Ok(mut inner) = id.lock() {
            inner.request = Some(request);
            inner.device = device;
            if let Some(device) = device {
                id.raw(&mut inner).verbs = device.ibv;
                id.raw(&mut inner).port_num = 1;
            }
            id.describe(&mut inner, &cm);
            inner.cm = Some(cm);
        }
        id.as_raw()
    }

    /// Writes the id's addresses and GIDs where the program reads them.
    fn describe(&self, inner: &mut MutexGuard<'_, Inner>, cm: &CmId) {
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
    fn describe_now(&self, inner: &mut MutexGuard<'_, Inner>) -> Result<(), c_int> {
        let cm = inner.cm.take().ok_or(EINVAL)?;
        self.describe(inner, &cm);
        inner.cm = Some(cm);
        Ok(())
    }

    /// The id's `roce_verbs::CmId`, made on the device of `ip` if it has none yet.
    fn attach<'a>(
        &self,
        inner: &'a mut MutexGuard<'_, Inner>,
        ip: IpAddr,
    ) -> Result<&'a CmId, c_int> {
        if inner.cm.is_none() {
            let device = verbs::device_for(ip)?;
            let channel = self.channel(inner)?;
            let cm = if self.raw(inner).ps == RDMA_PS_UDP {
                device.verbs.create_ud_id(&channel.channel)
            } else {
                device.verbs.create_id(&channel.channel)
            };
            let cm = cm.map_err(|error| crate::fail("rdma_create_id", &error))?;
            channel.register(cm.handle(), self);
            let raw = self.raw(inner);
            raw.verbs = device.ibv;
            raw.port_num = 1;
            inner.device = Some(device);
            inner.cm = Some(cm);
        }
        inner.cm.as_ref().ok_or(EINVAL)
    }

    /// `struct rdma_ud_param` for the UD service `qp_num` / `qkey` this id resolved.
    pub(crate) fn ud_param(&self, qp_num: u32, qkey: u32, private_data: &[u8]) -> rdma_ud_param {
        let av = self
            .lock()
            .ok()
            .and_then(|inner| inner.cm.as_ref()?.ud_address());
        let ah = av.as_ref().map(qp_attr::ah_attr).unwrap_or_default();
        crate::channel::ud_param(qp_num, qkey, private_data, ah)
    }

    fn cm<'a>(inner: &'a MutexGuard<'_, Inner>) -> Result<&'a CmId, c_int> {
        inner.cm.as_ref().ok_or(EINVAL)
    }

    /// Makes the id synchronous: its own channel, its events moved there.
    fn make_synchronous(&self) -> Result<(), c_int> {
        let channel = Channel::new()?;
        let mut inner = self.lock()?;
        let old = self.channel(&mut inner)?;
        if let Some(cm) = &inner.cm {
            cm.migrate(&channel.channel)
                .map_err(|error| crate::fail("rdma_migrate_id", &error))?;
            old.unregister(cm.handle());
            channel.register(cm.handle(), self);
        }
        self.raw(&mut inner).channel = channel.as_raw();
        inner.own_channel = Some(channel);
        Ok(())
    }

    /// For a synchronous id, waits for the event its call brings: `expected`, else the
    /// errno rdma-core gives (`ECONNREFUSED` for a reject, `ETIMEDOUT` when unreachable).
    fn complete(&self, expected: c_int) -> Result<(), c_int> {
        let channel = {
            let inner = self.lock()?;
            match &inner.own_channel {
                Some(channel) => core::ptr::from_ref::<Channel>(channel),
                None => return Ok(()),
            }
        };
        // SAFETY: the id's own channel lives as long as the id, which the caller holds.
        let event = unsafe { &*channel }.next()?;
        match event.what() {
            (code, _) if code == expected => Ok(()),
            (8, _) => Err(ECONNREFUSED),
            (7, _) => Err(ETIMEDOUT),
            (_, status) if status < 0 => Err(-status),
            _ => Err(EINVAL),
        }
    }
}

/// Reads a `sockaddr` the program passes.
///
/// # Safety
/// `addr` is NULL or points to a `sockaddr_in` or `sockaddr_in6` (as its family says).
unsafe fn from_sockaddr(addr: *const libc::sockaddr) -> Option<SocketAddr> {
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
fn port_of(storage: &libc::sockaddr_storage) -> u16 {
    // SAFETY: a sockaddr_storage holds a sockaddr of its family (or zeros).
    match unsafe { from_sockaddr(core::ptr::from_ref(storage).cast()) } {
        Some(addr) => addr.port().to_be(),
        None => 0,
    }
}

/// Runs `f` on the id, turning an errno into -1 with errno set.
fn with_id(id: *mut rdma_cm_id, f: impl FnOnce(&Id) -> Result<(), c_int>) -> c_int {
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
pub(crate) unsafe extern "C" fn create_id(
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
        crate::log_failure(
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
/// rejected, a listener stops.
pub(crate) unsafe extern "C" fn destroy_id(id: *mut rdma_cm_id) -> c_int {
    let destroyed = with_id(id, |ours| {
        let mut inner = ours.lock()?;
        if let Some(cm) = inner.cm.take() {
            ours.channel(&mut inner)?.unregister(cm.handle());
        }
        Ok(())
    });
    if destroyed == 0 {
        // SAFETY: an id of ours, destroyed once; unregistered above, so no event names it.
        drop(unsafe { Box::from_raw(id.cast::<Id>()) });
    }
    destroyed
}

/// `rdma_bind_addr`.
pub(crate) unsafe extern "C" fn bind_addr(id: *mut rdma_cm_id, addr: *mut libc::sockaddr) -> c_int {
    with_id(id, |ours| {
        // SAFETY: the caller passes a sockaddr.
        let addr = unsafe { from_sockaddr(addr) }.ok_or(EINVAL)?;
        let mut inner = ours.lock()?;
        let cm = ours.attach(&mut inner, addr.ip())?;
        cm.bind_addr(addr)
            .map_err(|error| crate::fail("rdma_bind_addr", &error))?;
        let raw = ours.raw(&mut inner);
        raw.route.addr.src_addr = to_storage(addr);
        Ok(())
    })
}

/// `rdma_resolve_addr`: reports `ADDR_RESOLVED` or `ADDR_ERROR` on the channel.
pub(crate) unsafe extern "C" fn resolve_addr(
    id: *mut rdma_cm_id,
    src: *mut libc::sockaddr,
    dst: *mut libc::sockaddr,
    _timeout_ms: c_int,
) -> c_int {
    with_id(id, |ours| {
        // SAFETY: the caller passes sockaddrs (or NULL for `src`).
        let (src, dst) = unsafe { (from_sockaddr(src), from_sockaddr(dst)) };
        let dst = dst.ok_or(EINVAL)?;
        let mut inner = ours.lock()?;
        let cm = ours.attach(&mut inner, src.map_or(dst.ip(), |src| src.ip()))?;
        if let Some(src) = src {
            cm.bind_addr(src)
                .map_err(|error| crate::fail("rdma_resolve_addr", &error))?;
        }
        cm.resolve_addr(dst)
            .map_err(|error| crate::fail("rdma_resolve_addr", &error))?;
        ours.describe_now(&mut inner)?;
        drop(inner);
        ours.complete(0)
    })
}

/// `rdma_resolve_route`: reports `ROUTE_RESOLVED` (RoCE has no SA: the path is local) and
/// sets `id->route.path_rec`.
pub(crate) unsafe extern "C" fn resolve_route(id: *mut rdma_cm_id, _timeout_ms: c_int) -> c_int {
    with_id(id, |ours| {
        let mut inner = ours.lock()?;
        Id::cm(&inner)?
            .resolve_route()
            .map_err(|error| crate::fail("rdma_resolve_route", &error))?;
        ours.describe_now(&mut inner)?;
        drop(inner);
        ours.complete(2)
    })
}

/// `rdma_listen`.
pub(crate) unsafe extern "C" fn listen(id: *mut rdma_cm_id, backlog: c_int) -> c_int {
    with_id(id, |ours| {
        let inner = ours.lock()?;
        // rdma-core's default for a backlog of 0 or less.
        let backlog = usize::try_from(backlog)
            .ok()
            .filter(|&n| n > 0)
            .unwrap_or(1024);
        Id::cm(&inner)?
            .listen(backlog)
            .map_err(|error| crate::fail("rdma_listen", &error))
    })
}

/// The PD and CQs a QP of the id is made with: the caller's, else the id's PD (allocated
/// once) and new CQs.
struct QpParts {
    pd: *mut c_void,
    send_cq: *mut c_void,
    recv_cq: *mut c_void,
}

/// `rdma_create_qp`: an RC QP through our libibverbs, in INIT (P_Key index 0, port 1, no
/// remote access until the CM exchange sets it), with the id's PD and new CQs where the
/// caller gives none; `id->qp` is set.
pub(crate) unsafe extern "C" fn create_qp(
    id: *mut rdma_cm_id,
    pd: *mut c_void,
    attr: *mut ibv_qp_init_attr,
) -> c_int {
    with_id(id, |ours| {
        // SAFETY: the caller passes an init attr.
        let mut init = unsafe { attr.as_ref() }.copied().ok_or(EINVAL)?;
        let caller = QpParts {
            pd,
            send_cq: init.send_cq,
            recv_cq: init.recv_cq,
        };
        attach_qp(
            ours,
            "rdma_create_qp",
            init.qp_type,
            caller,
            |verbs, _, parts| {
                init.send_cq = parts.send_cq;
                init.recv_cq = parts.recv_cq;
                // SAFETY: a PD of our libibverbs and a complete init attr.
                let qp = unsafe { (verbs.create_qp)(parts.pd, &mut init) };
                // As ibv_create_qp does to its argument: the caps granted.
                // SAFETY: the caller's init attr, checked not null above.
                unsafe { (*attr).cap = init.cap };
                qp
            },
        )
    })
}

/// `rdma_create_qp_ex` (perftest's `-R` uses it for the work request builders): as
/// `rdma_create_qp`, through the device's `create_qp_ex` op, with the caller's extended
/// attributes (`attr->pd` the id's when the caller gives none).
pub(crate) unsafe extern "C" fn create_qp_ex(
    id: *mut rdma_cm_id,
    attr: *mut ibv_qp_init_attr_ex,
) -> c_int {
    with_id(id, |ours| {
        // SAFETY: the caller passes a writable init attr, used only within this call.
        let init = unsafe { attr.as_mut() }.ok_or(EINVAL)?;
        let pd = if init.comp_mask & IBV_QP_INIT_ATTR_PD == 0 {
            core::ptr::null_mut()
        } else {
            init.pd
        };
        let caller = QpParts {
            pd,
            send_cq: init.send_cq,
            recv_cq: init.recv_cq,
        };
        attach_qp(
            ours,
            "rdma_create_qp_ex",
            init.qp_type,
            caller,
            |_, device, parts| {
                init.send_cq = parts.send_cq;
                init.recv_cq = parts.recv_cq;
                init.pd = parts.pd;
                init.comp_mask |= IBV_QP_INIT_ATTR_PD;
                // SAFETY: our libibverbs' contexts are `verbs_context`s (verbs.h's layout), so
                // the op sits at this fixed distance before the `ibv_context`.
                let create = unsafe {
                    device
                        .ibv
                        .cast::<u8>()
                        .sub(CREATE_QP_EX_BEFORE_CONTEXT)
                        .cast::<Option<CreateQpEx>>()
                        .read()
                };
                match create {
                    // SAFETY: the device's own op, its context and a complete init attr.
                    Some(create) => unsafe { create(device.ibv, init) },
                    None => {
                        set_errno(EOPNOTSUPP);
                        core::ptr::null_mut()
                    }
                }
            },
        )
    })
}

/// What `rdma_create_qp` and `rdma_create_qp_ex` share: RC only, the id's PD and new CQs
/// where `caller` has none, the QP `make` creates moved to INIT and set as `id->qp`.
fn attach_qp(
    ours: &Id,
    call: &str,
    qp_type: u32,
    caller: QpParts,
    make: impl FnOnce(&verbs::Verbs, Opened, &QpParts) -> *mut ibv_qp,
) -> Result<(), c_int> {
    let verbs = verbs::verbs()?;
    let mut inner = ours.lock()?;
    if c_int::try_from(qp_type) != Ok(ours.raw(&mut inner).qp_type) {
        crate::log_failure(
            call,
            &"a QP of the id's type (RC for TCP ids, UD for UDP ids)",
        );
        return Err(EOPNOTSUPP);
    }
    let device = inner.device.ok_or(EINVAL)?;
    let pd = match (caller.pd.is_null(), ours.raw(&mut inner).pd.is_null()) {
        (false, _) => caller.pd,
        (true, false) => ours.raw(&mut inner).pd,
        (true, true) => {
            // SAFETY: an open context of our libibverbs.
            let made = unsafe { (verbs.alloc_pd)(device.ibv) };
            if made.is_null() {
                return Err(crate::errno());
            }
            made
        }
    };
    ours.raw(&mut inner).pd = pd;
    let mut parts = QpParts { pd, ..caller };
    for send in [true, false] {
        let cq = if send {
            &mut parts.send_cq
        } else {
            &mut parts.recv_cq
        };
        if !cq.is_null() {
            continue;
        }
        // SAFETY: an open context of our libibverbs.
        let comp = unsafe { (verbs.create_comp_channel)(device.ibv) };
        if comp.is_null() {
            return Err(crate::errno());
        }
        inner.made.push((verbs.destroy_comp_channel, comp));
        // SAFETY: an open context and its channel.
        let made = unsafe {
            (verbs.create_cq)(device.ibv, DEFAULT_CQ_DEPTH, ours.as_raw().cast(), comp, 0)
        };
        if made.is_null() {
            return Err(crate::errno());
        }
        // The CQ goes before its channel.
        inner.made.insert(0, (verbs.destroy_cq, made));
        *cq = made;
        let raw = ours.raw(&mut inner);
        if send {
            raw.send_cq = made;
            raw.send_cq_channel = comp;
        } else {
            raw.recv_cq = made;
            raw.recv_cq_channel = comp;
        }
    }
    let qp = make(verbs, device, &parts);
    if qp.is_null() {
        return Err(crate::errno());
    }
    // As rdma-core: an RC QP waits in INIT for the exchange; a UD QP goes on to RTS.
    let steps: &[QpState] = if qp_type == IBV_QPT_UD {
        &[QpState::Init, QpState::Rtr, QpState::Rts]
    } else {
        &[QpState::Init]
    };
    for &state in steps {
        let moved = Id::cm(&inner)?.qp_attr(state).map_or(EINVAL, |answer| {
            let mut attr = ibv_qp_attr::default();
            let mask = qp_attr::to_c(&answer, &mut attr);
            // SAFETY: the QP just made, and an attr complete for `mask`.
            unsafe { (verbs.modify_qp)(qp, &mut attr, mask) }
        });
        if moved != 0 {
            // SAFETY: the QP just made, not handed out.
            unsafe { (verbs.destroy_qp)(qp) };
            return Err(moved);
        }
    }
    ours.raw(&mut inner).qp = qp;
    Ok(())
}

/// `rdma_destroy_qp`: the id's QP, and the CQs `rdma_create_qp` made for it.
pub(crate) unsafe extern "C" fn destroy_qp(id: *mut rdma_cm_id) {
    with_id(id, |ours| {
        let verbs = verbs::verbs()?;
        let mut inner = ours.lock()?;
        let raw = ours.raw(&mut inner);
        let qp = core::mem::replace(&mut raw.qp, core::ptr::null_mut());
        if !qp.is_null() {
            // SAFETY: the id's QP, destroyed once.
            unsafe { (verbs.destroy_qp)(qp) };
        }
        for (destroy, object) in core::mem::take(&mut inner.made) {
            // SAFETY: objects this library made for the id, destroyed once, CQs first.
            unsafe { destroy(object) };
        }
        Ok(())
    });
}

/// The QP number a connect or accept uses: the id's QP, else `param->qp_num` (a QP the
/// program manages itself).
fn qp_num(raw: &rdma_cm_id, param: Option<&rdma_conn_param>) -> Result<u32, c_int> {
    // SAFETY: the id's QP is NULL or one of our libibverbs, alive while the id uses it.
    match unsafe { raw.qp.as_ref() } {
        Some(qp) => Ok(qp.qp_num),
        None => param.map(|param| param.qp_num).ok_or(EINVAL),
    }
}

/// `ConnParam` from the program's `rdma_conn_param`.
fn conn_param(param: &rdma_conn_param) -> ConnParam {
    let data = if param.private_data.is_null() {
        Vec::new()
    } else {
        // SAFETY: the program's private data, `private_data_len` bytes.
        unsafe {
            core::slice::from_raw_parts(
                param.private_data.cast::<u8>(),
                usize::from(param.private_data_len),
            )
        }
        .to_vec()
    };
    ConnParam {
        private_data: data,
        responder_resources: param.responder_resources,
        initiator_depth: param.initiator_depth,
        retry_count: param.retry_count.min(7),
        rnr_retry_count: param.rnr_retry_count.min(7),
    }
}

/// `rdma_connect`: the REQ leaves; `ESTABLISHED`, `REJECTED` or `UNREACHABLE` follows.
pub(crate) unsafe extern "C" fn connect(id: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int {
    with_id(id, |ours| {
        // SAFETY: the caller passes NULL or a conn param.
        let param = unsafe { param.as_ref() };
        let mut inner = ours.lock()?;
        let cm = Id::cm(&inner)?;
        if cm.is_ud() {
            let private = param.map(conn_param).unwrap_or_default().private_data;
            cm.connect_ud(&private)
                .map_err(|error| crate::fail("rdma_connect", &error))?;
            drop(inner);
            return ours.complete(9);
        }
        let qpn = qp_num(ours.raw(&mut inner), param)?;
        let program_qp = ours.raw(&mut inner).qp.is_null();
        let param = param.map(conn_param).unwrap_or_default();
        let cm = Id::cm(&inner)?;
        let connected = if program_qp {
            cm.connect_program_qp(qpn, &param)
        } else {
            cm.connect_qp_num(qpn, &param)
        };
        connected.map_err(|error| crate::fail("rdma_connect", &error))?;
        if let Some(local) = cm.local_addr() {
            ours.raw(&mut inner).route.addr.src_addr = to_storage(local);
        }
        drop(inner);
        // An id without a QP hears CONNECT_RESPONSE and moves its QP itself, as rdma-core.
        ours.complete(if program_qp { 5 } else { 9 })
    })
}

/// `rdma_accept`: the QP goes to RTR and RTS and the REP leaves; `ESTABLISHED` follows the
/// RTU. With no param, the request's depths are granted.
pub(crate) unsafe extern "C" fn accept(id: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int {
    with_id(id, |ours| {
        // SAFETY: the caller passes NULL or a conn param.
        let param = unsafe { param.as_ref() };
        let mut inner = ours.lock()?;
        let qpn = qp_num(ours.raw(&mut inner), param)?;
        if Id::cm(&inner)?.is_ud() {
            // No RTU follows a SIDR_REP, so there is no event to wait for.
            let private = param.map(conn_param).unwrap_or_default().private_data;
            return Id::cm(&inner)?
                .accept_ud(qpn, &private)
                .map_err(|error| crate::fail("rdma_accept", &error));
        }
        let param = match (param, inner.request) {
            (Some(param), _) => conn_param(param),
            (None, Some(request)) => ConnParam {
                responder_resources: request.responder_resources,
                initiator_depth: request.initiator_depth,
                ..ConnParam::default()
            },
            (None, None) => ConnParam::default(),
        };
        let program_qp = ours.raw(&mut inner).qp.is_null();
        let cm = Id::cm(&inner)?;
        let accepted = if program_qp {
            cm.accept_program_qp(qpn, &param)
        } else {
            cm.accept_qp_num(qpn, &param)
        };
        accepted.map_err(|error| crate::fail("rdma_accept", &error))?;
        drop(inner);
        ours.complete(9)
    })
}

/// `rdma_reject`.
pub(crate) unsafe extern "C" fn reject(
    id: *mut rdma_cm_id,
    private_data: *const c_void,
    len: u8,
) -> c_int {
    with_id(id, |ours| {
        let data = if private_data.is_null() {
            &[][..]
        } else {
            // SAFETY: the program's private data, `len` bytes.
            unsafe { core::slice::from_raw_parts(private_data.cast::<u8>(), usize::from(len)) }
        };
        let inner = ours.lock()?;
        Id::cm(&inner)?
            .reject(data)
            .map_err(|error| crate::fail("rdma_reject", &error))
    })
}

/// `rdma_disconnect`: the QP goes to ERR and the DREQ leaves; `DISCONNECTED` follows.
pub(crate) unsafe extern "C" fn disconnect(id: *mut rdma_cm_id) -> c_int {
    with_id(id, |ours| {
        let inner = ours.lock()?;
        Id::cm(&inner)?
            .disconnect()
            .map_err(|error| crate::fail("rdma_disconnect", &error))
    })
}

/// `rdma_establish`: after `CONNECT_RESPONSE` on an id without a QP (the program moved
/// its own), sends the RTU. An id with a QP was established by the CM itself (`EINVAL`, as
/// rdma-core).
pub(crate) unsafe extern "C" fn establish(id: *mut rdma_cm_id) -> c_int {
    with_id(id, |ours| {
        let mut inner = ours.lock()?;
        if !ours.raw(&mut inner).qp.is_null() {
            return Err(EINVAL);
        }
        Id::cm(&inner)?
            .establish()
            .map_err(|error| crate::fail("rdma_establish", &error))
    })
}

/// `rdma_notify`: the CM learns of the QP's first packet from the QP itself, so there is
/// nothing to tell it.
pub(crate) unsafe extern "C" fn notify(id: *mut rdma_cm_id, _event: c_int) -> c_int {
    with_id(id, |ours| Id::cm(&ours.lock()?).map(|_| ()))
}

/// `rdma_migrate_id`: the id's events go to `channel` from now on.
pub(crate) unsafe extern "C" fn migrate_id(
    id: *mut rdma_cm_id,
    channel: *mut rdma_event_channel,
) -> c_int {
    with_id(id, |ours| {
        // SAFETY: the caller passes NULL or a channel of ours.
        let Some(to) = (unsafe { Channel::from_raw(channel) }) else {
            crate::log_failure(
                "rdma_migrate_id",
                &"synchronous ids (no channel) are not offered",
            );
            return Err(EOPNOTSUPP);
        };
        let mut inner = ours.lock()?;
        let from = ours.channel(&mut inner)?;
        if let Some(cm) = &inner.cm {
            cm.migrate(&to.channel)
                .map_err(|error| crate::fail("rdma_migrate_id", &error))?;
            from.unregister(cm.handle());
            to.register(cm.handle(), ours);
        }
        ours.raw(&mut inner).channel = to.as_raw();
        Ok(())
    })
}

/// `rdma_init_qp_attr`: the attributes that move the id's QP to `attr->qp_state` (INIT,
/// RTR or RTS) and their mask, as the kernel's rdma_cm derives them from the exchange.
pub(crate) unsafe extern "C" fn init_qp_attr(
    id: *mut rdma_cm_id,
    attr: *mut ibv_qp_attr,
    mask: *mut c_int,
) -> c_int {
    with_id(id, |ours| {
        // SAFETY: the caller passes a QP attr and a mask to fill.
        let (Some(attr), Some(mask)) = (unsafe { attr.as_mut() }, unsafe { mask.as_mut() }) else {
            return Err(EINVAL);
        };
        let state = qp_attr::qp_state(attr.qp_state).ok_or(EINVAL)?;
        let inner = ours.lock()?;
        let answer = Id::cm(&inner)?
            .qp_attr(state)
            .map_err(|error| crate::fail("rdma_init_qp_attr", &error))?;
        *mask = qp_attr::to_c(&answer, attr);
        Ok(())
    })
}

/// `rdma_get_src_port`, in network order.
pub(crate) unsafe extern "C" fn get_src_port(id: *mut rdma_cm_id) -> u16 {
    // SAFETY: the caller passes an id of ours.
    unsafe { id.as_ref() }.map_or(0, |raw| port_of(&raw.route.addr.src_addr))
}

/// `rdma_get_dst_port`, in network order.
pub(crate) unsafe extern "C" fn get_dst_port(id: *mut rdma_cm_id) -> u16 {
    // SAFETY: the caller passes an id of ours.
    unsafe { id.as_ref() }.map_or(0, |raw| port_of(&raw.route.addr.dst_addr))
}

/// `rdma_set_option`: the options rdma-core passes to the kernel for an RC id over RoCE
/// (`RDMA_OPTION_ID_TOS`, `_REUSEADDR`, `_AFONLY`, `_ACK_TIMEOUT`) are accepted and have no
/// effect here; others fail with `ENOSYS`, as the kernel answers them.
pub(crate) unsafe extern "C" fn set_option(
    id: *mut rdma_cm_id,
    level: c_int,
    optname: c_int,
    optval: *mut c_void,
    optlen: usize,
) -> c_int {
    with_id(id, |_| {
        const RDMA_OPTION_ID: c_int = 0;
        if optval.is_null() || optlen == 0 {
            return Err(EINVAL);
        }
        match (level, optname) {
            (RDMA_OPTION_ID, 0..=3) => Ok(()),
            _ => Err(38),
        }
    })
}

/// `rdma_get_devices`: every device of the namespace, opened, NULL-terminated; freed by
/// `rdma_free_devices`.
pub(crate) unsafe extern "C" fn get_devices(num: *mut c_int) -> *mut *mut c_void {
    let devices = match verbs::open_all() {
        Ok(devices) => devices,
        Err(errno) => {
            set_errno(errno);
            return core::ptr::null_mut();
        }
    };
    // SAFETY: calloc of count+1 pointers, freed by `rdma_free_devices`.
    let list = unsafe { libc::calloc(devices.len() + 1, core::mem::size_of::<*mut c_void>()) }
        .cast::<*mut c_void>();
    if list.is_null() {
        set_errno(12);
        return list;
    }
    for (index, device) in devices.iter().enumerate() {
        // SAFETY: within the array just allocated.
        unsafe { *list.add(index) = device.ibv };
    }
    // SAFETY: the caller passes NULL or a count to fill.
    if let Some(num) = unsafe { num.as_mut() } {
        *num = c_int::try_from(devices.len()).unwrap_or(c_int::MAX);
    }
    list
}

/// `rdma_free_devices`.
pub(crate) unsafe extern "C" fn free_devices(list: *mut *mut c_void) {
    // SAFETY: a list from `rdma_get_devices` (calloc), freed once; the devices stay open.
    unsafe { libc::free(list.cast()) };
}

/// `rdma_create_ep`: a synchronous id from `rdma_getaddrinfo`'s answer: a passive one bound
/// to its source (its requests get QPs as `attr` says), an active one with its address and
/// route resolved and, given `attr`, its QP.
pub(crate) unsafe extern "C" fn create_ep(
    id: *mut *mut rdma_cm_id,
    res: *mut rdma_addrinfo,
    pd: *mut c_void,
    attr: *mut ibv_qp_init_attr,
) -> c_int {
    // SAFETY: the caller passes an rdma_getaddrinfo answer.
    let Some(info) = (unsafe { res.as_ref() }) else {
        set_errno(EINVAL);
        return -1;
    };
    if id.is_null() {
        set_errno(EINVAL);
        return -1;
    }
    let mut made = core::ptr::null_mut();
    // SAFETY: no channel: a synchronous id.
    if unsafe {
        create_id(
            core::ptr::null_mut(),
            &mut made,
            core::ptr::null_mut(),
            info.ai_port_space,
        )
    } != 0
    {
        return -1;
    }
    // As rdma-core: the QP's type is the answer's (programs leave it zero).
    // SAFETY: the caller passes NULL or a QP init attr.
    if let Some(attr) = unsafe { attr.as_mut() } {
        attr.qp_type = u32::try_from(info.ai_qp_type).unwrap_or(IBV_QPT_RC);
    }
    let done = if info.ai_flags & RAI_PASSIVE != 0 {
        // SAFETY: an id just made and the answer's source address.
        let bound = unsafe { bind_addr(made, info.ai_src_addr) };
        if bound == 0 {
            // SAFETY: the id just made.
            if let (Some(ours), Some(attr)) =
                (unsafe { Id::from_raw(made) }, unsafe { attr.as_ref() })
            {
                if let Ok(mut inner) = ours.lock() {
                    inner.ep_qp = Some((pd, *attr));
                }
            }
        }
        bound
    } else {
        // SAFETY: an id just made and the answer's addresses; the QP attr is the caller's.
        unsafe {
            let mut done = resolve_addr(made, info.ai_src_addr, info.ai_dst_addr, 2000);
            if done == 0 {
                done = resolve_route(made, 2000);
            }
            if done == 0 && !attr.is_null() {
                done = create_qp(made, pd, attr);
            }
            done
        }
    };
    if done != 0 {
        let errno = crate::errno();
        // SAFETY: the id just made, not handed out.
        unsafe { destroy_id(made) };
        set_errno(errno);
        return -1;
    }
    // SAFETY: checked not null; the caller's out pointer.
    unsafe { *id = made };
    0
}

/// `rdma_destroy_ep`: the id's QP (and what `rdma_create_qp` made for it), then the id.
pub(crate) unsafe extern "C" fn destroy_ep(id: *mut rdma_cm_id) {
    // SAFETY: the caller passes an id of ours, not used after.
    unsafe {
        destroy_qp(id);
        destroy_id(id);
    }
}

/// `rdma_get_request`: waits on a synchronous listener for a connect request; the new id
/// is synchronous too and, after `rdma_create_ep` with a QP attr, has its QP.
pub(crate) unsafe extern "C" fn get_request(
    listen: *mut rdma_cm_id,
    id: *mut *mut rdma_cm_id,
) -> c_int {
    with_id(listen, |listener| {
        if id.is_null() {
            return Err(EINVAL);
        }
        let (channel, ep_qp) = {
            let inner = listener.lock()?;
            let channel = inner.own_channel.as_deref().ok_or(EINVAL)?;
            (core::ptr::from_ref::<Channel>(channel), inner.ep_qp)
        };
        // SAFETY: the listener's own channel lives as long as the listener.
        let event = unsafe { &*channel }.next()?;
        if event.what().0 != 4 {
            return Err(EINVAL);
        }
        let made = event.id();
        // SAFETY: the new id the request made.
        let ours = unsafe { Id::from_raw(made) }.ok_or(EINVAL)?;
        ours.make_synchronous()?;
        if let Some((pd, mut attr)) = ep_qp {
            // SAFETY: the new id, the PD and attr `rdma_create_ep` was given.
            if unsafe { create_qp(made, pd, &mut attr) } != 0 {
                return Err(crate::errno());
            }
        }
        // SAFETY: checked not null; the caller's out pointer.
        unsafe { *id = made };
        Ok(())
    })
}

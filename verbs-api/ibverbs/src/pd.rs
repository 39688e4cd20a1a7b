//! Protection domains, parent domains and thread domains, and memory regions over the
//! caller's memory: registration (with on-demand paging, explicit or implicit),
//! re-registration and prefetch advice.
//!
//! A parent domain (`ibv_alloc_parent_domain`) is a PD of ours standing for the PD it was
//! made from: objects made in it (QPs, SRQs, regions, address handles) belong to that PD, and
//! its allocators, if it has them, provide the memory of the QPs, SRQs and CQs made with it
//! ([`Placement`]), as a provider calls them for its queue buffers.

use core::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

use roce_cabi::{set_errno, EOPNOTSUPP};
use roce_transport::mr::MrError;
use roce_verbs::{AccessFlags, Rereg, Sge};

use crate::abi::*;
use crate::context::Context;
use crate::handles::{self, Kind};
use crate::logging::fail_null;

const EINVAL: c_int = 22;
const EBUSY: c_int = 16;
const ENOMEM: c_int = 12;
const EPERM: c_int = 1;
const EFAULT: c_int = 14;

/// Our `ibv_pd`, or a parent domain.
#[repr(C)]
pub(crate) struct Pd {
    pub(crate) raw: ibv_pd,
    pub(crate) pd: roce_verbs::Pd,
    /// Regions, QPs, address handles and parent domains made in it: while any is left, it
    /// cannot go.
    pub(crate) users: AtomicUsize,
    /// What a parent domain stands on.
    parent: Option<Parent>,
}

/// A parent domain's own: the PD it was made from, its thread domain, its allocators.
struct Parent {
    protection: *mut ibv_pd,
    td: *mut ibv_td,
    allocators: Option<Allocators>,
}

impl Pd {
    /// A PD (not a parent domain) whose C face is `raw`, over `pd`.
    pub(crate) fn plain(raw: ibv_pd, pd: roce_verbs::Pd) -> Pd {
        Pd {
            raw,
            pd,
            users: AtomicUsize::new(0),
            parent: None,
        }
    }

    /// The PD behind an `ibv_pd` we handed out.
    ///
    /// # Safety
    /// `pd` is NULL or came from [`alloc_pd`] or [`alloc_parent_domain`] and is not freed.
    pub(crate) unsafe fn from_raw<'a>(pd: *mut ibv_pd) -> Option<&'a Pd> {
        // SAFETY: `raw` is the first field of our `#[repr(C)]` Pd.
        unsafe { pd.cast::<Pd>().as_ref() }
    }

    /// Whether it is a parent domain.
    pub(crate) fn is_parent_domain(&self) -> bool {
        self.parent.is_some()
    }

    /// Whether objects made with it are used by one thread at a time (a parent domain on a
    /// thread domain), so they need no locking of their own.
    pub(crate) fn single_threaded(&self) -> bool {
        self.parent
            .as_ref()
            .is_some_and(|parent| !parent.td.is_null())
    }
}

/// `ibv_alloc_pd`.
pub(crate) unsafe extern "C" fn alloc_pd(context: *mut ibv_context) -> *mut ibv_pd {
    // SAFETY: the caller passes an open context.
    let Some(ours) = (unsafe { Context::from_raw(context) }) else {
        set_errno(EINVAL);
        return core::ptr::null_mut();
    };
    match ours.verbs().and_then(roce_verbs::Context::alloc_pd) {
        Ok(pd) => {
            let ptr = Box::into_raw(Box::new(Pd::plain(ibv_pd { context, handle: 0 }, pd)));
            // SAFETY: just made; nobody else has it yet.
            unsafe { (*ptr).raw.handle = handles::register(Kind::Pd, ptr as usize) };
            ptr.cast()
        }
        Err(error) => fail_null("ibv_alloc_pd", crate::errno_of(&error), &error),
    }
}

/// `ibv_dealloc_pd`, of a PD or a parent domain: `EBUSY` while objects use it.
pub(crate) unsafe extern "C" fn dealloc_pd(pd: *mut ibv_pd) -> c_int {
    // SAFETY: the caller passes a PD of ours.
    let Some(ours) = (unsafe { Pd::from_raw(pd) }) else {
        return EINVAL;
    };
    if ours.users.load(Ordering::Acquire) > 0 {
        return EBUSY;
    }
    if let Some(parent) = &ours.parent {
        // SAFETY: what a parent domain stands on outlives it (they cannot go while it uses
        // them).
        unsafe {
            if let Some(protection) = Pd::from_raw(parent.protection) {
                protection.users.fetch_sub(1, Ordering::AcqRel);
            }
            if let Some(td) = parent.td.cast::<Td>().as_ref() {
                td.users.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }
    // A parent domain has its PD's handle, which only the PD itself forgets.
    handles::forget(ours.raw.handle, pd as usize);
    // SAFETY: it was leaked from a Box in `alloc_pd`, `alloc_parent_domain` or `ibv_import_pd`,
    // and the caller gives it up.
    drop(unsafe { Box::from_raw(pd.cast::<Pd>()) });
    0
}

/// Our `ibv_td`: a promise that the objects of the parent domains made on it are used by one
/// thread at a time.
#[repr(C)]
struct Td {
    raw: ibv_td,
    /// Parent domains made on it.
    users: AtomicUsize,
}

/// `verbs_context.alloc_td` (the inline `ibv_alloc_td`).
pub(crate) unsafe extern "C" fn alloc_td(
    context: *mut ibv_context,
    attr: *mut ibv_td_init_attr,
) -> *mut ibv_td {
    const CALL: &str = "ibv_alloc_td";
    // SAFETY: the caller passes an open context and its attributes.
    let (Some(_), Some(attr)) = (unsafe { Context::from_raw(context) }, unsafe {
        attr.as_ref()
    }) else {
        return fail_null(CALL, EINVAL, &"NULL context or attributes");
    };
    if attr.comp_mask != 0 {
        return fail_null(CALL, EINVAL, &"unknown comp_mask bits");
    }
    Box::into_raw(Box::new(Td {
        raw: ibv_td { context },
        users: AtomicUsize::new(0),
    }))
    .cast()
}

/// `verbs_context.dealloc_td`: `EBUSY` while a parent domain uses it.
pub(crate) unsafe extern "C" fn dealloc_td(td: *mut ibv_td) -> c_int {
    // SAFETY: the caller passes a thread domain of ours.
    let Some(ours) = (unsafe { td.cast::<Td>().as_ref() }) else {
        return EINVAL;
    };
    if ours.users.load(Ordering::Acquire) > 0 {
        return EBUSY;
    }
    // SAFETY: leaked from a Box in `alloc_td`; the caller gives it up.
    drop(unsafe { Box::from_raw(td.cast::<Td>()) });
    0
}

/// A parent domain's allocator and its free, and what they are called with.
#[derive(Clone, Copy)]
pub(crate) struct Allocators {
    /// The parent domain, passed to both.
    domain: *mut ibv_pd,
    alloc: PdAlloc,
    free: PdFree,
    context: *mut c_void,
}

/// `verbs_context.alloc_parent_domain` (the inline `ibv_alloc_parent_domain`).
pub(crate) unsafe extern "C" fn alloc_parent_domain(
    context: *mut ibv_context,
    attr: *mut ibv_parent_domain_init_attr,
) -> *mut ibv_pd {
    const CALL: &str = "ibv_alloc_parent_domain";
    // SAFETY: the caller passes an open context and its attributes.
    let (Some(_), Some(attr)) = (unsafe { Context::from_raw(context) }, unsafe {
        attr.as_ref()
    }) else {
        return fail_null(CALL, EINVAL, &"NULL context or attributes");
    };
    let known = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
    if attr.comp_mask & !known != 0 {
        return fail_null(CALL, EINVAL, &"unknown comp_mask bits");
    }
    // SAFETY: the caller passes a PD of ours.
    let Some(protection) = (unsafe { Pd::from_raw(attr.pd) }) else {
        return fail_null(CALL, EINVAL, &"a parent domain needs a PD");
    };
    if protection.raw.context != context || protection.is_parent_domain() {
        return fail_null(CALL, EINVAL, &"not a PD of this context");
    }
    // SAFETY: the caller passes NULL or a thread domain of ours.
    let td = unsafe { attr.td.cast::<Td>().as_ref() };
    if td.is_some_and(|td| td.raw.context != context) {
        return fail_null(CALL, EINVAL, &"a thread domain of another context");
    }
    let pd_context = if attr.comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT != 0 {
        attr.pd_context
    } else {
        core::ptr::null_mut()
    };
    let allocators = if attr.comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS != 0 {
        match (attr.alloc, attr.free) {
            (Some(alloc), Some(free)) => Some((alloc, free)),
            (None, None) => None,
            _ => return fail_null(CALL, EINVAL, &"an allocator without its free, or back"),
        }
    } else {
        None
    };
    let domain = Box::into_raw(Box::new(Pd {
        raw: ibv_pd {
            context,
            handle: protection.raw.handle,
        },
        pd: protection.pd.clone(),
        users: AtomicUsize::new(0),
        parent: None,
    }));
    let parent = Parent {
        protection: attr.pd,
        td: attr.td,
        allocators: allocators.map(|(alloc, free)| Allocators {
            domain: domain.cast(),
            alloc,
            free,
            context: pd_context,
        }),
    };
    // SAFETY: just made, and not yet handed out.
    unsafe { (*domain).parent = Some(parent) };
    protection.users.fetch_add(1, Ordering::AcqRel);
    if let Some(td) = td {
        td.users.fetch_add(1, Ordering::AcqRel);
    }
    domain.cast()
}

/// `(RDMA_DRIVER_RXE << 32) | n`: the resource types our objects are allocated as, numbered
/// as `mlx5dv.h` numbers mlx5's (`MLX5DV_RES_TYPE_QP` is 1, `_SRQ` 4, `_CQ` 5) under rxe's
/// driver id.
const RDMA_DRIVER_RXE: u64 = 14;
pub(crate) const RES_TYPE_QP: u64 = RDMA_DRIVER_RXE << 32 | 1;
pub(crate) const RES_TYPE_SRQ: u64 = RDMA_DRIVER_RXE << 32 | 4;
pub(crate) const RES_TYPE_CQ: u64 = RDMA_DRIVER_RXE << 32 | 5;

/// `IBV_ALLOCATOR_USE_DEFAULT`: an allocator's answer that the library should allocate.
const USE_DEFAULT: usize = usize::MAX;

/// Where an object of ours lives: the heap, or memory a parent domain's allocator gave.
#[derive(Clone, Copy)]
pub(crate) enum Placement {
    Heap,
    Domain(Allocators, u64),
}

impl Placement {
    /// Moves `value` into memory of its own: from the allocator of `domain` (a parent domain
    /// the object is made with) for an object of `resource_type`, unless it has none or it
    /// answers `IBV_ALLOCATOR_USE_DEFAULT`; else the heap. `ENOMEM` when the allocator gives
    /// nothing, `EINVAL` when it gives memory not aligned as asked.
    pub(crate) fn place<T>(
        domain: Option<&Pd>,
        resource_type: u64,
        value: T,
    ) -> Result<(*mut T, Placement), c_int> {
        let allocators = domain.and_then(|pd| pd.parent.as_ref()?.allocators);
        let Some(allocators) = allocators else {
            return Ok((Box::into_raw(Box::new(value)), Placement::Heap));
        };
        let (size, align) = (size_of::<T>(), align_of::<T>());
        // SAFETY: the application's allocator, called as rdma-core's providers call it.
        let memory = unsafe {
            (allocators.alloc)(
                allocators.domain,
                allocators.context,
                size,
                align,
                resource_type,
            )
        };
        if memory as usize == USE_DEFAULT {
            return Ok((Box::into_raw(Box::new(value)), Placement::Heap));
        }
        if memory.is_null() {
            return Err(ENOMEM);
        }
        let placement = Placement::Domain(allocators, resource_type);
        if !(memory as usize).is_multiple_of(align) {
            // SAFETY: given back to the allocator it came from, unused.
            unsafe { placement.free(memory) };
            return Err(EINVAL);
        }
        let object = memory.cast::<T>();
        // SAFETY: the allocator gave `size` bytes aligned for T (checked), which nothing else
        // uses until we give them back.
        unsafe { object.write(value) };
        Ok((object, placement))
    }

    /// Gives memory back to where it came from.
    ///
    /// # Safety
    /// `memory` came from this placement and is no longer used.
    unsafe fn free(self, memory: *mut c_void) {
        if let Placement::Domain(allocators, resource_type) = self {
            // SAFETY: the application's free, called with what its allocator gave.
            unsafe {
                (allocators.free)(allocators.domain, allocators.context, memory, resource_type)
            };
        }
    }

    /// Drops the object at `object` and gives its memory back.
    ///
    /// # Safety
    /// `object` came from [`place`](Self::place) with this placement and is never used again.
    pub(crate) unsafe fn release<T>(self, object: *mut T) {
        match self {
            // SAFETY: per this function's contract, a Box of ours.
            Placement::Heap => drop(unsafe { Box::from_raw(object) }),
            Placement::Domain(..) => {
                // SAFETY: per this function's contract, a live T in the allocator's memory,
                // which goes back once the T is dropped.
                unsafe {
                    object.drop_in_place();
                    self.free(object.cast());
                }
            }
        }
    }
}

/// Our `ibv_mr`: a region over the caller's memory.
#[repr(C)]
struct Mr {
    raw: ibv_mr,
    mr: roce_verbs::Mr,
}

/// `IBV_ACCESS_ON_DEMAND`: on-demand paging.
const ACCESS_ON_DEMAND: u32 = 1 << 6;
/// The access bits rdma-core's kernel accepts (`IB_ACCESS_SUPPORTED`): up to
/// `IBV_ACCESS_FLUSH_PERSISTENT`, and the optional range (relaxed ordering and its kin),
/// which a device may ignore.
const ACCESS_KNOWN: u32 = ((1 << 10) - 1) | IBV_ACCESS_OPTIONAL_RANGE;
const IBV_ACCESS_OPTIONAL_RANGE: u32 = ((1 << 30) - 1) & !((1 << 20) - 1);

/// `ibv_reg_mr`: the caller's `length` bytes at `addr`, which peers address at `addr`.
pub(crate) unsafe extern "C" fn reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut ibv_mr {
    // SAFETY: the caller's promise of `ibv_reg_mr`, passed on.
    unsafe { reg_mr_iova2(pd, addr, length, addr as u64, access as u32) }
}

/// `ibv_reg_mr_iova` (1.7; the same as `ibv_reg_mr_iova2` with signed flags).
pub(crate) unsafe extern "C" fn reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    // SAFETY: the caller's promise of `ibv_reg_mr`, passed on.
    unsafe { reg_mr_iova2(pd, addr, length, iova, access as u32) }
}

/// `ibv_reg_mr_iova2`: the caller's `length` bytes at `addr`, which peers address from
/// `iova`. Access bits we need not enforce (relaxed ordering and the rest of the optional
/// range, hugetlb, ...) are accepted and ignored, as rdma-core does; unknown bits are
/// `EINVAL`. With `IBV_ACCESS_ON_DEMAND` nothing needs to be mapped, and `addr` NULL with
/// `length` `SIZE_MAX` registers the whole address space (implicit ODP).
pub(crate) unsafe extern "C" fn reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: u32,
) -> *mut ibv_mr {
    const CALL: &str = "ibv_reg_mr";
    // SAFETY: the caller passes a PD of ours.
    let Some(ours) = (unsafe { Pd::from_raw(pd) }) else {
        return fail_null(CALL, EINVAL, &"NULL PD");
    };
    if access & !ACCESS_KNOWN != 0 {
        return fail_null(CALL, EINVAL, &format!("unknown access bits {access:#x}"));
    }
    let flags = AccessFlags::from_bits_truncate(access);
    let made = if access & ACCESS_ON_DEMAND == 0 {
        // SAFETY: `ibv_reg_mr`'s contract: the memory stays mapped until `ibv_dereg_mr`, and
        // the program orders its own accesses against the transfers through completions.
        unsafe { ours.pd.reg_mr_iova(addr.cast(), length, iova, flags) }
    } else if addr.is_null() && length == usize::MAX {
        if iova != 0 {
            return fail_null(CALL, EINVAL, &"an implicit region is addressed from 0");
        }
        ours.pd.reg_mr_implicit(flags)
    } else {
        ours.pd.reg_mr_on_demand(addr.cast(), length, iova, flags)
    };
    match made {
        Ok(mr) => {
            ours.users.fetch_add(1, Ordering::AcqRel);
            let raw = ibv_mr {
                context: ours.raw.context,
                pd,
                addr,
                length,
                handle: 0,
                lkey: mr.lkey(),
                rkey: mr.rkey(),
            };
            let ptr = Box::into_raw(Box::new(Mr { raw, mr }));
            // SAFETY: just made; nobody else has it yet.
            unsafe { (*ptr).raw.handle = handles::register(Kind::Mr, ptr as usize) };
            ptr.cast()
        }
        Err(error) => fail_null(CALL, crate::errno_of(&error), &error),
    }
}

/// The errno of a refused re-registration: `EOPNOTSUPP` is what providers without it say.
fn rereg_failed(errno: c_int, why: &dyn std::fmt::Display) -> c_int {
    crate::log_failure("ibv_rereg_mr", why);
    set_errno(errno);
    IBV_REREG_MR_ERR_CMD
}

fn rereg_input(why: &str) -> c_int {
    crate::log_failure("ibv_rereg_mr", &why);
    set_errno(EINVAL);
    IBV_REREG_MR_ERR_INPUT
}

/// `ibv_rereg_mr`: changes a region's PD, memory (`addr`, `length`, which peers then address
/// at `addr`) or rights as `flags` say, keeping its keys. 0, or one of rdma-core's
/// `IBV_REREG_MR_ERR_*` with errno: `_INPUT` (the region is unchanged) for what libibverbs
/// itself refuses, `_CMD` for what the device refuses (here too the region stays as it was).
pub(crate) unsafe extern "C" fn rereg_mr(
    mr: *mut ibv_mr,
    flags: c_int,
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> c_int {
    // An imported region (IBV_MR_TYPE_IMPORTED_MR) is not the importer's to change.
    if handles::is_imported_mr(mr) {
        return rereg_input("an imported region");
    }
    // SAFETY: the caller passes a region of ours, which no other call uses meanwhile (as
    // rdma-core's own `ibv_rereg_mr` writes it).
    let Some(ours) = (unsafe { mr.cast::<Mr>().as_mut() }) else {
        return rereg_input("NULL region");
    };
    if flags & !IBV_REREG_MR_FLAGS_SUPPORTED != 0 {
        return rereg_input("unknown flags");
    }
    let translate = flags & IBV_REREG_MR_CHANGE_TRANSLATION != 0;
    if translate && (length == 0 || addr.is_null()) {
        return rereg_input("a new translation needs an address and a length");
    }
    let change_access = flags & IBV_REREG_MR_CHANGE_ACCESS != 0;
    if access != 0 && !change_access {
        return rereg_input("access given without IBV_REREG_MR_CHANGE_ACCESS");
    }
    // From here on, what the kernel's `ib_uverbs_rereg_mr` refuses.
    if flags == 0 {
        return rereg_failed(EINVAL, &"nothing to change");
    }
    let access = access as u32;
    if change_access && access & !ACCESS_KNOWN != 0 {
        return rereg_failed(EINVAL, &format!("unknown access bits {access:#x}"));
    }
    let new_pd = if flags & IBV_REREG_MR_CHANGE_PD != 0 {
        // SAFETY: the caller passes a PD of ours with this flag (pd is not read without it).
        match unsafe { Pd::from_raw(pd) } {
            Some(new_pd) if new_pd.raw.context == ours.raw.context => Some(new_pd),
            _ => return rereg_failed(EINVAL, &"no PD of this context"),
        }
    } else {
        None
    };
    let change = Rereg {
        pd: new_pd.map(|pd| &pd.pd),
        translation: translate.then_some((addr.cast::<u8>(), length)),
        access: change_access.then(|| AccessFlags::from_bits_truncate(access)),
        on_demand: change_access.then_some(access & ACCESS_ON_DEMAND != 0),
    };
    // SAFETY: `ibv_rereg_mr`'s contract, as `ibv_reg_mr`'s for the memory the region covers
    // from now on.
    if let Err(error) = unsafe { ours.mr.rereg(change) } {
        return rereg_failed(crate::errno_of(&error), &error);
    }
    if let Some(new_pd) = new_pd {
        // SAFETY: a region's PD outlives it (it cannot be freed while the region uses it).
        if let Some(old_pd) = unsafe { Pd::from_raw(ours.raw.pd) } {
            old_pd.users.fetch_sub(1, Ordering::AcqRel);
        }
        new_pd.users.fetch_add(1, Ordering::AcqRel);
        ours.raw.pd = pd;
    }
    if translate {
        ours.raw.addr = addr;
        ours.raw.length = length;
    }
    0
}

/// `ibv_dereg_mr`: from now on its keys are unknown to every peer and work request. When
/// it fails, the region stays registered and the program's `ibv_mr` valid, as rdma-core
/// frees nothing before the kernel has deregistered it.
pub(crate) unsafe extern "C" fn dereg_mr(mr: *mut ibv_mr) -> c_int {
    // SAFETY: the caller passes NULL or a region of ours.
    let Some(region) = (unsafe { mr.cast::<Mr>().as_ref() }) else {
        return EINVAL;
    };
    // Memory windows still bound to it keep it (rxe: IBTA 10.6.7.2.6).
    if region.mr.windows_bound().unwrap_or(0) > 0 {
        crate::log_failure("ibv_dereg_mr", &"memory windows are bound to the region");
        return EINVAL;
    }
    // An imported copy goes alone; the original stays its importer's.
    // SAFETY: the caller passes a region of ours and gives it up.
    if unsafe { handles::free_imported_mr(mr) } {
        return 0;
    }
    let ours = mr.cast::<Mr>();
    // SAFETY: the caller passes a region of ours (`raw` is our Mr's first field); its
    // region is moved out, and back in below unless the allocation is freed without it.
    let region = unsafe { core::ptr::addr_of_mut!((*ours).mr).read() };
    match region.try_dereg() {
        Ok(_) => {
            // SAFETY: as above; the program gives the region up now that it is gone.
            let raw = unsafe { &(*ours).raw };
            handles::forget(raw.handle, mr as usize);
            // SAFETY: a region's PD outlives it (it cannot be freed while we use it).
            if let Some(pd) = unsafe { Pd::from_raw(raw.pd) } {
                pd.users.fetch_sub(1, Ordering::AcqRel);
            }
            // SAFETY: leaked from a Box in `reg_mr`, given up by the caller; its region was
            // moved out above, so only the allocation goes (ManuallyDrop is transparent).
            drop(unsafe { Box::from_raw(ours.cast::<core::mem::ManuallyDrop<Mr>>()) });
            0
        }
        Err((region, error)) => {
            crate::log_failure("ibv_dereg_mr", &error);
            // SAFETY: back where it was read from; the program's `ibv_mr` is unchanged.
            unsafe { core::ptr::addr_of_mut!((*ours).mr).write(region) };
            crate::errno_of(&error)
        }
    }
}

/// `verbs_context.advise_mr` (the inline `ibv_advise_mr`): prefetches the pages of regions
/// with on-demand paging. Done before it returns, whether or not `IBV_ADVISE_MR_FLAG_FLUSH`
/// asks to wait. Errors as rxe's: an unknown advice is `EOPNOTSUPP`; an unknown flag, no
/// elements, an element outside a region of this PD or of one without on-demand paging
/// `EINVAL`; a write prefetch of a region without local write `EPERM`; a page that cannot be
/// faulted in `EFAULT`.
pub(crate) unsafe extern "C" fn advise_mr(
    pd: *mut ibv_pd,
    advice: u32,
    flags: u32,
    sg_list: *mut ibv_sge,
    num_sge: u32,
) -> c_int {
    const CALL: &str = "ibv_advise_mr";
    // SAFETY: the caller passes a PD of ours.
    let Some(ours) = (unsafe { Pd::from_raw(pd) }) else {
        return EINVAL;
    };
    let (write, fault) = match advice {
        IBV_ADVISE_MR_ADVICE_PREFETCH => (false, true),
        IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE => (true, true),
        IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT => (false, false),
        _ => {
            crate::log_failure(CALL, &format!("advice {advice}"));
            return EOPNOTSUPP;
        }
    };
    if flags & !IBV_ADVISE_MR_FLAG_FLUSH != 0 || num_sge == 0 || sg_list.is_null() {
        crate::log_failure(CALL, &"unknown flags, or no elements");
        return EINVAL;
    }
    // SAFETY: the caller passes `num_sge` elements.
    let given = unsafe { core::slice::from_raw_parts(sg_list, num_sge as usize) };
    let sges: Vec<Sge> = given
        .iter()
        .map(|sge| Sge {
            addr: sge.addr,
            length: sge.length,
            lkey: sge.lkey,
        })
        .collect();
    match ours.pd.prefetch(&sges, write, fault) {
        Ok(()) => 0,
        Err(error) => {
            crate::log_failure(CALL, &error);
            match error {
                roce_verbs::Error::Mr(MrError::AccessDenied) => EPERM,
                roce_verbs::Error::Mr(MrError::Unmapped) => EFAULT,
                roce_verbs::Error::Mr(_) => EINVAL,
                other => crate::errno_of(&other),
            }
        }
    }
}

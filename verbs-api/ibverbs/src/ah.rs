//! Address handles (`ibv_create_ah`, `ibv_create_ah_from_wc`, ...) and the address vector of
//! an `ibv_ah_attr`, which a QP's path takes too.

use core::ffi::c_int;
use std::sync::atomic::Ordering;

use roce_cabi::set_errno;
use roce_verbs::{AddressHandle, AddressVector};

use crate::abi::*;
use crate::context::Context;
use crate::logging::fail_null;
use crate::pd::Pd;

const EINVAL: c_int = 22;

/// The address vector of an `ibv_ah_attr`; RoCE needs the GRH (`is_global`). The DLID is
/// ignored (UCX puts a UDP source port there) and the flow label cut to its 20 bits.
pub(crate) fn address_vector(attr: &ibv_ah_attr) -> Result<AddressVector, &'static str> {
    if attr.is_global == 0 {
        return Err("RoCE address without a GRH (is_global = 0)");
    }
    if attr.port_num > 1 {
        return Err("port other than 1");
    }
    Ok(AddressVector {
        dgid: attr.grh.dgid,
        sgid_index: attr.grh.sgid_index,
        hop_limit: attr.grh.hop_limit,
        traffic_class: attr.grh.traffic_class,
        flow_label: attr.grh.flow_label & 0xF_FFFF,
    })
}

/// Our `ibv_ah`.
#[repr(C)]
pub(crate) struct Ah {
    raw: ibv_ah,
    pub(crate) handle: AddressHandle,
}

impl Ah {
    /// The address handle behind an `ibv_ah` we handed out.
    ///
    /// # Safety
    /// `ah` is NULL or came from [`create_ah`] and is not destroyed.
    pub(crate) unsafe fn from_raw<'a>(ah: *mut ibv_ah) -> Option<&'a Ah> {
        // SAFETY: `raw` is the first field of our `#[repr(C)]` Ah.
        unsafe { ah.cast::<Ah>().as_ref() }
    }
}

/// `ibv_create_ah` (resolving the neighbour's MAC first, which may take an ARP round).
pub(crate) unsafe extern "C" fn create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    // SAFETY: the caller passes a PD of ours and the attributes.
    let (Some(ours), Some(attr)) = (unsafe { Pd::from_raw(pd) }, unsafe { attr.as_ref() }) else {
        return fail_null("ibv_create_ah", EINVAL, &"NULL PD or attributes");
    };
    let av = match address_vector(attr) {
        Ok(av) => av,
        Err(why) => return fail_null("ibv_create_ah", EINVAL, &why),
    };
    match ours.pd.create_ah(av) {
        Ok(handle) => {
            ours.users.fetch_add(1, Ordering::AcqRel);
            Box::into_raw(Box::new(Ah {
                raw: ibv_ah {
                    context: ours.raw.context,
                    pd,
                    handle: 0,
                },
                handle,
            }))
            .cast()
        }
        Err(error) => fail_null("ibv_create_ah", crate::errno_of(&error), &error),
    }
}

/// `ibv_destroy_ah`.
pub(crate) unsafe extern "C" fn destroy_ah(ah: *mut ibv_ah) -> c_int {
    // SAFETY: the caller passes an address handle of ours.
    let Some(ours) = (unsafe { Ah::from_raw(ah) }) else {
        return EINVAL;
    };
    // SAFETY: its PD outlives it (it cannot be freed while we use it).
    if let Some(pd) = unsafe { Pd::from_raw(ours.raw.pd) } {
        pd.users.fetch_sub(1, Ordering::AcqRel);
    }
    // SAFETY: leaked from a Box in `create_ah`; the caller gives it up.
    drop(unsafe { Box::from_raw(ah.cast::<Ah>()) });
    0
}

/// `ibv_init_ah_from_wc`: the address of the sender of a UD receive, from the GRH area at
/// the start of its buffer (for IPv4, the IPv4 header sits in its last 20 bytes, as rxe
/// writes it).
pub(crate) unsafe extern "C" fn init_ah_from_wc(
    context: *mut ibv_context,
    port_num: u8,
    wc: *mut ibv_wc,
    grh: *mut [u8; 40],
    ah_attr: *mut ibv_ah_attr,
) -> c_int {
    // SAFETY: the caller passes an open context, the completion, its receive buffer's
    // first 40 bytes, and a writable attribute struct.
    let (Some(context), Some(wc), Some(grh), Some(out)) = (
        unsafe { Context::from_raw(context) },
        unsafe { wc.as_ref() },
        unsafe { grh.as_ref() },
        unsafe { ah_attr.as_mut() },
    ) else {
        set_errno(EINVAL);
        return -1;
    };
    if wc.wc_flags & IBV_WC_GRH == 0 {
        set_errno(EINVAL);
        return -1;
    }
    let (sgid, dgid, hop_limit, traffic_class) = if grh[20] >> 4 == 4 {
        let ip =
            |at: usize| std::net::Ipv4Addr::new(grh[at], grh[at + 1], grh[at + 2], grh[at + 3]);
        (
            ip(32).to_ipv6_mapped().octets(),
            ip(36).to_ipv6_mapped().octets(),
            grh[28],
            grh[21],
        )
    } else {
        let mut sgid = [0u8; 16];
        let mut dgid = [0u8; 16];
        sgid.copy_from_slice(&grh[8..24]);
        dgid.copy_from_slice(&grh[24..40]);
        (sgid, dgid, grh[7], (grh[0] << 4) | (grh[1] >> 4))
    };
    // The reply leaves from the GID the request came to.
    let Some(sgid_index) = context.device().gids.iter().position(|gid| *gid == dgid) else {
        set_errno(EINVAL);
        return -1;
    };
    *out = ibv_ah_attr {
        grh: ibv_global_route {
            dgid: sgid,
            flow_label: 0,
            sgid_index: sgid_index as u8,
            hop_limit,
            traffic_class,
        },
        dlid: wc.slid,
        sl: wc.sl,
        src_path_bits: wc.dlid_path_bits,
        static_rate: 0,
        is_global: 1,
        port_num,
    };
    0
}

/// `ibv_create_ah_from_wc`.
pub(crate) unsafe extern "C" fn create_ah_from_wc(
    pd: *mut ibv_pd,
    wc: *mut ibv_wc,
    grh: *mut [u8; 40],
    port_num: u8,
) -> *mut ibv_ah {
    let mut attr = ibv_ah_attr::default();
    // SAFETY: the caller passes a PD of ours, a completion and its receive buffer.
    unsafe {
        let context = match Pd::from_raw(pd) {
            Some(pd) => pd.raw.context,
            None => return fail_null("ibv_create_ah_from_wc", EINVAL, &"NULL PD"),
        };
        if init_ah_from_wc(context, port_num, wc, grh, &mut attr) != 0 {
            return core::ptr::null_mut();
        }
        create_ah(pd, &mut attr)
    }
}

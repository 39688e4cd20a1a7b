//! Posting a caller's list of work requests, shared by QPs (`ibv_post_send`,
//! `ibv_post_recv`, the `ibv_wr_*` builders) and SRQs (`ibv_post_srq_recv`): the walk over
//! the list and the conversions they use.

use core::ffi::c_int;

use roce_verbs::{RecvWr, SgList, Sge};

use crate::abi::*;

const EINVAL: c_int = 22;

/// Most inline bytes a send may carry (what `max_inline_data` may ask for).
pub(crate) const MAX_INLINE_DATA: u32 = 1024;

/// The scatter/gather list of a work request.
///
/// # Safety
/// `sg_list` points to `num_sge` elements when `num_sge` > 0.
pub(crate) unsafe fn sg_list(sg_list: *const ibv_sge, num_sge: c_int) -> Result<SgList, c_int> {
    let count = usize::try_from(num_sge).map_err(|_| EINVAL)?;
    if count == 0 {
        return Ok(SgList::new());
    }
    if sg_list.is_null() {
        return Err(EINVAL);
    }
    // SAFETY: per this function's contract.
    let sges = unsafe { core::slice::from_raw_parts(sg_list, count) };
    Ok(sges
        .iter()
        .map(|sge| Sge {
            addr: sge.addr,
            length: sge.length,
            lkey: sge.lkey,
        })
        .collect())
}

/// Walks a caller's list of work requests, converting each until one does not convert.
pub(crate) struct Walk<W, F> {
    next: *mut W,
    /// Converts one request; called only on valid requests of the caller's list.
    convert: F,
    next_of: fn(&W) -> *mut W,
    /// The request that did not convert, and why.
    refused: Option<(*mut W, c_int)>,
}

impl<W, T, F: FnMut(&W) -> Result<T, c_int>> Iterator for Walk<W, F> {
    type Item = T;

    fn next(&mut self) -> Option<T> {
        // SAFETY: the caller of `ibv_post_*` passes a NULL-terminated list of valid requests.
        let wr = unsafe { self.next.as_ref() }?;
        match (self.convert)(wr) {
            Ok(item) => {
                self.next = (self.next_of)(wr);
                Some(item)
            }
            Err(errno) => {
                self.refused = Some((self.next, errno));
                None
            }
        }
    }
}

/// The `index`th request of a list.
///
/// # Safety
/// The list has more than `index` valid requests.
unsafe fn nth<W>(mut wr: *mut W, index: usize, next_of: fn(&W) -> *mut W) -> *mut W {
    for _ in 0..index {
        // SAFETY: per this function's contract.
        wr = next_of(unsafe { &*wr });
    }
    wr
}

/// Posts a list through `post`, setting `bad_wr` to the first request not posted.
///
/// # Safety
/// `wr` is a NULL-terminated list of valid requests; `bad_wr` is writable.
pub(crate) unsafe fn post_list<W, T, F: FnMut(&W) -> Result<T, c_int>>(
    wr: *mut W,
    bad_wr: *mut *mut W,
    convert: F,
    next_of: fn(&W) -> *mut W,
    post: impl FnOnce(&mut Walk<W, F>) -> Result<(), roce_verbs::PostFailure>,
) -> c_int {
    let mut walk = Walk {
        next: wr,
        convert,
        next_of,
        refused: None,
    };
    let (bad, errno) = match post(&mut walk) {
        // SAFETY: the failure's index is of a request the walk went through.
        Err(failure) => (unsafe { nth(wr, failure.index, next_of) }, {
            crate::log_failure("ibv_post_*", &failure);
            crate::errno_of(&failure.error)
        }),
        Ok(()) => match walk.refused {
            Some(refused) => refused,
            None => return 0,
        },
    };
    if !bad_wr.is_null() {
        // SAFETY: per this function's contract.
        unsafe { *bad_wr = bad };
    }
    errno
}

/// One `ibv_recv_wr` as a [`RecvWr`].
///
/// # Safety
/// `wr` is a valid work request of the caller's.
unsafe fn recv_wr(wr: &ibv_recv_wr) -> Result<RecvWr, c_int> {
    Ok(RecvWr {
        wr_id: wr.wr_id,
        // SAFETY: the caller's list of `num_sge` elements.
        sg_list: unsafe { sg_list(wr.sg_list, wr.num_sge) }?,
    })
}

/// Posts a caller's list of receive requests through `post` (a QP's or an SRQ's receive
/// queue), setting `bad_wr` to the first request not posted.
///
/// # Safety
/// `wr` is a NULL-terminated list of valid requests; `bad_wr` is writable.
pub(crate) unsafe fn post_recv_list(
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
    post: impl FnOnce(&mut dyn Iterator<Item = RecvWr>) -> Result<(), roce_verbs::PostFailure>,
) -> c_int {
    // SAFETY: the walk passes only requests of the caller's list, which are valid.
    let convert = |wr: &ibv_recv_wr| unsafe { recv_wr(wr) };
    // SAFETY: per this function's contract.
    unsafe { post_list(wr, bad_wr, convert, |wr| wr.next, |walk| post(walk)) }
}

/// The bytes an inline send carries, copied now from the caller's buffers (which need not
/// be registered).
///
/// # Safety
/// Each element's `addr` points to `length` readable bytes.
pub(crate) unsafe fn inline_bytes(sges: &SgList, into: &mut Vec<u8>) -> Result<(), c_int> {
    let total = roce_transport::wr::sg_len(sges).ok_or(EINVAL)?;
    if total > MAX_INLINE_DATA {
        return Err(EINVAL);
    }
    for sge in sges {
        if sge.length == 0 {
            continue;
        }
        // SAFETY: per this function's contract (the caller's buffer, read before
        // `ibv_post_send` returns, as the inline flag promises the caller).
        let bytes = unsafe {
            core::slice::from_raw_parts(sge.addr as usize as *const u8, sge.length as usize)
        };
        into.extend_from_slice(bytes);
    }
    Ok(())
}

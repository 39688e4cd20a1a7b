//! The device's limits ([`Device::query`](crate::Device::query), which reports the
//! transport's [`LIMITS`]) where the verbs layer must check them itself: a region's length
//! before its addresses are allocated, and the number of live QPs. Everything else (CQ depth,
//! QP caps, `modify_qp` attributes, posting) the transport enforces, and [`Error::errno`]
//! gives rdma-core's errno for its refusals.

use roce_transport::mr::MrError;
use roce_transport::LIMITS;

use crate::error::Error;

/// `ibv_reg_mr`: a region longer than `max_mr_size` cannot be backed (`ENOMEM`, as rxe
/// answers when the pages cannot be pinned).
pub(crate) fn check_mr_len(len: usize) -> Result<(), Error> {
    if u64::try_from(len).map_or(true, |len| len > LIMITS.max_mr_size) {
        return Err(MrError::OutOfMemory.into());
    }
    Ok(())
}

/// `ibv_create_qp` with `live` QPs already: at most `max_qp` at once, else `EINVAL` (rxe's
/// object pool).
pub(crate) fn check_qp_count(live: usize) -> Result<(), Error> {
    if live >= LIMITS.max_qp as usize {
        return Err(Error::InvalidArgument(
            "the device's max_qp QPs exist already",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errno(result: Result<(), Error>) -> Option<i32> {
        result.err().map(|error| error.errno())
    }

    #[test]
    fn regions_up_to_max_mr_size_pass_and_longer_ones_are_enomem() {
        let max = usize::try_from(LIMITS.max_mr_size).unwrap();
        assert_eq!(errno(check_mr_len(max)), None);
        let enomem = Some(rustix::io::Errno::NOMEM.raw_os_error());
        assert_eq!(errno(check_mr_len(max + 1)), enomem);
        assert_eq!(errno(check_mr_len(usize::MAX)), enomem);
    }

    #[test]
    fn live_qps_up_to_max_qp() {
        let max = LIMITS.max_qp as usize;
        assert_eq!(errno(check_qp_count(max - 1)), None);
        assert_eq!(errno(check_qp_count(max)), Some(22));
    }
}

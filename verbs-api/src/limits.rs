//! The device's limits ([`Device::query`](crate::Device::query)), enforced at the verbs
//! boundary where rdma-core's rxe provider enforces them, with its errors.

use roce_transport::mr::MrError;

use crate::device::DeviceAttr;
use crate::error::Error;

/// `ibv_reg_mr`: a region longer than `max_mr_size` cannot be backed (`ENOMEM`, as rxe
/// answers when the pages cannot be pinned).
pub(crate) fn check_mr_len(device: &DeviceAttr, len: usize) -> Result<(), Error> {
    if u64::try_from(len).map_or(true, |len| len > device.max_mr_size) {
        return Err(MrError::OutOfMemory.into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::Device;

    fn attr() -> DeviceAttr {
        let device = Device {
            name: "x".into(),
            ifindex: 1,
            mac: [2, 0, 0, 0, 0, 1],
            netdev_mtu: 1500,
            up: true,
            gids: vec![],
        };
        device.query()
    }

    fn errno(result: Result<(), Error>) -> Option<i32> {
        result.err().map(|error| error.errno())
    }

    #[test]
    fn regions_up_to_max_mr_size_pass_and_longer_ones_are_enomem() {
        let attr = attr();
        let max = usize::try_from(attr.max_mr_size).unwrap();
        assert_eq!(errno(check_mr_len(&attr, max)), None);
        let enomem = Some(rustix::io::Errno::NOMEM.raw_os_error());
        assert_eq!(errno(check_mr_len(&attr, max + 1)), enomem);
        assert_eq!(errno(check_mr_len(&attr, usize::MAX)), enomem);
    }
}

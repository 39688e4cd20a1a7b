//! The device's limits ([`Device::query`](crate::Device::query)), enforced at the verbs
//! boundary where rdma-core's rxe provider enforces them, with its errors: creating a CQ or
//! QP, registering memory, modifying a QP. Posting is bounded by the QP's caps, which
//! creation kept within the device's limits: too many SGEs are `EINVAL`, a full queue
//! `ENOMEM` (see [`Error::errno`]).

use roce_transport::mr::MrError;
use roce_transport::qp::QpCaps;
use roce_transport::qp_state::QpAttr;

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

/// `ibv_create_cq` (rxe's `rxe_cq_chk_attr`): 1 to `max_cqe` entries, else `EINVAL`.
pub(crate) fn check_cq_depth(device: &DeviceAttr, depth: usize) -> Result<(), Error> {
    if depth == 0 {
        return Err(Error::InvalidArgument("a CQ needs at least one entry"));
    }
    if depth > device.max_cqe as usize {
        return Err(Error::InvalidArgument(
            "more CQ entries than the device's max_cqe",
        ));
    }
    Ok(())
}

/// `ibv_create_qp` (rxe's `rxe_qp_chk_cap`): queues of at most `max_qp_wr` requests of
/// at most `max_sge` elements, else `EINVAL`.
pub(crate) fn check_qp_caps(device: &DeviceAttr, caps: &QpCaps) -> Result<(), Error> {
    let over = [
        (
            "max_send_wr above the device's max_qp_wr",
            caps.max_send_wr > device.max_qp_wr,
        ),
        (
            "max_recv_wr above the device's max_qp_wr",
            caps.max_recv_wr > device.max_qp_wr,
        ),
        (
            "max_send_sge above the device's max_sge",
            caps.max_send_sge > device.max_sge,
        ),
        (
            "max_recv_sge above the device's max_sge",
            caps.max_recv_sge > device.max_sge,
        ),
    ];
    match over.into_iter().find(|(_, over)| *over) {
        Some((what, _)) => Err(Error::InvalidArgument(what)),
        None => Ok(()),
    }
}

/// `ibv_create_qp` with `live` QPs already: at most `max_qp` at once, else `EINVAL` (rxe's
/// object pool).
pub(crate) fn check_qp_count(device: &DeviceAttr, live: usize) -> Result<(), Error> {
    if live >= device.max_qp as usize {
        return Err(Error::InvalidArgument(
            "the device's max_qp QPs exist already",
        ));
    }
    Ok(())
}

/// `ibv_modify_qp` (rxe's `rxe_qp_chk_attr`): a P_Key index inside the table, READs and
/// atomics within `max_qp_rd_atom` either way, else `EINVAL`.
pub(crate) fn check_modify(device: &DeviceAttr, attr: &QpAttr) -> Result<(), Error> {
    let rd_atom = |n: Option<u8>| n.is_some_and(|n| n > device.max_qp_rd_atom);
    let over = [
        (
            "pkey_index outside the device's P_Key table",
            attr.pkey_index
                .is_some_and(|index| index >= device.max_pkeys),
        ),
        (
            "max_rd_atomic above the device's max_qp_rd_atom",
            rd_atom(attr.max_rd_atomic),
        ),
        (
            "max_dest_rd_atomic above the device's max_qp_rd_atom",
            rd_atom(attr.max_dest_rd_atomic),
        ),
    ];
    match over.into_iter().find(|(_, over)| *over) {
        Some((what, _)) => Err(Error::InvalidArgument(what)),
        None => Ok(()),
    }
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

    const EINVAL: Option<i32> = Some(22);

    #[test]
    fn cq_depths_from_one_to_max_cqe_pass() {
        let attr = attr();
        let max = attr.max_cqe as usize;
        assert_eq!(errno(check_cq_depth(&attr, 1)), None);
        assert_eq!(errno(check_cq_depth(&attr, max)), None);
        assert_eq!(errno(check_cq_depth(&attr, 0)), EINVAL);
        assert_eq!(errno(check_cq_depth(&attr, max + 1)), EINVAL);
    }

    #[test]
    fn each_qp_cap_is_walked_to_its_limit_and_one_past() {
        let attr = attr();
        let at_limit = QpCaps {
            max_send_wr: attr.max_qp_wr,
            max_recv_wr: attr.max_qp_wr,
            max_send_sge: attr.max_sge,
            max_recv_sge: attr.max_sge,
            max_inline_data: 0,
        };
        assert_eq!(errno(check_qp_caps(&attr, &at_limit)), None);
        let past: [fn(&mut QpCaps); 4] = [
            |caps| caps.max_send_wr += 1,
            |caps| caps.max_recv_wr += 1,
            |caps| caps.max_send_sge += 1,
            |caps| caps.max_recv_sge += 1,
        ];
        for (n, one_past) in past.iter().enumerate() {
            let mut caps = at_limit;
            one_past(&mut caps);
            assert_eq!(errno(check_qp_caps(&attr, &caps)), EINVAL, "cap {n}");
        }
        assert_eq!(errno(check_qp_count(&attr, attr.max_qp as usize - 1)), None);
        assert_eq!(errno(check_qp_count(&attr, attr.max_qp as usize)), EINVAL);
    }

    #[test]
    fn modify_keeps_pkey_index_and_rd_atomic_within_the_device() {
        let attr = attr();
        let check = |qp_attr: QpAttr| errno(check_modify(&attr, &qp_attr));
        let pkey = |index| QpAttr {
            pkey_index: Some(index),
            ..QpAttr::default()
        };
        assert_eq!(check(pkey(attr.max_pkeys - 1)), None);
        assert_eq!(check(pkey(attr.max_pkeys)), EINVAL);
        assert_eq!(check(pkey(u16::MAX)), EINVAL);
        let max = attr.max_qp_rd_atom;
        for n in [max, max + 1] {
            let expected = if n > max { EINVAL } else { None };
            let out = QpAttr {
                max_rd_atomic: Some(n),
                ..QpAttr::default()
            };
            let dest = QpAttr {
                max_dest_rd_atomic: Some(n),
                ..QpAttr::default()
            };
            assert_eq!((check(out), check(dest)), (expected, expected), "{n}");
        }
    }
}

//! UD multicast on RoCEv2: a multicast group is a multicast IP address, its GID that address
//! as a GID (IPv4 as `::ffff:a.b.c.d`), and a datagram to it carries the destination QP
//! number [`MULTICAST_QPN`] to every QP attached to the group (IBTA A17.5.6: no multicast
//! LID on RoCE). On Ethernet the frame goes to the IP multicast address's MAC (RFC 1112 for
//! IPv4, RFC 2464 for IPv6), as the kernel's IP stack addresses rxe's multicast sends.

/// The destination QP number of a multicast datagram (`IB_MULTICAST_QPN`).
pub const MULTICAST_QPN: u32 = 0xFF_FFFF;

/// Whether `gid` is a multicast group: an IPv6 multicast address (`ff00::/8`) or the
/// IPv4-mapped GID of an IPv4 multicast address (224.0.0.0/4), the kernel's
/// `rdma_is_multicast_addr`.
pub fn is_multicast_gid(gid: &[u8; 16]) -> bool {
    if gid[0] == 0xFF {
        return true;
    }
    let mapped = gid[..10] == [0; 10] && gid[10..12] == [0xFF; 2];
    mapped && gid[12] & 0xF0 == 0xE0
}

/// The destination MAC of frames to the multicast group `gid`: `01:00:5e` and the low 23
/// bits of an IPv4 group, `33:33` and the last 32 bits of an IPv6 one; `None` for a GID that
/// is not a multicast group.
pub fn multicast_mac(gid: &[u8; 16]) -> Option<[u8; 6]> {
    if !is_multicast_gid(gid) {
        return None;
    }
    Some(if gid[0] == 0xFF {
        [0x33, 0x33, gid[12], gid[13], gid[14], gid[15]]
    } else {
        [0x01, 0x00, 0x5E, gid[13] & 0x7F, gid[14], gid[15]]
    })
}

/// Whether `mac` is a group address (the I/G bit), as multicast and broadcast MACs are.
pub fn is_group_mac(mac: &[u8; 6]) -> bool {
    mac[0] & 1 == 1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(a: u8, b: u8, c: u8, d: u8) -> [u8; 16] {
        [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, a, b, c, d]
    }

    #[test]
    fn multicast_gids_are_ipv6_multicast_or_mapped_ipv4_multicast() {
        assert!(is_multicast_gid(&v4(224, 0, 0, 1)));
        assert!(is_multicast_gid(&v4(239, 255, 255, 255)));
        assert!(!is_multicast_gid(&v4(223, 255, 255, 255)));
        assert!(!is_multicast_gid(&v4(240, 0, 0, 1)));
        assert!(!is_multicast_gid(&v4(10, 0, 0, 1)));
        let mut ff02 = [0u8; 16];
        ff02[0] = 0xFF;
        ff02[1] = 0x02;
        ff02[15] = 1;
        assert!(is_multicast_gid(&ff02));
        // IPv4-compatible (not mapped) 239.1.1.1 and a link-local unicast GID are not groups.
        let mut compatible = v4(239, 1, 1, 1);
        compatible[10] = 0;
        compatible[11] = 0;
        assert!(!is_multicast_gid(&compatible));
        let mut fe80 = [0u8; 16];
        fe80[0] = 0xFE;
        fe80[1] = 0x80;
        assert!(!is_multicast_gid(&fe80));
    }

    #[test]
    fn macs_follow_rfc_1112_and_rfc_2464() {
        // 239.129.2.3: the high bit of the second byte is not in the MAC.
        assert_eq!(
            multicast_mac(&v4(239, 129, 2, 3)),
            Some([0x01, 0x00, 0x5E, 0x01, 0x02, 0x03])
        );
        assert_eq!(
            multicast_mac(&v4(224, 0, 0, 251)),
            Some([0x01, 0x00, 0x5E, 0x00, 0x00, 0xFB])
        );
        let ff12: [u8; 16] = [
            0xFF, 0x12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xDE, 0xAD, 0xBE, 0xEF,
        ];
        assert_eq!(
            multicast_mac(&ff12),
            Some([0x33, 0x33, 0xDE, 0xAD, 0xBE, 0xEF])
        );
        assert_eq!(multicast_mac(&v4(10, 1, 2, 3)), None);
        assert!(is_group_mac(&[0x01, 0x00, 0x5E, 0, 0, 1]));
        assert!(is_group_mac(&[0x33, 0x33, 0, 0, 0, 1]));
        assert!(is_group_mac(&[0xFF; 6]));
        assert!(!is_group_mac(&[0x02, 0, 0, 0, 0, 1]));
    }
}

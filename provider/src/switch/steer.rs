//! Where a frame goes, and whether a client may send it: the switch's decisions, on bytes
//! alone (no I/O, no state but what the caller passes).
//!
//! Steering is an index, never a search: each attached process owns one block (a `slot`,
//! 0 to [`SLOTS`]` - 1`) of the device's QP numbers (the top 8 of the 24 bits) and of the
//! CM's communication IDs (the top 8 of 32), as its endpoint hands out only those
//! (`Endpoint::set_id_block`). So a frame's BTH destination QPN names its process, and so
//! does a CM message's ID of ours (every answer carries it as the *remote* ID). The only
//! messages that name no process are those that open a conversation, REQ and SIDR_REQ: they
//! go to the process that registered their service ID (`rdma_listen`).

use roce_wire::cm::{attribute, req, sidr_rep, sidr_req, ServiceId, MGMT_CLASS};
use roce_wire::frame::IpRepr;
use roce_wire::{mad, Frame, FrameRepr};

/// Blocks of a device's identifiers; the last holds the multicast QPN (0xFFFFFF), so
/// processes get the others.
pub const SLOTS: usize = 256;
/// The block no process gets.
pub const RESERVED_SLOT: u8 = 255;
/// BTH destination QPN of multicast (IBTA: QP 0xFFFFFF).
const MULTICAST_QPN: u32 = 0xFF_FFFF;

/// Where a received frame goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// The process owning this block (if one does).
    Slot(u8),
    /// The process that listens on this service (REQ, SIDR_REQ).
    Service(ServiceId),
    /// Every process (multicast: each filters by its own attachments).
    Everyone,
    /// Nowhere: dropped, for this reason.
    Drop(Why),
}

/// Why a frame was dropped or refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// Not RoCEv2, or malformed (the program gives the switch only UDP 4791).
    Malformed,
    /// To QP 1 but not a CM message we steer (another management class, LAP/APR).
    NotCm,
    /// Sent by a client with an identity that is not its own, or not from our addresses.
    Refused,
}

/// The identity of the device on the link, against which clients' frames are checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The interface's MAC.
    pub mac: [u8; 6],
    /// Its addresses as GIDs (IPv4-mapped for IPv4).
    pub gids: Vec<[u8; 16]>,
}

/// Where a frame received from the wire, or sent by a client to this device, goes.
pub fn route(bytes: &[u8]) -> Route {
    let Ok(frame) = Frame::new_checked(bytes) else {
        return Route::Drop(Why::Malformed);
    };
    match frame.bth().dest_qpn() {
        MULTICAST_QPN => Route::Everyone,
        mad::GSI_QPN => route_mad(frame.payload()),
        qpn => Route::Slot((qpn >> 16) as u8),
    }
}

/// A CM MAD goes to the process whose ID it answers, or (REQ, SIDR_REQ) to the service's.
fn route_mad(payload: &[u8]) -> Route {
    let Ok(mad) = mad::Packet::new_checked(payload) else {
        return Route::Drop(Why::NotCm);
    };
    if mad.mgmt_class() != MGMT_CLASS {
        return Route::Drop(Why::NotCm);
    }
    let data = mad.data();
    let slot = |id: u32| Route::Slot((id >> 24) as u8);
    match mad.attribute_id() {
        attribute::REQ => req::Packet::new_checked(data).map_or(Route::Drop(Why::NotCm), |req| {
            Route::Service(req.service_id())
        }),
        attribute::SIDR_REQ => sidr_req::Packet::new_checked(data)
            .map_or(Route::Drop(Why::NotCm), |req| {
                Route::Service(req.service_id())
            }),
        attribute::SIDR_REP => sidr_rep::Packet::new_checked(data)
            .map_or(Route::Drop(Why::NotCm), |rep| slot(rep.request_id())),
        attribute::MRA
        | attribute::REJ
        | attribute::REP
        | attribute::RTU
        | attribute::DREQ
        | attribute::DREP => remote_comm_id(data).map_or(Route::Drop(Why::NotCm), slot),
        _ => Route::Drop(Why::NotCm),
    }
}

/// The remote communication ID, bytes 4 to 8 of every CM message that has one (MRA, REJ,
/// REP, RTU, DREQ, DREP: each message's `field::REMOTE_COMM_ID` in `roce_wire::cm`).
fn remote_comm_id(data: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(data.get(4..8)?.try_into().ok()?))
}

/// The sender's own communication ID (or SIDR request ID), bytes 0 to 4 of every CM
/// message but SIDR_REP (`field::LOCAL_COMM_ID`, `field::REQUEST_ID`).
fn local_comm_id(data: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(data.get(0..4)?.try_into().ok()?))
}

/// Whether the client owning block `slot` may send `bytes`: a RoCEv2 frame from the
/// device's MAC and one of its addresses that claims no identity of another process — a UD
/// packet's source QP (DETH) is in the block; a CM message's own ID is in the block (or 0,
/// a REJ of a REQ no connection was made for), a SIDR_REP's QP too. RC and UC packets
/// carry no source QP: their sender is known to the peer only by the connection.
pub fn check_sent(identity: &Identity, slot: u8, bytes: &[u8]) -> Result<(), Why> {
    let frame = Frame::new_checked(bytes).map_err(|_| Why::Malformed)?;
    let repr = FrameRepr::parse_ignoring_icrc(&frame).map_err(|_| Why::Malformed)?;
    if repr.ethernet.src != identity.mac {
        return Err(Why::Refused);
    }
    let source = match repr.ip {
        IpRepr::V4(ip) => ip.src.to_ipv6_mapped().octets(),
        IpRepr::V6(ip) => ip.src.octets(),
    };
    if !identity.gids.contains(&source) {
        return Err(Why::Refused);
    }
    let ours = |id: u32| (id >> 24) as u8 == slot;
    let Some(deth) = repr.ext.deth else {
        return Ok(());
    };
    if deth.src_qpn != mad::GSI_QPN {
        return if (deth.src_qpn >> 16) as u8 == slot {
            Ok(())
        } else {
            Err(Why::Refused)
        };
    }
    let mad = mad::Packet::new_checked(repr.payload).map_err(|_| Why::NotCm)?;
    if mad.mgmt_class() != MGMT_CLASS {
        return Err(Why::NotCm);
    }
    let data = mad.data();
    let allowed = match mad.attribute_id() {
        attribute::SIDR_REP => {
            let qpn = sidr_rep::Packet::new_checked(data)
                .map_err(|_| Why::NotCm)?
                .qpn();
            qpn == 0 || (qpn >> 16) as u8 == slot
        }
        attribute::REJ => local_comm_id(data).is_some_and(|id| id == 0 || ours(id)),
        _ => local_comm_id(data).is_some_and(ours),
    };
    if allowed {
        Ok(())
    } else {
        Err(Why::Refused)
    }
}

/// Whether a frame is addressed to this device's MAC (the switch's loopback: it never
/// reaches the wire), or to a multicast group (the wire and every other process).
pub fn destination(identity: &Identity, bytes: &[u8]) -> Destination {
    match bytes.get(..6) {
        Some(dst) if dst == identity.mac => Destination::Here,
        Some(dst) if dst[0] & 1 == 1 => Destination::Both,
        _ => Destination::Wire,
    }
}

/// Where a client's frame goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Destination {
    /// To another host.
    Wire,
    /// To a process on this device.
    Here,
    /// Multicast: the wire, and the processes here.
    Both,
}

#[cfg(test)]
mod tests {
    use super::*;
    use roce_wire::bth;
    use roce_wire::cm::{rej, PortSpace};
    use roce_wire::deth;
    use roce_wire::{ExtHeader, ExtRepr, Opcode};
    use std::net::Ipv4Addr;

    const MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
    const PEER_MAC: [u8; 6] = [2, 0, 0, 0, 0, 2];
    const IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
    const PEER_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

    fn identity() -> Identity {
        Identity {
            mac: MAC,
            gids: vec![IP.to_ipv6_mapped().octets()],
        }
    }

    /// A frame from `src` to `dst` with this opcode, destination QP and payload (a DETH
    /// with source QP `src_qpn` when the opcode has one).
    fn frame(
        src: ([u8; 6], Ipv4Addr),
        dst: ([u8; 6], Ipv4Addr),
        opcode: Opcode,
        dest_qpn: u32,
        src_qpn: u32,
        payload: &[u8],
    ) -> Vec<u8> {
        let mut repr = FrameRepr::ipv4(
            src,
            dst,
            bth::Repr::new(opcode, dest_qpn, roce_wire::Psn::new(5)),
            ExtRepr::default(),
            payload,
        );
        if opcode.info().headers.contains(&ExtHeader::Deth) {
            repr.ext.deth = Some(deth::Repr {
                qkey: mad::GSI_QKEY,
                src_qpn,
            });
        }
        let mut bytes = vec![0; repr.buffer_len()];
        let len = repr.emit(&mut bytes).unwrap();
        bytes.truncate(len);
        bytes
    }

    /// A CM MAD with attribute `attr` whose message starts with `local` then `remote`
    /// (and, for REQ/SIDR_REQ, `service` at bytes 8 to 16).
    fn mad(attr: u16, local: u32, remote: u32, service: u64) -> Vec<u8> {
        let mut bytes = vec![0u8; mad::MAD_LEN];
        bytes[0] = mad::BASE_VERSION;
        bytes[1] = MGMT_CLASS;
        bytes[2] = 2;
        bytes[3] = mad::METHOD_SEND;
        bytes[16..18].copy_from_slice(&attr.to_be_bytes());
        let data = &mut bytes[mad::HEADER_LEN..];
        data[0..4].copy_from_slice(&local.to_be_bytes());
        data[4..8].copy_from_slice(&remote.to_be_bytes());
        data[8..16].copy_from_slice(&service.to_be_bytes());
        bytes
    }

    fn from_peer(dest_qpn: u32, payload: &[u8]) -> Vec<u8> {
        let opcode = if dest_qpn == 1 {
            Opcode::UdSendOnly
        } else {
            Opcode::RcSendOnly
        };
        frame((PEER_MAC, PEER_IP), (MAC, IP), opcode, dest_qpn, 1, payload)
    }

    #[test]
    fn a_frame_goes_to_the_block_of_its_destination_qp() {
        assert_eq!(route(&from_peer(0x11, b"hi")), Route::Slot(0));
        assert_eq!(route(&from_peer(0x03_0042, b"hi")), Route::Slot(3));
        assert_eq!(route(&from_peer(0xFF_FFFF, b"hi")), Route::Everyone);
        assert_eq!(route(&[0u8; 60]), Route::Drop(Why::Malformed));
        assert_eq!(
            route(&from_peer(0x11, b"hi")[..40]),
            Route::Drop(Why::Malformed)
        );
    }

    #[test]
    fn cm_messages_go_to_the_owner_of_the_id_they_answer_or_to_the_listener() {
        let service = ServiceId::rdma_ip(PortSpace::Tcp, 7471);
        let req = mad(attribute::REQ, 0x0900_0001, 0, service.0);
        assert_eq!(route(&from_peer(1, &req)), Route::Service(service));
        let sidr = mad(attribute::SIDR_REQ, 0x0900_0001, 0, service.0);
        assert_eq!(route(&from_peer(1, &sidr)), Route::Service(service));
        for attr in [
            attribute::MRA,
            attribute::REJ,
            attribute::REP,
            attribute::RTU,
            attribute::DREQ,
            attribute::DREP,
        ] {
            let answer = mad(attr, 0x0900_0001, 0x07AB_CDEF, 0);
            assert_eq!(route(&from_peer(1, &answer)), Route::Slot(7), "{attr:#x}");
        }
        // SIDR_REP carries the requester's ID first.
        let rep = mad(attribute::SIDR_REP, 0x04AB_CDEF, 0, 0);
        assert_eq!(route(&from_peer(1, &rep)), Route::Slot(4));
        let mut other_class = mad(attribute::REP, 1, 2, 0);
        other_class[1] = 0x03;
        assert_eq!(route(&from_peer(1, &other_class)), Route::Drop(Why::NotCm));
        let lap = mad(attribute::LAP, 1, 2, 0);
        assert_eq!(route(&from_peer(1, &lap)), Route::Drop(Why::NotCm));
    }

    /// The offsets `remote_comm_id` reads are the wire crate's own, for every message.
    #[test]
    fn the_remote_id_is_where_the_wire_crate_puts_it() {
        let mut data = [0u8; mad::DATA_LEN];
        let mut packet = rej::Packet::new_unchecked(&mut data[..]);
        packet.set_remote_comm_id(0x1234_5678);
        packet.set_local_comm_id(0x0A0B_0C0D);
        assert_eq!(remote_comm_id(&data), Some(0x1234_5678));
        assert_eq!(local_comm_id(&data), Some(0x0A0B_0C0D));
        let mut packet = roce_wire::cm::rep::Packet::new_unchecked(&mut data[..]);
        packet.set_remote_comm_id(0x2234_5678);
        assert_eq!(remote_comm_id(&data), Some(0x2234_5678));
        let mut packet = roce_wire::cm::dreq::Packet::new_unchecked(&mut data[..]);
        packet.set_remote_comm_id(0x3234_5678);
        assert_eq!(remote_comm_id(&data), Some(0x3234_5678));
        let mut packet = roce_wire::cm::mra::Packet::new_unchecked(&mut data[..]);
        packet.set_remote_comm_id(0x4234_5678);
        assert_eq!(remote_comm_id(&data), Some(0x4234_5678));
        let mut packet = roce_wire::cm::rtu::Packet::new_unchecked(&mut data[..]);
        packet.set_remote_comm_id(0x5234_5678);
        assert_eq!(remote_comm_id(&data), Some(0x5234_5678));
    }

    #[test]
    fn a_client_sends_only_as_itself() {
        let id = identity();
        let ours = (MAC, IP);
        let peer = (PEER_MAC, PEER_IP);
        let rc = frame(ours, peer, Opcode::RcSendOnly, 0x11, 0, b"x");
        assert_eq!(check_sent(&id, 3, &rc), Ok(()), "RC names no source QP");
        let ud_mine = frame(ours, peer, Opcode::UdSendOnly, 0x11, 0x03_0012, b"x");
        assert_eq!(check_sent(&id, 3, &ud_mine), Ok(()));
        assert_eq!(check_sent(&id, 4, &ud_mine), Err(Why::Refused));
        let spoofed_mac = frame((PEER_MAC, IP), peer, Opcode::RcSendOnly, 0x11, 0, b"x");
        assert_eq!(check_sent(&id, 3, &spoofed_mac), Err(Why::Refused));
        let spoofed_ip = frame((MAC, PEER_IP), peer, Opcode::RcSendOnly, 0x11, 0, b"x");
        assert_eq!(check_sent(&id, 3, &spoofed_ip), Err(Why::Refused));
        let req = mad(attribute::REQ, 0x0300_0001, 0, 1);
        let cm = frame(ours, peer, Opcode::UdSendOnly, 1, 1, &req);
        assert_eq!(check_sent(&id, 3, &cm), Ok(()));
        assert_eq!(check_sent(&id, 2, &cm), Err(Why::Refused));
        let rej = mad(attribute::REJ, 0, 0x0900_0000, 0);
        let cm = frame(ours, peer, Opcode::UdSendOnly, 1, 1, &rej);
        assert_eq!(
            check_sent(&id, 2, &cm),
            Ok(()),
            "a REJ with no connection of ours"
        );
        assert_eq!(check_sent(&id, 2, &[0u8; 70]), Err(Why::Malformed));
    }

    #[test]
    fn frames_to_our_mac_stay_here() {
        let id = identity();
        assert_eq!(destination(&id, &from_peer(0x11, b"")), Destination::Here);
        let out = frame(
            (MAC, IP),
            (PEER_MAC, PEER_IP),
            Opcode::RcSendOnly,
            0x11,
            0,
            b"",
        );
        assert_eq!(destination(&id, &out), Destination::Wire);
        let mut group = out.clone();
        group[..6].copy_from_slice(&[0x01, 0x00, 0x5e, 0, 0, 1]);
        assert_eq!(destination(&id, &group), Destination::Both);
    }
}

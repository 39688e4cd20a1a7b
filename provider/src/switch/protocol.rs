//! What the switch and a client say over the client's Unix socket (`SOCK_SEQPACKET`, so
//! each message arrives whole): a message is a tag and a few 64-bit words; the shared
//! memory and eventfds travel beside it as `SCM_RIGHTS`.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::net::{
    recvmsg, sendmsg, AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags,
    SendAncillaryBuffer, SendAncillaryMessage, SendFlags, SocketAddrUnix, SocketFlags, SocketType,
};

/// Changes whenever a message changes: a client and a switch of different builds refuse
/// each other rather than misread each other.
pub const PROTOCOL_VERSION: u64 = 1;

/// Most words a message carries.
const MAX_WORDS: usize = 64;

/// How the switch hands a client the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The client is the device's only user: it opens AF_XDP itself, as without a switch,
    /// until the switch asks for the device back ([`Message::Release`]).
    Direct,
    /// The client's frames go through its rings to the switch, which owns the device.
    Ring,
}

/// The switch's counters, and the asking client's own (`ROCE_STATS`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SwitchStats {
    /// Frames the switch received from the wire.
    pub wire_rx: u64,
    /// Frames the switch sent to the wire for its clients.
    pub wire_tx: u64,
    /// Frames handed to a client's ring (from the wire or another client).
    pub steered: u64,
    /// Of those, frames from one client to another on this device, which never reached
    /// the wire (rxe's loopback).
    pub looped: u64,
    /// Frames dropped for a QP number or CM ID whose block no client owns (its client
    /// left or was killed, or never existed).
    pub dropped_no_owner: u64,
    /// Frames dropped because their client's ring was full (it stopped reading).
    pub dropped_ring_full: u64,
    /// Frames dropped as not RoCEv2 or malformed.
    pub dropped_malformed: u64,
    /// MADs to QP 1 dropped as not the CM's, or of a CM message we do not steer.
    pub dropped_not_cm: u64,
    /// REQs and SIDR_REQs for a service nobody listened on within the hold time.
    pub dropped_no_listener: u64,
    /// Frames a client sent that it may not (another's source QP or CM ID, not our
    /// address, not RoCEv2): dropped.
    pub tx_refused: u64,
    /// Times a client's transmit ring was drained in a turn that had no room on the wire.
    pub wire_full: u64,
    /// Clients attached now.
    pub clients: u64,
    /// Clients that left without detaching (killed).
    pub clients_lost: u64,
    /// Clients that broke the ring protocol and were dropped.
    pub clients_broken: u64,
    /// The asking client's: frames steered to it.
    pub client_steered: u64,
    /// The asking client's: frames for it dropped for its full ring.
    pub client_ring_full: u64,
    /// The asking client's: frames it sent that were refused.
    pub client_refused: u64,
}

impl SwitchStats {
    const WORDS: usize = 17;

    fn to_words(self) -> [u64; Self::WORDS] {
        [
            self.wire_rx,
            self.wire_tx,
            self.steered,
            self.looped,
            self.dropped_no_owner,
            self.dropped_ring_full,
            self.dropped_malformed,
            self.dropped_not_cm,
            self.dropped_no_listener,
            self.tx_refused,
            self.wire_full,
            self.clients,
            self.clients_lost,
            self.clients_broken,
            self.client_steered,
            self.client_ring_full,
            self.client_refused,
        ]
    }

    fn from_words(w: &[u64]) -> Option<SwitchStats> {
        let w: &[u64; Self::WORDS] = w.try_into().ok()?;
        Some(SwitchStats {
            wire_rx: w[0],
            wire_tx: w[1],
            steered: w[2],
            looped: w[3],
            dropped_no_owner: w[4],
            dropped_ring_full: w[5],
            dropped_malformed: w[6],
            dropped_not_cm: w[7],
            dropped_no_listener: w[8],
            tx_refused: w[9],
            wire_full: w[10],
            clients: w[11],
            clients_lost: w[12],
            clients_broken: w[13],
            client_steered: w[14],
            client_ring_full: w[15],
            client_refused: w[16],
        })
    }

    /// Each counter with its name, in a fixed order (for `ROCE_STATS`).
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> {
        const NAMES: [&str; SwitchStats::WORDS] = [
            "wire_rx",
            "wire_tx",
            "steered",
            "looped",
            "dropped_no_owner",
            "dropped_ring_full",
            "dropped_malformed",
            "dropped_not_cm",
            "dropped_no_listener",
            "tx_refused",
            "wire_full",
            "clients",
            "clients_lost",
            "clients_broken",
            "this_process_steered",
            "this_process_ring_full",
            "this_process_refused",
        ];
        NAMES.into_iter().zip(self.to_words())
    }
}

/// One message, either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Message {
    /// Client: attach me to the device with interface index `ifindex`.
    Hello {
        /// [`PROTOCOL_VERSION`] of the client's build.
        version: u64,
        /// The interface the client means.
        ifindex: u32,
    },
    /// Switch: attached; this process owns block `slot` of QP numbers and CM IDs. Comes
    /// with the memfd of its two rings and two eventfds: the one the switch writes to wake
    /// the client, and the one the client writes to wake the switch.
    Welcome {
        /// The block.
        slot: u8,
        /// Direct or through the rings.
        mode: Mode,
        /// Data bytes of the ring the switch writes (frames to the client).
        to_client: u64,
        /// Data bytes of the ring the client writes, which follows it.
        from_client: u64,
    },
    /// Switch: not attached (`errno`: the version differs, the device is another, every
    /// block is taken).
    Refused {
        /// Why, as an errno.
        errno: i32,
    },
    /// Client: REQs and SIDR_REQs for `service_id` are mine.
    Listen {
        /// The service ID.
        service_id: u64,
    },
    /// Client: no longer.
    Unlisten {
        /// The service ID.
        service_id: u64,
    },
    /// Switch: done (0), or failed with an errno.
    Done {
        /// 0 or an errno (`EADDRINUSE`: another process listens on it).
        errno: i32,
    },
    /// Switch, to a [`Mode::Direct`] client: another process needs the device; close your
    /// AF_XDP sockets and move to your rings, then say [`Released`](Message::Released).
    Release,
    /// Client: my AF_XDP sockets are closed; my frames are in my ring from now on.
    Released,
    /// Client: your counters, please.
    Stats,
    /// Switch: the counters, with the asking client's.
    StatsAre(SwitchStats),
}

impl Message {
    fn encode(&self) -> (u64, Vec<u64>) {
        match *self {
            Message::Hello { version, ifindex } => (1, vec![version, ifindex.into()]),
            Message::Welcome {
                slot,
                mode,
                to_client,
                from_client,
            } => (
                2,
                vec![
                    slot.into(),
                    u64::from(mode == Mode::Ring),
                    to_client,
                    from_client,
                ],
            ),
            Message::Refused { errno } => (3, vec![errno as u64]),
            Message::Listen { service_id } => (4, vec![service_id]),
            Message::Unlisten { service_id } => (5, vec![service_id]),
            Message::Done { errno } => (6, vec![errno as u64]),
            Message::Release => (7, vec![]),
            Message::Released => (8, vec![]),
            Message::Stats => (9, vec![]),
            Message::StatsAre(stats) => (10, stats.to_words().to_vec()),
        }
    }

    fn decode(tag: u64, w: &[u64]) -> Option<Message> {
        let errno = |word: u64| i32::try_from(word).ok();
        Some(match (tag, w) {
            (1, &[version, ifindex]) => Message::Hello {
                version,
                ifindex: u32::try_from(ifindex).ok()?,
            },
            (2, &[slot, ring, to_client, from_client]) => Message::Welcome {
                slot: u8::try_from(slot).ok()?,
                mode: if ring == 1 { Mode::Ring } else { Mode::Direct },
                to_client,
                from_client,
            },
            (3, &[code]) => Message::Refused {
                errno: errno(code)?,
            },
            (4, &[service_id]) => Message::Listen { service_id },
            (5, &[service_id]) => Message::Unlisten { service_id },
            (6, &[code]) => Message::Done {
                errno: errno(code)?,
            },
            (7, &[]) => Message::Release,
            (8, &[]) => Message::Released,
            (9, &[]) => Message::Stats,
            (10, words) => Message::StatsAre(SwitchStats::from_words(words)?),
            _ => return None,
        })
    }
}

/// The abstract Unix socket name of the switch of interface `ifindex` (`name`): abstract
/// names belong to the network namespace, as the interface does, so each namespace's
/// device has its own, and nothing is left in the file system.
pub fn address(ifindex: u32, name: &str) -> io::Result<SocketAddrUnix> {
    let name = format!("roce-xdp/switch/{ifindex}/{name}");
    Ok(SocketAddrUnix::new_abstract_name(name.as_bytes())?)
}

/// A new `SOCK_SEQPACKET` Unix socket.
pub fn seqpacket() -> io::Result<OwnedFd> {
    Ok(rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )?)
}

/// Sends `message` with `fds` (at most 4).
pub fn send(socket: impl AsFd, message: &Message, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let (tag, words) = message.encode();
    let mut bytes = Vec::with_capacity(8 * (1 + words.len()));
    bytes.extend_from_slice(&tag.to_le_bytes());
    for word in words {
        bytes.extend_from_slice(&word.to_le_bytes());
    }
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(4))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "too many fds"));
    }
    let sent = sendmsg(
        socket,
        &[IoSlice::new(&bytes)],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    if sent != bytes.len() {
        return Err(io::Error::other("message cut short"));
    }
    Ok(())
}

/// What [`recv`] got.
#[derive(Debug)]
pub enum Received {
    /// A message and the fds that came with it.
    Message(Message, Vec<OwnedFd>),
    /// The other side closed its end.
    Closed,
    /// Nothing waits (a non-blocking socket).
    Nothing,
}

/// Takes one message (blocking or not, as the socket is); a message we cannot read is an
/// error (`InvalidData`).
pub fn recv(socket: impl AsFd) -> io::Result<Received> {
    let mut bytes = [0u8; 8 * (1 + MAX_WORDS)];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(4))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let received = match recvmsg(
        socket,
        &mut [IoSliceMut::new(&mut bytes)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    ) {
        Ok(received) => received,
        Err(rustix::io::Errno::AGAIN) => return Ok(Received::Nothing),
        Err(rustix::io::Errno::CONNRESET) => return Ok(Received::Closed),
        Err(error) => return Err(error.into()),
    };
    let mut fds = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(rights) = message {
            fds.extend(rights);
        }
    }
    if received.bytes == 0 {
        return Ok(Received::Closed);
    }
    let bad = || io::Error::new(io::ErrorKind::InvalidData, "a message we cannot read");
    if received.bytes % 8 != 0 || received.bytes > bytes.len() {
        return Err(bad());
    }
    let words: Vec<u64> = bytes[..received.bytes]
        .chunks_exact(8)
        .map(|word| u64::from_le_bytes(word.try_into().unwrap_or_default()))
        .collect();
    let message = Message::decode(words[0], &words[1..]).ok_or_else(bad)?;
    Ok(Received::Message(message, fds))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::net::socketpair;

    #[test]
    fn every_message_survives_the_socket_with_its_fds() {
        let (a, b) = socketpair(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )
        .unwrap();
        let stats = SwitchStats {
            wire_rx: 1,
            client_refused: 17,
            ..SwitchStats::default()
        };
        let messages = [
            Message::Hello {
                version: PROTOCOL_VERSION,
                ifindex: 7,
            },
            Message::Welcome {
                slot: 254,
                mode: Mode::Ring,
                to_client: 1 << 22,
                from_client: 1 << 21,
            },
            Message::Welcome {
                slot: 0,
                mode: Mode::Direct,
                to_client: 1,
                from_client: 2,
            },
            Message::Refused { errno: 16 },
            Message::Listen {
                service_id: 0x0106_0000_0000_4a3b,
            },
            Message::Unlisten { service_id: 3 },
            Message::Done { errno: 0 },
            Message::Release,
            Message::Released,
            Message::Stats,
            Message::StatsAre(stats),
        ];
        let memfd = rustix::fs::memfd_create("t", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        for message in messages {
            send(&a, &message, &[memfd.as_fd()]).unwrap();
            match recv(&b).unwrap() {
                Received::Message(got, fds) => {
                    assert_eq!(got, message);
                    assert_eq!(fds.len(), 1);
                }
                other => panic!("{other:?}"),
            }
        }
        // Garbage is refused, not misread; a closed peer is seen as such.
        rustix::net::send(&a, &[9u8; 12], SendFlags::empty()).unwrap();
        assert!(recv(&b).is_err());
        rustix::net::send(&a, &99u64.to_le_bytes(), SendFlags::empty()).unwrap();
        assert!(recv(&b).is_err());
        drop(a);
        assert!(matches!(recv(&b).unwrap(), Received::Closed));
    }
}

//! The names the CM's parts share: whose GID, which connection. The CM and every part of it
//! import this module; it imports none of them.

/// A GID: on RoCEv2 an IPv6 address, IPv4-mapped (`::ffff:a.b.c.d`) for IPv4.
pub type Gid = [u8; 16];

/// A connection (or SIDR request) of this CM: its local communication ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId(pub u32);

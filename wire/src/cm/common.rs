//! What the messages' modules share: the message an MRA or REJ refers to, length fields,
//! and how the two communication IDs are printed.

use core::fmt;

use crate::{Error, Result};

/// Which message an MRA or REJ refers to (2 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MessageKind {
    /// The REQ.
    Req = 0,
    /// The REP.
    Rep = 1,
    /// Anything else (a LAP).
    Other = 2,
}

impl MessageKind {
    pub(super) fn from_bits(bits: u8) -> Result<MessageKind> {
        match bits {
            0 => Ok(MessageKind::Req),
            1 => Ok(MessageKind::Rep),
            2 => Ok(MessageKind::Other),
            _ => Err(Error),
        }
    }
}

/// A length field's value, refused when it is over `max`, the bytes its field has.
pub(super) fn length_within(length: u8, max: usize) -> Result<u8> {
    if usize::from(length) > max {
        return Err(Error);
    }
    Ok(length)
}

/// The two communication IDs that open most messages, as every `Display` prints them.
pub(super) struct CommIds(pub(super) u32, pub(super) u32);

impl fmt::Display for CommIds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "local_id={:#010x} remote_id={:#010x}", self.0, self.1)
    }
}

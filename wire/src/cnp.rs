//! The body of a RoCEv2 congestion notification packet (BTH opcode 0x81): 16 reserved bytes.
//!
//! A CNP carries no fields of its own; the BTH names the QP being slowed down and sets BECN.
//! The reserved bytes are sent as zero and ignored on receipt.

use core::fmt;

use crate::Result;

fixed_header_packet! {
    16;
    /// A view of a CNP body.
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Zeroes the reserved bytes.
    pub fn clear(&mut self) {
        self.buffer.as_mut()[..HEADER_LEN].fill(0);
    }
}

/// A parsed CNP body (nothing but its presence).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Repr;

fixed_len_repr!();

impl Repr {
    /// Parses the body; its reserved bytes are ignored.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(_packet: &Packet<&T>) -> Result<Repr> {
        Ok(Repr)
    }

    /// Writes sixteen zero bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.clear();
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("cnp")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emit_zeroes_and_parse_accepts() {
        let mut bytes = [0xA5; 16];
        Repr.emit(&mut Packet::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes, [0; 16]);
        assert_eq!(
            Repr::parse(&Packet::new_checked(&bytes[..]).unwrap()),
            Ok(Repr)
        );
        assert!(Packet::new_checked(&bytes[..15]).is_err());
    }
}

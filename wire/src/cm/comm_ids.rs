//! The layout DREP (IBTA Table 113) and RTU (Table 111) share: the two communication IDs and
//! private data. The MAD attribute ID, not the layout, tells the two apart.

use core::fmt;

use super::common::CommIds;

/// Bytes of private data.
pub const PRIVATE_DATA_LEN: usize = 224;

mod field {
    use crate::Field;

    pub const LOCAL_COMM_ID: Field = 0..4;
    pub const REMOTE_COMM_ID: Field = 4..8;
    pub const PRIVATE_DATA: Field = 8..232;
}

cm_message_packet!("a DREP or an RTU");

comm_id_accessors!();

cm_message_repr! {
    /// A parsed DREP or RTU.
    parse: "Parses a DREP or an RTU (every bit pattern is valid).";
    emit: "Writes the DREP or RTU.";
    comm_ids;
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", CommIds(self.local_comm_id, self.remote_comm_id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cm::tests::capture_message;

    /// The message at `index` in rping_rdmacm.pcap, which carries these IDs and zero private data.
    struct Capture {
        index: usize,
        local_comm_id: u32,
        remote_comm_id: u32,
    }

    const RTU: Capture = Capture {
        index: 2,
        local_comm_id: 0x6fd0_c1a6,
        remote_comm_id: 0x0322_dfd9,
    };

    const DREP: Capture = Capture {
        index: 4,
        local_comm_id: 0x0322_dfd9,
        remote_comm_id: 0x6fd0_c1a6,
    };

    impl Capture {
        fn bytes(&self) -> [u8; HEADER_LEN] {
            capture_message(self.index)
        }

        fn repr(&self) -> Repr {
            Repr {
                local_comm_id: self.local_comm_id,
                remote_comm_id: self.remote_comm_id,
                private_data: [0; PRIVATE_DATA_LEN],
            }
        }

        fn deconstruct(&self) {
            let bytes = self.bytes();
            let packet = Packet::new_checked(&bytes[..]).unwrap();
            assert_eq!(packet.local_comm_id(), self.local_comm_id);
            assert_eq!(packet.remote_comm_id(), self.remote_comm_id);
            assert_eq!(packet.private_data(), &[0; PRIVATE_DATA_LEN][..]);
        }

        fn construct(&self) {
            let mut bytes = [0xA5; HEADER_LEN];
            let mut packet = Packet::new_unchecked(&mut bytes[..]);
            packet.set_local_comm_id(self.local_comm_id);
            packet.set_remote_comm_id(self.remote_comm_id);
            packet.private_data_mut().fill(0);
            assert_eq!(bytes, self.bytes());
        }

        fn parse(&self) {
            let bytes = self.bytes();
            assert_eq!(
                Repr::parse(&Packet::new_checked(&bytes[..]).unwrap()),
                Ok(self.repr())
            );
        }

        fn emit(&self) {
            let mut bytes = [0xA5; HEADER_LEN];
            self.repr().emit(&mut Packet::new_unchecked(&mut bytes[..]));
            assert_eq!(bytes, self.bytes());
        }
    }

    #[test]
    fn deconstruct() {
        RTU.deconstruct();
        DREP.deconstruct();
    }

    #[test]
    fn construct() {
        RTU.construct();
        DREP.construct();
    }

    #[test]
    fn parse() {
        RTU.parse();
        DREP.parse();
    }

    #[test]
    fn emit() {
        RTU.emit();
        DREP.emit();
    }
}

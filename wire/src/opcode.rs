//! BTH opcodes and what each one implies, after the IBTA opcode table (and rxe's
//! `rxe_opcode.c`, minus its zero-filled 256-entry array: an unknown opcode is an error here).

use core::fmt;

/// An extension transport header that may follow the BTH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExtHeader {
    /// RDMA extended transport header: virtual address, R_Key, DMA length.
    Reth,
    /// ACK extended transport header: syndrome and MSN.
    Aeth,
    /// Datagram extended transport header: Q_Key and source QP.
    Deth,
    /// Immediate data.
    ImmDt,
    /// Invalidate extended transport header: the R_Key to invalidate.
    Ieth,
    /// Atomic extended transport header: address, R_Key, swap/add and compare operands.
    AtomicEth,
    /// Atomic acknowledge extended transport header: the original remote value.
    AtomicAckEth,
    /// FLUSH extended transport header: selectivity level and placement type.
    Feth,
    /// The 16 reserved bytes that form a CNP's body.
    Cnp,
}

impl ExtHeader {
    /// Length of the header on the wire, in bytes.
    pub const fn wire_len(self) -> usize {
        match self {
            ExtHeader::Reth => crate::reth::HEADER_LEN,
            ExtHeader::Aeth => crate::aeth::HEADER_LEN,
            ExtHeader::Deth => crate::deth::HEADER_LEN,
            ExtHeader::ImmDt => crate::immdt::HEADER_LEN,
            ExtHeader::Ieth => crate::ieth::HEADER_LEN,
            ExtHeader::AtomicEth => crate::atomic_eth::HEADER_LEN,
            ExtHeader::AtomicAckEth => crate::atomic_ack_eth::HEADER_LEN,
            ExtHeader::Feth => crate::feth::HEADER_LEN,
            ExtHeader::Cnp => crate::cnp::HEADER_LEN,
        }
    }
}

/// The transport service an opcode belongs to (its top three bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Service {
    /// Reliable connection.
    Rc,
    /// Unreliable connection.
    Uc,
    /// Unreliable datagram.
    Ud,
    /// RoCEv2 congestion notification.
    Cnp,
}

/// Where a packet sits in a multi-packet message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Position {
    /// First packet of a message of two or more.
    First,
    /// Neither first nor last.
    Middle,
    /// Last packet of a message of two or more.
    Last,
    /// The whole message in one packet (also every ACK and atomic).
    Only,
}

impl Position {
    /// Whether this packet starts a message.
    pub const fn starts_message(self) -> bool {
        matches!(self, Position::First | Position::Only)
    }

    /// Whether this packet ends a message.
    pub const fn ends_message(self) -> bool {
        matches!(self, Position::Last | Position::Only)
    }
}

/// Everything an opcode tells a parser and a state machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpcodeInfo {
    /// Extension headers that follow the BTH, in wire order.
    pub headers: &'static [ExtHeader],
    /// Sent by a requester (true) or by a responder as a response or acknowledgement (false).
    pub is_request: bool,
    /// Position within its message.
    pub position: Position,
    /// Whether a payload follows the headers.
    pub has_payload: bool,
    /// Whether an ImmDt header is present.
    pub has_immediate: bool,
    /// Whether an IETH (send with invalidate) is present.
    pub has_invalidate: bool,
}

impl OpcodeInfo {
    /// Total length of the extension headers, in bytes.
    pub const fn ext_len(&self) -> usize {
        let mut total = 0;
        let mut i = 0;
        while i < self.headers.len() {
            total += self.headers[i].wire_len();
            i += 1;
        }
        total
    }
}

macro_rules! opcodes {
    ($($(#[$doc:meta])* $name:ident = $value:literal, $text:literal,
        [$($header:ident),*], $request:literal, $position:ident, $payload:literal;)*) => {
        /// A BTH opcode of RC, UC or UD, or the RoCEv2 CNP.
        ///
        /// The spec's reserved values and the RD opcodes are not variants: [`TryFrom<u8>`]
        /// rejects them before anything reads a length from them.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u8)]
        pub enum Opcode {
            $($(#[$doc])* $name = $value,)*
        }

        impl Opcode {
            /// Every opcode, in numeric order.
            pub const ALL: &'static [Opcode] = &[$(Opcode::$name,)*];

            /// The IBTA/rxe name, such as `RC_SEND_FIRST`.
            pub const fn name(self) -> &'static str {
                match self {
                    $(Opcode::$name => $text,)*
                }
            }

            /// Headers, role and position implied by this opcode.
            #[inline]
            pub const fn info(self) -> OpcodeInfo {
                // One table indexed by the opcode's value: every packet asks this more than
                // once, and an index is cheaper than the match a function per arm becomes.
                const TABLE: [OpcodeInfo; 256] = {
                    let mut table = [OpcodeInfo {
                        headers: &[],
                        is_request: false,
                        position: Position::Only,
                        has_payload: false,
                        has_immediate: false,
                        has_invalidate: false,
                    }; 256];
                    $({
                        const HEADERS: &[ExtHeader] = &[$(ExtHeader::$header),*];
                        table[$value] = OpcodeInfo {
                            headers: HEADERS,
                            is_request: $request,
                            position: Position::$position,
                            has_payload: $payload,
                            has_immediate: contains(HEADERS, ExtHeader::ImmDt),
                            has_invalidate: contains(HEADERS, ExtHeader::Ieth),
                        };
                    })*
                    table
                };
                TABLE[self as usize]
            }
        }

        impl TryFrom<u8> for Opcode {
            type Error = crate::Error;

            fn try_from(value: u8) -> crate::Result<Self> {
                match value {
                    $($value => Ok(Opcode::$name),)*
                    _ => Err(crate::Error),
                }
            }
        }
    };
}

const fn contains(headers: &[ExtHeader], wanted: ExtHeader) -> bool {
    let mut i = 0;
    while i < headers.len() {
        if headers[i] as u8 == wanted as u8 {
            return true;
        }
        i += 1;
    }
    false
}

opcodes! {
    /// RC SEND, first packet.
    RcSendFirst = 0x00, "RC_SEND_FIRST", [], true, First, true;
    /// RC SEND, middle packet.
    RcSendMiddle = 0x01, "RC_SEND_MIDDLE", [], true, Middle, true;
    /// RC SEND, last packet.
    RcSendLast = 0x02, "RC_SEND_LAST", [], true, Last, true;
    /// RC SEND, last packet, with immediate data.
    RcSendLastWithImmediate = 0x03, "RC_SEND_LAST_WITH_IMMEDIATE", [ImmDt], true, Last, true;
    /// RC SEND in one packet.
    RcSendOnly = 0x04, "RC_SEND_ONLY", [], true, Only, true;
    /// RC SEND in one packet, with immediate data.
    RcSendOnlyWithImmediate = 0x05, "RC_SEND_ONLY_WITH_IMMEDIATE", [ImmDt], true, Only, true;
    /// RC RDMA WRITE, first packet.
    RcRdmaWriteFirst = 0x06, "RC_RDMA_WRITE_FIRST", [Reth], true, First, true;
    /// RC RDMA WRITE, middle packet.
    RcRdmaWriteMiddle = 0x07, "RC_RDMA_WRITE_MIDDLE", [], true, Middle, true;
    /// RC RDMA WRITE, last packet.
    RcRdmaWriteLast = 0x08, "RC_RDMA_WRITE_LAST", [], true, Last, true;
    /// RC RDMA WRITE, last packet, with immediate data.
    RcRdmaWriteLastWithImmediate = 0x09, "RC_RDMA_WRITE_LAST_WITH_IMMEDIATE", [ImmDt], true, Last, true;
    /// RC RDMA WRITE in one packet.
    RcRdmaWriteOnly = 0x0A, "RC_RDMA_WRITE_ONLY", [Reth], true, Only, true;
    /// RC RDMA WRITE in one packet, with immediate data.
    RcRdmaWriteOnlyWithImmediate = 0x0B, "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", [Reth, ImmDt], true, Only, true;
    /// RC RDMA READ request.
    RcRdmaReadRequest = 0x0C, "RC_RDMA_READ_REQUEST", [Reth], true, Only, false;
    /// RC RDMA READ response, first packet.
    RcRdmaReadResponseFirst = 0x0D, "RC_RDMA_READ_RESPONSE_FIRST", [Aeth], false, First, true;
    /// RC RDMA READ response, middle packet.
    RcRdmaReadResponseMiddle = 0x0E, "RC_RDMA_READ_RESPONSE_MIDDLE", [], false, Middle, true;
    /// RC RDMA READ response, last packet.
    RcRdmaReadResponseLast = 0x0F, "RC_RDMA_READ_RESPONSE_LAST", [Aeth], false, Last, true;
    /// RC RDMA READ response in one packet.
    RcRdmaReadResponseOnly = 0x10, "RC_RDMA_READ_RESPONSE_ONLY", [Aeth], false, Only, true;
    /// RC ACK or NAK.
    RcAcknowledge = 0x11, "RC_ACKNOWLEDGE", [Aeth], false, Only, false;
    /// RC atomic acknowledgement carrying the original value.
    RcAtomicAcknowledge = 0x12, "RC_ATOMIC_ACKNOWLEDGE", [Aeth, AtomicAckEth], false, Only, false;
    /// RC atomic compare and swap.
    RcCompareSwap = 0x13, "RC_COMPARE_SWAP", [AtomicEth], true, Only, false;
    /// RC atomic fetch and add.
    RcFetchAdd = 0x14, "RC_FETCH_ADD", [AtomicEth], true, Only, false;
    /// RC SEND, last packet, invalidating an R_Key.
    RcSendLastWithInvalidate = 0x16, "RC_SEND_LAST_WITH_INVALIDATE", [Ieth], true, Last, true;
    /// RC SEND in one packet, invalidating an R_Key.
    RcSendOnlyWithInvalidate = 0x17, "RC_SEND_ONLY_WITH_INVALIDATE", [Ieth], true, Only, true;
    /// RC FLUSH (memory placement extensions).
    RcFlush = 0x1C, "RC_FLUSH", [Feth, Reth], true, Only, false;
    /// RC ATOMIC WRITE: an 8-byte payload written atomically.
    RcAtomicWrite = 0x1D, "RC_ATOMIC_WRITE", [Reth], true, Only, true;
    /// UC SEND, first packet.
    UcSendFirst = 0x20, "UC_SEND_FIRST", [], true, First, true;
    /// UC SEND, middle packet.
    UcSendMiddle = 0x21, "UC_SEND_MIDDLE", [], true, Middle, true;
    /// UC SEND, last packet.
    UcSendLast = 0x22, "UC_SEND_LAST", [], true, Last, true;
    /// UC SEND, last packet, with immediate data.
    UcSendLastWithImmediate = 0x23, "UC_SEND_LAST_WITH_IMMEDIATE", [ImmDt], true, Last, true;
    /// UC SEND in one packet.
    UcSendOnly = 0x24, "UC_SEND_ONLY", [], true, Only, true;
    /// UC SEND in one packet, with immediate data.
    UcSendOnlyWithImmediate = 0x25, "UC_SEND_ONLY_WITH_IMMEDIATE", [ImmDt], true, Only, true;
    /// UC RDMA WRITE, first packet.
    UcRdmaWriteFirst = 0x26, "UC_RDMA_WRITE_FIRST", [Reth], true, First, true;
    /// UC RDMA WRITE, middle packet.
    UcRdmaWriteMiddle = 0x27, "UC_RDMA_WRITE_MIDDLE", [], true, Middle, true;
    /// UC RDMA WRITE, last packet.
    UcRdmaWriteLast = 0x28, "UC_RDMA_WRITE_LAST", [], true, Last, true;
    /// UC RDMA WRITE, last packet, with immediate data.
    UcRdmaWriteLastWithImmediate = 0x29, "UC_RDMA_WRITE_LAST_WITH_IMMEDIATE", [ImmDt], true, Last, true;
    /// UC RDMA WRITE in one packet.
    UcRdmaWriteOnly = 0x2A, "UC_RDMA_WRITE_ONLY", [Reth], true, Only, true;
    /// UC RDMA WRITE in one packet, with immediate data.
    UcRdmaWriteOnlyWithImmediate = 0x2B, "UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", [Reth, ImmDt], true, Only, true;
    /// UD SEND (always one packet).
    UdSendOnly = 0x64, "UD_SEND_ONLY", [Deth], true, Only, true;
    /// UD SEND with immediate data.
    UdSendOnlyWithImmediate = 0x65, "UD_SEND_ONLY_WITH_IMMEDIATE", [Deth, ImmDt], true, Only, true;
    /// RoCEv2 congestion notification packet.
    Cnp = 0x81, "CNP", [Cnp], false, Only, false;
}

impl Opcode {
    /// The transport service, from the opcode's top bits.
    pub const fn service(self) -> Service {
        match self as u8 >> 5 {
            0 => Service::Rc,
            1 => Service::Uc,
            3 => Service::Ud,
            _ => Service::Cnp,
        }
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn try_from_accepts_exactly_the_table() {
        let mut known = 0;
        for value in 0..=u8::MAX {
            match Opcode::try_from(value) {
                Ok(opcode) => {
                    assert_eq!(opcode as u8, value);
                    known += 1;
                }
                Err(_) => assert!(!Opcode::ALL.iter().any(|o| *o as u8 == value)),
            }
        }
        assert_eq!(known, Opcode::ALL.len());
        assert_eq!(known, 40);
    }

    #[test]
    fn reserved_and_rd_opcodes_are_rejected() {
        for value in [
            0x15, 0x18, 0x1E, 0x1F, 0x2C, 0x40, 0x4A, 0x60, 0x66, 0x80, 0xFF,
        ] {
            assert!(Opcode::try_from(value).is_err(), "{value:#x}");
        }
    }

    #[test]
    fn names_follow_the_service_prefix() {
        for opcode in Opcode::ALL {
            let prefix = match opcode.service() {
                Service::Rc => "RC_",
                Service::Uc => "UC_",
                Service::Ud => "UD_",
                Service::Cnp => "CNP",
            };
            assert!(opcode.name().starts_with(prefix), "{opcode}");
        }
    }

    #[test]
    fn info_is_consistent_with_names() {
        for opcode in Opcode::ALL {
            let info = opcode.info();
            let name = opcode.name();
            assert_eq!(info.has_immediate, name.contains("IMMEDIATE"), "{name}");
            assert_eq!(info.has_invalidate, name.contains("INVALIDATE"), "{name}");
            let position = if name.ends_with("FIRST") {
                Position::First
            } else if name.ends_with("MIDDLE") {
                Position::Middle
            } else if name.contains("_LAST") {
                Position::Last
            } else {
                Position::Only
            };
            assert_eq!(info.position, position, "{name}");
            let carries_reth = name.contains("WRITE_FIRST")
                || name.contains("WRITE_ONLY")
                || name.contains("READ_REQUEST")
                || name.contains("FLUSH")
                || name.contains("ATOMIC_WRITE");
            assert_eq!(
                info.headers.contains(&ExtHeader::Reth),
                carries_reth,
                "{name}"
            );
        }
    }

    #[test]
    fn ext_len_sums_the_headers() {
        assert_eq!(Opcode::RcSendMiddle.info().ext_len(), 0);
        assert_eq!(Opcode::RcRdmaWriteOnlyWithImmediate.info().ext_len(), 20);
        assert_eq!(Opcode::RcAtomicAcknowledge.info().ext_len(), 12);
        assert_eq!(Opcode::RcCompareSwap.info().ext_len(), 28);
        assert_eq!(Opcode::UdSendOnlyWithImmediate.info().ext_len(), 12);
        assert_eq!(Opcode::RcFlush.info().ext_len(), 20);
        assert_eq!(Opcode::Cnp.info().ext_len(), 16);
    }
}

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
    /// XRC extended transport header: the destination XRC SRQ.
    XrcEth,
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
            ExtHeader::XrcEth => crate::xrceth::HEADER_LEN,
        }
    }

    /// This header's bit in a set of headers (see `ExtRepr::matches`).
    pub const fn bit(self) -> u16 {
        1 << self as u16
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
    /// Extended reliable connection (IBTA Annex A14).
    Xrc,
}

/// What a packet does: the operation its message carries out, whatever its service and its
/// place in the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    /// SEND (into a posted receive).
    Send,
    /// RDMA WRITE.
    Write,
    /// RDMA READ request.
    ReadRequest,
    /// RDMA READ response data.
    ReadResponse,
    /// Atomic compare and swap.
    CompareSwap,
    /// Atomic fetch and add.
    FetchAdd,
    /// ACK or NAK.
    Acknowledge,
    /// Atomic acknowledgement carrying the original value.
    AtomicAcknowledge,
    /// FLUSH (memory placement extensions).
    Flush,
    /// ATOMIC WRITE (memory placement extensions).
    AtomicWrite,
    /// RoCEv2 congestion notification.
    Cnp,
}

impl Operation {
    /// Whether this is a remote atomic (compare and swap, fetch and add).
    pub const fn is_atomic(self) -> bool {
        matches!(self, Operation::CompareSwap | Operation::FetchAdd)
    }
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

    /// The place of packet `index` (from 0) in a message of `count` packets.
    #[inline]
    pub const fn of(index: u32, count: u32) -> Position {
        if count <= 1 {
            Position::Only
        } else if index == 0 {
            Position::First
        } else if index + 1 >= count {
            Position::Last
        } else {
            Position::Middle
        }
    }
}

/// Everything an opcode tells a parser and a state machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpcodeInfo {
    /// Extension headers that follow the BTH, in wire order.
    pub headers: &'static [ExtHeader],
    /// What the packet does.
    pub operation: Operation,
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
    ($($(#[$doc:meta])* $name:ident = $value:literal, $text:literal, $operation:ident,
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
                        operation: Operation::Cnp,
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
                            operation: Operation::$operation,
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
    RcSendFirst = 0x00, "RC_SEND_FIRST", Send, [], true, First, true;
    /// RC SEND, middle packet.
    RcSendMiddle = 0x01, "RC_SEND_MIDDLE", Send, [], true, Middle, true;
    /// RC SEND, last packet.
    RcSendLast = 0x02, "RC_SEND_LAST", Send, [], true, Last, true;
    /// RC SEND, last packet, with immediate data.
    RcSendLastWithImmediate = 0x03, "RC_SEND_LAST_WITH_IMMEDIATE", Send, [ImmDt], true, Last, true;
    /// RC SEND in one packet.
    RcSendOnly = 0x04, "RC_SEND_ONLY", Send, [], true, Only, true;
    /// RC SEND in one packet, with immediate data.
    RcSendOnlyWithImmediate = 0x05, "RC_SEND_ONLY_WITH_IMMEDIATE", Send, [ImmDt], true, Only, true;
    /// RC RDMA WRITE, first packet.
    RcRdmaWriteFirst = 0x06, "RC_RDMA_WRITE_FIRST", Write, [Reth], true, First, true;
    /// RC RDMA WRITE, middle packet.
    RcRdmaWriteMiddle = 0x07, "RC_RDMA_WRITE_MIDDLE", Write, [], true, Middle, true;
    /// RC RDMA WRITE, last packet.
    RcRdmaWriteLast = 0x08, "RC_RDMA_WRITE_LAST", Write, [], true, Last, true;
    /// RC RDMA WRITE, last packet, with immediate data.
    RcRdmaWriteLastWithImmediate = 0x09, "RC_RDMA_WRITE_LAST_WITH_IMMEDIATE", Write, [ImmDt], true, Last, true;
    /// RC RDMA WRITE in one packet.
    RcRdmaWriteOnly = 0x0A, "RC_RDMA_WRITE_ONLY", Write, [Reth], true, Only, true;
    /// RC RDMA WRITE in one packet, with immediate data.
    RcRdmaWriteOnlyWithImmediate = 0x0B, "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", Write, [Reth, ImmDt], true, Only, true;
    /// RC RDMA READ request.
    RcRdmaReadRequest = 0x0C, "RC_RDMA_READ_REQUEST", ReadRequest, [Reth], true, Only, false;
    /// RC RDMA READ response, first packet.
    RcRdmaReadResponseFirst = 0x0D, "RC_RDMA_READ_RESPONSE_FIRST", ReadResponse, [Aeth], false, First, true;
    /// RC RDMA READ response, middle packet.
    RcRdmaReadResponseMiddle = 0x0E, "RC_RDMA_READ_RESPONSE_MIDDLE", ReadResponse, [], false, Middle, true;
    /// RC RDMA READ response, last packet.
    RcRdmaReadResponseLast = 0x0F, "RC_RDMA_READ_RESPONSE_LAST", ReadResponse, [Aeth], false, Last, true;
    /// RC RDMA READ response in one packet.
    RcRdmaReadResponseOnly = 0x10, "RC_RDMA_READ_RESPONSE_ONLY", ReadResponse, [Aeth], false, Only, true;
    /// RC ACK or NAK.
    RcAcknowledge = 0x11, "RC_ACKNOWLEDGE", Acknowledge, [Aeth], false, Only, false;
    /// RC atomic acknowledgement carrying the original value.
    RcAtomicAcknowledge = 0x12, "RC_ATOMIC_ACKNOWLEDGE", AtomicAcknowledge, [Aeth, AtomicAckEth], false, Only, false;
    /// RC atomic compare and swap.
    RcCompareSwap = 0x13, "RC_COMPARE_SWAP", CompareSwap, [AtomicEth], true, Only, false;
    /// RC atomic fetch and add.
    RcFetchAdd = 0x14, "RC_FETCH_ADD", FetchAdd, [AtomicEth], true, Only, false;
    /// RC SEND, last packet, invalidating an R_Key.
    RcSendLastWithInvalidate = 0x16, "RC_SEND_LAST_WITH_INVALIDATE", Send, [Ieth], true, Last, true;
    /// RC SEND in one packet, invalidating an R_Key.
    RcSendOnlyWithInvalidate = 0x17, "RC_SEND_ONLY_WITH_INVALIDATE", Send, [Ieth], true, Only, true;
    /// RC FLUSH (memory placement extensions).
    RcFlush = 0x1C, "RC_FLUSH", Flush, [Feth, Reth], true, Only, false;
    /// RC ATOMIC WRITE: an 8-byte payload written atomically.
    RcAtomicWrite = 0x1D, "RC_ATOMIC_WRITE", AtomicWrite, [Reth], true, Only, true;
    /// UC SEND, first packet.
    UcSendFirst = 0x20, "UC_SEND_FIRST", Send, [], true, First, true;
    /// UC SEND, middle packet.
    UcSendMiddle = 0x21, "UC_SEND_MIDDLE", Send, [], true, Middle, true;
    /// UC SEND, last packet.
    UcSendLast = 0x22, "UC_SEND_LAST", Send, [], true, Last, true;
    /// UC SEND, last packet, with immediate data.
    UcSendLastWithImmediate = 0x23, "UC_SEND_LAST_WITH_IMMEDIATE", Send, [ImmDt], true, Last, true;
    /// UC SEND in one packet.
    UcSendOnly = 0x24, "UC_SEND_ONLY", Send, [], true, Only, true;
    /// UC SEND in one packet, with immediate data.
    UcSendOnlyWithImmediate = 0x25, "UC_SEND_ONLY_WITH_IMMEDIATE", Send, [ImmDt], true, Only, true;
    /// UC RDMA WRITE, first packet.
    UcRdmaWriteFirst = 0x26, "UC_RDMA_WRITE_FIRST", Write, [Reth], true, First, true;
    /// UC RDMA WRITE, middle packet.
    UcRdmaWriteMiddle = 0x27, "UC_RDMA_WRITE_MIDDLE", Write, [], true, Middle, true;
    /// UC RDMA WRITE, last packet.
    UcRdmaWriteLast = 0x28, "UC_RDMA_WRITE_LAST", Write, [], true, Last, true;
    /// UC RDMA WRITE, last packet, with immediate data.
    UcRdmaWriteLastWithImmediate = 0x29, "UC_RDMA_WRITE_LAST_WITH_IMMEDIATE", Write, [ImmDt], true, Last, true;
    /// UC RDMA WRITE in one packet.
    UcRdmaWriteOnly = 0x2A, "UC_RDMA_WRITE_ONLY", Write, [Reth], true, Only, true;
    /// UC RDMA WRITE in one packet, with immediate data.
    UcRdmaWriteOnlyWithImmediate = 0x2B, "UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", Write, [Reth, ImmDt], true, Only, true;
    /// UD SEND (always one packet).
    UdSendOnly = 0x64, "UD_SEND_ONLY", Send, [Deth], true, Only, true;
    /// UD SEND with immediate data.
    UdSendOnlyWithImmediate = 0x65, "UD_SEND_ONLY_WITH_IMMEDIATE", Send, [Deth, ImmDt], true, Only, true;
    /// RoCEv2 congestion notification packet.
    Cnp = 0x81, "CNP", Cnp, [Cnp], false, Only, false;
    /// XRC SEND, first packet.
    XrcSendFirst = 0xA0, "XRC_SEND_FIRST", Send, [XrcEth], true, First, true;
    /// XRC SEND, middle packet.
    XrcSendMiddle = 0xA1, "XRC_SEND_MIDDLE", Send, [XrcEth], true, Middle, true;
    /// XRC SEND, last packet.
    XrcSendLast = 0xA2, "XRC_SEND_LAST", Send, [XrcEth], true, Last, true;
    /// XRC SEND, last packet, with immediate data.
    XrcSendLastWithImmediate = 0xA3, "XRC_SEND_LAST_WITH_IMMEDIATE", Send, [XrcEth, ImmDt], true, Last, true;
    /// XRC SEND in one packet.
    XrcSendOnly = 0xA4, "XRC_SEND_ONLY", Send, [XrcEth], true, Only, true;
    /// XRC SEND in one packet, with immediate data.
    XrcSendOnlyWithImmediate = 0xA5, "XRC_SEND_ONLY_WITH_IMMEDIATE", Send, [XrcEth, ImmDt], true, Only, true;
    /// XRC RDMA WRITE, first packet.
    XrcRdmaWriteFirst = 0xA6, "XRC_RDMA_WRITE_FIRST", Write, [XrcEth, Reth], true, First, true;
    /// XRC RDMA WRITE, middle packet.
    XrcRdmaWriteMiddle = 0xA7, "XRC_RDMA_WRITE_MIDDLE", Write, [XrcEth], true, Middle, true;
    /// XRC RDMA WRITE, last packet.
    XrcRdmaWriteLast = 0xA8, "XRC_RDMA_WRITE_LAST", Write, [XrcEth], true, Last, true;
    /// XRC RDMA WRITE, last packet, with immediate data.
    XrcRdmaWriteLastWithImmediate = 0xA9, "XRC_RDMA_WRITE_LAST_WITH_IMMEDIATE", Write, [XrcEth, ImmDt], true, Last, true;
    /// XRC RDMA WRITE in one packet.
    XrcRdmaWriteOnly = 0xAA, "XRC_RDMA_WRITE_ONLY", Write, [XrcEth, Reth], true, Only, true;
    /// XRC RDMA WRITE in one packet, with immediate data.
    XrcRdmaWriteOnlyWithImmediate = 0xAB, "XRC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", Write, [XrcEth, Reth, ImmDt], true, Only, true;
    /// XRC RDMA READ request.
    XrcRdmaReadRequest = 0xAC, "XRC_RDMA_READ_REQUEST", ReadRequest, [XrcEth, Reth], true, Only, false;
    /// XRC RDMA READ response, first packet.
    XrcRdmaReadResponseFirst = 0xAD, "XRC_RDMA_READ_RESPONSE_FIRST", ReadResponse, [Aeth], false, First, true;
    /// XRC RDMA READ response, middle packet.
    XrcRdmaReadResponseMiddle = 0xAE, "XRC_RDMA_READ_RESPONSE_MIDDLE", ReadResponse, [], false, Middle, true;
    /// XRC RDMA READ response, last packet.
    XrcRdmaReadResponseLast = 0xAF, "XRC_RDMA_READ_RESPONSE_LAST", ReadResponse, [Aeth], false, Last, true;
    /// XRC RDMA READ response in one packet.
    XrcRdmaReadResponseOnly = 0xB0, "XRC_RDMA_READ_RESPONSE_ONLY", ReadResponse, [Aeth], false, Only, true;
    /// XRC ACK or NAK.
    XrcAcknowledge = 0xB1, "XRC_ACKNOWLEDGE", Acknowledge, [Aeth], false, Only, false;
    /// XRC atomic acknowledgement carrying the original value.
    XrcAtomicAcknowledge = 0xB2, "XRC_ATOMIC_ACKNOWLEDGE", AtomicAcknowledge, [Aeth, AtomicAckEth], false, Only, false;
    /// XRC atomic compare and swap.
    XrcCompareSwap = 0xB3, "XRC_COMPARE_SWAP", CompareSwap, [XrcEth, AtomicEth], true, Only, false;
    /// XRC atomic fetch and add.
    XrcFetchAdd = 0xB4, "XRC_FETCH_ADD", FetchAdd, [XrcEth, AtomicEth], true, Only, false;
    /// XRC SEND, last packet, invalidating an R_Key.
    XrcSendLastWithInvalidate = 0xB6, "XRC_SEND_LAST_WITH_INVALIDATE", Send, [XrcEth, Ieth], true, Last, true;
    /// XRC SEND in one packet, invalidating an R_Key.
    XrcSendOnlyWithInvalidate = 0xB7, "XRC_SEND_ONLY_WITH_INVALIDATE", Send, [XrcEth, Ieth], true, Only, true;
}

/// What ends a message besides its payload: nothing, immediate data or an R_Key to
/// invalidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Trailer {
    /// No ImmDt or IETH.
    None,
    /// An ImmDt header.
    Immediate,
    /// An IETH header.
    Invalidate,
}

/// Slots of the reverse table, one per (service, operation, position, trailer).
const SERVICES: usize = 5;
const OPERATIONS: usize = Operation::Cnp as usize + 1;
const POSITIONS: usize = 4;
const TRAILERS: usize = 3;

#[inline]
const fn find_slot(
    service: Service,
    operation: Operation,
    position: Position,
    trailer: Trailer,
) -> usize {
    ((service as usize * OPERATIONS + operation as usize) * POSITIONS + position as usize)
        * TRAILERS
        + trailer as usize
}

impl Opcode {
    /// The transport service, from the opcode's top bits.
    pub const fn service(self) -> Service {
        match self as u8 >> 5 {
            0 => Service::Rc,
            1 => Service::Uc,
            3 => Service::Ud,
            5 => Service::Xrc,
            _ => Service::Cnp,
        }
    }

    /// What ends this opcode's message besides the payload.
    #[inline]
    pub const fn trailer(self) -> Trailer {
        let info = self.info();
        if info.has_immediate {
            Trailer::Immediate
        } else if info.has_invalidate {
            Trailer::Invalidate
        } else {
            Trailer::None
        }
    }

    /// The opcode of a packet of `operation` on `service` at `position` in its message,
    /// ending with `trailer`; `None` if the spec has no such packet (a READ on UC, a SEND
    /// with invalidate that is not its message's last packet, ...). The inverse of
    /// [`info`](Self::info), [`service`](Self::service) and [`trailer`](Self::trailer).
    #[inline]
    pub const fn find(
        service: Service,
        operation: Operation,
        position: Position,
        trailer: Trailer,
    ) -> Option<Opcode> {
        // Built from the same rows as `info`, so the two cannot disagree.
        const TABLE: [Option<Opcode>; SERVICES * OPERATIONS * POSITIONS * TRAILERS] = {
            let mut table = [None; SERVICES * OPERATIONS * POSITIONS * TRAILERS];
            let mut i = 0;
            while i < Opcode::ALL.len() {
                let opcode = Opcode::ALL[i];
                let info = opcode.info();
                let slot = find_slot(
                    opcode.service(),
                    info.operation,
                    info.position,
                    opcode.trailer(),
                );
                table[slot] = Some(opcode);
                i += 1;
            }
            table
        };
        TABLE[find_slot(service, operation, position, trailer)]
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
        assert_eq!(known, 63);
    }

    #[test]
    fn reserved_and_rd_opcodes_are_rejected() {
        for value in [
            0x15, 0x18, 0x1E, 0x1F, 0x2C, 0x40, 0x4A, 0x60, 0x66, 0x80, 0xB5, 0xB8, 0xFF,
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
                Service::Xrc => "XRC_",
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
    fn find_inverts_info() {
        let mut found = 0;
        for service in [
            Service::Rc,
            Service::Uc,
            Service::Ud,
            Service::Cnp,
            Service::Xrc,
        ] {
            for operation in [
                Operation::Send,
                Operation::Write,
                Operation::ReadRequest,
                Operation::ReadResponse,
                Operation::CompareSwap,
                Operation::FetchAdd,
                Operation::Acknowledge,
                Operation::AtomicAcknowledge,
                Operation::Flush,
                Operation::AtomicWrite,
                Operation::Cnp,
            ] {
                for position in [
                    Position::First,
                    Position::Middle,
                    Position::Last,
                    Position::Only,
                ] {
                    for trailer in [Trailer::None, Trailer::Immediate, Trailer::Invalidate] {
                        let Some(opcode) = Opcode::find(service, operation, position, trailer)
                        else {
                            continue;
                        };
                        found += 1;
                        let info = opcode.info();
                        assert_eq!(opcode.service(), service, "{opcode}");
                        assert_eq!(info.operation, operation, "{opcode}");
                        assert_eq!(info.position, position, "{opcode}");
                        assert_eq!(opcode.trailer(), trailer, "{opcode}");
                    }
                }
            }
        }
        assert_eq!(found, Opcode::ALL.len());
    }

    #[test]
    fn operation_is_consistent_with_names() {
        for opcode in Opcode::ALL {
            let name = opcode.name();
            let operation = opcode.info().operation;
            let expected = if name.contains("READ_REQUEST") {
                Operation::ReadRequest
            } else if name.contains("READ_RESPONSE") {
                Operation::ReadResponse
            } else if name.contains("ATOMIC_ACKNOWLEDGE") {
                Operation::AtomicAcknowledge
            } else if name.contains("ACKNOWLEDGE") {
                Operation::Acknowledge
            } else if name.contains("ATOMIC_WRITE") {
                Operation::AtomicWrite
            } else if name.contains("RDMA_WRITE") {
                Operation::Write
            } else if name.contains("SEND") {
                Operation::Send
            } else if name.contains("COMPARE_SWAP") {
                Operation::CompareSwap
            } else if name.contains("FETCH_ADD") {
                Operation::FetchAdd
            } else if name.contains("FLUSH") {
                Operation::Flush
            } else {
                Operation::Cnp
            };
            assert_eq!(operation, expected, "{name}");
            assert_eq!(
                opcode.info().is_request,
                operation_is_request(operation),
                "{name}"
            );
        }
    }

    fn operation_is_request(operation: Operation) -> bool {
        !matches!(
            operation,
            Operation::ReadResponse
                | Operation::Acknowledge
                | Operation::AtomicAcknowledge
                | Operation::Cnp
        )
    }

    #[test]
    fn position_of_each_packet() {
        assert_eq!(Position::of(0, 0), Position::Only);
        assert_eq!(Position::of(0, 1), Position::Only);
        assert_eq!(Position::of(0, 2), Position::First);
        assert_eq!(Position::of(1, 2), Position::Last);
        assert_eq!(Position::of(0, 3), Position::First);
        assert_eq!(Position::of(1, 3), Position::Middle);
        assert_eq!(Position::of(2, 3), Position::Last);
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
        assert_eq!(Opcode::XrcSendMiddle.info().ext_len(), 4);
        assert_eq!(Opcode::XrcRdmaWriteOnlyWithImmediate.info().ext_len(), 24);
        assert_eq!(Opcode::XrcCompareSwap.info().ext_len(), 32);
        assert_eq!(Opcode::XrcAcknowledge.info().ext_len(), 4);
    }

    /// Every XRC request carries the XRCETH first; XRC responses carry none, and otherwise
    /// each XRC opcode has its RC twin's headers, 0xA0 above it.
    #[test]
    fn xrc_opcodes_are_rc_with_an_xrceth() {
        let mut xrc = 0;
        for &opcode in Opcode::ALL {
            if opcode.service() != Service::Xrc {
                continue;
            }
            xrc += 1;
            let info = opcode.info();
            let rc = Opcode::try_from(opcode as u8 - 0xA0).expect("an RC twin");
            assert_eq!(opcode.name()[4..], rc.name()[3..], "{opcode}");
            let rest = if info.is_request {
                assert_eq!(info.headers.first(), Some(&ExtHeader::XrcEth), "{opcode}");
                &info.headers[1..]
            } else {
                info.headers
            };
            assert_eq!(rest, rc.info().headers, "{opcode}");
            assert_eq!(
                (info.operation, info.position, info.has_payload),
                (
                    rc.info().operation,
                    rc.info().position,
                    rc.info().has_payload
                )
            );
        }
        assert_eq!(xrc, 23);
    }
}

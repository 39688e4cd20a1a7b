//! Proves each header `Repr` survives parse → emit → parse, and emit keeps every bit it holds.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roce_wire::{
    aeth, atomic_ack_eth, atomic_eth, bth, cnp, deth, feth, ieth, immdt, reth, xrceth, ExtHeader,
    ExtRepr, Opcode,
};
use roce_wire_fuzz::{assert_same_bits, ext_reserved, BTH_RESERVED};

/// Parses `$bytes` as header `$module`, emits it into a fresh buffer and checks the result.
macro_rules! round_trip {
    ($module:ident, $bytes:expr, $reserved:expr) => {{
        let bytes = $bytes;
        let Ok(packet) = $module::Packet::new_checked(bytes) else {
            return;
        };
        let Ok(repr) = $module::Repr::parse(&packet) else {
            return;
        };
        let mut out = [0xA5; $module::HEADER_LEN];
        repr.emit(&mut $module::Packet::new_unchecked(&mut out[..]));
        let again = $module::Repr::parse(&$module::Packet::new_checked(&out[..]).unwrap());
        assert_eq!(again, Ok(repr));
        assert_same_bits(bytes, &out, $reserved);
    }};
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    match selector % 12 {
        0 => round_trip!(bth, rest, &BTH_RESERVED),
        1 => round_trip!(reth, rest, ext_reserved(ExtHeader::Reth)),
        2 => round_trip!(aeth, rest, ext_reserved(ExtHeader::Aeth)),
        3 => round_trip!(deth, rest, ext_reserved(ExtHeader::Deth)),
        4 => round_trip!(immdt, rest, ext_reserved(ExtHeader::ImmDt)),
        5 => round_trip!(ieth, rest, ext_reserved(ExtHeader::Ieth)),
        6 => round_trip!(atomic_eth, rest, ext_reserved(ExtHeader::AtomicEth)),
        7 => round_trip!(atomic_ack_eth, rest, ext_reserved(ExtHeader::AtomicAckEth)),
        8 => round_trip!(feth, rest, ext_reserved(ExtHeader::Feth)),
        9 => round_trip!(cnp, rest, ext_reserved(ExtHeader::Cnp)),
        10 => round_trip!(xrceth, rest, ext_reserved(ExtHeader::XrcEth)),
        _ => ext_round_trip(rest),
    }
});

/// The same for `ExtRepr`, with the opcode taken from the first byte.
fn ext_round_trip(data: &[u8]) {
    let Some((&opcode, bytes)) = data.split_first() else {
        return;
    };
    let Ok(opcode) = Opcode::try_from(opcode) else {
        return;
    };
    let Ok(ext) = ExtRepr::parse(opcode, bytes) else {
        return;
    };
    assert!(ext.matches(opcode));
    let len = ExtRepr::buffer_len(opcode);
    let mut out = vec![0xA5; len];
    assert_eq!(ext.emit(opcode, &mut out), Ok(len));
    assert_eq!(ExtRepr::parse(opcode, &out), Ok(ext));
    let reserved: Vec<u8> = opcode
        .info()
        .headers
        .iter()
        .flat_map(|&header| ext_reserved(header).iter().copied())
        .collect();
    assert_same_bits(bytes, &out, &reserved);
}

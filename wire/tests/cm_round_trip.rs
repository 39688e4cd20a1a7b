//! Parse → emit → parse is the identity for every CM message and the rdma_cm header, and no
//! bytes make a parser panic.

use proptest::prelude::*;
use roce_wire::cm::{self, attribute, cma};
use roce_wire::mad;

const ATTRIBUTES: [u16; 9] = [
    attribute::REQ,
    attribute::MRA,
    attribute::REJ,
    attribute::REP,
    attribute::RTU,
    attribute::DREQ,
    attribute::DREP,
    attribute::SIDR_REQ,
    attribute::SIDR_REP,
];

/// A MAD with a valid CM header, one of the nine attributes and arbitrary message bytes.
fn cm_mad() -> impl Strategy<Value = Vec<u8>> {
    (
        prop::sample::select(&ATTRIBUTES[..]),
        any::<u64>(),
        prop::collection::vec(any::<u8>(), mad::DATA_LEN),
    )
        .prop_map(|(attribute_id, transaction_id, data)| {
            let mut bytes = vec![0; mad::MAD_LEN];
            let mut packet = mad::Packet::new_unchecked(&mut bytes[..]);
            mad::Repr {
                base_version: mad::BASE_VERSION,
                mgmt_class: cm::MGMT_CLASS,
                class_version: cm::CLASS_VERSION,
                method: mad::METHOD_SEND,
                status: 0,
                class_specific: 0,
                transaction_id,
                attribute_id,
                attribute_modifier: 0,
            }
            .emit(&mut packet);
            packet.data_mut().copy_from_slice(&data);
            bytes
        })
}

fn parse(bytes: &[u8]) -> Result<cm::Repr, roce_wire::Error> {
    cm::Repr::parse(&mad::Packet::new_checked(bytes)?)
}

proptest! {
    #[test]
    fn cm_parse_emit_parse_is_identity(bytes in cm_mad()) {
        if let Ok(repr) = parse(&bytes) {
            prop_assert_eq!(repr.message.attribute_id(), mad::Packet::new_unchecked(&bytes[..]).attribute_id());
            let mut emitted = vec![0xA5; repr.buffer_len()];
            repr.emit(&mut mad::Packet::new_unchecked(&mut emitted[..]));
            prop_assert_eq!(parse(&emitted), Ok(repr));
            let mut again = vec![0x5A; repr.buffer_len()];
            repr.emit(&mut mad::Packet::new_unchecked(&mut again[..]));
            prop_assert_eq!(again, emitted);
        }
    }

    #[test]
    fn cm_parse_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        // Any outcome is fine; a panic fails the test.
        let _ = parse(&bytes);
    }

    #[test]
    fn cma_header_parse_emit_parse_is_identity(bytes in prop::collection::vec(any::<u8>(), cma::HEADER_LEN)) {
        let mut bytes = bytes;
        bytes[0] = cma::CMA_VERSION;
        bytes[1] = if bytes[1] & 1 == 0 { 0x40 } else { 0x60 };
        let repr = cma::Repr::parse(&cma::Packet::new_checked(&bytes[..]).unwrap()).unwrap();
        let mut emitted = [0xA5; cma::HEADER_LEN];
        repr.emit(&mut cma::Packet::new_unchecked(&mut emitted[..]));
        prop_assert_eq!(cma::Repr::parse(&cma::Packet::new_checked(&emitted[..]).unwrap()), Ok(repr));
    }
}

/// Most random message bytes must parse, or the identity test above would prove little.
#[test]
fn random_messages_mostly_parse() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let strategy = cm_mad();
    let parsed = (0..900)
        .filter(|_| parse(&strategy.new_tree(&mut runner).unwrap().current()).is_ok())
        .count();
    assert!(parsed > 600, "only {parsed} of 900 parsed");
}

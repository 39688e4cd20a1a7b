//! Proves the CM MAD parsers never panic and that parse → emit → parse is the identity for
//! every CM message and for the rdma_cm header inside a REQ's or SIDR_REQ's private data.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roce_wire::cm::{self, cma, Message};
use roce_wire::mad;

fuzz_target!(|data: &[u8]| {
    let Ok(packet) = mad::Packet::new_checked(data) else {
        return;
    };
    let Ok(repr) = cm::Repr::parse(&packet) else {
        return;
    };
    let mut out = [0xA5; mad::MAD_LEN];
    repr.emit(&mut mad::Packet::new_unchecked(&mut out[..]));
    let again = cm::Repr::parse(&mad::Packet::new_checked(&out[..]).unwrap());
    assert_eq!(again, Ok(repr));

    let private_data: &[u8] = match &repr.message {
        Message::Req(req) => &req.private_data,
        Message::SidrReq(sidr) => &sidr.private_data,
        _ => return,
    };
    let Ok(header) = cma::Repr::parse(&cma::Packet::new_checked(private_data).unwrap()) else {
        return;
    };
    let mut out = [0xA5; cma::HEADER_LEN];
    header.emit(&mut cma::Packet::new_unchecked(&mut out[..]));
    assert_eq!(
        cma::Repr::parse(&cma::Packet::new_checked(&out[..]).unwrap()),
        Ok(header)
    );
});

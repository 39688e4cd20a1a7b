//! The InfiniBand transport (requester, responder, completer for RC, UC and UD) as a sans-IO
//! state machine, driven by `handle_packet`, `handle_timeout` and posted work requests.
//!
//! Nothing is implemented yet: this crate is an empty placeholder for issue #3, so that the
//! workspace already has the shape the design describes.
#![no_std]
#![deny(unsafe_code)]

//! The user-facing verbs API, with rdma-core's names where they fit.
//!
//! Nothing is implemented yet: this crate is an empty placeholder for issue #4.
#![deny(unsafe_code)]

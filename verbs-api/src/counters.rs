//! The device's counters, with the names and meanings of rxe's `hw_counters`.

use roce_transport::Counters;

use crate::context::Context;
use crate::error::Error;

impl Context {
    /// A snapshot of the device's counters (`sent_pkts`, `rcvd_pkts`, `duplicate_request`,
    /// ...) as Linux rxe counts them; [`Counters::iter`] gives them as name/value pairs in
    /// rxe's order.
    pub fn counters(&self) -> Result<Counters, Error> {
        Ok(self.shared().lock()?.engine.endpoint().counters())
    }
}

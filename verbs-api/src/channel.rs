//! Completion channels (`ibv_comp_channel`).
//!
//! A [`CompChannel`] is an eventfd: epoll it, or block in
//! [`get_cq_event`](CompChannel::get_cq_event). As with `ibv_req_notify_cq`, a CQ signals
//! its channel once per arming, for the first matching completion after it.

use std::fmt;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;
use std::time::Duration;

use roce_transport::CqId;

use crate::error::Error;
use crate::queues::ChannelEvents;
use crate::shared::Shared;
use crate::wait;

/// A completion channel (`ibv_comp_channel`).
pub struct CompChannel {
    pub(crate) shared: Arc<Shared>,
    pub(crate) events: Arc<ChannelEvents>,
}

impl CompChannel {
    pub(crate) fn new(shared: &Arc<Shared>) -> Result<CompChannel, Error> {
        Ok(CompChannel {
            shared: Arc::clone(shared),
            events: Arc::new(ChannelEvents::new()?),
        })
    }

    /// Waits for a CQ of this channel to signal (`ibv_get_cq_event`) and says which
    /// ([`Cq::id`](crate::Cq::id)). `None` waits for ever; a timeout gives
    /// [`Error::TimedOut`].
    pub fn get_cq_event(&self, timeout: Option<Duration>) -> Result<CqId, Error> {
        wait::next_event(&self.shared, &self.events, timeout)
    }

    /// `ibv_destroy_comp_channel`: destroys the channel now, or gives it back with
    /// [`Error::Busy`] while a CQ still reports to it.
    pub fn destroy(self) -> Result<(), (CompChannel, Error)> {
        // The CQs' handles and the engine's map hold the others.
        if Arc::strong_count(&self.events) > 1 {
            return Err((self, Error::Busy("completion channel")));
        }
        Ok(())
    }
}

impl fmt::Debug for CompChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompChannel").finish_non_exhaustive()
    }
}

impl AsFd for CompChannel {
    /// Readable while events wait to be taken with [`get_cq_event`](Self::get_cq_event).
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.events.as_fd()
    }
}

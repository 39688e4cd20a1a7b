//! A device's async events, heard by every context of it: the contexts of one device in a
//! process share one engine (see `context`), and each has its own queue and fd, as each
//! `ibv_context` of a kernel device has its own `async_fd`. The engine pushes every event to
//! every queue; a C face keeps those of its own objects.

use std::sync::{Arc, Mutex, Weak};

use roce_transport::endpoint::AsyncEvent;

use crate::queues::EventQueue;

/// The queues of the contexts open on one engine.
#[derive(Default)]
pub(crate) struct AsyncEvents {
    queues: Mutex<Vec<Weak<EventQueue<AsyncEvent>>>>,
}

impl AsyncEvents {
    /// Makes `queue` hear every later event, until it is dropped.
    pub(crate) fn subscribe(&self, queue: &Arc<EventQueue<AsyncEvent>>) {
        if let Ok(mut queues) = self.queues.lock() {
            queues.retain(|queue| queue.strong_count() > 0);
            queues.push(Arc::downgrade(queue));
        }
    }

    /// Queues `event` for every context still open.
    pub(crate) fn push(&self, event: AsyncEvent) {
        if let Ok(queues) = self.queues.lock() {
            for queue in queues.iter().filter_map(Weak::upgrade) {
                queue.push(event);
            }
        }
    }
}

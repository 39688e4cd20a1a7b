//! XRC domains (`ibv_open_xrcd`, IBTA Annex A14): what XRC SRQs and XRC target QPs belong
//! to. A target QP takes each request into the XRC SRQ its XRCETH names, and only an SRQ of
//! the target's own domain is ever named successfully; the SRQ gives the PD that checks the
//! request's keys and the CQ its receive completes in.

use std::collections::HashSet;

use crate::errno;

/// An XRC domain of an [`Endpoint`](crate::Endpoint).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct XrcdId(u32);

/// Why an XRC domain call was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum XrcError {
    /// No such XRC domain (or it was closed).
    #[error("unknown XRC domain")]
    UnknownXrcd,
    /// An XRC SRQ or target QP still belongs to it.
    #[error("XRC domain still has SRQs or target QPs")]
    Busy,
}

impl XrcError {
    /// The errno the verbs call fails with (`ibv_close_xrcd`: `EBUSY` while in use).
    pub fn errno(&self) -> i32 {
        match self {
            XrcError::UnknownXrcd => errno::EINVAL,
            XrcError::Busy => errno::EBUSY,
        }
    }
}

/// The domains alive; an id is never reused.
#[derive(Debug, Default)]
pub(crate) struct XrcdTable {
    next: u32,
    live: HashSet<u32>,
}

impl XrcdTable {
    pub fn alloc(&mut self) -> XrcdId {
        let id = self.next;
        self.next += 1;
        self.live.insert(id);
        XrcdId(id)
    }

    pub fn exists(&self, id: XrcdId) -> bool {
        self.live.contains(&id.0)
    }

    pub fn remove(&mut self, id: XrcdId) -> Result<(), XrcError> {
        if self.live.remove(&id.0) {
            Ok(())
        } else {
            Err(XrcError::UnknownXrcd)
        }
    }
}

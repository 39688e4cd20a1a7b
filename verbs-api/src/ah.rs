//! Address handles (`ibv_ah`): where a UD send goes.

use roce_transport::qp_state::AddressVector;
use roce_transport::wr::UdDest;

use crate::error::Error;
use crate::mr::Pd;

/// An address handle for UD sends (`ibv_ah`): where to, with the neighbour resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddressHandle {
    av: AddressVector,
}

impl AddressHandle {
    /// The destination of a UD send to `remote_qpn` with `remote_qkey`.
    pub fn dest(&self, remote_qpn: u32, remote_qkey: u32) -> UdDest {
        UdDest {
            av: self.av,
            remote_qpn,
            remote_qkey,
        }
    }

    /// The address vector.
    pub fn av(&self) -> AddressVector {
        self.av
    }
}

impl Pd {
    /// Creates an address handle (`ibv_create_ah`), resolving the neighbour's MAC first.
    pub fn create_ah(&self, av: AddressVector) -> Result<AddressHandle, Error> {
        self.inner.shared.check_path(av.sgid_index, av.dgid)?;
        self.inner.shared.resolve(av.dgid)?;
        Ok(AddressHandle { av })
    }
}

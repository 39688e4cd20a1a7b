//! The UMEM of one AF_XDP socket: memory the kernel and we take turns on, buffer by buffer.
//!
//! Whose turn it is lives in the types: an [`RxBuffer`] or [`TxSlot`] value is our turn on
//! its bytes, and only such a value opens them ([`Umem::frame`], [`Umem::slot_mut`]). Handing
//! one to the kernel (the fill or TX ring) consumes it; the kernel's answer (the RX or
//! completion ring) is the only way to get it back ([`Umem::received`], [`Umem::completed`],
//! the one `unsafe` step). So safe code never reaches bytes the kernel may be writing.
//!
//! The area is registered in unaligned-chunk mode so that receive buffers can overlap: copy
//! mode writes a frame at the buffer's address plus 256 bytes of headroom, at most 3840 bytes
//! per buffer, and continues a longer frame (multi-buffer) in the next buffer of the fill ring.
//! Buffers spaced 3840 bytes apart therefore receive into back-to-back bytes, and a frame of
//! two descriptors lies in one piece where it can be parsed in place. The kernel never writes
//! a buffer's headroom (our program adds no metadata), which is the part that overlaps the
//! previous buffer.

use std::alloc::{self, Layout};
use std::io;
use std::ptr::NonNull;

use xdpilone::xdp::XdpDesc;

/// Bytes the kernel reserves in front of each received frame in copy mode
/// (`XDP_PACKET_HEADROOM`).
pub(crate) const RX_HEADROOM: u64 = 256;
/// The chunk size registered with the kernel: a page (larger needs hugepages).
pub(crate) const CHUNK_SIZE: u32 = 4096;
/// Received bytes per buffer, and the distance between buffers.
pub(crate) const RX_STRIDE: u64 = CHUNK_SIZE as u64 - RX_HEADROOM;
/// A transmit slot: two chunks, enough for any frame we send.
pub(crate) const TX_SLOT: u64 = 2 * CHUNK_SIZE as u64;
/// Descriptor option: more of this frame follows in the next descriptor.
pub(crate) const XDP_PKT_CONTD: u32 = 1;
/// Descriptor addresses in unaligned mode carry an offset in their top 16 bits.
const ADDRESS_BITS: u32 = 48;

/// Our turn on receive buffer `index` (its 3840 data bytes).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct RxBuffer(u32);

/// Our turn on transmit slot `index`.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct TxSlot(u32);

/// Page-aligned memory shared with the kernel: `rx_buffers` receive buffers, then
/// `tx_slots` transmit slots.
pub(crate) struct Umem {
    memory: NonNull<u8>,
    layout: Layout,
    rx_buffers: u32,
    tx_slots: u32,
    /// Where the transmit slots start (page-aligned).
    tx_base: u64,
}

impl Umem {
    /// Allocates the area, zeroed, and hands out every buffer and slot (the only time any
    /// is created without the kernel giving it back).
    pub(crate) fn new(
        rx_buffers: u32,
        tx_slots: u32,
    ) -> io::Result<(Umem, Vec<RxBuffer>, Vec<TxSlot>)> {
        let rx_end = u64::from(rx_buffers) * RX_STRIDE + RX_HEADROOM;
        let tx_base = rx_end.next_multiple_of(u64::from(CHUNK_SIZE));
        let len = tx_base + u64::from(tx_slots) * TX_SLOT;
        let len = usize::try_from(len).map_err(io::Error::other)?;
        let layout = Layout::from_size_align(len, CHUNK_SIZE as usize).map_err(io::Error::other)?;
        // SAFETY: the layout has a non-zero size (at least the headroom).
        #[allow(unsafe_code)]
        let memory = unsafe { alloc::alloc_zeroed(layout) };
        let memory = NonNull::new(memory).ok_or_else(|| io::Error::other("out of memory"))?;
        let umem = Umem {
            memory,
            layout,
            rx_buffers,
            tx_slots,
            tx_base,
        };
        Ok((
            umem,
            (0..rx_buffers).map(RxBuffer).collect(),
            (0..tx_slots).map(TxSlot).collect(),
        ))
    }

    /// The whole area, to register with the kernel.
    pub(crate) fn area(&self) -> NonNull<[u8]> {
        NonNull::slice_from_raw_parts(self.memory, self.layout.size())
    }

    /// The fill-ring address of a receive buffer; giving it to the kernel consumes it.
    pub(crate) fn fill_address(&self, buffer: RxBuffer) -> u64 {
        u64::from(buffer.0) * RX_STRIDE
    }

    /// Whether `second` receives right after `first` in memory.
    pub(crate) fn adjacent(first: &RxBuffer, second: &RxBuffer) -> bool {
        first.0.checked_add(1) == Some(second.0)
    }

    /// Takes back the receive buffer of an RX descriptor's address, with where its data
    /// starts; `None` for an address that is no buffer's (the kernel never gives one).
    ///
    /// # Safety
    /// `address` comes from this UMEM's RX ring, read just now: the kernel has finished
    /// writing that buffer and gives it back, so no other `RxBuffer` for it exists.
    #[allow(unsafe_code)]
    pub(crate) unsafe fn received(&self, address: u64) -> Option<RxBuffer> {
        let base = address & ((1 << ADDRESS_BITS) - 1);
        let offset = address >> ADDRESS_BITS;
        let index = u32::try_from(base / RX_STRIDE).ok()?;
        let valid =
            base.is_multiple_of(RX_STRIDE) && offset == RX_HEADROOM && index < self.rx_buffers;
        valid.then_some(RxBuffer(index))
    }

    /// The `len` bytes received from `first` on, when `buffers` (from `first`) are adjacent
    /// and together hold them; `None` otherwise.
    pub(crate) fn frame(&self, buffers: &[RxBuffer], len: usize) -> Option<&[u8]> {
        let first = buffers.first()?;
        let contiguous = buffers
            .windows(2)
            .all(|pair| Self::adjacent(&pair[0], &pair[1]));
        if !contiguous || len > buffers.len() * RX_STRIDE as usize {
            return None;
        }
        let start = u64::from(first.0) * RX_STRIDE + RX_HEADROOM;
        // SAFETY: `start + len` lies inside the receive buffers of `buffers` (adjacent, each
        // RX_STRIDE long, the last ending at most at the RX region's end, checked at
        // construction), which we own while borrowed here; the kernel does not touch them.
        #[allow(unsafe_code)]
        Some(unsafe { std::slice::from_raw_parts(self.memory.as_ptr().add(start as usize), len) })
    }

    /// The descriptors that send the `len`-byte frame written in `slot`: one per chunk it
    /// fills. Handing them to the kernel hands it the slot, which comes back through
    /// [`completed`](Self::completed).
    pub(crate) fn descriptors(&self, slot: TxSlot, len: usize) -> (XdpDesc, Option<XdpDesc>) {
        let chunk = CHUNK_SIZE as usize;
        let first = XdpDesc {
            addr: self.tx_address(&slot, 0),
            len: len.min(chunk) as u32,
            options: if len > chunk { XDP_PKT_CONTD } else { 0 },
        };
        let second = (len > chunk).then(|| XdpDesc {
            addr: self.tx_address(&slot, chunk as u64),
            len: (len - chunk) as u32,
            options: 0,
        });
        (first, second)
    }

    /// The descriptor address of a transmit slot's byte `offset`.
    fn tx_address(&self, slot: &TxSlot, offset: u64) -> u64 {
        self.tx_base + u64::from(slot.0) * TX_SLOT + offset
    }

    /// The bytes of a transmit slot, to write a frame into.
    pub(crate) fn slot_mut(&mut self, slot: &mut TxSlot) -> &mut [u8] {
        let start = self.tx_address(slot, 0) as usize;
        // SAFETY: the slot lies inside the area (index below `tx_slots`, by construction) and
        // is ours while `slot` is: the kernel does not read it, and `&mut self` keeps this
        // the only reference.
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts_mut(self.memory.as_ptr().add(start), TX_SLOT as usize)
        }
    }

    /// Takes back the transmit slot of a completion-ring address. A frame's second
    /// descriptor (the slot's second chunk) completes with its first and gives `None`.
    ///
    /// # Safety
    /// `address` comes from this UMEM's completion ring, read just now: the kernel has sent
    /// the frame and gives the slot back, so no other `TxSlot` for it exists.
    #[allow(unsafe_code)]
    pub(crate) unsafe fn completed(&self, address: u64) -> Option<TxSlot> {
        let offset = address.checked_sub(self.tx_base)?;
        let index = u32::try_from(offset / TX_SLOT).ok()?;
        (offset.is_multiple_of(TX_SLOT) && index < self.tx_slots).then_some(TxSlot(index))
    }
}

impl Drop for Umem {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout; the socket using it is closed first
        // (declared before the UMEM in its owner).
        #[allow(unsafe_code)]
        unsafe {
            alloc::dealloc(self.memory.as_ptr(), self.layout)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_addresses_we_gave_come_back_as_buffers() {
        let (umem, rx, tx) = Umem::new(4, 2).unwrap();
        let addresses: Vec<u64> = rx.into_iter().map(|b| umem.fill_address(b)).collect();
        assert_eq!(addresses, [0, 3840, 7680, 11520]);
        let rx_desc = |base: u64| base | (RX_HEADROOM << ADDRESS_BITS);
        #[allow(unsafe_code)]
        // SAFETY: the test holds no buffer; what comes back is only compared.
        unsafe {
            assert_eq!(umem.received(rx_desc(3840)), Some(RxBuffer(1)));
            assert_eq!(umem.received(rx_desc(3841)), None);
            assert_eq!(umem.received(3840), None, "no headroom offset");
            assert_eq!(
                umem.received(rx_desc(4 * 3840)),
                None,
                "past the last buffer"
            );
            let slot1 = umem.tx_address(&tx[1], 0);
            assert_eq!(umem.completed(slot1), Some(TxSlot(1)));
            assert_eq!(
                umem.completed(slot1 + 4096),
                None,
                "second chunk of a frame"
            );
            assert_eq!(umem.completed(slot1 + 2 * TX_SLOT), None);
            assert_eq!(umem.completed(0), None);
        }
    }

    #[test]
    fn adjacent_buffers_hold_one_frame_in_one_piece() {
        let (umem, _, _) = Umem::new(4, 1).unwrap();
        let (b1, b2, b3) = (RxBuffer(1), RxBuffer(2), RxBuffer(3));
        let pair = [b1, b2];
        assert_eq!(umem.frame(&pair, 5000).map(<[u8]>::len), Some(5000));
        assert_eq!(umem.frame(&pair, 7681), None, "longer than two buffers");
        let [b1, _] = pair;
        assert_eq!(umem.frame(&[b1, b3], 5000), None, "not adjacent");
        let last = umem.frame(&[RxBuffer(3)], 3840).unwrap();
        assert_eq!(last.len(), 3840);
    }
}

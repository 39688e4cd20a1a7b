/// Declares the `Packet` view of a fixed-length header: construction, length check and
/// access to the underlying buffer. Field accessors stay in each header's own file.
macro_rules! fixed_header_packet {
    ($len:expr; $(#[$doc:meta])*) => {
        /// Length of this header on the wire, in bytes.
        pub const HEADER_LEN: usize = $len;

        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct Packet<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> Packet<T> {
            /// Wraps a buffer without checking its length; accessors may then panic.
            pub const fn new_unchecked(buffer: T) -> Self {
                Packet { buffer }
            }

            /// Wraps a buffer after [`check_len`](Self::check_len); no accessor panics after this.
            pub fn new_checked(buffer: T) -> $crate::Result<Self> {
                let packet = Self::new_unchecked(buffer);
                packet.check_len()?;
                Ok(packet)
            }

            /// Fails when the buffer is shorter than the header.
            pub fn check_len(&self) -> $crate::Result<()> {
                if self.buffer.as_ref().len() < HEADER_LEN {
                    Err($crate::Error)
                } else {
                    Ok(())
                }
            }

            /// Gives the buffer back.
            pub fn into_inner(self) -> T {
                self.buffer
            }
        }
    };
}

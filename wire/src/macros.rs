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

/// Declares a CM message's accessors for the two communication IDs that open it (big-endian
/// `u32`s at `field::LOCAL_COMM_ID` and `field::REMOTE_COMM_ID` of the invoking module).
macro_rules! comm_id_accessors {
    () => {
        comm_id_accessors!(
            "The sender's communication ID.",
            "The receiver's communication ID."
        );
    };
    ($local_doc:literal, $remote_doc:literal) => {
        impl<T: AsRef<[u8]>> Packet<T> {
            #[doc = $local_doc]
            pub fn local_comm_id(&self) -> u32 {
                $crate::read_u32(&self.buffer.as_ref()[field::LOCAL_COMM_ID])
            }

            #[doc = $remote_doc]
            pub fn remote_comm_id(&self) -> u32 {
                $crate::read_u32(&self.buffer.as_ref()[field::REMOTE_COMM_ID])
            }
        }

        impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
            /// Sets the local communication ID.
            pub fn set_local_comm_id(&mut self, value: u32) {
                self.buffer.as_mut()[field::LOCAL_COMM_ID].copy_from_slice(&value.to_be_bytes());
            }

            /// Sets the remote communication ID.
            pub fn set_remote_comm_id(&mut self, value: u32) {
                self.buffer.as_mut()[field::REMOTE_COMM_ID].copy_from_slice(&value.to_be_bytes());
            }

            /// Sets both communication IDs, as a `Repr` writes them.
            fn set_comm_ids(&mut self, local: u32, remote: u32) {
                self.set_local_comm_id(local);
                self.set_remote_comm_id(remote);
            }
        }
    };
}

/// Declares a CM message's accessors for the private data that ends it (`field::PRIVATE_DATA`,
/// `PRIVATE_DATA_LEN` bytes, of the invoking module).
macro_rules! private_data_accessors {
    () => {
        impl<T: AsRef<[u8]>> Packet<T> {
            /// Private data.
            pub fn private_data(&self) -> &[u8] {
                &self.buffer.as_ref()[field::PRIVATE_DATA]
            }

            /// Private data, copied out at its full wire length for a `Repr`.
            fn private_data_array(&self) -> [u8; PRIVATE_DATA_LEN] {
                let mut private_data = [0; PRIVATE_DATA_LEN];
                private_data.copy_from_slice(self.private_data());
                private_data
            }
        }

        impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
            /// Private data, to fill.
            pub fn private_data_mut(&mut self) -> &mut [u8] {
                &mut self.buffer.as_mut()[field::PRIVATE_DATA]
            }

            /// Writes a `Repr`'s private data.
            fn set_private_data(&mut self, value: &[u8; PRIVATE_DATA_LEN]) {
                self.private_data_mut().copy_from_slice(value);
            }
        }
    };
}

/// Declares the byte helpers of a CM message whose fields share bytes (bit fields set with
/// `cm::set_bits`), and `clear`, which zeroes the reserved bits those setters
/// leave alone.
macro_rules! shared_byte_accessors {
    () => {
        impl<T: AsRef<[u8]>> Packet<T> {
            fn byte(&self, index: usize) -> u8 {
                self.buffer.as_ref()[index]
            }
        }

        impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
            fn byte_mut(&mut self, index: usize) -> &mut u8 {
                &mut self.buffer.as_mut()[index]
            }

            /// Zeroes every byte, reserved ones included; the setters then fill the fields.
            pub fn clear(&mut self) {
                self.buffer.as_mut()[..HEADER_LEN].fill(0);
            }
        }
    };
}

/// Declares a header's `parse` and `emit` tests: `$bytes` parses to `$repr`, and `$repr`
/// emits exactly `$bytes` over a buffer pre-filled with 0xA5, so a byte `emit` skips shows.
#[cfg(test)]
macro_rules! parse_emit_tests {
    ($bytes:expr, $repr:expr) => {
        #[test]
        fn parse() {
            let bytes = $bytes;
            assert_eq!(
                Repr::parse(&Packet::new_checked(&bytes[..]).unwrap()),
                Ok($repr)
            );
        }

        #[test]
        fn emit() {
            let mut bytes = [0xA5; HEADER_LEN];
            $repr.emit(&mut Packet::new_unchecked(&mut bytes[..]));
            assert_eq!(bytes, $bytes);
        }
    };
}

/// Declares `buffer_len` for the `Repr` of a fixed-length header: it always writes
/// `HEADER_LEN` bytes.
macro_rules! fixed_len_repr {
    () => {
        impl Repr {
            /// Bytes [`emit`](Self::emit) writes.
            pub const fn buffer_len(&self) -> usize {
                HEADER_LEN
            }
        }
    };
}

/// Declares the `Packet` view of a CM message (`$what`, e.g. "a REQ"): the 232 bytes after the
/// MAD header, ending in private data.
macro_rules! cm_message_packet {
    ($what:literal) => {
        fixed_header_packet! {
            $crate::mad::DATA_LEN;
            #[doc = concat!("A read/write view of ", $what, " (the bytes after the MAD header).")]
        }

        private_data_accessors!();
    };
}

/// Declares the accessors of the remote virtual address and R_Key that open a RETH and an
/// AtomicETH (`field::VIRTUAL_ADDRESS` and `field::RKEY` of the invoking module);
/// `$address_doc` says what the address points at.
macro_rules! remote_address_accessors {
    ($address_doc:literal) => {
        impl<T: AsRef<[u8]>> Packet<T> {
            #[doc = $address_doc]
            pub fn virtual_address(&self) -> u64 {
                $crate::read_u64(&self.buffer.as_ref()[field::VIRTUAL_ADDRESS])
            }

            /// Remote key authorising the access.
            pub fn rkey(&self) -> u32 {
                $crate::read_u32(&self.buffer.as_ref()[field::RKEY])
            }
        }

        impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
            /// Sets the remote virtual address.
            pub fn set_virtual_address(&mut self, address: u64) {
                self.buffer.as_mut()[field::VIRTUAL_ADDRESS]
                    .copy_from_slice(&address.to_be_bytes());
            }

            /// Sets the remote key.
            pub fn set_rkey(&mut self, rkey: u32) {
                self.buffer.as_mut()[field::RKEY].copy_from_slice(&rkey.to_be_bytes());
            }
        }
    };
}

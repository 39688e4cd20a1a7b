/// Declares the `Packet` view of a header that must be at least `$len` bytes long (`$what`
/// says what those bytes are): construction, length check and access to the underlying
/// buffer. Field accessors stay in each header's own file.
macro_rules! packet_view {
    ($len:expr, $what:literal; $(#[$doc:meta])*) => {
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

            #[doc = concat!("Fails when the buffer is shorter than ", $what, ".")]
            pub fn check_len(&self) -> $crate::Result<()> {
                if self.buffer.as_ref().len() < $len {
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

/// Declares `HEADER_LEN` and the `Packet` view of a fixed-length header.
macro_rules! fixed_header_packet {
    ($len:expr; $(#[$doc:meta])*) => {
        /// Length of this header on the wire, in bytes.
        pub const HEADER_LEN: usize = $len;

        packet_view!(HEADER_LEN, "the header"; $(#[$doc])*);
    };
}

/// Declares a getter and a setter for each row of a header's field table. A row is
/// `/// doc` `name / set_name: kind @ FIELD;`, with `FIELD` from the invoking module's `mod field`
/// and `kind` saying how the bytes hold the value: `u8` (one byte), `u16`, `u32`, `u64`
/// (big-endian), `u24` (a `u32`; setting keeps its low 24 bits), `psn`, `service_id`, `gid`,
/// `bits(shift, width)` and `flag(shift)` (bits of a byte other fields share), and
/// `lone_bits(shift, width)` (the only field of its byte: setting it zeroes the reserved bits).
macro_rules! field_accessors {
    (@type u8) => { u8 };
    (@type u16) => { u16 };
    (@type u24) => { u32 };
    (@type u32) => { u32 };
    (@type u64) => { u64 };
    (@type psn) => { $crate::Psn };
    (@type service_id) => { $crate::cm::ServiceId };
    (@type bits) => { u8 };
    (@type lone_bits) => { u8 };
    (@type flag) => { bool };
    (@type gid) => { [u8; 16] };

    (@get u8, $bytes:expr, $field:expr) => { $bytes[$field] };
    (@get u16, $bytes:expr, $field:expr) => { $crate::read_u16(&$bytes[$field]) };
    (@get u24, $bytes:expr, $field:expr) => { $crate::read_u24(&$bytes[$field]) };
    (@get u32, $bytes:expr, $field:expr) => { $crate::read_u32(&$bytes[$field]) };
    (@get u64, $bytes:expr, $field:expr) => { $crate::read_u64(&$bytes[$field]) };
    (@get psn, $bytes:expr, $field:expr) => {
        $crate::Psn::new($crate::read_u24(&$bytes[$field]))
    };
    (@get service_id, $bytes:expr, $field:expr) => {
        $crate::cm::ServiceId($crate::read_u64(&$bytes[$field]))
    };
    (@get bits($shift:expr, $width:expr), $bytes:expr, $field:expr) => {
        $crate::bits($bytes[$field], $shift, $width)
    };
    (@get lone_bits($shift:expr, $width:expr), $bytes:expr, $field:expr) => {
        $crate::bits($bytes[$field], $shift, $width)
    };
    (@get gid, $bytes:expr, $field:expr) => { $crate::read_array(&$bytes[$field]) };
    (@get flag($shift:expr), $bytes:expr, $field:expr) => {
        $crate::bits($bytes[$field], $shift, 1) == 1
    };

    (@set u8, $bytes:expr, $field:expr, $value:expr) => { $bytes[$field] = $value };
    (@set u24, $bytes:expr, $field:expr, $value:expr) => {
        $crate::write_u24(&mut $bytes[$field], $value & 0xFF_FFFF)
    };
    (@set psn, $bytes:expr, $field:expr, $value:expr) => {
        $crate::write_u24(&mut $bytes[$field], $value.value())
    };
    (@set service_id, $bytes:expr, $field:expr, $value:expr) => {
        $bytes[$field].copy_from_slice(&$value.0.to_be_bytes())
    };
    (@set bits($shift:expr, $width:expr), $bytes:expr, $field:expr, $value:expr) => {
        $crate::set_bits(&mut $bytes[$field], $shift, $width, $value)
    };
    (@set lone_bits($shift:expr, $width:expr), $bytes:expr, $field:expr, $value:expr) => {
        $crate::set_lone_bits(&mut $bytes[$field], $shift, $width, $value)
    };
    (@set gid, $bytes:expr, $field:expr, $value:expr) => {
        $bytes[$field].copy_from_slice(&$value)
    };
    (@set flag($shift:expr), $bytes:expr, $field:expr, $value:expr) => {
        $crate::set_bits(&mut $bytes[$field], $shift, 1, $value.into())
    };
    // u16, u32 and u64: the value's big-endian bytes.
    (@set $int:ident, $bytes:expr, $field:expr, $value:expr) => {
        $bytes[$field].copy_from_slice(&$value.to_be_bytes())
    };

    ($(
        $(#[$doc:meta])*
        $get:ident / $set:ident: $kind:ident $(($($arg:expr),+))? @ $field:ident;
    )*) => {
        impl<T: AsRef<[u8]>> Packet<T> {
            $(
                $(#[$doc])*
                pub fn $get(&self) -> field_accessors!(@type $kind) {
                    field_accessors!(
                        @get $kind $(($($arg),+))?, self.buffer.as_ref(), field::$field
                    )
                }
            )*
        }

        impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
            $(
                #[doc = concat!("Sets [`", stringify!($get), "`](Self::", stringify!($get), ").")]
                pub fn $set(&mut self, value: field_accessors!(@type $kind)) {
                    field_accessors!(
                        @set $kind $(($($arg),+))?, self.buffer.as_mut(), field::$field, value
                    )
                }
            )*
        }
    };
}

/// Declares the accessors of a field held as bytes (`field::$field`, `$len` bytes, of the
/// invoking module): a slice to read, one to fill, and private copies in and out at the full
/// length for a `Repr`.
macro_rules! byte_array_accessors {
    ($doc:literal, $get:ident / $get_mut:ident / $array:ident / $set:ident: $field:ident, $len:ident) => {
        impl<T: AsRef<[u8]>> Packet<T> {
            #[doc = $doc]
            pub fn $get(&self) -> &[u8] {
                &self.buffer.as_ref()[field::$field]
            }

            fn $array(&self) -> [u8; $len] {
                $crate::read_array(self.$get())
            }
        }

        impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
            #[doc = concat!($doc, ", to fill.")]
            pub fn $get_mut(&mut self) -> &mut [u8] {
                &mut self.buffer.as_mut()[field::$field]
            }

            fn $set(&mut self, value: [u8; $len]) {
                self.$get_mut().copy_from_slice(&value);
            }
        }
    };
}

/// Declares a CM message's accessors for the two communication IDs that open it
/// (`field::LOCAL_COMM_ID` and `field::REMOTE_COMM_ID` of the invoking module).
macro_rules! comm_id_accessors {
    () => {
        comm_id_accessors!(
            "The sender's communication ID.",
            "The receiver's communication ID."
        );
    };
    ($local_doc:literal, $remote_doc:literal) => {
        field_accessors! {
            #[doc = $local_doc]
            local_comm_id / set_local_comm_id: u32 @ LOCAL_COMM_ID;
            #[doc = $remote_doc]
            remote_comm_id / set_remote_comm_id: u32 @ REMOTE_COMM_ID;
        }
    };
}

/// Declares `clear` for a CM message whose fields share bytes: it zeroes the reserved bits
/// the bit-field setters leave alone.
macro_rules! clear_method {
    () => {
        impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
            /// Zeroes every byte, reserved ones included; the setters then fill the fields.
            pub fn clear(&mut self) {
                self.buffer.as_mut()[..HEADER_LEN].fill(0);
            }
        }
    };
}

/// Declares a fixed-length header's `Repr`, with `parse`, `emit` and `buffer_len`, from its
/// field list. A row `/// doc` `name: Type = [getter] / setter,` copies one field through the
/// `Packet`'s accessors; `[getter?]` names a getter that refuses values the format does not
/// allow. `emit: "...", clear first;` zeroes the header before the setters run.
macro_rules! header_repr {
    (
        $(#[$doc:meta])*
        parse: $parse_doc:literal;
        emit: $emit_doc:literal $(, $clear:ident first)?;
        $(
            $(#[$field_doc:meta])*
            $name:ident: $ty:ty = [$get:ident $($try:tt)?] / $set:ident,
        )*
    ) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct Repr {
            $(
                $(#[$field_doc])*
                pub $name: $ty,
            )*
        }

        fixed_len_repr!();

        impl Repr {
            #[doc = $parse_doc]
            pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> $crate::Result<Repr> {
                Ok(Repr {
                    $($name: packet.$get() $($try)?,)*
                })
            }

            #[doc = $emit_doc]
            pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
                $(packet.$clear();)?
                $(packet.$set(self.$name);)*
            }
        }
    };
}

/// Declares a CM message's `Repr` as `header_repr` does, with the private data that ends
/// every message as its last field and, after `comm_ids;`, the two communication IDs that
/// open most messages as its first.
macro_rules! cm_message_repr {
    (
        $(#[$doc:meta])*
        parse: $parse_doc:literal;
        emit: $emit_doc:literal $(, $clear:ident first)?;
        comm_ids;
        $($rows:tt)*
    ) => {
        cm_message_repr! {
            $(#[$doc])*
            parse: $parse_doc;
            emit: $emit_doc $(, $clear first)?;
            /// The sender's communication ID.
            local_comm_id: u32 = [local_comm_id] / set_local_comm_id,
            /// The receiver's communication ID.
            remote_comm_id: u32 = [remote_comm_id] / set_remote_comm_id,
            $($rows)*
        }
    };
    (
        $(#[$doc:meta])*
        parse: $parse_doc:literal;
        emit: $emit_doc:literal $(, $clear:ident first)?;
        $($rows:tt)*
    ) => {
        header_repr! {
            $(#[$doc])*
            parse: $parse_doc;
            emit: $emit_doc $(, $clear first)?;
            $($rows)*
            /// Private data.
            private_data: [u8; PRIVATE_DATA_LEN] = [private_data_array] / set_private_data,
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

        byte_array_accessors!(
            "Private data",
            private_data / private_data_mut / private_data_array / set_private_data:
                PRIVATE_DATA, PRIVATE_DATA_LEN
        );
    };
}

/// Declares the accessors of the remote virtual address and R_Key that open a RETH and an
/// AtomicETH (`field::VIRTUAL_ADDRESS` and `field::RKEY` of the invoking module);
/// `$address_doc` says what the address points at.
macro_rules! remote_address_accessors {
    ($address_doc:literal) => {
        field_accessors! {
            #[doc = $address_doc]
            virtual_address / set_virtual_address: u64 @ VIRTUAL_ADDRESS;
            /// Remote key authorising the access.
            rkey / set_rkey: u32 @ RKEY;
        }
    };
}

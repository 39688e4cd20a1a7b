//! The extension headers between the BTH and the payload, as one value.

use core::fmt;

use crate::{
    aeth, atomic_ack_eth, atomic_eth, cnp, deth, feth, ieth, immdt, reth, xrceth, Error, ExtHeader,
    Opcode, Result,
};

/// Every extension header a packet carries; which ones are present is fixed by its opcode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ExtRepr {
    /// The XRC SRQ an XRC request is for.
    pub xrceth: Option<xrceth::Repr>,
    /// RDMA WRITE/READ/FLUSH/ATOMIC WRITE target.
    pub reth: Option<reth::Repr>,
    /// ACK, NAK or RNR NAK with MSN.
    pub aeth: Option<aeth::Repr>,
    /// UD Q_Key and source QP.
    pub deth: Option<deth::Repr>,
    /// Immediate data.
    pub immdt: Option<immdt::Repr>,
    /// R_Key to invalidate.
    pub ieth: Option<ieth::Repr>,
    /// Atomic target and operands.
    pub atomic_eth: Option<atomic_eth::Repr>,
    /// Atomic original value.
    pub atomic_ack_eth: Option<atomic_ack_eth::Repr>,
    /// FLUSH selectivity and placement.
    pub feth: Option<feth::Repr>,
    /// CNP body.
    pub cnp: Option<cnp::Repr>,
}

/// Splits `len` bytes off the front of `bytes`.
fn take(bytes: &[u8], len: usize) -> Result<(&[u8], &[u8])> {
    bytes.split_at_checked(len).ok_or(Error)
}

impl ExtRepr {
    /// Parses the headers `opcode` implies from the front of `bytes` (which may hold more).
    pub fn parse(opcode: Opcode, bytes: &[u8]) -> Result<ExtRepr> {
        let mut ext = ExtRepr::default();
        let mut rest = bytes;
        for &header in opcode.info().headers {
            let (this, tail) = take(rest, header.wire_len())?;
            rest = tail;
            match header {
                ExtHeader::XrcEth => {
                    let packet = xrceth::Packet::new_checked(this)?;
                    ext.xrceth = Some(xrceth::Repr::parse(&packet)?)
                }
                ExtHeader::Reth => {
                    ext.reth = Some(reth::Repr::parse(&reth::Packet::new_checked(this)?)?)
                }
                ExtHeader::Aeth => {
                    ext.aeth = Some(aeth::Repr::parse(&aeth::Packet::new_checked(this)?)?)
                }
                ExtHeader::Deth => {
                    ext.deth = Some(deth::Repr::parse(&deth::Packet::new_checked(this)?)?)
                }
                ExtHeader::ImmDt => {
                    ext.immdt = Some(immdt::Repr::parse(&immdt::Packet::new_checked(this)?)?)
                }
                ExtHeader::Ieth => {
                    ext.ieth = Some(ieth::Repr::parse(&ieth::Packet::new_checked(this)?)?)
                }
                ExtHeader::AtomicEth => {
                    let packet = atomic_eth::Packet::new_checked(this)?;
                    ext.atomic_eth = Some(atomic_eth::Repr::parse(&packet)?)
                }
                ExtHeader::AtomicAckEth => {
                    let packet = atomic_ack_eth::Packet::new_checked(this)?;
                    ext.atomic_ack_eth = Some(atomic_ack_eth::Repr::parse(&packet)?)
                }
                ExtHeader::Feth => {
                    ext.feth = Some(feth::Repr::parse(&feth::Packet::new_checked(this)?)?)
                }
                ExtHeader::Cnp => {
                    ext.cnp = Some(cnp::Repr::parse(&cnp::Packet::new_checked(this)?)?)
                }
            }
        }
        Ok(ext)
    }

    /// Bytes [`emit`](Self::emit) writes for `opcode`.
    pub const fn buffer_len(opcode: Opcode) -> usize {
        opcode.info().ext_len()
    }

    /// Whether exactly the headers `opcode` needs are present.
    pub fn matches(&self, opcode: Opcode) -> bool {
        // As sets of bits: the emit of every packet asks (a search of the opcode's list per
        // header cost a 64 B WRITE 2 % of its instructions).
        let wanted = opcode
            .info()
            .headers
            .iter()
            .fold(0, |set, header| set | header.bit());
        let present = [
            (ExtHeader::XrcEth, self.xrceth.is_some()),
            (ExtHeader::Reth, self.reth.is_some()),
            (ExtHeader::Aeth, self.aeth.is_some()),
            (ExtHeader::Deth, self.deth.is_some()),
            (ExtHeader::ImmDt, self.immdt.is_some()),
            (ExtHeader::Ieth, self.ieth.is_some()),
            (ExtHeader::AtomicEth, self.atomic_eth.is_some()),
            (ExtHeader::AtomicAckEth, self.atomic_ack_eth.is_some()),
            (ExtHeader::Feth, self.feth.is_some()),
            (ExtHeader::Cnp, self.cnp.is_some()),
        ]
        .iter()
        .fold(0, |set, &(header, is_present)| {
            set | if is_present { header.bit() } else { 0 }
        });
        present == wanted
    }

    /// Writes the headers in wire order; fails unless they [`match`](Self::matches) `opcode`
    /// and fit in `bytes`. Returns the bytes written.
    pub fn emit(&self, opcode: Opcode, bytes: &mut [u8]) -> Result<usize> {
        let len = Self::buffer_len(opcode);
        if !self.matches(opcode) || bytes.len() < len {
            return Err(Error);
        }
        let mut offset = 0;
        for &header in opcode.info().headers {
            let this = &mut bytes[offset..offset + header.wire_len()];
            offset += header.wire_len();
            // `matches` guarantees each `Option` below is `Some`.
            match header {
                ExtHeader::XrcEth => emit_some(self.xrceth, |r| {
                    r.emit(&mut xrceth::Packet::new_unchecked(this))
                }),
                ExtHeader::Reth => emit_some(self.reth, |r| {
                    r.emit(&mut reth::Packet::new_unchecked(this))
                }),
                ExtHeader::Aeth => emit_some(self.aeth, |r| {
                    r.emit(&mut aeth::Packet::new_unchecked(this))
                }),
                ExtHeader::Deth => emit_some(self.deth, |r| {
                    r.emit(&mut deth::Packet::new_unchecked(this))
                }),
                ExtHeader::ImmDt => emit_some(self.immdt, |r| {
                    r.emit(&mut immdt::Packet::new_unchecked(this))
                }),
                ExtHeader::Ieth => emit_some(self.ieth, |r| {
                    r.emit(&mut ieth::Packet::new_unchecked(this))
                }),
                ExtHeader::AtomicEth => emit_some(self.atomic_eth, |r| {
                    r.emit(&mut atomic_eth::Packet::new_unchecked(this))
                }),
                ExtHeader::AtomicAckEth => emit_some(self.atomic_ack_eth, |r| {
                    r.emit(&mut atomic_ack_eth::Packet::new_unchecked(this))
                }),
                ExtHeader::Feth => emit_some(self.feth, |r| {
                    r.emit(&mut feth::Packet::new_unchecked(this))
                }),
                ExtHeader::Cnp => {
                    emit_some(self.cnp, |r| r.emit(&mut cnp::Packet::new_unchecked(this)))
                }
            }
        }
        Ok(offset)
    }
}

fn emit_some<R>(repr: Option<R>, emit: impl FnOnce(R)) {
    if let Some(repr) = repr {
        emit(repr);
    }
}

impl fmt::Display for ExtRepr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: [Option<&dyn fmt::Display>; 10] = [
            self.xrceth.as_ref().map(|r| r as &dyn fmt::Display),
            self.feth.as_ref().map(|r| r as &dyn fmt::Display),
            self.reth.as_ref().map(|r| r as &dyn fmt::Display),
            self.aeth.as_ref().map(|r| r as &dyn fmt::Display),
            self.atomic_ack_eth.as_ref().map(|r| r as &dyn fmt::Display),
            self.atomic_eth.as_ref().map(|r| r as &dyn fmt::Display),
            self.deth.as_ref().map(|r| r as &dyn fmt::Display),
            self.immdt.as_ref().map(|r| r as &dyn fmt::Display),
            self.ieth.as_ref().map(|r| r as &dyn fmt::Display),
            self.cnp.as_ref().map(|r| r as &dyn fmt::Display),
        ];
        let mut first = true;
        for part in parts.into_iter().flatten() {
            if !first {
                f.write_str(" ")?;
            }
            first = false;
            write!(f, "{part}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_emit_follow_the_opcode_table() {
        let bytes: [u8; 40] = core::array::from_fn(|i| i as u8);
        for &opcode in Opcode::ALL {
            let len = ExtRepr::buffer_len(opcode);
            let ext = match ExtRepr::parse(opcode, &bytes) {
                Ok(ext) => ext,
                // Only reserved AETH syndromes can fail on these bytes.
                Err(_) => {
                    assert!(opcode.info().headers.contains(&ExtHeader::Aeth));
                    continue;
                }
            };
            assert!(ext.matches(opcode), "{opcode}");
            assert!(ExtRepr::parse(opcode, &bytes[..len.saturating_sub(1)]).is_err() || len == 0);
            let mut out = [0u8; 40];
            assert_eq!(ext.emit(opcode, &mut out), Ok(len));
            assert_eq!(ExtRepr::parse(opcode, &out), Ok(ext), "{opcode}");
        }
    }

    /// Every header one too many or one missing, for every opcode: not a match.
    #[test]
    fn one_header_more_or_less_does_not_match() {
        let bytes = [0u8; 40];
        macro_rules! each_header {
            ($($field:ident),*) => {$(
                // The header as some opcode carries it, to add where it is missing.
                let carried = Opcode::ALL
                    .iter()
                    .find_map(|&opcode| ExtRepr::parse(opcode, &bytes).ok()?.$field);
                assert!(carried.is_some(), "no opcode carries {}", stringify!($field));
                for &opcode in Opcode::ALL {
                    let Ok(ext) = ExtRepr::parse(opcode, &bytes) else {
                        continue;
                    };
                    let mut changed = ext;
                    changed.$field = if ext.$field.is_some() { None } else { carried };
                    let field = stringify!($field);
                    assert!(!changed.matches(opcode), "{opcode} with {field} toggled");
                }
            )*};
        }
        each_header!(
            xrceth,
            reth,
            aeth,
            deth,
            immdt,
            ieth,
            atomic_eth,
            atomic_ack_eth,
            feth,
            cnp
        );
    }

    #[test]
    fn emit_refuses_headers_the_opcode_does_not_carry() {
        let ext = ExtRepr {
            immdt: Some(immdt::Repr { immediate: 7 }),
            ..ExtRepr::default()
        };
        let mut out = [0u8; 40];
        assert_eq!(ext.emit(Opcode::RcSendOnly, &mut out), Err(Error));
        assert_eq!(ext.emit(Opcode::RcSendOnlyWithImmediate, &mut out), Ok(4));
        assert_eq!(
            ext.emit(Opcode::RcSendOnlyWithImmediate, &mut out[..3]),
            Err(Error)
        );
    }
}

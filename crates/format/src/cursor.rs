//! [`Cursor`]: a little-endian reader over a byte slice for the parsers.
//!
//! Every read is bounds-checked against the slice and fails with
//! [`CodecError::Truncated`] naming what was being read, so a parser built on
//! it never panics or reads past its input on a short or lying buffer, and
//! never allocates: it only hands out sub-slices.

use crate::error::{CodecError, Result};

/// A little-endian cursor over a byte slice with bounds-checked reads.
#[derive(Debug, Clone)]
pub struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Cursor { buf, pos: 0 }
    }
    pub fn pos(&self) -> usize {
        self.pos
    }
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }
    pub fn rest(&self) -> &'a [u8] {
        &self.buf[self.pos..]
    }
    pub fn take(&mut self, n: u64, what: &'static str) -> Result<&'a [u8]> {
        if n > self.remaining() as u64 {
            return Err(CodecError::Truncated {
                what,
                need: n,
                have: self.remaining() as u64,
            });
        }
        let n = n as usize;
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    pub fn u8(&mut self, what: &'static str) -> Result<u8> {
        Ok(self.take(1, what)?[0])
    }
    pub fn u16(&mut self, what: &'static str) -> Result<u16> {
        Ok(u16::from_le_bytes(self.take(2, what)?.try_into().unwrap()))
    }
    pub fn u32(&mut self, what: &'static str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4, what)?.try_into().unwrap()))
    }
    pub fn u64(&mut self, what: &'static str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8, what)?.try_into().unwrap()))
    }
    /// An unsigned LEB128 integer (7 bits a byte, low first, at most 10
    /// bytes); one that overflows 64 bits or is not in its shortest form
    /// is refused, so each value has exactly one encoding.
    pub fn varint(&mut self, what: &'static str) -> Result<u64> {
        let mut v = 0u64;
        for i in 0..10 {
            let b = self.u8(what)?;
            let bits = (b & 0x7f) as u64;
            if i == 9 && bits > 1 {
                return Err(CodecError::invalid(what, "varint overflows 64 bits"));
            }
            v |= bits << (7 * i);
            if b & 0x80 == 0 {
                if b == 0 && i > 0 {
                    return Err(CodecError::invalid(what, "varint not in its shortest form"));
                }
                return Ok(v);
            }
        }
        Err(CodecError::invalid(what, "varint longer than 10 bytes"))
    }
}

/// Appends `v` as an unsigned LEB128 integer ([`Cursor::varint`]).
pub fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_round_trip_and_have_one_form() {
        for v in [
            0,
            1,
            127,
            128,
            300,
            1 << 20,
            u32::MAX as u64,
            u64::MAX - 1,
            u64::MAX,
        ] {
            let mut b = Vec::new();
            put_varint(&mut b, v);
            let mut c = Cursor::new(&b);
            assert_eq!(c.varint("v").unwrap(), v);
            assert_eq!(c.remaining(), 0);
        }
        // Not shortest, overflowing, too long, truncated.
        for bad in [
            &[0x80, 0x00][..],
            &[0xff; 9][..],
            &[0xff; 11][..],
            &[0x80][..],
        ] {
            let mut b = bad.to_vec();
            if bad.len() == 9 {
                b.push(0x02); // the 10th byte may only hold bit 63
            }
            assert!(Cursor::new(&b).varint("v").is_err(), "{b:?}");
        }
    }
}

//! Pure codecs: transforms (byte-plane, bit-field), zstd glue and rANS.
//!
//! Nothing here does I/O or knows about containers; every function works on
//! slices and writes into caller-provided buffers whose length is the
//! expected output size. That is how decoding stays bounded: a payload that
//! claims more output than the caller's buffer is an error, never an
//! allocation of the claimed size.

pub mod plane;
pub mod rans;
pub mod transform;
pub mod zstd;

use thiserror::Error;

/// Errors from decoding or encoding a plane or stream.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum CodecError {
    #[error("payload truncated: {what} needs {need} bytes, {have} available")]
    Truncated {
        what: &'static str,
        need: u64,
        have: u64,
    },
    #[error("{what}: decoded {got} bytes, expected {expected}")]
    LengthMismatch {
        what: &'static str,
        got: u64,
        expected: u64,
    },
    #[error("zstd: {0}")]
    Zstd(String),
    #[error("zstd frame window 2^{log} exceeds the 2^27 limit")]
    WindowTooLarge { log: u32 },
    #[error("rANS: {0}")]
    Rans(String),
    #[error("invalid {what}: {detail}")]
    Invalid { what: &'static str, detail: String },
}

impl CodecError {
    pub fn invalid(what: &'static str, detail: impl Into<String>) -> Self {
        CodecError::Invalid {
            what,
            detail: detail.into(),
        }
    }
}

pub type Result<T> = std::result::Result<T, CodecError>;

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
}

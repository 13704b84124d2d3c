//! The error of parsing and decoding frames and planes: [`CodecError`].
//!
//! Frame and container parsers (through [`Cursor`](super::cursor::Cursor))
//! and the codec's decoders report through this one type, so a truncated
//! header and a corrupt stream of the same frame read alike to callers. It
//! lives in `format`, the lower layer, so that parsing needs nothing from
//! `codec`; `codec` re-exports it as `codec::CodecError` and `codec::Result`.
//! The messages reach users through the CLI: keep them stable.

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

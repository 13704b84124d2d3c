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
    /// A block (or a piece of a plane decoded at once) larger than
    /// `format::frame::MAX_BLOCK_BYTES`: refused before anything is
    /// allocated for it.
    #[error("{what} decodes to {bytes} bytes, more than the {limit}-byte limit on one block")]
    TooLarge {
        what: String,
        bytes: u64,
        limit: u64,
    },
    /// The allocator refused a buffer within the limit (the process is
    /// short of memory): this decode fails, the process carries on.
    #[error("cannot allocate {bytes} bytes for {what}")]
    Alloc { what: &'static str, bytes: u64 },
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

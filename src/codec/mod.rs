//! Pure codecs: transforms (byte-plane, bit-field), zstd glue, rANS, and the
//! decoding of the frames `format::frame` parses (`frame`).
//!
//! Nothing here does I/O or knows about containers (ZSTN, .blz); every
//! function works on slices and writes into caller-provided buffers whose
//! length is the expected output size. That is how decoding stays bounded: a
//! payload that claims more output than the caller's buffer is an error,
//! never an allocation of the claimed size.
//!
//! Errors are [`CodecError`], defined beside the parsers in `format::error`
//! (parsers and decoders of the same frame report alike) and re-exported
//! here; payload headers are read with `format::cursor::Cursor`.

pub mod frame;
pub mod plane;
pub mod rans;
pub mod transform;
pub mod zstd;

pub use crate::format::error::{CodecError, Result};

//! **ckptfs-codec**: the codecs. Depends on `ckptfs-format` only.
//!
//! Pure codecs: transforms (byte-plane, bit-field, split-float in `split`),
//! zstd glue, rANS (z4ai's coders in `rans`, ckptfs's 32-state coder of
//! plane method 6 in `rans32`), and the decoding of the frames
//! `format::frame` parses (`frame`).
//!
//! Nothing here does I/O or knows about containers (ZSTN, .blz); every
//! function works on slices and writes into caller-provided buffers whose
//! length is the expected output size. That is how decoding stays bounded: a
//! payload that claims more output than the caller's buffer is an error,
//! never an allocation of the claimed size. Buffers a decoder must size
//! from a file's lengths (decoded planes, sparse values, palette indices)
//! come from [`zeroed`]: at most `format::frame::MAX_BLOCK_BYTES`, and
//! allocated fallibly, so that a read fails rather than the process.
//!
//! Errors are [`CodecError`], defined beside the parsers in `format::error`
//! (parsers and decoders of the same frame report alike) and re-exported
//! here; payload headers are read with `format::cursor::Cursor`.

pub mod buffers;
pub mod frame;
#[cfg(target_arch = "x86_64")]
mod join_avx2;
#[cfg(target_arch = "x86_64")]
mod join_avx512;
pub mod plane;
pub mod rans;
pub mod rans32;
pub mod sparse;
pub mod split;
#[cfg(target_arch = "x86_64")]
mod split_avx2;
#[cfg(target_arch = "x86_64")]
mod split_avx512;
pub mod transform;
pub mod xor_delta;
pub mod zstd;

#[cfg(test)]
#[path = "../../../tests/common/support.rs"]
#[allow(dead_code)] // each crate's tests use some of the helpers
mod test_support;

pub use ckptfs_format::error::{CodecError, Result};

use ckptfs_format::frame::MAX_BLOCK_BYTES;

/// A zeroed buffer of `len` bytes for decoded data whose length a file
/// states: refused above [`MAX_BLOCK_BYTES`], and allocated fallibly, so
/// that a process short of memory fails this decode instead of aborting.
/// Every decoder buffer sized from a file goes through here (or
/// [`grow_zeroed`]).
pub fn zeroed(len: u64, what: &'static str) -> Result<Vec<u8>> {
    if len > MAX_BLOCK_BYTES {
        return Err(CodecError::TooLarge {
            what: what.to_string(),
            bytes: len,
            limit: MAX_BLOCK_BYTES,
        });
    }
    if len == 0 {
        return Ok(Vec::new());
    }
    // Asked of the allocator as zeroed memory (calloc), not allocated and
    // then set to zero: memory fresh from the kernel is zero already, and
    // the allocator skips the pass over it that `resize` would make.
    let layout = std::alloc::Layout::array::<u8>(len as usize)
        .map_err(|_| CodecError::Alloc { what, bytes: len })?;
    // On failure the caches give memory back and it is tried again, for a
    // while (ckptfs_format::memory).
    let p = ckptfs_format::memory::with_relief(len, || {
        // SAFETY: `layout` has a non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        (!p.is_null()).then_some(p)
    })
    .ok_or(CodecError::Alloc { what, bytes: len })?;
    // SAFETY: `p` was allocated by the global allocator with the layout of
    // `len` bytes of align 1, all of them initialised (zero).
    Ok(unsafe { Vec::from_raw_parts(p, len as usize, len as usize) })
}

/// Makes `buf` (a reused scratch buffer) at least `len` bytes long, with
/// the checks of [`zeroed`]. What `buf` held is not kept when it grows
/// past its capacity (it is scratch: every caller decodes into it).
pub fn grow_zeroed(buf: &mut Vec<u8>, len: u64, what: &'static str) -> Result<()> {
    if len > MAX_BLOCK_BYTES {
        return Err(CodecError::TooLarge {
            what: what.to_string(),
            bytes: len,
            limit: MAX_BLOCK_BYTES,
        });
    }
    let len = len as usize;
    if buf.len() < len {
        if buf.capacity() >= len {
            buf.resize(len, 0);
        } else {
            *buf = zeroed(len as u64, what)?;
        }
    }
    Ok(())
}

/// Scratch buffers kept per thread between decodes are dropped above this
/// size, so that one large block does not pin its memory in every thread.
pub(crate) const SCRATCH_KEEP: usize = 16 << 20;

/// Whether the CPU has AVX2 (the join and rANS kernels for CPUs without
/// AVX-512 ask this one check).
#[cfg(target_arch = "x86_64")]
pub(crate) fn has_avx2() -> bool {
    static HAVE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);
    cpu_check(&HAVE, || is_x86_feature_detected!("avx2"))
}

/// A CPU feature check run once and cached in `cell` (0 unknown, 1 no,
/// 2 yes): the SIMD paths ask on every call.
#[cfg(target_arch = "x86_64")]
pub(crate) fn cpu_check(cell: &std::sync::atomic::AtomicU8, detect: fn() -> bool) -> bool {
    use std::sync::atomic::Ordering;
    match cell.load(Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => {
            let y = detect();
            cell.store(1 + u8::from(y), Ordering::Relaxed);
            y
        }
    }
}

//! **ckptfs-pack**: the writers, [`export`] (plain safetensors, GGUF) and
//! [`model`] (a model directory or archive as tensors). Depends on
//! `ckptfs-format`, `ckptfs-codec` and `ckptfs-archive`.
//!
//! The writers: what `ckptfs pack` produces.
//!
//! - [`tensor`]: the per-tensor encoder. One tensor's bytes in, one z4ai
//!   frame (bit-field, byte-plane or opaque) and its CKX1 digests out. Both
//!   writers below use it, so a tensor is stored the same way in either
//!   (unless `.blz --raw`, which stores tensor bytes as they are).
//! - [`zstn`]: one `.safetensors` in, one `.zstn` out (head, frames, CKX1
//!   block, index, footer), readable by z4ai. [`pack`].
//! - [`blz`]: a model directory in, one `.blz` archive out (prelude, JSON
//!   header, blobs), tensors deduplicated across shards. [`pack_dir`].
//! - [`blazex`]: a model directory in, one BLAZE-X `.blz` out (the
//!   `blazex` tool's uncompressed layout). [`pack_blazex`].
//! - [`blzdiff`]: BLAZE-X `.blzdiff` patches, written (`diff`) and
//!   applied (`apply`).
//! - [`delta`]: a `.safetensors` and its base in, ckptfs's delta archive
//!   (`.z4dm`: a z4ai `Z4DM` plus the `CKD1` trailer) out. [`delta::pack_delta`].
//! - [`seal`]: a z4ai-written `.zstn` in, the same file with ckptfs's CKX1
//!   checksum block added out (frames untouched). [`seal_file`].
//!
//! The crate root holds the types the writers share with their callers:
//! options, statistics, and the error of the encoder and the `.zstn` writer.
//! Writers build on `format` and `codec` and know nothing of the mount.
//! Their output bytes for a fixed input are pinned (`.zstn` by
//! tests/golden.rs, `.blz` by tests/blz.rs): a change that moves them must
//! bump the format version.

pub mod blazex;
pub mod blxd;
pub mod blz;
pub mod blzdiff;
pub mod compose;
pub mod delta;
pub mod seal;
pub mod tensor;
pub mod zstn;

pub mod export;
pub mod model;

pub use blazex::{pack_blazex, seal_blazex, BlazexPackStats, BlazexSealOutcome};
pub use blz::{pack_dir, walk, BlzPackError};
pub use seal::seal_file;
pub use zstn::pack;

use ckptfs_format::safetensors::HeaderError;
use std::io;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum PackError {
    #[error("{0}")]
    Header(#[from] HeaderError),
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("internal check failed: {0}")]
    Internal(String),
}

#[derive(Debug, Clone, Copy)]
pub struct PackOptions {
    /// zstd level for opaque frames.
    pub level: i32,
    /// Which frame layouts the writer may use.
    pub compat: Compat,
}

impl Default for PackOptions {
    /// Level 3 and the process's default layout set ([`set_default_compat`]).
    fn default() -> Self {
        PackOptions {
            level: 3,
            compat: default_compat(),
        }
    }
}

/// The frame layouts a writer may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compat {
    /// Every layout ckptfs reads, among them the split-float frames
    /// (doc/FORMAT.md §1) that z4ai 0.2.0 does not read.
    #[default]
    Ckptfs,
    /// Only frames z4ai 0.2.0 reads (the layouts ckptfs wrote before
    /// split-float frames).
    Z4ai,
}

static DEFAULT_COMPAT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Sets the layouts of `PackOptions::default()` for this process: what
/// `ckptfs mount --compat z4ai` uses for the mount's write-back, whose
/// commits build their options with `Default::default()`.
pub fn set_default_compat(c: Compat) {
    DEFAULT_COMPAT.store(c == Compat::Z4ai, std::sync::atomic::Ordering::Relaxed);
}

fn default_compat() -> Compat {
    if DEFAULT_COMPAT.load(std::sync::atomic::Ordering::Relaxed) {
        Compat::Z4ai
    } else {
        Compat::Ckptfs
    }
}

/// What [`pack`] wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PackStats {
    pub tensors: usize,
    pub unique: usize,
    pub raw_bytes: u64,
    pub stored_bytes: u64,
}

#[derive(Debug, Clone, Copy, Default)]
pub struct BlzOptions {
    /// Store tensor bytes raw (BLAZE-X layout) instead of ckptfs frames.
    pub raw: bool,
    pub pack: PackOptions,
}

/// What [`pack_dir`] wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BlzStats {
    pub files: usize,
    pub shards: usize,
    pub tensors: usize,
    pub blobs: usize,
    /// Tensors whose bytes were already stored (by another tensor).
    pub deduplicated: usize,
    /// Total size of the files.
    pub raw_bytes: u64,
    /// Size of the archive.
    pub stored_bytes: u64,
}

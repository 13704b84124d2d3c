//! ckptfs: compressed model checkpoints served as ordinary files.
//!
//! The layers are crates, bottom up (README's Layout):
//!
//! - [`format`] (`ckptfs-format`): bytes on disk, no codec; with
//!   [`memory`] (allocations sized by untrusted lengths) and [`fsutil`]
//!   (durable file replacement), which every layer above uses;
//! - [`codec`] (`ckptfs-codec`): the entropy coders and transforms;
//! - [`store`] (`ckptfs-store`): object storage;
//! - [`archive`] (`ckptfs-archive`): the readers, the block cache, deltas;
//! - [`pack`] (`ckptfs-pack`): the writers, export and GGUF;
//! - [`fs`] (`ckptfs-fs`): the filesystem core and its thin FUSE adapter;
//! - this crate: the command line ([`cli`], [`commands`]).
//!
//! The layers are re-exported here under their module names, so the
//! binary, the Python package and the tests name everything as
//! `ckptfs::LAYER::...`.

pub use ckptfs_archive as archive;
pub use ckptfs_archive::{cache, z4delta};
pub use ckptfs_codec as codec;
pub use ckptfs_format as format;
pub use ckptfs_format::{fsutil, memory};
pub use ckptfs_fs as fs;
pub use ckptfs_fs::{fuse, metrics};
pub use ckptfs_pack as pack;
pub use ckptfs_pack::{export, model};
pub use ckptfs_store as store;

pub mod cli;
pub mod commands;

/// Keeps glibc from returning every freed decode block to the kernel: blocks
/// of about 1 MiB are allocated and freed constantly, and above the default
/// mmap threshold each one costs an mmap, 256 page faults and a munmap.
pub fn tune_allocator() {
    // SAFETY: mallopt only adjusts allocator parameters.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 64 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
    }
}

//! ckptfs: compressed model checkpoints served as ordinary files.
//!
//! The core (formats, codecs, archives) is independent of FUSE and of the
//! command line; `fuse` and `commands` are thin layers over it.

pub mod archive;
pub mod cache;
pub mod cli;
pub mod codec;
pub mod commands;
pub mod export;
pub mod format;
pub mod fs;
pub mod fsutil;
pub mod fuse;
pub mod memory;
pub mod metrics;
pub mod model;
pub mod pack;
pub mod store;
#[cfg(test)]
mod test_support;
pub mod z4delta;

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

//! The integration tests, in one binary: one module per behaviour (a file
//! of tests/), with the shared setup in `common`. One binary links the
//! crates once (a test binary per file linked them 35 times: most of a clean
//! test build's disk and time), and its tests share the test threads, so a
//! slow mount test no longer holds up the files after it.
//!
//! Run one file's tests with its module name as the filter:
//! `cargo test --test tests mount_read::`.

mod common;

mod blazex;
mod blz;
mod corruption;
mod delta;
mod export;
mod export_arch;
mod export_llama;
mod golden;
mod hostile;
mod interop;
mod mount_backup;
mod mount_blazex;
mod mount_blz;
mod mount_delta;
mod mount_delta_write;
mod mount_direct;
mod mount_family;
mod mount_family_release;
mod mount_fsx;
mod mount_gguf;
mod mount_hf_cache;
mod mount_hostile_store;
mod mount_memory;
mod mount_mmap;
mod mount_new_user;
mod mount_ops;
mod mount_pjdfstest;
mod mount_read;
mod mount_rename_over;
mod mount_restart;
mod mount_s3;
mod mount_s3_write;
mod mount_write;
mod mount_xattr;
mod new_user;
mod pack;
mod repack;
mod s3_cli;
mod seal;
mod vectors;
mod z4ai_delta;
mod z4ai_quirks;

//! ckptfs: compressed model checkpoints served as ordinary files.
//!
//! The core (formats, codecs, archives) is independent of FUSE and of the
//! command line; `fuse` and `commands` are thin layers over it.

pub mod archive;
pub mod cache;
pub mod cli;
pub mod codec;
pub mod commands;
pub mod format;
pub mod fs;
pub mod fsutil;
pub mod fuse;

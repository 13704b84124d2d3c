//! The write path of `CheckpointFs`: creating, writing, renaming and
//! removing files, and the write-back that compresses staged
//! `.safetensors` files after their last close.
//!
//! - Plain files (any name but `X.safetensors`) are written straight
//!   through to STORE.
//! - A regular file `X.safetensors` written through the mount (created,
//!   opened for writing, truncated, or renamed to that name) is staged in
//!   the spool ([`super::spool`], [`stage`]) and served from there.
//! - A plain file of any other name whose content is safetensors is
//!   staged when its last writer closes ([`adopt`]), and stored as
//!   `N.zsame` under its own name.
//! - After the last writer closes ([`writers`]), the write-back thread
//!   ([`queue`]) compresses it and commits the `.zstn` ([`commit`]), or
//!   with `--delta auto` and a named base a `.z4dm` against it
//!   ([`delta_commit`]); otherwise, with `--delta auto`, the family thread
//!   then rewrites its predecessor as a delta against it ([`family`]).
//! - Deltas in STORE keep their bases: what removes, replaces or moves a
//!   base first rewrites its dependents ([`relations`]).
//! - `ckptfs repack` replays a store's commits through the family policy,
//!   offline ([`repack`]).
//!
//! Each call has its file: [`open`] (open for writing, `write`, `fsync`,
//! `fallocate`), [`create`] (`create`, `mknod`, `mkdir`, `symlink`,
//! `link`), [`remove`] (`unlink`, `rmdir`), [`rename`], [`setattr`].
//! `ns` serialises the changes that replace or remove what presents a name
//! (`create`, `link`, `unlink`, `rmdir`, `rename`, staging, a commit);
//! reads and lookups do not take it.
//!
//! A compression runs with no lock held; writers register in `writers`
//! before waiting for a running compression of their file (`Spool::bump`),
//! and a compression checks `writers` after marking itself running, so a
//! file is never truncated under the compressor's map.

mod adopt;
mod backing;
mod commit;
mod create;
mod delta_commit;
mod family;
mod open;
mod queue;
mod relations;
mod remove;
mod rename;
pub mod repack;
mod setattr;
mod stage;
mod writers;

pub(super) use family::FamilyQueue;
pub(super) use queue::WritebackQueue;
pub(super) use relations::RelationCache;

use super::inode::{Inode, NodeKind};
use super::namespace;
use super::spool::{self, Spool};
use super::{CheckpointFs, FsError, Result};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

impl CheckpointFs {
    fn spool(&self) -> Result<&Spool> {
        match &self.spool {
            Some(s) if !self.read_only => Ok(s),
            _ => Err(FsError::ReadOnly),
        }
    }

    /// A directory that may be changed: not read-only, not inside a
    /// `.blz`. Returns it with its path relative to STORE.
    fn writable_dir(&self, parent: u64) -> Result<(Arc<Inode>, PathBuf)> {
        self.spool()?;
        let p = self.dir_inode(parent)?;
        if matches!(p.kind(), NodeKind::Blz | NodeKind::BlzDir { .. }) {
            return Err(FsError::ReadOnly);
        }
        let rel = self.rel(&p)?;
        Ok((p, rel))
    }

    /// Names the mount cannot create: the spool, and regular-file names
    /// that STORE uses for archives (`X.zstn`, `X.blz`).
    fn check_new_name(&self, rel: &Path, name: &OsStr, dir: bool) -> Result<()> {
        if name.len() > 255 {
            return Err(FsError::NameTooLong);
        }
        if rel.as_os_str().is_empty() && name == spool::SPOOL_DIR {
            return Err(FsError::ReservedName);
        }
        if !dir && namespace::is_archive_name(name) {
            // A regular file with this name in STORE is presented as an
            // archive under another name; refuse rather than surprise.
            // The caller sees only EPERM: the log says why and what to do.
            log::warn!(
                "refusing to create {:?} in the mount (EPERM): names ending in \
                 .zstn, .zsame, .z4dm and .blz are the store's archives; copy an \
                 archive into the store directory {} (a .blz then appears as a \
                 directory, a .zstn as a .safetensors)",
                rel.join(name),
                self.store.path().display()
            );
            return Err(FsError::ReservedName);
        }
        Ok(())
    }
}

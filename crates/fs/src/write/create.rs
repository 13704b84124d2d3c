//! New entries: `create`, `mknod`, `mkdir`, `symlink`, `link`.
//!
//! A new `X.safetensors` is created staged in the spool; anything else is
//! created in STORE. New entries get the caller's ownership when the daemon
//! runs as root. Reserved names are refused (see `check_new_name`).

use super::open::backing_flags;
use crate::inode::{Inode, NodeKind};
use crate::resolve::not_found_is;
use crate::spool::Spool;
use crate::sys::set_owner;
use crate::{Caller, CheckpointFs, Entry, FsError, Opened, Result};
use std::ffi::OsStr;
use std::fs::Metadata;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

impl CheckpointFs {
    /// `create` with `O_CREAT`: a new file (staged for `X.safetensors`),
    /// or the existing one opened with `flags` (without `O_EXCL`).
    pub fn create(
        &self,
        parent: u64,
        name: &OsStr,
        mode: u32,
        flags: i32,
        caller: Caller,
    ) -> Result<(Entry, Opened)> {
        let (p, rel) = self.writable_dir(parent)?;
        match self.resolve(&p, name) {
            Ok(_) if flags & libc::O_EXCL != 0 => return Err(FsError::Exists),
            Ok(_) => {
                let e = self.lookup(parent, name)?;
                let o = self.open(e.attr.ino, flags)?;
                return Ok((e, o));
            }
            Err(FsError::NotFound) => {}
            Err(e) => return Err(e),
        }
        self.check_new_name(&rel, name, false)?;
        let dm = self.store.lstat(&rel).map_err(not_found_is)?;
        let _g = self.ns.lock();
        let spool = self.spool()?;
        if self.stages(name) {
            self.store.may_write_dir(&rel)?;
            let (id, file) = spool.create(&rel.join(name), mode, flags)?;
            if let Err(e) = set_owner(&self.store, &Spool::data_rel(id), caller, &dm) {
                let _ = spool.remove(id);
                return Err(e);
            }
            let m = file.metadata()?;
            let identity = (m.dev(), m.ino());
            let inode = self
                .inodes
                .assign(parent, name, name, NodeKind::Staged { id }, identity);
            spool.set_ino(id, inode.ino);
            self.add_writer(identity);
            spool.bump(id);
            let opened = self.plain_handle(inode.ino, file, Some(identity), true, flags);
            let entry = self.entry_of(&inode, &m)?;
            Ok((entry, opened))
        } else {
            let path = rel.join(name);
            let acc = flags & libc::O_ACCMODE;
            let oacc = match (acc != libc::O_WRONLY, acc != libc::O_RDONLY) {
                (true, true) => libc::O_RDWR,
                (false, true) => libc::O_WRONLY,
                _ => libc::O_RDONLY,
            };
            // open(O_CREAT | O_RDONLY) is valid.
            let file = self.store.open_file(
                &path,
                oacc | backing_flags(flags) | libc::O_CREAT | libc::O_EXCL,
                mode & 0o7777,
            )?;
            if let Err(e) = set_owner(&self.store, &path, caller, &dm) {
                let _ = self.store.unlink(&path);
                return Err(e);
            }
            let m = file.metadata()?;
            let identity = (m.dev(), m.ino());
            let inode = self
                .inodes
                .assign(parent, name, name, NodeKind::Plain, identity);
            let writer = (acc != libc::O_RDONLY).then_some(identity);
            if let Some(w) = writer {
                self.add_writer(w);
            }
            let opened = self.plain_handle(inode.ino, file, writer, true, flags);
            let entry = self.entry_of(&inode, &m)?;
            Ok((entry, opened))
        }
    }

    fn entry_of(&self, inode: &Inode, m: &Metadata) -> Result<Entry> {
        let attr = self.attr_of(inode, m)?;
        inode.state().lookups += 1;
        Ok(Entry {
            attr,
            ttl: self.attr_ttl(inode.ino),
        })
    }

    /// `mknod`: regular files (as `create`), FIFOs, sockets and devices.
    pub fn mknod(
        &self,
        parent: u64,
        name: &OsStr,
        mode: u32,
        rdev: u32,
        caller: Caller,
    ) -> Result<Entry> {
        if mode & libc::S_IFMT == libc::S_IFREG || mode & libc::S_IFMT == 0 {
            let (e, o) = self.create(
                parent,
                name,
                mode & 0o7777,
                libc::O_EXCL | libc::O_WRONLY,
                caller,
            )?;
            let fh = match o {
                Opened::Plain { fh, .. } | Opened::Archive { fh, .. } => fh,
            };
            self.release(fh);
            return Ok(e);
        }
        let (path, dm) = self.new_entry(parent, name, false)?;
        self.store.mknod(&path, mode, rdev as u64)?;
        set_owner(&self.store, &path, caller, &dm)?;
        self.lookup(parent, name)
    }

    /// The backing path for a new entry `name` in `parent` (writable,
    /// allowed, not existing) and the metadata of its directory.
    fn new_entry(&self, parent: u64, name: &OsStr, dir: bool) -> Result<(PathBuf, Metadata)> {
        let (p, rel) = self.writable_dir(parent)?;
        self.check_new_name(&rel, name, dir)?;
        if self.resolve(&p, name).is_ok() {
            return Err(FsError::Exists);
        }
        let dm = self.store.lstat(&rel).map_err(not_found_is)?;
        Ok((rel.join(name), dm))
    }

    pub fn mkdir(&self, parent: u64, name: &OsStr, mode: u32, caller: Caller) -> Result<Entry> {
        let (path, dm) = self.new_entry(parent, name, true)?;
        self.store.mkdir(&path, mode & 0o7777)?;
        set_owner(&self.store, &path, caller, &dm)?;
        // mkdir(2) ignores set-ID bits of mode except as the fs decides;
        // keep what the backing filesystem did.
        self.lookup(parent, name)
    }

    pub fn symlink(
        &self,
        parent: u64,
        name: &OsStr,
        target: &Path,
        caller: Caller,
    ) -> Result<Entry> {
        let (path, dm) = self.new_entry(parent, name, false)?;
        self.store.symlink(target, &path)?;
        set_owner(&self.store, &path, caller, &dm)?;
        self.lookup(parent, name)
    }

    /// Hard links, for plain files only (an archive or staged file has no
    /// single backing file to link).
    pub fn link(&self, ino: u64, newparent: u64, newname: &OsStr) -> Result<Entry> {
        let (np, rel) = self.writable_dir(newparent)?;
        self.check_new_name(&rel, newname, false)?;
        let inode = self.inode(ino)?;
        match inode.kind() {
            NodeKind::Plain => {}
            NodeKind::Directory | NodeKind::Blz => return Err(FsError::NotLinkable),
            NodeKind::BlzDir { .. } | NodeKind::BlzFile { .. } | NodeKind::GgufView => {
                return Err(FsError::ReadOnly)
            }
            // Deliberate: see doc/SEMANTICS.md.
            NodeKind::Archive | NodeKind::Staged { .. } => return Err(FsError::NotLinkable),
        }
        if self.stages(newname) {
            return Err(FsError::NotLinkable);
        }
        if self.resolve(&np, newname).is_ok() {
            return Err(FsError::Exists);
        }
        let _g = self.ns.lock();
        self.store.link(&self.rel(&inode)?, &rel.join(newname))?;
        self.lookup_locked(newparent, newname)
    }
}

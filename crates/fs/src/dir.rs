//! Directory listings of STORE.
//!
//! `opendir` reads the backing directory now and keeps the listing in the
//! handle; `readdir` serves that snapshot, so a listing is as fresh as its
//! `opendir`. Each entry is presented as [`super::namespace`] says
//! (archives under their `.safetensors` name, a `.blz` as a directory,
//! staged files over what STORE has under the same name, the spool hidden),
//! and gets its inode here, so `ls -i` agrees with `stat`. Listings inside a
//! `.blz` come from the archive instead (see `blz_dir`).

use super::handles::{DirItem, Handle};
use super::inode::NodeKind;
use super::namespace;
use super::resolve::not_found_is;
use super::spool;
use super::{CheckpointFs, DirectoryReplier, FileKind, FsError, Result};
use std::collections::HashMap;
use std::ffi::OsString;
use std::os::unix::fs::{DirEntryExt, MetadataExt};

impl CheckpointFs {
    /// Reads the directory from STORE now; `readdir` serves this snapshot.
    pub fn opendir(&self, ino: u64) -> Result<u64> {
        let d = self.dir_inode(ino)?;
        if matches!(d.kind(), NodeKind::Blz | NodeKind::BlzDir { .. }) {
            return self.opendir_blz(&d);
        }
        let rel = self.rel(&d)?;
        let dir = self.store.path().join(&rel);
        let mut raw = Vec::new();
        let mut kinds = HashMap::new();
        let staged: HashMap<OsString, u64> = match &self.spool {
            Some(s) => s.names_in(&rel).into_iter().map(|(i, n)| (n, i)).collect(),
            None => HashMap::new(),
        };
        for e in self.store.read_dir(&rel).map_err(not_found_is)? {
            let e = e?;
            if rel.as_os_str().is_empty() && e.file_name() == spool::SPOOL_DIR {
                continue;
            }
            let ft = e.file_type()?;
            kinds.insert(e.file_name(), (ft, e.ino()));
            raw.push((e.file_name(), ft.is_file()));
        }
        let (resolved, shadowed) = namespace::resolve_dir(&raw);
        for s in shadowed {
            self.warn_shadowed(&dir, &s.hidden, &s.shown);
        }
        let mut items = dot_entries(d.ino, d.parent());
        let dev = d.identity().0;
        for (name, id) in &staged {
            let Some(s) = &self.spool else { break };
            let Ok(m) = std::fs::symlink_metadata(s.data_path(*id)) else {
                continue;
            };
            let inode = self.inodes.assign(
                d.ino,
                name,
                name,
                NodeKind::Staged { id: *id },
                (m.dev(), m.ino()),
            );
            s.set_ino(*id, inode.ino);
            items.push(DirItem {
                ino: inode.ino,
                kind: FileKind::RegularFile,
                name: name.clone(),
            });
        }
        let presented: std::collections::HashSet<OsString> =
            resolved.iter().map(|r| r.presented.clone()).collect();
        for r in resolved {
            if staged.contains_key(&r.presented) {
                continue;
            }
            let (ft, bino) = kinds[&r.backing];
            let is_model = || {
                (r.archive && namespace::is_blz_name(&r.backing))
                    || (!r.archive && ft.is_dir() && self.is_model_dir(&rel.join(&r.backing)))
            };
            // The model's GGUF view, unless something else has its name.
            if let Some(view) = self
                .gguf_name(&r.presented)
                .filter(|v| !presented.contains(v) && !staged.contains_key(v) && is_model())
            {
                if self.gguf_view(&rel.join(&r.backing), &view).is_ok() {
                    let inode = self.inodes.assign(
                        d.ino,
                        &view,
                        &r.backing,
                        NodeKind::GgufView,
                        (dev, bino),
                    );
                    items.push(DirItem {
                        ino: inode.ino,
                        kind: FileKind::RegularFile,
                        name: view,
                    });
                }
            }
            let (kind, fk) = if r.archive && namespace::is_blz_name(&r.backing) {
                (NodeKind::Blz, FileKind::Directory)
            } else if r.archive {
                (NodeKind::Archive, FileKind::RegularFile)
            } else if ft.is_dir() {
                (NodeKind::Directory, FileKind::Directory)
            } else {
                use std::os::unix::fs::FileTypeExt;
                let fk = if ft.is_symlink() {
                    FileKind::Symlink
                } else if ft.is_fifo() {
                    FileKind::NamedPipe
                } else if ft.is_socket() {
                    FileKind::Socket
                } else if ft.is_char_device() {
                    FileKind::CharDevice
                } else if ft.is_block_device() {
                    FileKind::BlockDevice
                } else {
                    FileKind::RegularFile
                };
                (NodeKind::Plain, fk)
            };
            let inode = self
                .inodes
                .assign(d.ino, &r.presented, &r.backing, kind, (dev, bino));
            items.push(DirItem {
                ino: inode.ino,
                kind: fk,
                name: r.presented,
            });
        }
        Ok(self.insert_handle(Handle::Dir(items)))
    }

    pub fn readdir(&self, fh: u64, offset: u64, out: &mut dyn DirectoryReplier) -> Result<()> {
        let h = self.handle(fh)?;
        let Handle::Dir(items) = &*h else {
            return Err(FsError::NotADirectory);
        };
        for (i, it) in items.iter().enumerate().skip(offset as usize) {
            if out.add(it.ino, i as u64 + 1, it.kind, &it.name) {
                break;
            }
        }
        Ok(())
    }

    pub fn releasedir(&self, fh: u64) {
        self.release(fh);
    }

    /// `fsync` of a directory: its backing directory.
    pub fn fsyncdir(&self, ino: u64) -> Result<()> {
        let d = self.dir_inode(ino)?;
        if matches!(d.kind(), NodeKind::Blz | NodeKind::BlzDir { .. }) {
            return Ok(());
        }
        self.store.sync_dir(&self.rel(&d)?)?;
        Ok(())
    }
}

/// The `.` and `..` entries every listing starts with.
pub(super) fn dot_entries(ino: u64, parent: u64) -> Vec<DirItem> {
    vec![
        DirItem {
            ino,
            kind: FileKind::Directory,
            name: ".".into(),
        },
        DirItem {
            ino: parent,
            kind: FileKind::Directory,
            name: "..".into(),
        },
    ]
}

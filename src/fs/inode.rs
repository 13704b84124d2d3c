//! The inode table: stable FUSE inode numbers for presented paths.
//!
//! An inode is identified by (parent inode, presented name, backing file
//! identity (dev, ino)). Looking up the same path while it names the same
//! backing file always yields the same number. When STORE replaces the file
//! (a rename over it, a backup restore), the next lookup sees a different
//! backing identity and allocates a new inode, exactly as a local
//! filesystem gives the new file a new `st_ino`. The old inode lives on
//! while the kernel references it, so open handles and their page cache
//! keep the version they opened and never mix with the new one.
//!
//! Numbers are never reused within a mount. The kernel's lookup count is
//! tracked per inode; when it drops to zero an inode that has been
//! superseded is removed, and a current one just drops its parsed archive
//! (the number stays, so `ls -i` is stable).
//!
//! Designed for the write issue: `rename`/`unlink` will move or remove the
//! `(parent, name)` mapping here, without touching inode numbers.
//!
//! Lock order: `InodeTable::tables`, then an `Inode::state`.

use super::{ArchiveSlot, BlzSlot};
use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

pub const ROOT_INO: u64 = 1;

/// What the inode is backed by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeKind {
    Directory,
    /// A `.zstn` archive presented as `.safetensors`.
    Archive,
    /// Anything else, passed through as it is.
    Plain,
    /// A `.blz` model archive presented as a read-only directory; its
    /// state holds the parsed archive.
    Blz,
    /// A directory inside a `.blz`. `root` is the inode of the `.blz`;
    /// the path inside the archive is `backing` relative to the root's
    /// `backing`, and `identity` is the `.blz` file's.
    BlzDir {
        root: u64,
    },
    /// A file inside a `.blz` (same fields as `BlzDir`).
    BlzFile {
        root: u64,
    },
}

impl NodeKind {
    /// Presented as a directory.
    pub fn is_dir(self) -> bool {
        matches!(
            self,
            NodeKind::Directory | NodeKind::Blz | NodeKind::BlzDir { .. }
        )
    }
}

/// Identity of a backing file: (st_dev, st_ino).
pub type Identity = (u64, u64);

#[derive(Debug)]
pub struct Inode {
    pub ino: u64,
    pub parent: u64,
    pub name: OsString,
    /// Path relative to STORE ("" for the root).
    pub backing: PathBuf,
    pub kind: NodeKind,
    pub identity: Identity,
    state: Mutex<InodeState>,
}

#[derive(Debug, Default)]
pub struct InodeState {
    pub lookups: u64,
    /// The last attributes answered (served when the path was replaced).
    pub attr: Option<super::Attr>,
    /// The parsed archive of the version last seen (archives only).
    pub archive: Option<ArchiveSlot>,
    /// The parsed `.blz` of the version last seen (`Blz` inodes only).
    pub blz: Option<BlzSlot>,
    /// Generation of the archive version the previous open served; an open
    /// of the same generation keeps the kernel page cache.
    pub last_open_generation: Option<u64>,
}

impl Inode {
    pub fn state(&self) -> MutexGuard<'_, InodeState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[derive(Debug)]
struct Tables {
    next: u64,
    by_ino: HashMap<u64, Arc<Inode>>,
    by_name: HashMap<(u64, OsString), u64>,
}

#[derive(Debug)]
pub struct InodeTable {
    tables: RwLock<Tables>,
}

impl InodeTable {
    pub fn new(root_identity: Identity) -> Self {
        let root = Arc::new(Inode {
            ino: ROOT_INO,
            parent: ROOT_INO,
            name: OsString::new(),
            backing: PathBuf::new(),
            kind: NodeKind::Directory,
            identity: root_identity,
            state: Mutex::new(InodeState::default()),
        });
        InodeTable {
            tables: RwLock::new(Tables {
                next: ROOT_INO + 1,
                by_ino: HashMap::from([(ROOT_INO, root)]),
                by_name: HashMap::new(),
            }),
        }
    }

    pub fn get(&self, ino: u64) -> Option<Arc<Inode>> {
        self.tables
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .by_ino
            .get(&ino)
            .cloned()
    }

    /// The inode for `name` in `parent` backed by `backing` with
    /// `identity`: the existing one if nothing changed, else a new one.
    pub fn assign(
        &self,
        parent: u64,
        name: &OsStr,
        backing: PathBuf,
        kind: NodeKind,
        identity: Identity,
    ) -> Arc<Inode> {
        let key = (parent, name.to_os_string());
        {
            let t = self.tables.read().unwrap_or_else(|p| p.into_inner());
            if let Some(i) = t.by_name.get(&key).and_then(|ino| t.by_ino.get(ino)) {
                if i.identity == identity && i.kind == kind && i.backing == backing {
                    return i.clone();
                }
            }
        }
        let mut t = self.tables.write().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = t.by_name.get(&key).and_then(|ino| t.by_ino.get(ino)) {
            if i.identity == identity && i.kind == kind && i.backing == backing {
                return i.clone();
            }
        }
        // Superseded inodes nobody references any more can go now.
        if let Some(old) = t
            .by_name
            .get(&key)
            .and_then(|ino| t.by_ino.get(ino))
            .cloned()
        {
            if old.state().lookups == 0 {
                t.by_ino.remove(&old.ino);
            }
        }
        let ino = t.next;
        t.next += 1;
        let inode = Arc::new(Inode {
            ino,
            parent,
            name: key.1.clone(),
            backing,
            kind,
            identity,
            state: Mutex::new(InodeState::default()),
        });
        t.by_ino.insert(ino, inode.clone());
        t.by_name.insert(key, ino);
        inode
    }

    /// Drops `n` kernel references to `ino`.
    pub fn forget(&self, ino: u64, n: u64) {
        if ino == ROOT_INO {
            return;
        }
        let mut t = self.tables.write().unwrap_or_else(|p| p.into_inner());
        let Some(inode) = t.by_ino.get(&ino).cloned() else {
            return;
        };
        let mut st = inode.state();
        st.lookups = st.lookups.saturating_sub(n);
        if st.lookups > 0 {
            return;
        }
        st.archive = None;
        st.blz = None;
        drop(st);
        let current = t.by_name.get(&(inode.parent, inode.name.clone())) == Some(&ino);
        if !current {
            t.by_ino.remove(&ino);
        }
    }

    pub fn len(&self) -> usize {
        self.tables
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .by_ino
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_path_same_file_same_inode_replaced_file_new_inode() {
        let t = InodeTable::new((1, 2));
        let a = t.assign(
            ROOT_INO,
            OsStr::new("m.safetensors"),
            "m.zstn".into(),
            NodeKind::Archive,
            (1, 10),
        );
        let b = t.assign(
            ROOT_INO,
            OsStr::new("m.safetensors"),
            "m.zstn".into(),
            NodeKind::Archive,
            (1, 10),
        );
        assert_eq!(a.ino, b.ino);
        a.state().lookups = 1;
        let c = t.assign(
            ROOT_INO,
            OsStr::new("m.safetensors"),
            "m.zstn".into(),
            NodeKind::Archive,
            (1, 11),
        );
        assert_ne!(a.ino, c.ino);
        // The old inode stays reachable until the kernel forgets it.
        assert!(t.get(a.ino).is_some());
        t.forget(a.ino, 1);
        assert!(t.get(a.ino).is_none());
        // The current one stays (stable numbers) even with no references.
        t.forget(c.ino, 1);
        assert!(t.get(c.ino).is_some());
    }
}

//! The inode table: stable FUSE inode numbers for presented paths.
//!
//! An inode is identified by (parent inode, presented name, backing file
//! identity (dev, ino)). Looking up the same path while it names the same
//! backing file always yields the same number. When STORE replaces the file
//! behind the mount's back (an rsync, a backup restore), the next lookup
//! sees a different backing identity and allocates a new inode, exactly as
//! a local filesystem gives the new file a new `st_ino`. The old inode
//! lives on while the kernel references it, so open handles and their page
//! cache keep the version they opened and never mix with the new one.
//!
//! Changes made through the mount move inodes instead: `rename` moves the
//! `(parent, name)` mapping and updates the inode's location in place (the
//! kernel keeps using the same number for the new name); a file whose
//! backing changes representation without changing content (a staged file
//! committed as a `.zstn`) keeps its number, with its [`Loc`] updated.
//!
//! An inode stores only its own backing name and its parent, never a full
//! path, so renaming a directory is one update; `CheckpointFs` computes
//! backing paths by walking the parents.
//!
//! Numbers are never reused within a mount. The kernel's lookup count is
//! tracked per inode; when it drops to zero an inode that has been
//! superseded is removed, and a current one just drops its parsed archive
//! (the number stays, so `ls -i` is stable).

use super::Slot;
use parking_lot::{Mutex, MutexGuard, RwLock};
use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::sync::Arc;

pub const ROOT_INO: u64 = 1;

/// What the inode is backed by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeKind {
    Directory,
    /// A `.zstn` archive presented as `.safetensors`.
    Archive,
    /// Anything else, passed through as it is.
    Plain,
    /// A `.safetensors` written through the mount and not yet compressed:
    /// a plain file in the spool (`id` names it there).
    Staged {
        id: u64,
    },
    /// A `.blz` model archive presented as a read-only directory; its
    /// state holds the parsed archive.
    Blz,
    /// A directory inside a `.blz`. `root` is the inode of the `.blz`;
    /// the backing name is the entry's name inside the archive, and
    /// `identity` is the `.blz` file's.
    BlzDir {
        root: u64,
    },
    /// A file inside a `.blz` (same fields as `BlzDir`).
    BlzFile {
        root: u64,
    },
    /// `NAME.<cast>.gguf` (`mount --gguf`): the GGUF export of the model
    /// whose backing name (a directory or a `.blz`) and identity it has.
    GgufView,
}

impl NodeKind {
    /// Presented as a directory.
    pub fn is_dir(self) -> bool {
        matches!(
            self,
            NodeKind::Directory | NodeKind::Blz | NodeKind::BlzDir { .. }
        )
    }

    /// Inside a `.blz` (read-only).
    pub fn in_blz(self) -> bool {
        matches!(self, NodeKind::BlzDir { .. } | NodeKind::BlzFile { .. })
    }
}

/// Identity of a backing file: (st_dev, st_ino).
pub type Identity = (u64, u64);

/// Where an inode is: its place in the presented tree and its backing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loc {
    pub parent: u64,
    /// Presented name.
    pub name: OsString,
    /// Name of the backing entry in the parent's backing directory (for
    /// `Staged`, the presented name; the data lives in the spool).
    pub backing: OsString,
    pub kind: NodeKind,
    pub identity: Identity,
}

#[derive(Debug)]
pub struct Inode {
    pub ino: u64,
    loc: RwLock<Loc>,
    state: Mutex<InodeState>,
}

#[derive(Debug, Default)]
pub struct InodeState {
    pub lookups: u64,
    /// The last attributes answered (served when the path was replaced).
    pub attr: Option<super::Attr>,
    /// The parsed archive of the version last seen (archives only).
    pub archive: Option<Slot>,
    /// The parsed `.blz` of the version last seen (`Blz` inodes only).
    pub blz: Option<Slot>,
    /// Generation of the archive version the previous open served; an open
    /// of the same generation keeps the kernel page cache.
    pub last_open_generation: Option<u64>,
    /// A plain or staged file a rename replaced, kept open while the
    /// kernel may still open this inode: an open that resolved the name
    /// before the rename is served these bytes, as a replaced archive's
    /// open is served its mapped version (see `rename`).
    pub replaced: Option<std::sync::Arc<std::fs::File>>,
}

impl Inode {
    pub fn state(&self) -> MutexGuard<'_, InodeState> {
        self.state.lock()
    }

    pub fn loc(&self) -> Loc {
        self.loc.read().clone()
    }

    pub fn kind(&self) -> NodeKind {
        self.loc.read().kind
    }

    pub fn identity(&self) -> Identity {
        self.loc.read().identity
    }

    pub fn parent(&self) -> u64 {
        self.loc.read().parent
    }

    /// Changes the backing of this inode in place (same presented file).
    pub fn rebase(&self, backing: OsString, kind: NodeKind, identity: Identity) {
        let mut l = self.loc.write();
        l.backing = backing;
        l.kind = kind;
        l.identity = identity;
        drop(l);
        let mut st = self.state();
        st.archive = None;
        st.blz = None;
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
            loc: RwLock::new(Loc {
                parent: ROOT_INO,
                name: OsString::new(),
                backing: OsString::new(),
                kind: NodeKind::Directory,
                identity: root_identity,
            }),
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
        self.tables.read().by_ino.get(&ino).cloned()
    }

    /// The current inode of `name` in `parent`, if one was assigned.
    pub fn find(&self, parent: u64, name: &OsStr) -> Option<Arc<Inode>> {
        let t = self.tables.read();
        t.by_name
            .get(&(parent, name.to_os_string()))
            .and_then(|i| t.by_ino.get(i))
            .cloned()
    }

    /// The inode for `name` in `parent` backed by `backing` with
    /// `identity`: the existing one if nothing changed, else a new one.
    pub fn assign(
        &self,
        parent: u64,
        name: &OsStr,
        backing: &OsStr,
        kind: NodeKind,
        identity: Identity,
    ) -> Arc<Inode> {
        self.assign_if(parent, name, backing, kind, identity, || true, false)
            .expect("unconditional")
    }

    /// [`Self::assign`] if `still_true` holds under the table's lock (the
    /// namespace did not change since the caller resolved the name), else
    /// None and nothing recorded. `looked_up`: for a `lookup`, which counts
    /// the kernel's lookup of the inode under that lock; counted only
    /// later, it could be dropped meanwhile as unreferenced (by a rename
    /// over its name) and the kernel then told a number the table no
    /// longer knows (every open of it ESTALE). A caller that fails before
    /// replying gives the count back with [`Self::forget`].
    #[allow(clippy::too_many_arguments)]
    pub fn assign_if(
        &self,
        parent: u64,
        name: &OsStr,
        backing: &OsStr,
        kind: NodeKind,
        identity: Identity,
        still_true: impl Fn() -> bool,
        looked_up: bool,
    ) -> Option<Arc<Inode>> {
        let counted = |i: &Arc<Inode>| {
            if looked_up {
                i.state().lookups += 1;
            }
            i.clone()
        };
        let key = (parent, name.to_os_string());
        let same = |i: &Inode| {
            let l = i.loc.read();
            l.identity == identity && l.kind == kind && l.backing == backing && l.parent == parent
        };
        {
            let t = self.tables.read();
            if let Some(i) = t.by_name.get(&key).and_then(|ino| t.by_ino.get(ino)) {
                if same(i) {
                    return still_true().then(|| counted(i));
                }
            }
        }
        let mut t = self.tables.write();
        if !still_true() {
            return None;
        }
        if let Some(i) = t.by_name.get(&key).and_then(|ino| t.by_ino.get(ino)) {
            if same(i) {
                return Some(counted(i));
            }
        }
        // Superseded inodes nobody references any more can go now.
        if let Some(old) = t.by_name.remove(&key) {
            t.drop_if_unreferenced(old);
        }
        let ino = t.next;
        t.next += 1;
        let inode = Arc::new(Inode {
            ino,
            loc: RwLock::new(Loc {
                parent,
                name: key.1.clone(),
                backing: backing.to_os_string(),
                kind,
                identity,
            }),
            state: Mutex::new(InodeState::default()),
        });
        t.by_ino.insert(ino, inode.clone());
        t.by_name.insert(key, ino);
        Some(counted(&inode))
    }

    /// `name` in `parent` no longer exists (unlinked): its inode, if any,
    /// lives on while the kernel references it.
    pub fn remove_name(&self, parent: u64, name: &OsStr) {
        let mut t = self.tables.write();
        if let Some(old) = t.by_name.remove(&(parent, name.to_os_string())) {
            t.drop_if_unreferenced(old);
        }
    }

    /// Moves `ino` to `name` in `parent`, with backing name `backing`
    /// (and, for a file that changed representation, a new kind and
    /// identity). Whatever had that name is superseded.
    pub fn rename(
        &self,
        ino: u64,
        parent: u64,
        name: &OsStr,
        backing: OsString,
        kind: NodeKind,
        identity: Identity,
    ) {
        let mut t = self.tables.write();
        let Some(inode) = t.by_ino.get(&ino).cloned() else {
            return;
        };
        let old = inode.loc();
        if t.by_name.get(&(old.parent, old.name.clone())) == Some(&ino) {
            t.by_name.remove(&(old.parent, old.name.clone()));
        }
        let key = (parent, name.to_os_string());
        if let Some(prev) = t.by_name.insert(key, ino) {
            if prev != ino {
                t.drop_if_unreferenced(prev);
            }
        }
        let mut l = inode.loc.write();
        l.parent = parent;
        l.name = name.to_os_string();
        l.backing = backing;
        l.kind = kind;
        l.identity = identity;
    }

    /// Drops `n` kernel references to `ino`.
    pub fn forget(&self, ino: u64, n: u64) {
        if ino == ROOT_INO {
            return;
        }
        let mut t = self.tables.write();
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
        st.replaced = None;
        drop(st);
        let l = inode.loc();
        let current = t.by_name.get(&(l.parent, l.name)) == Some(&ino);
        if !current {
            t.by_ino.remove(&ino);
        }
    }

    pub fn len(&self) -> usize {
        self.tables.read().by_ino.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Tables {
    fn drop_if_unreferenced(&mut self, ino: u64) {
        if ino == ROOT_INO {
            return;
        }
        if let Some(old) = self.by_ino.get(&ino) {
            if old.state().lookups == 0 {
                self.by_ino.remove(&ino);
            }
        }
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
            OsStr::new("m.zstn"),
            NodeKind::Archive,
            (1, 10),
        );
        let b = t.assign(
            ROOT_INO,
            OsStr::new("m.safetensors"),
            OsStr::new("m.zstn"),
            NodeKind::Archive,
            (1, 10),
        );
        assert_eq!(a.ino, b.ino);
        a.state().lookups = 1;
        let c = t.assign(
            ROOT_INO,
            OsStr::new("m.safetensors"),
            OsStr::new("m.zstn"),
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

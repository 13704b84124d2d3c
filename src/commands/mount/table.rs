//! The mount table, as `/proc/self/mountinfo` lists it: whether a path
//! is a ckptfs mount or lies inside one.

use std::io::BufRead;
use std::path::{Path, PathBuf};

pub(super) fn mountinfo_has(mountpoint: &Path) -> bool {
    let want = mountpoint
        .as_os_str()
        .to_string_lossy()
        .replace(' ', "\\040");
    mounts().iter().any(|(m, ckptfs)| *ckptfs && *m == want)
}

/// The mount points of `/proc/self/mountinfo` (escaped as it writes them),
/// each with whether it is a ckptfs mount.
fn mounts() -> Vec<(String, bool)> {
    mount_table()
        .into_iter()
        .map(|m| {
            let ckptfs = m.is_ckptfs();
            (m.point, ckptfs)
        })
        .collect()
}

/// One line of `/proc/self/mountinfo`: "ID PARENT MAJ:MIN ROOT POINT OPTS
/// ... - FSTYPE SOURCE SUPEROPTS" (POINT and SOURCE escaped, `\040` for a
/// space).
pub(super) struct MountEntry {
    point: String,
    pub(super) opts: String,
    pub(super) fstype: String,
    pub(super) source: String,
}

impl MountEntry {
    /// fuser mounts with fstype "fuse" (or "fuse.ckptfs" via fusermount)
    /// and the source "ckptfs:STORE".
    pub(super) fn is_ckptfs(&self) -> bool {
        self.fstype.starts_with("fuse") && self.source.starts_with("ckptfs:")
    }
}

pub(super) fn unescape(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

fn mount_table() -> Vec<MountEntry> {
    let Ok(f) = std::fs::File::open("/proc/self/mountinfo") else {
        return Vec::new();
    };
    std::io::BufReader::new(f)
        .lines()
        .map_while(|l| l.ok())
        .filter_map(|l| {
            let fields: Vec<&str> = l.split(' ').collect();
            let dash = fields.iter().position(|f| *f == "-")?;
            Some(MountEntry {
                point: fields.get(4)?.to_string(),
                opts: fields.get(5)?.to_string(),
                fstype: fields.get(dash + 1)?.to_string(),
                source: fields.get(dash + 2)?.to_string(),
            })
        })
        .collect()
}

/// The topmost mount whose mount point is `path` (absolute), if any.
pub(super) fn mount_at(path: &Path) -> Option<MountEntry> {
    let want = path.to_string_lossy().replace(' ', "\\040");
    mount_table().into_iter().rev().find(|m| m.point == want)
}

/// Whether `path` (which must exist) lies inside a ckptfs mount: the
/// mount point that is its longest prefix is one.
pub(in crate::commands) fn in_ckptfs_mount(path: &Path) -> bool {
    let Ok(p) = path.canonicalize() else {
        return false;
    };
    mounts()
        .into_iter()
        .filter(|(m, _)| p.starts_with(m.replace("\\040", " ")))
        .max_by_key(|(m, _)| m.len())
        .is_some_and(|(_, ckptfs)| ckptfs)
}

/// The root of the ckptfs mount that `path` (canonical) lies in: the
/// longest mount point that is its prefix, if that is a ckptfs mount.
pub(in crate::commands) fn ckptfs_mount_of(path: &Path) -> Option<PathBuf> {
    mounts()
        .into_iter()
        .map(|(m, ckptfs)| (PathBuf::from(unescape(&m)), ckptfs))
        .filter(|(m, _)| path.starts_with(m))
        .max_by_key(|(m, _)| m.as_os_str().len())
        .and_then(|(m, ckptfs)| ckptfs.then_some(m))
}

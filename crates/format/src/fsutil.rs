//! Durable file replacement: write to a temporary sibling, fsync, rename,
//! fsync the directory. A crash at any point leaves the old file or the new
//! one, never a torn file.

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// Writes `path` atomically through `fill`. Without `overwrite`, an existing
/// `path` is an error (`AlreadyExists`), checked again at the rename.
pub fn write_atomic<F>(path: &Path, overwrite: bool, fill: F) -> io::Result<()>
where
    F: FnOnce(&mut io::BufWriter<&File>) -> io::Result<()>,
{
    if !overwrite && path.symlink_metadata().is_ok() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            "output exists (use --force to replace it)",
        ));
    }
    // tempfile creates 0600 files; give the result the mode a plain create
    // would have (0666 minus the umask).
    let mode = 0o666 & !umask();
    write_via_temp(path, overwrite, |f| set_mode(f, mode), fill)
}

/// As [`write_atomic`] (replacing `path`), for the daemon's own state
/// files: mode 0600 whatever the umask (the daemon runs with umask 0).
pub fn write_private<F>(path: &Path, fill: F) -> io::Result<()>
where
    F: FnOnce(&mut io::BufWriter<&File>) -> io::Result<()>,
{
    write_via_temp(path, true, |f| set_mode(f, 0o600), fill)
}

/// Replaces the existing regular file `path` (not a symlink: resolve it
/// first) atomically through `fill`, keeping its permission bits and, when
/// the process may, its owner and group. If `fill` fails, `path` is left as
/// it was. Other hard links to `path` keep the old contents.
pub fn replace_atomic<F>(path: &Path, fill: F) -> io::Result<()>
where
    F: FnOnce(&mut io::BufWriter<&File>) -> io::Result<()>,
{
    use std::os::unix::fs::MetadataExt;
    let old = path.symlink_metadata()?;
    let keep = |f: &File| {
        // Only root (or the owner, for the group) may give a file away;
        // anyone else keeps the file as their own, as cp does.
        let _ = std::os::unix::fs::fchown(f, Some(old.uid()), Some(old.gid()));
        set_mode(f, old.mode() & 0o7777)
    };
    write_via_temp(path, true, keep, fill)
}

fn set_mode(f: &File, mode: u32) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    f.set_permissions(std::fs::Permissions::from_mode(mode))
}

/// Creates a temporary sibling of `path`, sets it up with `init`, fills
/// it, fsyncs it, renames it to `path` and fsyncs the directory.
fn write_via_temp<I, F>(path: &Path, overwrite: bool, init: I, fill: F) -> io::Result<()>
where
    I: FnOnce(&File) -> io::Result<()>,
    F: FnOnce(&mut io::BufWriter<&File>) -> io::Result<()>,
{
    let dir = parent_dir(path);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(".tmp")
        .tempfile_in(&dir)?;
    init(tmp.as_file())?;
    {
        let mut w = io::BufWriter::with_capacity(1 << 20, tmp.as_file());
        fill(&mut w)?;
        w.flush()?;
    }
    tmp.as_file().sync_all()?;
    if overwrite {
        tmp.persist(path).map_err(|e| e.error)?;
    } else {
        tmp.persist_noclobber(path).map_err(|e| e.error)?;
    }
    sync_dir(&dir)
}

/// The process umask, read without changing it (Linux `/proc/self/status`).
fn umask() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Umask:"))
                .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
        })
        .unwrap_or(0o022)
}

/// Creates `dir` with mode `leaf_mode` and any missing parent with
/// `parent_mode`, exactly: the modes are set after creation, so neither a
/// process umask of 0 (the mount daemon's) nor a strict one changes them.
/// Directories that already exist are left as they are.
pub fn create_dirs(dir: &Path, leaf_mode: u32, parent_mode: u32) -> io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let missing: Vec<&Path> = dir
        .ancestors()
        .take_while(|p| !p.as_os_str().is_empty() && p.symlink_metadata().is_err())
        .collect();
    for (i, d) in missing.iter().enumerate().rev() {
        let mode = if i == 0 { leaf_mode } else { parent_mode };
        match std::fs::DirBuilder::new().mode(mode).create(d) {
            Ok(()) => std::fs::set_permissions(d, std::fs::Permissions::from_mode(mode))?,
            // Made by someone else meanwhile: theirs, as it is.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
    if !dir.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::NotADirectory,
            format!("{}: not a directory", dir.display()),
        ));
    }
    Ok(())
}

/// The directory holding `path` ("." for a bare file name).
pub fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// `to` relative to directory `from` (both absolute, or both relative to
/// one root, and normalised: no `.` or `..` components).
pub fn relative(from: &Path, to: &Path) -> PathBuf {
    use std::path::Component;
    let f: Vec<Component> = from.components().collect();
    let t: Vec<Component> = to.components().collect();
    let common = f.iter().zip(&t).take_while(|(a, b)| a == b).count();
    let mut out = PathBuf::new();
    for _ in common..f.len() {
        out.push("..");
    }
    for c in &t[common..] {
        out.push(c);
    }
    out
}

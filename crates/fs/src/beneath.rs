//! Every access to STORE goes through here: paths relative to STORE are
//! resolved beneath a descriptor of STORE's root, held open for the life
//! of the mount, with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
//! RESOLVE_NO_MAGICLINKS)`, and changes are `*at()` calls on the parent
//! directory's descriptor with the last component never followed.
//!
//! Invariants: the daemon never follows a symlink found in STORE (one in
//! the middle of a path fails with ELOOP; a last component that is a
//! symlink is acted on as the symlink itself, which the mount presents as
//! one and the caller's kernel resolves), and never leaves STORE (no `..`
//! above it, no absolute path). Paths longer than `PATH_MAX` are walked a
//! chunk of components at a time, each chunk resolved beneath the last.
//!
//! Identity: a FUSE worker serving a request with `--allow-other` sets the
//! caller (`on_behalf`); each primitive here then runs with the caller's
//! fsuid, fsgid and supplementary groups (per thread, restored before it
//! returns), so the kernel checks the real caller against the real file,
//! as libfuse's passthrough filesystems do. Without a caller set (the
//! write-back thread, the spool, a mount without `--allow-other`, or a
//! daemon that is not root) the daemon acts as itself.
//!
//! The system calls are rustix's (typed, no `unsafe`), but for
//! `setfsuid`/`setfsgid`, which rustix does not have.
//!
//! This module does not depend on the rest of `fs`; it speaks `io::Result`.

use rustix::fs::{Access, AtFlags, Mode, OFlags, ResolveFlags, Timestamps, CWD};
use rustix::io::Errno;
use rustix::process::Gid;
use std::cell::RefCell;
use std::ffi::{CString, OsStr};
use std::fs::{File, Metadata};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// Below this length a relative path is resolved in one `openat2`.
const CHUNK: usize = 3072;

const RESOLVE: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS);

/// Who a request acts for: fsuid, fsgid and supplementary groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ids {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

impl Ids {
    /// The caller of a request: its uid and gid, and the supplementary
    /// groups of process `pid` (none when it cannot be read).
    pub fn of_process(uid: u32, gid: u32, pid: u32) -> Ids {
        let groups = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|s| {
                s.lines().find_map(|l| {
                    l.strip_prefix("Groups:").map(|g| {
                        g.split_whitespace()
                            .filter_map(|n| n.parse().ok())
                            .collect()
                    })
                })
            })
            .unwrap_or_default();
        Ids { uid, gid, groups }
    }
}

thread_local! {
    static CALLER: RefCell<Option<Ids>> = const { RefCell::new(None) };
}

/// Who this thread accesses STORE for now (None: the daemon itself).
pub fn current_caller() -> Option<Ids> {
    CALLER.with(|c| c.borrow().clone())
}

/// Until dropped, STORE is accessed from this thread as `ids` (restores
/// the previous caller on drop).
#[must_use]
pub struct OnBehalf {
    prev: Option<Ids>,
}

pub fn on_behalf(ids: Ids) -> OnBehalf {
    OnBehalf {
        prev: CALLER.with(|c| c.replace(Some(ids))),
    }
}

impl Drop for OnBehalf {
    fn drop(&mut self) {
        let prev = self.prev.take();
        CALLER.with(|c| *c.borrow_mut() = prev);
    }
}

/// Whether STORE is accessed as a caller other than the daemon right now.
pub fn acting_for_caller() -> bool {
    daemon_is_root() && CALLER.with(|c| c.borrow().is_some())
}

fn daemon_is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// The thread's fs identity switched to the caller's; restored on drop.
struct Switched {
    groups: Vec<Gid>,
}

fn switch() -> io::Result<Option<Switched>> {
    if !daemon_is_root() {
        // A daemon that is not root has no more rights than its owner.
        return Ok(None);
    }
    let Some(ids) = CALLER.with(|c| c.borrow().clone()) else {
        return Ok(None);
    };
    let saved = rustix::process::getgroups()?;
    // Groups first, while the thread still has every capability. The
    // raw syscall (rustix's): glibc's setgroups() changes every thread.
    // The gids are the kernel's own (from /proc), never -1.
    let groups: Vec<Gid> = ids
        .groups
        .iter()
        .map(|&g| Gid::from_raw_unchecked(g))
        .collect();
    rustix::thread::set_thread_groups(&groups)?;
    let guard = Switched { groups: saved };
    // rustix has no setfsuid/setfsgid.
    // SAFETY: setfsgid/setfsuid only change this thread's fs identity;
    // calling them with -1 reads it back (they report no errors).
    let ok = unsafe {
        libc::setfsgid(ids.gid);
        libc::setfsuid(ids.uid);
        libc::setfsgid(u32::MAX) as u32 == ids.gid && libc::setfsuid(u32::MAX) as u32 == ids.uid
    };
    if !ok {
        // Dropping `guard` restores the daemon's identity.
        return Err(Errno::PERM.into());
    }
    Ok(Some(guard))
}

impl Drop for Switched {
    fn drop(&mut self) {
        let uid = rustix::process::geteuid().as_raw();
        let gid = rustix::process::getegid().as_raw();
        // SAFETY: as in `switch`; uid first, which restores the file
        // capabilities, then the groups.
        unsafe {
            libc::setfsuid(uid);
            libc::setfsgid(gid);
        }
        if let Err(e) = rustix::thread::set_thread_groups(&self.groups) {
            // Cannot go on with a wrong identity on this thread.
            log::error!("restoring the daemon's groups: {}", io::Error::from(e));
            std::process::abort();
        }
    }
}

fn cstr(s: &OsStr) -> io::Result<CString> {
    CString::new(s.as_bytes()).map_err(|_| Errno::INVAL.into())
}

/// The `/proc/self/fd` link of `fd`: the file it holds, never a path
/// looked up again.
fn proc_link(fd: impl AsFd) -> String {
    format!("/proc/self/fd/{}", fd.as_fd().as_raw_fd())
}

/// A directory descriptor (STORE's root, or one opened) and a name in it.
struct At<'a> {
    root: BorrowedFd<'a>,
    dir: Option<OwnedFd>,
    name: CString,
}

impl At<'_> {
    fn fd(&self) -> BorrowedFd<'_> {
        self.dir.as_ref().map_or(self.root, |d| d.as_fd())
    }
}

/// STORE: its path (for messages) and the descriptor of its root.
#[derive(Debug)]
pub struct Beneath {
    path: PathBuf,
    root: OwnedFd,
    /// A top-level entry that is the daemon's own (the spool): what lies
    /// under it is accessed as the daemon, whoever asks.
    own: Option<std::ffi::OsString>,
}

impl Beneath {
    pub fn open(path: &Path) -> io::Result<Beneath> {
        let c = cstr(path.as_os_str())?;
        let root = rustix::fs::open(
            &c,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Beneath {
            path: path.to_path_buf(),
            root,
            own: None,
        })
    }

    /// Marks the top-level entry `name` as the daemon's own.
    pub fn with_own(mut self, name: &str) -> Beneath {
        self.own = Some(name.into());
        self
    }

    /// The caller's identity for an access to `rel` (none under `own`).
    fn ids_for(&self, rel: &Path) -> io::Result<Option<Switched>> {
        let first = rel.components().next().map(|c| c.as_os_str());
        if first.is_some() && first == self.own.as_deref() {
            return Ok(None);
        }
        switch()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn openat2(dir: BorrowedFd<'_>, rel: &OsStr, flags: OFlags, mode: Mode) -> io::Result<OwnedFd> {
        let c = cstr(rel)?;
        let mode = if flags.contains(OFlags::CREATE) {
            mode
        } else {
            Mode::empty()
        };
        loop {
            match rustix::fs::openat2(dir, &c, flags | OFlags::CLOEXEC, mode, RESOLVE) {
                Ok(fd) => return Ok(fd),
                // EAGAIN: a concurrent rename raced RESOLVE_BENEATH's check.
                Err(Errno::INTR | Errno::AGAIN) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Opens `rel` beneath the root. Paths too long for one call are
    /// walked in chunks of whole components, each beneath the last.
    fn resolve(&self, rel: &Path, flags: OFlags, mode: Mode) -> io::Result<OwnedFd> {
        let mut comps: Vec<&OsStr> = Vec::new();
        for c in rel.components() {
            match c {
                Component::Normal(n) => comps.push(n),
                Component::CurDir => {}
                // Never built by the mount; refused rather than trusted.
                Component::ParentDir | Component::RootDir | Component::Prefix(_) => {
                    return Err(Errno::XDEV.into())
                }
            }
        }
        let mut held: Option<OwnedFd> = None;
        let mut rest = &comps[..];
        loop {
            let dir = held.as_ref().map_or(self.root.as_fd(), |f| f.as_fd());
            let mut take = 0;
            let mut len = 0;
            while take < rest.len() && (take == 0 || len + rest[take].len() + 1 < CHUNK) {
                len += rest[take].len() + 1;
                take += 1;
            }
            if take == rest.len() {
                let p: PathBuf = rest.iter().collect();
                let p = if p.as_os_str().is_empty() {
                    OsStr::new(".")
                } else {
                    p.as_os_str()
                };
                return Self::openat2(dir, p, flags, mode);
            }
            let p: PathBuf = rest[..take].iter().collect();
            held = Some(Self::openat2(
                dir,
                p.as_os_str(),
                OFlags::PATH | OFlags::DIRECTORY,
                Mode::empty(),
            )?);
            rest = &rest[take..];
        }
    }

    /// The parent directory of `rel` (opened) and its last component.
    fn at(&self, rel: &Path) -> io::Result<At<'_>> {
        let name = rel.file_name().ok_or(Errno::INVAL)?;
        let parent = rel.parent().unwrap_or(Path::new(""));
        let name = cstr(name)?;
        let root = self.root.as_fd();
        if parent.as_os_str().is_empty() {
            return Ok(At {
                root,
                dir: None,
                name,
            });
        }
        let d = self.resolve(parent, OFlags::PATH | OFlags::DIRECTORY, Mode::empty())?;
        Ok(At {
            root,
            dir: Some(d),
            name,
        })
    }

    /// `lstat` of `rel` (a symlink is described, not followed).
    pub fn lstat(&self, rel: &Path) -> io::Result<Metadata> {
        let _ids = self.ids_for(rel)?;
        let fd = self.resolve(rel, OFlags::PATH | OFlags::NOFOLLOW, Mode::empty())?;
        File::from(fd).metadata()
    }

    /// Opens `rel` with `flags` (`O_NOFOLLOW` added: a symlink is ELOOP);
    /// `mode` applies with `O_CREAT`.
    pub fn open_file(&self, rel: &Path, flags: i32, mode: u32) -> io::Result<File> {
        let _ids = self.ids_for(rel)?;
        // Every bit as given: openat2 refuses (EINVAL) what it does not know.
        let flags = OFlags::from_bits_retain(flags as u32) | OFlags::NOFOLLOW;
        Ok(File::from(self.resolve(
            rel,
            flags,
            Mode::from_bits_retain(mode),
        )?))
    }

    /// The entries of directory `rel`.
    pub fn read_dir(&self, rel: &Path) -> io::Result<std::fs::ReadDir> {
        let _ids = self.ids_for(rel)?;
        let fd = self.resolve(
            rel,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW,
            Mode::empty(),
        )?;
        // Our own descriptor, reopened through /proc: the directory it
        // names, not a path looked up again.
        std::fs::read_dir(proc_link(&fd))
    }

    /// Whether the caller may add and remove entries in directory `rel`
    /// (checked by the kernel against the real directory), for changes
    /// the daemon then makes as itself (moves into and out of its spool).
    pub fn may_write_dir(&self, rel: &Path) -> io::Result<()> {
        let _ids = self.ids_for(rel)?;
        let fd = self.resolve(rel, OFlags::PATH | OFlags::DIRECTORY, Mode::empty())?;
        // AT_EACCESS checks the fs identity (faccessat2).
        Ok(rustix::fs::accessat(
            CWD,
            proc_link(&fd),
            Access::WRITE_OK | Access::EXEC_OK,
            AtFlags::EACCESS,
        )?)
    }

    pub fn is_dir(&self, rel: &Path) -> bool {
        self.lstat(rel).is_ok_and(|m| m.is_dir())
    }

    pub fn unlink(&self, rel: &Path) -> io::Result<()> {
        let _ids = self.ids_for(rel)?;
        let a = self.at(rel)?;
        Ok(rustix::fs::unlinkat(a.fd(), &a.name, AtFlags::empty())?)
    }

    pub fn rmdir(&self, rel: &Path) -> io::Result<()> {
        let _ids = self.ids_for(rel)?;
        let a = self.at(rel)?;
        Ok(rustix::fs::unlinkat(a.fd(), &a.name, AtFlags::REMOVEDIR)?)
    }

    pub fn mkdir(&self, rel: &Path, mode: u32) -> io::Result<()> {
        let _ids = self.ids_for(rel)?;
        let a = self.at(rel)?;
        Ok(rustix::fs::mkdirat(
            a.fd(),
            &a.name,
            Mode::from_bits_retain(mode),
        )?)
    }

    /// Creates the directories of `rel` that do not exist, mode 0755 (the
    /// daemon runs with umask 0: 0777 would make them world-writable).
    pub fn create_dir_all(&self, rel: &Path) -> io::Result<()> {
        let mut cur = PathBuf::new();
        for c in rel.components() {
            cur.push(c);
            match self.mkdir(&cur, 0o755) {
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                r => r?,
            }
        }
        Ok(())
    }

    /// `mode` holds the file type, as mknod(2)'s does.
    pub fn mknod(&self, rel: &Path, mode: u32, rdev: u64) -> io::Result<()> {
        let _ids = self.ids_for(rel)?;
        let a = self.at(rel)?;
        // rustix takes the type apart from the permissions and puts them
        // back together; a type of 0 is a regular file, as for mknod(2),
        // and one it does not know stays invalid (EINVAL).
        let kind = match mode & libc::S_IFMT {
            0 => rustix::fs::FileType::RegularFile,
            t => rustix::fs::FileType::from_raw_mode(t),
        };
        let perm = Mode::from_bits_retain(mode & !libc::S_IFMT);
        Ok(rustix::fs::mknodat(a.fd(), &a.name, kind, perm, rdev)?)
    }

    pub fn symlink(&self, target: &Path, rel: &Path) -> io::Result<()> {
        let _ids = self.ids_for(rel)?;
        let a = self.at(rel)?;
        let t = cstr(target.as_os_str())?;
        Ok(rustix::fs::symlinkat(&t, a.fd(), &a.name)?)
    }

    /// A hard link `dst` to `src` (a symlink `src` is linked, not followed).
    pub fn link(&self, src: &Path, dst: &Path) -> io::Result<()> {
        let _ids = self.ids_for(src)?;
        let s = self.at(src)?;
        let d = self.at(dst)?;
        // No AT_SYMLINK_FOLLOW: `src` is never followed.
        Ok(rustix::fs::linkat(
            s.fd(),
            &s.name,
            d.fd(),
            &d.name,
            AtFlags::empty(),
        )?)
    }

    pub fn rename(&self, src: &Path, dst: &Path) -> io::Result<()> {
        let _ids = self.ids_for(src)?;
        let s = self.at(src)?;
        let d = self.at(dst)?;
        Ok(rustix::fs::renameat(s.fd(), &s.name, d.fd(), &d.name)?)
    }

    /// Moves `rel` out of STORE to `dst` in the daemon's spool, as the
    /// daemon (the spool is the daemon's; `rel` is still resolved beneath
    /// STORE without symlinks).
    pub fn rename_out(&self, rel: &Path, dst: &Path) -> io::Result<()> {
        let s = self.at(rel)?;
        let d = cstr(dst.as_os_str())?;
        Ok(rustix::fs::renameat(s.fd(), &s.name, CWD, &d)?)
    }

    /// Moves `src` from the daemon's spool to `rel` in STORE, as the daemon.
    pub fn rename_in(&self, src: &Path, rel: &Path) -> io::Result<()> {
        let d = self.at(rel)?;
        let s = cstr(src.as_os_str())?;
        Ok(rustix::fs::renameat(CWD, &s, d.fd(), &d.name)?)
    }

    pub fn readlink(&self, rel: &Path) -> io::Result<Vec<u8>> {
        let _ids = self.ids_for(rel)?;
        let a = self.at(rel)?;
        let target = rustix::fs::readlinkat(a.fd(), &a.name, Vec::new())?;
        Ok(target.into_bytes())
    }

    /// `lchown`; `u32::MAX` leaves an id as it is.
    pub fn lchown(&self, rel: &Path, uid: u32, gid: u32) -> io::Result<()> {
        let _ids = self.ids_for(rel)?;
        let a = self.at(rel)?;
        let uid = (uid != u32::MAX).then(|| rustix::fs::Uid::from_raw(uid));
        let gid = (gid != u32::MAX).then(|| Gid::from_raw(gid));
        Ok(rustix::fs::chownat(
            a.fd(),
            &a.name,
            uid,
            gid,
            AtFlags::SYMLINK_NOFOLLOW,
        )?)
    }

    /// `chmod` of `rel` itself; a symlink has no mode of its own (EOPNOTSUPP).
    pub fn chmod(&self, rel: &Path, mode: u32) -> io::Result<()> {
        let _ids = self.ids_for(rel)?;
        let fd = self.resolve(rel, OFlags::PATH | OFlags::NOFOLLOW, Mode::empty())?;
        let f = File::from(fd);
        if f.metadata()?.file_type().is_symlink() {
            return Err(Errno::OPNOTSUPP.into());
        }
        // An O_PATH descriptor has no fchmod: its /proc link names the
        // file it holds, not a path looked up again.
        Ok(rustix::fs::chmod(
            proc_link(&f),
            Mode::from_bits_retain(mode),
        )?)
    }

    /// Access and modification times (`UTIME_NOW` and `UTIME_OMIT` as in
    /// utimensat(2)).
    pub fn utimens(&self, rel: &Path, ts: &[libc::timespec; 2]) -> io::Result<()> {
        let _ids = self.ids_for(rel)?;
        let t = |t: &libc::timespec| rustix::fs::Timespec {
            tv_sec: t.tv_sec,
            tv_nsec: t.tv_nsec,
        };
        let times = Timestamps {
            last_access: t(&ts[0]),
            last_modification: t(&ts[1]),
        };
        if rel.as_os_str().is_empty() {
            // STORE's root has no parent to name it in.
            let fd = self.resolve(rel, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())?;
            return Ok(rustix::fs::futimens(&fd, &times)?);
        }
        let a = self.at(rel)?;
        Ok(rustix::fs::utimensat(
            a.fd(),
            &a.name,
            &times,
            AtFlags::SYMLINK_NOFOLLOW,
        )?)
    }

    /// fsync of directory `rel`.
    pub fn sync_dir(&self, rel: &Path) -> io::Result<()> {
        self.open_file(rel, libc::O_RDONLY | libc::O_DIRECTORY, 0)?
            .sync_all()
    }

    /// Runs `f` on the `/proc/self/fd` link of `rel` opened `O_PATH |
    /// O_NOFOLLOW` (the file itself, never a path looked up again), as the
    /// caller: the xattr calls have no `*at()` form.
    fn via_proc<T>(&self, rel: &Path, f: impl FnOnce(&str) -> io::Result<T>) -> io::Result<T> {
        let _ids = self.ids_for(rel)?;
        let fd = self.resolve(rel, OFlags::PATH | OFlags::NOFOLLOW, Mode::empty())?;
        f(&proc_link(&fd))
    }

    /// The value of extended attribute `name` of `rel`.
    pub fn getxattr(&self, rel: &Path, name: &OsStr) -> io::Result<Vec<u8>> {
        let n = cstr(name)?;
        self.via_proc(rel, |p| {
            read_sized(
                || rustix::fs::getxattr_query(p, &n),
                |buf| rustix::fs::getxattr(p, &n, buf),
            )
        })
    }

    /// The extended attribute names of `rel`, each NUL-terminated.
    pub fn listxattr(&self, rel: &Path) -> io::Result<Vec<u8>> {
        self.via_proc(rel, |p| {
            read_sized(
                || rustix::fs::listxattr_query(p),
                |buf| rustix::fs::listxattr(p, buf),
            )
        })
    }

    pub fn setxattr(&self, rel: &Path, name: &OsStr, value: &[u8], flags: i32) -> io::Result<()> {
        let n = cstr(name)?;
        let flags = rustix::fs::XattrFlags::from_bits_retain(flags as u32);
        self.via_proc(rel, |p| Ok(rustix::fs::setxattr(p, &n, value, flags)?))
    }

    pub fn removexattr(&self, rel: &Path, name: &OsStr) -> io::Result<()> {
        let n = cstr(name)?;
        self.via_proc(rel, |p| Ok(rustix::fs::removexattr(p, &n)?))
    }

    pub fn statvfs(&self) -> io::Result<rustix::fs::StatVfs> {
        Ok(rustix::fs::fstatvfs(&self.root)?)
    }
}

/// Asks `query` for the size, then `read`s into a buffer of it, again if
/// the value grew in between (ERANGE).
fn read_sized(
    query: impl Fn() -> rustix::io::Result<usize>,
    read: impl Fn(&mut [u8]) -> rustix::io::Result<usize>,
) -> io::Result<Vec<u8>> {
    loop {
        let mut buf = vec![0u8; query()?];
        match read(&mut buf) {
            Ok(m) => {
                buf.truncate(m);
                return Ok(buf);
            }
            Err(Errno::RANGE) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

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
//! This module does not depend on the rest of `fs`; it speaks `io::Result`.

use std::cell::RefCell;
use std::ffi::{CString, OsStr};
use std::fs::{File, Metadata};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// Below this length a relative path is resolved in one `openat2`.
const CHUNK: usize = 3072;

const RESOLVE: u64 =
    libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;

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
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The thread's fs identity switched to the caller's; restored on drop.
struct Switched {
    groups: Vec<libc::gid_t>,
}

fn raw_setgroups(g: &[libc::gid_t]) -> io::Result<()> {
    // The raw syscall: glibc's setgroups() changes every thread.
    // SAFETY: `g` is a valid array of `g.len()` gids.
    let rc = unsafe { libc::syscall(libc::SYS_setgroups, g.len(), g.as_ptr()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn switch() -> io::Result<Option<Switched>> {
    if !daemon_is_root() {
        // A daemon that is not root has no more rights than its owner.
        return Ok(None);
    }
    let Some(ids) = CALLER.with(|c| c.borrow().clone()) else {
        return Ok(None);
    };
    // SAFETY: getgroups with size 0 only counts.
    let n = unsafe { libc::getgroups(0, std::ptr::null_mut()) };
    let mut saved = vec![0 as libc::gid_t; n.max(0) as usize];
    // SAFETY: `saved` has room for `n` gids.
    let n = unsafe { libc::getgroups(saved.len() as libc::c_int, saved.as_mut_ptr()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    saved.truncate(n as usize);
    // Groups first, while the thread still has every capability.
    raw_setgroups(&ids.groups)?;
    let guard = Switched { groups: saved };
    // SAFETY: setfsgid/setfsuid only change this thread's fs identity;
    // calling them with -1 reads it back (they report no errors).
    let ok = unsafe {
        libc::setfsgid(ids.gid);
        libc::setfsuid(ids.uid);
        libc::setfsgid(u32::MAX) as u32 == ids.gid && libc::setfsuid(u32::MAX) as u32 == ids.uid
    };
    if !ok {
        // Dropping `guard` restores the daemon's identity.
        return Err(io::Error::from_raw_os_error(libc::EPERM));
    }
    Ok(Some(guard))
}

impl Drop for Switched {
    fn drop(&mut self) {
        // SAFETY: as in `switch`; uid first, which restores the file
        // capabilities, then the groups.
        unsafe {
            libc::setfsuid(libc::geteuid());
            libc::setfsgid(libc::getegid());
        }
        if let Err(e) = raw_setgroups(&self.groups) {
            // Cannot go on with a wrong identity on this thread.
            log::error!("restoring the daemon's groups: {e}");
            std::process::abort();
        }
    }
}

fn cstr(s: &OsStr) -> io::Result<CString> {
    CString::new(s.as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn rc(r: libc::c_int) -> io::Result<()> {
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// A directory descriptor and a name in it.
struct At {
    _dir: Option<OwnedFd>,
    fd: RawFd,
    name: CString,
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
        // SAFETY: `c` is a valid NUL-terminated path.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just opened and is owned by nobody else.
        let root = unsafe { OwnedFd::from_raw_fd(fd) };
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

    fn openat2(dir: RawFd, rel: &OsStr, flags: i32, mode: u32) -> io::Result<OwnedFd> {
        let c = cstr(rel)?;
        // SAFETY: open_how is plain old data; zero is valid for each field.
        let mut how: libc::open_how = unsafe { std::mem::zeroed() };
        how.flags = (flags | libc::O_CLOEXEC) as u64;
        how.mode = if flags & libc::O_CREAT != 0 {
            mode as u64
        } else {
            0
        };
        how.resolve = RESOLVE;
        loop {
            // SAFETY: `c` is a valid path and `how` a valid open_how of the
            // size passed.
            let fd = unsafe {
                libc::syscall(
                    libc::SYS_openat2,
                    dir,
                    c.as_ptr(),
                    &how as *const libc::open_how,
                    std::mem::size_of::<libc::open_how>(),
                )
            };
            if fd >= 0 {
                // SAFETY: a new descriptor owned by nobody else.
                return Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) });
            }
            let e = io::Error::last_os_error();
            // EAGAIN: a concurrent rename raced RESOLVE_BENEATH's check.
            if !matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN)) {
                return Err(e);
            }
        }
    }

    /// Opens `rel` beneath the root. Paths too long for one call are
    /// walked in chunks of whole components, each beneath the last.
    fn resolve(&self, rel: &Path, flags: i32, mode: u32) -> io::Result<OwnedFd> {
        let mut comps: Vec<&OsStr> = Vec::new();
        for c in rel.components() {
            match c {
                Component::Normal(n) => comps.push(n),
                Component::CurDir => {}
                // Never built by the mount; refused rather than trusted.
                Component::ParentDir | Component::RootDir | Component::Prefix(_) => {
                    return Err(io::Error::from_raw_os_error(libc::EXDEV))
                }
            }
        }
        let mut held: Option<OwnedFd> = None;
        let mut rest = &comps[..];
        loop {
            let dir = held
                .as_ref()
                .map_or(self.root.as_raw_fd(), |f| f.as_raw_fd());
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
                libc::O_PATH | libc::O_DIRECTORY,
                0,
            )?);
            rest = &rest[take..];
        }
    }

    /// The parent directory of `rel` (opened) and its last component.
    fn at(&self, rel: &Path) -> io::Result<At> {
        let name = rel
            .file_name()
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
        let parent = rel.parent().unwrap_or(Path::new(""));
        let name = cstr(name)?;
        if parent.as_os_str().is_empty() {
            return Ok(At {
                _dir: None,
                fd: self.root.as_raw_fd(),
                name,
            });
        }
        let d = self.resolve(parent, libc::O_PATH | libc::O_DIRECTORY, 0)?;
        Ok(At {
            fd: d.as_raw_fd(),
            _dir: Some(d),
            name,
        })
    }

    /// `lstat` of `rel` (a symlink is described, not followed).
    pub fn lstat(&self, rel: &Path) -> io::Result<Metadata> {
        let _ids = self.ids_for(rel)?;
        let fd = self.resolve(rel, libc::O_PATH | libc::O_NOFOLLOW, 0)?;
        File::from(fd).metadata()
    }

    /// Opens `rel` with `flags` (`O_NOFOLLOW` added: a symlink is ELOOP);
    /// `mode` applies with `O_CREAT`.
    pub fn open_file(&self, rel: &Path, flags: i32, mode: u32) -> io::Result<File> {
        let _ids = self.ids_for(rel)?;
        Ok(File::from(self.resolve(
            rel,
            flags | libc::O_NOFOLLOW,
            mode,
        )?))
    }

    /// The entries of directory `rel`.
    pub fn read_dir(&self, rel: &Path) -> io::Result<std::fs::ReadDir> {
        let _ids = self.ids_for(rel)?;
        let fd = self.resolve(
            rel,
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
            0,
        )?;
        // Our own descriptor, reopened through /proc: the directory it
        // names, not a path looked up again.
        std::fs::read_dir(format!("/proc/self/fd/{}", fd.as_raw_fd()))
    }

    /// Whether the caller may add and remove entries in directory `rel`
    /// (checked by the kernel against the real directory), for changes
    /// the daemon then makes as itself (moves into and out of its spool).
    pub fn may_write_dir(&self, rel: &Path) -> io::Result<()> {
        let _ids = self.ids_for(rel)?;
        let fd = self.resolve(rel, libc::O_PATH | libc::O_DIRECTORY, 0)?;
        let p = cstr(OsStr::new(&format!("/proc/self/fd/{}", fd.as_raw_fd())))?;
        // SAFETY: NUL-terminated path; AT_EACCESS checks the fs identity.
        rc(unsafe {
            libc::faccessat(
                libc::AT_FDCWD,
                p.as_ptr(),
                libc::W_OK | libc::X_OK,
                libc::AT_EACCESS,
            )
        })
    }

    pub fn is_dir(&self, rel: &Path) -> bool {
        self.lstat(rel).is_ok_and(|m| m.is_dir())
    }

    pub fn unlink(&self, rel: &Path) -> io::Result<()> {
        let _ids = self.ids_for(rel)?;
        let a = self.at(rel)?;
        // SAFETY: valid descriptor and NUL-terminated name.
        rc(unsafe { libc::unlinkat(a.fd, a.name.as_ptr(), 0) })
    }

    pub fn rmdir(&self, rel: &Path) -> io::Result<()> {
        let _ids = self.ids_for(rel)?;
        let a = self.at(rel)?;
        // SAFETY: valid descriptor and NUL-terminated name.
        rc(unsafe { libc::unlinkat(a.fd, a.name.as_ptr(), libc::AT_REMOVEDIR) })
    }

    pub fn mkdir(&self, rel: &Path, mode: u32) -> io::Result<()> {
        let _ids = self.ids_for(rel)?;
        let a = self.at(rel)?;
        // SAFETY: valid descriptor and NUL-terminated name.
        rc(unsafe { libc::mkdirat(a.fd, a.name.as_ptr(), mode as libc::mode_t) })
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

    pub fn mknod(&self, rel: &Path, mode: u32, rdev: u64) -> io::Result<()> {
        let _ids = self.ids_for(rel)?;
        let a = self.at(rel)?;
        // SAFETY: valid descriptor and NUL-terminated name.
        rc(unsafe {
            libc::mknodat(
                a.fd,
                a.name.as_ptr(),
                mode as libc::mode_t,
                rdev as libc::dev_t,
            )
        })
    }

    pub fn symlink(&self, target: &Path, rel: &Path) -> io::Result<()> {
        let _ids = self.ids_for(rel)?;
        let a = self.at(rel)?;
        let t = cstr(target.as_os_str())?;
        // SAFETY: valid descriptor and NUL-terminated strings.
        rc(unsafe { libc::symlinkat(t.as_ptr(), a.fd, a.name.as_ptr()) })
    }

    /// A hard link `dst` to `src` (a symlink `src` is linked, not followed).
    pub fn link(&self, src: &Path, dst: &Path) -> io::Result<()> {
        let _ids = self.ids_for(src)?;
        let s = self.at(src)?;
        let d = self.at(dst)?;
        // SAFETY: valid descriptors and NUL-terminated names; flags 0
        // never follows `src`.
        rc(unsafe { libc::linkat(s.fd, s.name.as_ptr(), d.fd, d.name.as_ptr(), 0) })
    }

    pub fn rename(&self, src: &Path, dst: &Path) -> io::Result<()> {
        let _ids = self.ids_for(src)?;
        let s = self.at(src)?;
        let d = self.at(dst)?;
        // SAFETY: valid descriptors and NUL-terminated names.
        rc(unsafe { libc::renameat(s.fd, s.name.as_ptr(), d.fd, d.name.as_ptr()) })
    }

    /// Moves `rel` out of STORE to `dst` in the daemon's spool, as the
    /// daemon (the spool is the daemon's; `rel` is still resolved beneath
    /// STORE without symlinks).
    pub fn rename_out(&self, rel: &Path, dst: &Path) -> io::Result<()> {
        let s = self.at(rel)?;
        let d = cstr(dst.as_os_str())?;
        // SAFETY: valid descriptor and NUL-terminated names.
        rc(unsafe { libc::renameat(s.fd, s.name.as_ptr(), libc::AT_FDCWD, d.as_ptr()) })
    }

    /// Moves `src` from the daemon's spool to `rel` in STORE, as the daemon.
    pub fn rename_in(&self, src: &Path, rel: &Path) -> io::Result<()> {
        let d = self.at(rel)?;
        let s = cstr(src.as_os_str())?;
        // SAFETY: valid descriptor and NUL-terminated names.
        rc(unsafe { libc::renameat(libc::AT_FDCWD, s.as_ptr(), d.fd, d.name.as_ptr()) })
    }

    pub fn readlink(&self, rel: &Path) -> io::Result<Vec<u8>> {
        let _ids = self.ids_for(rel)?;
        let a = self.at(rel)?;
        let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
        // SAFETY: valid descriptor, name, and a writable buffer of its length.
        let n = unsafe {
            libc::readlinkat(
                a.fd,
                a.name.as_ptr(),
                buf.as_mut_ptr() as *mut libc::c_char,
                buf.len(),
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        buf.truncate(n as usize);
        Ok(buf)
    }

    /// `lchown`; `u32::MAX` leaves an id as it is.
    pub fn lchown(&self, rel: &Path, uid: u32, gid: u32) -> io::Result<()> {
        let _ids = self.ids_for(rel)?;
        let a = self.at(rel)?;
        // SAFETY: valid descriptor and NUL-terminated name.
        rc(unsafe { libc::fchownat(a.fd, a.name.as_ptr(), uid, gid, libc::AT_SYMLINK_NOFOLLOW) })
    }

    /// `chmod` of `rel` itself; a symlink has no mode of its own (EOPNOTSUPP).
    pub fn chmod(&self, rel: &Path, mode: u32) -> io::Result<()> {
        let _ids = self.ids_for(rel)?;
        let fd = self.resolve(rel, libc::O_PATH | libc::O_NOFOLLOW, 0)?;
        let f = File::from(fd);
        if f.metadata()?.file_type().is_symlink() {
            return Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP));
        }
        // An O_PATH descriptor has no fchmod: its /proc link names the
        // file it holds, not a path looked up again.
        let p = cstr(OsStr::new(&format!("/proc/self/fd/{}", f.as_raw_fd())))?;
        // SAFETY: NUL-terminated path.
        rc(unsafe { libc::chmod(p.as_ptr(), mode as libc::mode_t) })
    }

    pub fn utimens(&self, rel: &Path, ts: &[libc::timespec; 2]) -> io::Result<()> {
        let _ids = self.ids_for(rel)?;
        if rel.as_os_str().is_empty() {
            // STORE's root has no parent to name it in.
            let fd = self.resolve(rel, libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
            // SAFETY: valid descriptor and two timespecs.
            return rc(unsafe { libc::futimens(fd.as_raw_fd(), ts.as_ptr()) });
        }
        let a = self.at(rel)?;
        // SAFETY: valid descriptor, name, and two timespecs.
        rc(unsafe {
            libc::utimensat(
                a.fd,
                a.name.as_ptr(),
                ts.as_ptr(),
                libc::AT_SYMLINK_NOFOLLOW,
            )
        })
    }

    /// fsync of directory `rel`.
    pub fn sync_dir(&self, rel: &Path) -> io::Result<()> {
        self.open_file(rel, libc::O_RDONLY | libc::O_DIRECTORY, 0)?
            .sync_all()
    }

    /// Runs `f` on the `/proc/self/fd` link of `rel` opened `O_PATH |
    /// O_NOFOLLOW` (the file itself, never a path looked up again), as the
    /// caller: the xattr calls have no `*at()` form.
    fn via_proc<T>(&self, rel: &Path, f: impl FnOnce(&CString) -> io::Result<T>) -> io::Result<T> {
        let _ids = self.ids_for(rel)?;
        let fd = self.resolve(rel, libc::O_PATH | libc::O_NOFOLLOW, 0)?;
        let p = cstr(OsStr::new(&format!("/proc/self/fd/{}", fd.as_raw_fd())))?;
        f(&p)
    }

    /// The value of extended attribute `name` of `rel`.
    pub fn getxattr(&self, rel: &Path, name: &OsStr) -> io::Result<Vec<u8>> {
        let n = cstr(name)?;
        self.via_proc(rel, |p| {
            read_sized(|buf, len| {
                // SAFETY: NUL-terminated path and name; `buf` is writable
                // for `len` bytes (or null with `len` 0).
                unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf, len) }
            })
        })
    }

    /// The extended attribute names of `rel`, each NUL-terminated.
    pub fn listxattr(&self, rel: &Path) -> io::Result<Vec<u8>> {
        self.via_proc(rel, |p| {
            read_sized(|buf, len| {
                // SAFETY: NUL-terminated path; `buf` is writable for `len`
                // bytes (or null with `len` 0).
                unsafe { libc::listxattr(p.as_ptr(), buf as *mut libc::c_char, len) }
            })
        })
    }

    pub fn setxattr(&self, rel: &Path, name: &OsStr, value: &[u8], flags: i32) -> io::Result<()> {
        let n = cstr(name)?;
        self.via_proc(rel, |p| {
            // SAFETY: NUL-terminated path and name; `value` is readable for
            // its length.
            rc(unsafe {
                libc::setxattr(
                    p.as_ptr(),
                    n.as_ptr(),
                    value.as_ptr() as *const libc::c_void,
                    value.len(),
                    flags,
                )
            })
        })
    }

    pub fn removexattr(&self, rel: &Path, name: &OsStr) -> io::Result<()> {
        let n = cstr(name)?;
        self.via_proc(rel, |p| {
            // SAFETY: NUL-terminated path and name.
            rc(unsafe { libc::removexattr(p.as_ptr(), n.as_ptr()) })
        })
    }

    pub fn statvfs(&self) -> io::Result<libc::statvfs> {
        // SAFETY: statvfs is plain old data; all-zero bytes are valid.
        let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: valid descriptor and a writable statvfs.
        rc(unsafe { libc::fstatvfs(self.root.as_raw_fd(), &mut s) })?;
        Ok(s)
    }
}

/// Calls a `getxattr`-style function first for the size, then with a
/// buffer of it, again if the value grew in between (ERANGE).
fn read_sized(mut call: impl FnMut(*mut libc::c_void, usize) -> isize) -> io::Result<Vec<u8>> {
    loop {
        let n = call(std::ptr::null_mut(), 0);
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut buf = vec![0u8; n as usize];
        let m = call(buf.as_mut_ptr() as *mut libc::c_void, buf.len());
        if m >= 0 {
            buf.truncate(m as usize);
            return Ok(buf);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ERANGE) {
            return Err(e);
        }
    }
}

//! A real ckptfs mount for integration tests: a temp store, a temp
//! mountpoint, the built binary in the foreground as a child process, and a
//! Drop guard that always unmounts (aborting a wedged connection if it must).

use super::bin;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn mounted(mnt: &Path) -> bool {
    let want = mnt.to_string_lossy().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(want.as_str()))
}

/// The entries of `store`'s spool but the daemon's writer lock and its
/// list of families to settle (no staged data), sorted.
pub fn spool_entries(store: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(store.join(".ckptfs-spool"))
        .map(|d| {
            d.map(|e| e.unwrap().file_name().into_string().unwrap())
                .filter(|n| n != "writer.lock" && n != "family.pending")
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

pub struct Mount {
    pub dir: tempfile::TempDir,
    pub store: PathBuf,
    /// What `ckptfs mount` is given as STORE instead of `store` (a URL).
    pub arg: Option<PathBuf>,
    pub mnt: PathBuf,
    pub child: Option<Child>,
    pub log: PathBuf,
}

impl Mount {
    /// Mounts a fresh store that `fill` populates, in the foreground.
    pub fn new(fill: impl FnOnce(&Path), extra: &[&str]) -> Mount {
        Mount::of(fill, None, extra, &[], None)
    }

    /// As `new`, with the daemon started under a soft limit of `n` open
    /// files (its hard limit unchanged).
    pub fn with_soft_nofile(fill: impl FnOnce(&Path), n: u64) -> Mount {
        Mount::of(fill, None, &[], &[], Some(n))
    }

    /// As `new`, with `env` added to the daemon's environment (test
    /// hooks such as `CKPTFS_TEST_PAUSE`; a remount does not get them).
    pub fn with_env(fill: impl FnOnce(&Path), extra: &[&str], env: &[(&str, &str)]) -> Mount {
        Mount::of(fill, None, extra, env, None)
    }

    /// A mount of `store_arg` (an `s3://` URL) instead of `store`, which
    /// `fill` still fills (with the originals, say).
    pub fn of_store_arg(fill: impl FnOnce(&Path), store_arg: &str, extra: &[&str]) -> Mount {
        Mount::of(fill, Some(store_arg), extra, &[], None)
    }

    fn of(
        fill: impl FnOnce(&Path),
        store_arg: Option<&str>,
        extra: &[&str],
        env: &[(&str, &str)],
        soft_nofile: Option<u64>,
    ) -> Mount {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("store");
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&store).unwrap();
        std::fs::create_dir(&mnt).unwrap();
        fill(&store);
        let mnt = mnt.canonicalize().unwrap();
        let log = dir.path().join("daemon.log");
        let arg = store_arg.map(PathBuf::from);
        let mut cmd = Command::new(bin());
        if let Some(n) = soft_nofile {
            use std::os::unix::process::CommandExt;
            // SAFETY: getrlimit and setrlimit are async-signal-safe and
            // touch only this child.
            unsafe {
                cmd.pre_exec(move || {
                    let mut l = libc::rlimit {
                        rlim_cur: 0,
                        rlim_max: 0,
                    };
                    if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    l.rlim_cur = n.min(l.rlim_max);
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &l) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let child = cmd
            .arg("mount")
            .arg(arg.as_ref().unwrap_or(&store))
            .arg(&mnt)
            .arg("--foreground")
            .args(extra)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(std::fs::File::options().append(true).open(&log).unwrap())
            .spawn()
            .expect("start ckptfs mount");
        let mut m = Mount {
            dir,
            store,
            arg,
            mnt,
            child: Some(child),
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !mounted(&m.mnt) {
            if let Some(st) = m.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("ckptfs mount exited ({st}): {}", m.log_text());
            }
            assert!(
                Instant::now() < deadline,
                "mount did not come up: {}",
                m.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        m
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Unmounts and waits for the daemon; returns its exit status.
    pub fn unmount(&mut self) -> Option<std::process::ExitStatus> {
        let mut child = self.child.take()?;
        let out = Command::new(bin()).arg("umount").arg(&self.mnt).output();
        if !out.is_ok_and(|o| o.status.success()) {
            let _ = Command::new(bin())
                .args(["umount", "--lazy"])
                .arg(&self.mnt)
                .output();
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(st) = child.try_wait().unwrap() {
                return Some(st);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Mount {
    /// Kills the daemon with SIGKILL (no cleanup at all) and detaches the
    /// dead mount.
    pub fn kill9(&mut self) {
        let mut child = self.child.take().expect("running");
        child.kill().unwrap();
        child.wait().unwrap();
        let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        assert!(!mounted(&self.mnt), "dead mount still attached");
    }

    /// Mounts the same store at the same place again, in the foreground.
    pub fn remount(&mut self, extra: &[&str]) {
        assert!(self.child.is_none(), "unmount first");
        let child = Command::new(bin())
            .arg("mount")
            .arg(self.arg.as_ref().unwrap_or(&self.store))
            .arg(&self.mnt)
            .arg("--foreground")
            .args(extra)
            .stdin(Stdio::null())
            .stdout(
                std::fs::File::options()
                    .append(true)
                    .open(&self.log)
                    .unwrap(),
            )
            .stderr(
                std::fs::File::options()
                    .append(true)
                    .open(&self.log)
                    .unwrap(),
            )
            .spawn()
            .expect("start ckptfs mount");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !mounted(&self.mnt) {
            if let Some(st) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("ckptfs mount exited ({st}): {}", self.log_text());
            }
            assert!(Instant::now() < deadline, "remount did not come up");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The staged files and records in STORE's spool (not the writer lock
    /// the daemon holds there).
    pub fn spool_entries(&self) -> Vec<String> {
        spool_entries(&self.store)
    }

    /// Writes `bytes` as `rel` in the mount (making its directories) and
    /// waits for the commit. Panics after `secs`.
    pub fn save(&self, rel: &str, bytes: &[u8], secs: u64) {
        let p = self.path(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, bytes).unwrap();
        self.wait_committed(secs);
    }

    /// `rel` in the mount, read whole (a failure panics with the log).
    pub fn read(&self, rel: &str) -> Vec<u8> {
        std::fs::read(self.path(rel)).unwrap_or_else(|e| panic!("{rel}: {e}: {}", self.log_text()))
    }

    /// Waits until the daemon's log holds `what` `n` times (say
    /// "family settled": one a family settled). Panics after `secs`.
    pub fn wait_logged(&self, what: &str, n: usize, secs: u64) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while self.log_text().matches(what).count() < n {
            assert!(
                Instant::now() < deadline,
                "never {n}x {what:?} in {secs} s: {}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until STORE holds no staged file (every write compressed or
    /// put back). Panics after `secs`.
    pub fn wait_committed(&self, secs: u64) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let left = spool_entries(&self.store);
            if left.is_empty() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "spool not empty after {secs} s ({left:?}): {}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        self.unmount();
        if mounted(&self.mnt) {
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
    }
}

/// A page-aligned buffer for O_DIRECT.
pub struct Aligned {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

impl Aligned {
    pub fn new(len: usize) -> Aligned {
        let layout = std::alloc::Layout::from_size_align(len, 4096).unwrap();
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null());
        Aligned { ptr, layout }
    }
    pub fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: ptr is a live allocation of layout.size() bytes we own.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.layout.size()) }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout in `new`.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

//! What a new user trips on when mounting (issue 46): a non-empty
//! mountpoint, STORE and MOUNTPOINT swapped, `umount` of what is not
//! mounted, `umount` that must find the daemon from the mount, the modes
//! of what the daemon creates, a `.blz` copied into the mount.

use crate::common;

use common::{bin, ckptfs, vectors_dir, Mount};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn mounted(mnt: &Path) -> bool {
    let want = mnt.to_string_lossy().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(want.as_str()))
}

/// Detaches `mnt` when dropped, whatever the test did.
struct Detach(std::path::PathBuf);
impl Drop for Detach {
    fn drop(&mut self) {
        if mounted(&self.0) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
}

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

#[test]
fn a_non_empty_mountpoint_or_swapped_arguments_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let store = d.path().join("store");
    let mnt = d.path().join("mnt");
    std::fs::create_dir_all(store.join(".ckptfs-spool")).unwrap();
    std::fs::copy(vectors_dir().join("tiny.zstn"), store.join("tiny.zstn")).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    std::fs::write(mnt.join("notes.txt"), b"mine").unwrap();
    let _g = Detach(mnt.canonicalize().unwrap());
    let log = d.path().join("m.log");
    let (s, m, l) = (
        store.to_str().unwrap(),
        mnt.to_str().unwrap(),
        log.to_str().unwrap(),
    );
    // Non-empty: refused, in the background and in the foreground.
    for extra in [&[][..], &["--foreground"][..]] {
        let out = ckptfs(&[&["mount", s, m, "--read-only", "--log-file", l], extra].concat());
        let e = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{e}");
        assert!(e.contains("mnt: not empty"), "{e}");
        assert!(e.contains("--allow-nonempty"), "{e}");
        assert!(!mounted(&mnt), "{e}");
    }
    // Swapped: the "mountpoint" is a store (it has a spool). Refused even
    // with --allow-nonempty, and nothing is created in either directory.
    let empty = d.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let out = ckptfs(&[
        "mount",
        empty.to_str().unwrap(),
        s,
        "--allow-nonempty",
        "--log-file",
        l,
    ]);
    let e = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{e}");
    assert!(
        e.contains("holds .ckptfs-spool, so it is a ckptfs store"),
        "{e}"
    );
    assert!(e.contains("the arguments are STORE MOUNTPOINT"), "{e}");
    assert_eq!(std::fs::read_dir(&empty).unwrap().count(), 0);
    // --allow-nonempty mounts over what is there, which shows again after.
    let out = ckptfs(&[
        "mount",
        s,
        m,
        "--read-only",
        "--allow-nonempty",
        "--log-file",
        l,
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        std::fs::read(mnt.join("tiny.safetensors")).unwrap(),
        std::fs::read(vectors_dir().join("tiny.safetensors")).unwrap()
    );
    assert!(!mnt.join("notes.txt").exists());
    // A STORE that is a ckptfs mount is refused.
    let other = d.path().join("other");
    std::fs::create_dir(&other).unwrap();
    let out = ckptfs(&["mount", m, other.to_str().unwrap(), "--read-only"]);
    let e = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{e}");
    assert!(e.contains("mnt: a ckptfs mount, not a store"), "{e}");
    let out = ckptfs(&["umount", m]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(std::fs::read(mnt.join("notes.txt")).unwrap(), b"mine");
}

#[test]
fn umount_of_what_is_not_mounted_says_so() {
    let d = tempfile::tempdir().unwrap();
    let out = ckptfs(&["umount", d.path().to_str().unwrap()]);
    let e = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{e}");
    assert!(e.contains(": not a mount point"), "{e}");
    assert!(!e.contains("Invalid argument"), "{e}");
}

/// `ckptfs umount` run with another state directory than the daemon's
/// (another user's environment, a sudo without -E, a systemd unit) still
/// finds the daemon from the mount and returns only once it has committed
/// what was written and exited.
#[test]
fn umount_finds_the_daemon_from_the_mount_and_waits_for_its_write_back() {
    let mut m = Mount::new(|_| {}, &[]);
    let payload = std::fs::read(vectors_dir().join("bf16_dense.safetensors")).unwrap();
    for i in 0..4 {
        std::fs::write(m.path(&format!("w{i}.safetensors")), &payload).unwrap();
    }
    let elsewhere = tempfile::tempdir().unwrap();
    let out = Command::new(bin())
        .args(["umount"])
        .arg(&m.mnt)
        .env("XDG_STATE_HOME", elsewhere.path())
        .env("HOME", elsewhere.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    // Returned only after the daemon exited: it is already reaped-able.
    let st = m.child.as_mut().unwrap().try_wait().unwrap();
    assert!(st.is_some(), "umount returned while the daemon still ran");
    m.child = None;
    for i in 0..4 {
        assert!(m.store.join(format!("w{i}.zstn")).is_file(), "w{i}.zstn");
    }
    assert!(m.spool_entries().is_empty(), "{:?}", m.spool_entries());
}

/// The daemon runs with umask 0 (modes of created files arrive with the
/// caller's umask applied): whatever it creates itself has an explicit
/// mode. Run here under umask 0 as well, so nothing inherited hides it.
#[test]
fn what_the_daemon_creates_has_explicit_modes() {
    let d = tempfile::tempdir().unwrap();
    let store = d.path().join("store");
    let mnt = d.path().join("mnt");
    std::fs::create_dir(&store).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    let _g = Detach(mnt.canonicalize().unwrap());
    let state = d.path().join("home/.local/state");
    let mut cmd = Command::new(bin());
    cmd.arg("mount")
        .arg(&store)
        .arg(&mnt)
        .env("XDG_STATE_HOME", &state);
    // SAFETY: umask is async-signal-safe and touches only this child.
    unsafe {
        cmd.pre_exec(|| {
            libc::umask(0);
            Ok(())
        });
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    // A directory the daemon must recreate in STORE (removed behind the
    // mount's back while a file in it was staged).
    std::fs::create_dir(mnt.join("run")).unwrap();
    let payload = std::fs::read(vectors_dir().join("tiny.safetensors")).unwrap();
    let mut f = std::fs::File::create(mnt.join("run/x.safetensors")).unwrap();
    std::io::Write::write_all(&mut f, &payload).unwrap();
    std::fs::remove_dir(store.join("run")).unwrap();
    drop(f);
    let out = ckptfs(&["umount", mnt.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(store.join("run/x.zstn").is_file());
    assert_eq!(
        mode(&store.join("run")),
        0o755,
        "directory recreated in STORE"
    );
    let own = state.join("ckptfs");
    assert_eq!(mode(&d.path().join("home")), 0o755);
    assert_eq!(mode(&d.path().join("home/.local")), 0o755);
    assert_eq!(mode(&state), 0o755);
    assert_eq!(mode(&own), 0o700);
    assert_eq!(mode(&store.join(".ckptfs-spool")), 0o700);
    assert_eq!(mode(&store.join(".ckptfs-spool/writer.lock")), 0o600);
    let mut names = Vec::new();
    for e in std::fs::read_dir(&own).unwrap() {
        let p = e.unwrap().path();
        assert_eq!(mode(&p), 0o600, "{}", p.display());
        names.push(p.file_name().unwrap().to_string_lossy().into_owned());
    }
    assert_eq!(names.len(), 1, "only the log: {names:?}");
    assert!(names[0].ends_with(".log"), "{names:?}");
}

#[test]
fn a_blz_copied_into_the_mount_is_refused_with_a_log_line_saying_where_it_goes() {
    let m = Mount::new(|_| {}, &[]);
    let e = std::fs::write(m.path("model.blz"), b"BLZ").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EPERM));
    let log = m.log_text();
    assert!(
        log.contains("refusing to create \"model.blz\"")
            && log.contains("copy an archive into the store directory"),
        "{log}"
    );
}

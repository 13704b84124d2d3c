//! Real-mount tests: a user who can write into STORE directly must not get
//! the daemon (root) to act outside what they may do themselves. The
//! attack (issue 17): with `--allow-other`, make a directory through the
//! mount, hold a handle on it, then in STORE swap it for a symlink to a
//! root-only directory, and work through the handle and through paths.
//!
//! Each operation is run as `nobody` (uid 65534) by a small Python helper
//! and must be refused. The errno is ELOOP when the daemon meets the
//! swapped-in symlink (it never resolves one in STORE), or whatever the
//! caller's kernel answers first (ENOENT for a name the daemon cannot
//! look up, EACCES/EPERM from the caller's own identity, EOPNOTSUPP for
//! xattrs the mount does not store, ENOTDIR for the symlink presented
//! where a directory was). A directory handle opened before the swap
//! still lists what it listed then. The root-only directory must be
//! left exactly as it was. Needs root and /dev/fuse, as CI provides.

use crate::common;

use common::{run_as_nobody, Mount, NOBODY};
use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Every entry under `dir`: (relative path, mode, uid, contents).
fn snapshot(dir: &Path) -> BTreeMap<String, (u32, u32, Vec<u8>)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            let data = if m.is_file() {
                std::fs::read(&p).unwrap()
            } else {
                Vec::new()
            };
            if m.is_dir() {
                stack.push(p.clone());
            }
            let rel = p.strip_prefix(dir).unwrap().display().to_string();
            out.insert(rel, (m.mode(), m.uid(), data));
        }
    }
    out
}

const ATTACK: &str = r#"
import errno, os, sys
mnt, store = sys.argv[1], sys.argv[2]
u = os.path.join(mnt, "shared", "u")
os.mkdir(u)
d = os.open(u, os.O_RDONLY | os.O_DIRECTORY)
os.rename(os.path.join(store, "shared", "u"), os.path.join(store, "shared", "u.old"))
os.symlink(os.path.join(store, "secret"), os.path.join(store, "shared", "u"))

def attempt(name, f):
    try:
        r = f()
        if isinstance(r, int) and name.startswith("open"):
            os.close(r)
        print(name, "ok", repr(r)[:60])
    except OSError as e:
        print(name, errno.errorcode.get(e.errno, str(e.errno)))

attempt("openat_creat", lambda: os.open("x", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=d))
attempt("open_creat_path", lambda: os.open(os.path.join(u, "y"), os.O_CREAT | os.O_WRONLY, 0o644))
attempt("open_creat_staged", lambda: os.open(os.path.join(u, "w.safetensors"), os.O_CREAT | os.O_WRONLY, 0o644))
attempt("mkdirat", lambda: os.mkdir("z", dir_fd=d))
attempt("mkdir_path", lambda: os.mkdir(os.path.join(u, "z2")))
attempt("unlinkat", lambda: os.unlink("victim", dir_fd=d))
attempt("unlink_path", lambda: os.unlink(os.path.join(u, "victim")))
attempt("rmdirat", lambda: os.rmdir("sub", dir_fd=d))
attempt("renameat", lambda: os.rename("victim", "moved", src_dir_fd=d, dst_dir_fd=d))
attempt("rename_out", lambda: os.rename(os.path.join(u, "victim"), os.path.join(mnt, "shared", "stolen")))
attempt("chmodat", lambda: os.chmod("victim", 0o666, dir_fd=d))
attempt("chmod_path", lambda: os.chmod(os.path.join(u, "victim"), 0o666))
attempt("truncate_path", lambda: os.truncate(os.path.join(u, "victim"), 0))
attempt("utime_path", lambda: os.utime(os.path.join(u, "victim"), (0, 0)))
attempt("setxattr", lambda: os.setxattr(os.path.join(u, "victim"), "user.x", b"1"))
attempt("removexattr", lambda: os.removexattr(os.path.join(u, "victim"), "user.x"))
attempt("link_out", lambda: os.link(os.path.join(u, "victim"), os.path.join(mnt, "shared", "hl")))
attempt("linkat_in", lambda: os.link("victim", "hl2", src_dir_fd=d, dst_dir_fd=d))
attempt("symlinkat", lambda: os.symlink("/", "sl", dir_fd=d))
attempt("read_path", lambda: open(os.path.join(u, "readable.txt"), "rb").read())
attempt("read_at", lambda: os.read(os.open("readable.txt", os.O_RDONLY, dir_fd=d), 100))
attempt("listdir_fd", lambda: os.listdir(d))
attempt("listdir_path", lambda: os.listdir(u))
attempt("stat_at", lambda: os.stat("victim", dir_fd=d, follow_symlinks=False).st_size)
"#;

#[test]
fn symlink_swapped_into_store_gives_no_access_to_root_only_files() {
    let mut m = Mount::new(
        |s| {
            let secret = s.join("secret");
            std::fs::create_dir(&secret).unwrap();
            std::fs::write(secret.join("victim"), b"root's").unwrap();
            chmod(&secret.join("victim"), 0o644);
            std::fs::write(secret.join("readable.txt"), b"root only").unwrap();
            chmod(&secret.join("readable.txt"), 0o644);
            std::fs::create_dir(secret.join("sub")).unwrap();
            chmod(&secret, 0o700);
            // Shared, as /tmp is: anyone may add entries.
            std::fs::create_dir(s.join("shared")).unwrap();
            chmod(&s.join("shared"), 0o1777);
            chmod(s, 0o755);
        },
        &["--allow-other"],
    );
    chmod(m.dir.path(), 0o755);
    let secret = m.store.join("secret");
    let before = snapshot(&secret);

    let out = run_as_nobody(ATTACK, &[&m.mnt, &m.store]);
    let mut results = BTreeMap::new();
    for line in out.lines() {
        let mut w = line.split_whitespace();
        results.insert(w.next().unwrap().to_string(), w.next().unwrap().to_string());
    }
    assert!(results.len() >= 20, "helper output: {out}");
    let allowed = [
        "ELOOP",
        "EACCES",
        "EPERM",
        "ENOENT",
        "EOPNOTSUPP",
        "ENOTSUP",
        "ENODATA",
        "ENOTDIR",
    ];
    for (op, r) in &results {
        if op == "listdir_fd" {
            // Listed at opendir, before the swap: the user's own empty
            // directory, nothing of the root-only one.
            assert!(out.contains("listdir_fd ok []"), "{out}");
            continue;
        }
        assert!(
            allowed.contains(&r.as_str()),
            "{op}: not refused ({r}); helper output:\n{out}"
        );
    }
    // The daemon never went through the symlink: nothing changed in the
    // root-only directory.
    assert_eq!(snapshot(&secret), before);
    // The user's own directory, moved aside, is still theirs.
    let old = std::fs::metadata(m.store.join("shared/u.old")).unwrap();
    assert_eq!(old.uid(), NOBODY);
    m.unmount();
}

#[test]
fn allow_other_creates_as_the_caller_and_refuses_what_the_caller_may_not() {
    let mut m = Mount::new(
        |s| {
            std::fs::create_dir(s.join("shared")).unwrap();
            chmod(&s.join("shared"), 0o1777);
            std::fs::create_dir(s.join("rootdir")).unwrap();
            chmod(&s.join("rootdir"), 0o755);
            chmod(s, 0o755);
        },
        &["--allow-other"],
    );
    chmod(m.dir.path(), 0o755);
    let out = run_as_nobody(
        r#"
import errno, os, sys
mnt = sys.argv[1]
os.mkdir(os.path.join(mnt, "shared", "mine"))
with open(os.path.join(mnt, "shared", "mine", "f.txt"), "w") as f:
    f.write("x")
try:
    open(os.path.join(mnt, "rootdir", "no.txt"), "w")
    print("rootdir ok")
except OSError as e:
    print("rootdir", errno.errorcode[e.errno])
"#,
        &[&m.mnt],
    );
    assert_eq!(out.trim(), "rootdir EACCES");
    for p in ["shared/mine", "shared/mine/f.txt"] {
        let st = std::fs::metadata(m.store.join(p)).unwrap();
        assert_eq!((st.uid(), st.gid()), (NOBODY, NOBODY), "{p}");
    }
    assert!(!m.store.join("rootdir/no.txt").exists());
    m.unmount();
}

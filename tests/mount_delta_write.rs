//! `ckptfs mount --delta auto` (issue 14): checkpoints saved into the
//! mount are stored as deltas (`X.z4dm`) against the previous step, read
//! back exact (and after a remount); unlinking, overwriting and renaming a
//! base keeps every dependent exact and `ckptfs verify STORE` green;
//! `kill -9` during a delta commit, a rewrite of a dependent and a rename
//! loses nothing.
//!
//! Needs root and /dev/fuse, as the other mount tests.

use crate::common;

use common::{
    ckptfs, gauss_bf16, gauss_f32, getxattr, names, run_as_nobody, safetensors_file, verify_ok,
    Mount, Rng,
};
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

const DELTA: &[&str] = &["--delta", "auto"];

/// A training run: tensors in bf16 and fp32; each step changes a few of
/// them (a small update on every element), the rest stay.
struct Run {
    rng: Rng,
    tensors: Vec<(String, &'static str, Vec<u64>, Vec<u8>)>,
    step: usize,
}

impl Run {
    fn new(seed: u64) -> Run {
        let mut rng = Rng(seed | 1);
        let mut tensors = Vec::new();
        for i in 0..8 {
            if i % 2 == 0 {
                let v = gauss_bf16(&mut rng, 1 << 16, 0.02);
                tensors.push((format!("l{i}.w"), "BF16", vec![256, 256], v));
            } else {
                let v = gauss_f32(&mut rng, 1 << 15, 0.02);
                tensors.push((format!("l{i}.w"), "F32", vec![128, 256], v));
            }
        }
        Run {
            rng,
            tensors,
            step: 0,
        }
    }

    fn bytes(&self) -> Vec<u8> {
        let t: Vec<(&str, &str, Vec<u64>, Vec<u8>)> = self
            .tensors
            .iter()
            .map(|(n, d, s, b)| (n.as_str(), *d, s.clone(), b.clone()))
            .collect();
        safetensors_file(&t, None)
    }

    /// The next step: two tensors get a small update.
    fn advance(&mut self) {
        self.step += 1;
        for k in 0..2 {
            let i = (self.step * 3 + k * 5) % self.tensors.len();
            let t = &mut self.tensors[i];
            let w = if t.1 == "BF16" { 2 } else { 4 };
            for e in t.3.chunks_mut(w) {
                if self.rng.below(3) == 0 {
                    // Flip a low mantissa bit: a learning-rate-sized step.
                    e[0] ^= 1 << self.rng.below(3);
                }
            }
        }
    }
}

fn setxattr(p: &Path, name: &str, value: &str) {
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    let n = CString::new(name).unwrap();
    // SAFETY: NUL-terminated path and name; the value is valid for its length.
    let r = unsafe {
        libc::setxattr(
            c.as_ptr(),
            n.as_ptr(),
            value.as_ptr() as *const libc::c_void,
            value.len(),
            0,
        )
    };
    assert_eq!(
        r,
        0,
        "setxattr {}: {}",
        p.display(),
        std::io::Error::last_os_error()
    );
}

/// Saves `bytes` as `rel` naming `base` (`user.ckptfs.base`, relative to
/// its directory): a delta against it. Does not wait.
fn write_based(m: &Mount, rel: &str, bytes: &[u8], base: &str) {
    use std::io::Write;
    let p = m.path(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    let mut f = std::fs::File::create(&p).unwrap();
    setxattr(&p, "user.ckptfs.base", base);
    f.write_all(bytes).unwrap();
}

/// [`write_based`], then waits for the commit.
fn save_based(m: &Mount, rel: &str, bytes: &[u8], base: &str) {
    write_based(m, rel, bytes, base);
    m.wait_committed(120);
}

/// Issue 47: the newest checkpoint standalone, older ones reverse deltas
/// against their successor, a keyframe every 4 (`FAMILY_DEPTH` 3).
#[test]
fn ten_checkpoints_are_deltas_and_read_back_exact() {
    let mut m = Mount::new(|_| {}, DELTA);
    let mut run = Run::new(5);
    let mut want = Vec::new();
    for step in 0..10 {
        let b = run.bytes();
        m.save(&format!("step-{step}/model.safetensors"), &b, 120);
        m.wait_logged("family settled", step + 1, 120);
        want.push(b);
        run.advance();
    }
    let standalone = std::fs::metadata(m.store.join("step-9/model.zstn"))
        .unwrap()
        .len();
    let mut delta_bytes = 0;
    // step: its base step and its real depth (None: standalone).
    let layout = [
        Some((1, 3)),
        Some((2, 2)),
        Some((3, 1)),
        None,
        Some((5, 3)),
        Some((6, 2)),
        Some((7, 1)),
        None,
        Some((9, 1)),
        None,
    ];
    for (step, l) in layout.iter().enumerate() {
        let d = m.store.join(format!("step-{step}"));
        let p = m.path(&format!("step-{step}/model.safetensors"));
        let Some((base, depth)) = l else {
            assert_eq!(
                names(&d),
                vec!["model.zstn"],
                "step {step}: {}",
                m.log_text()
            );
            continue;
        };
        assert_eq!(
            names(&d),
            vec!["model.z4dm"],
            "step {step}: {}",
            m.log_text()
        );
        // `du` counts the delta's own stored bytes.
        let du = std::fs::metadata(&p).unwrap().blocks() * 512;
        let stored = std::fs::metadata(d.join("model.z4dm")).unwrap().len();
        assert!(
            du >= stored && du < stored + 8192,
            "du {du}, stored {stored}"
        );
        assert!(
            stored * 2 < standalone,
            "step {step}: {stored} vs {standalone}"
        );
        delta_bytes += stored;
        let b = getxattr(&p, "user.ckptfs.base").unwrap();
        assert!(
            b.starts_with(&format!("../step-{base}/")),
            "step {step}: {b}"
        );
        let o = ckptfs(&["info", d.join("model.z4dm").to_str().unwrap()]);
        let info = String::from_utf8_lossy(&o.stdout);
        assert!(
            info.contains(&format!("chain depth {depth})")),
            "step {step}: {info}"
        );
    }
    eprintln!("10 checkpoints: standalone {standalone} bytes each, 7 deltas {delta_bytes} bytes");
    let v = verify_ok(&m.store);
    assert!(v.contains("10 archives verified, 0 failed"), "{v}");
    assert_eq!(v.matches("base content matches").count(), 7, "{v}");
    // Each family's layout: its full file, then the chain under it.
    for f in [
        "FAMILY step-3/model.zstn <- step-2/model.z4dm <- step-1/model.z4dm <- step-0/model.z4dm\n",
        "FAMILY step-7/model.zstn <- step-6/model.z4dm <- step-5/model.z4dm <- step-4/model.z4dm\n",
        "FAMILY step-9/model.zstn <- step-8/model.z4dm\n",
    ] {
        assert!(v.contains(f), "{f}: {v}");
    }
    for (step, w) in want.iter().enumerate() {
        let got = std::fs::read(m.path(&format!("step-{step}/model.safetensors"))).unwrap();
        assert!(got == *w, "step {step} differs");
    }
    m.unmount();
    m.remount(&[]);
    for (step, w) in want.iter().enumerate() {
        let got = std::fs::read(m.path(&format!("step-{step}/model.safetensors"))).unwrap();
        assert!(got == *w, "step {step} differs after a remount");
    }
}

#[test]
fn the_base_xattr_picks_the_base_and_without_delta_nothing_changes() {
    let mut m = Mount::new(|_| {}, DELTA);
    let mut run = Run::new(9);
    let a = run.bytes();
    m.save("run/x/model.safetensors", &a, 120);
    run.advance();
    let b = run.bytes();
    m.save("run/y/model.safetensors", &b, 120);
    run.advance();
    // x is now a delta against y (its successor, in the background).
    m.wait_logged("family settled", 2, 120);
    let c = run.bytes();
    // Without the xattr, c would be stored standalone.
    let p = m.path("run/z/model.safetensors");
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&p).unwrap();
        f.write_all(&c).unwrap();
        setxattr(&p, "user.ckptfs.base", "../x/model.safetensors");
        f.flush().unwrap();
    }
    m.wait_committed(120);
    assert_eq!(names(&m.store.join("run/z")), vec!["model.z4dm"]);
    assert_eq!(
        getxattr(&p, "user.ckptfs.base").as_deref(),
        Some("../x/model.z4dm")
    );
    assert!(std::fs::read(&p).unwrap() == c);
    // A file with nothing in common is stored standalone.
    let other = safetensors_file(&[("q", "F32", vec![4], vec![1; 16])], None);
    m.save("run/w/model.safetensors", &other, 120);
    assert_eq!(names(&m.store.join("run/w")), vec!["model.zstn"]);
    verify_ok(&m.store);
    // Without --delta: standalone.
    m.unmount();
    m.remount(&[]);
    m.save("run/v/model.safetensors", &c, 120);
    assert_eq!(names(&m.store.join("run/v")), vec!["model.zstn"]);
}

/// step-0 <- step-1 <- step-2 (forward deltas, each naming its base),
/// returning the three files.
fn chain(m: &Mount, seed: u64) -> Vec<Vec<u8>> {
    let mut run = Run::new(seed);
    let mut want = Vec::new();
    for step in 0..3 {
        let b = run.bytes();
        let rel = format!("step-{step}/model.safetensors");
        match step {
            0 => m.save(&rel, &b, 120),
            _ => save_based(
                m,
                &rel,
                &b,
                &format!("../step-{}/model.safetensors", step - 1),
            ),
        }
        want.push(b);
        run.advance();
    }
    assert_eq!(names(&m.store.join("step-2")), vec!["model.z4dm"]);
    want
}

#[test]
fn unlink_overwrite_and_rename_of_bases_keep_dependents() {
    let m = Mount::new(|_| {}, DELTA);
    let want = chain(&m, 21);
    // A directory rename: both relations cross it.
    std::fs::rename(m.path("step-1"), m.path("step-1b")).unwrap();
    assert_eq!(m.read("step-1b/model.safetensors"), want[1]);
    assert_eq!(m.read("step-2/model.safetensors"), want[2]);
    assert_eq!(
        getxattr(&m.path("step-2/model.safetensors"), "user.ckptfs.base").as_deref(),
        Some("../step-1b/model.z4dm")
    );
    verify_ok(&m.store);
    // A file rename of the root base.
    std::fs::rename(
        m.path("step-0/model.safetensors"),
        m.path("step-0/renamed.safetensors"),
    )
    .unwrap();
    assert_eq!(
        getxattr(&m.path("step-1b/model.safetensors"), "user.ckptfs.base").as_deref(),
        Some("../step-0/renamed.zstn")
    );
    verify_ok(&m.store);
    // Overwriting the root base (O_TRUNC, then commit): the old one is
    // released; in the background step-1b is made standalone, step-2 now
    // depends on that.
    let fresh = Run::new(99).bytes();
    m.save("step-0/renamed.safetensors", &fresh, 120);
    m.wait_logged("released base removed", 1, 300);
    assert_eq!(names(&m.store.join("step-1b")), vec!["model.zstn"]);
    assert_eq!(
        getxattr(&m.path("step-2/model.safetensors"), "user.ckptfs.base").as_deref(),
        Some("../step-1b/model.zstn")
    );
    // Its recorded depth is the real one again (it was 2).
    let o = ckptfs(&["info", m.store.join("step-2/model.z4dm").to_str().unwrap()]);
    let info = String::from_utf8_lossy(&o.stdout);
    assert!(info.contains("chain depth 1)"), "{info}");
    assert_eq!(m.read("step-0/renamed.safetensors"), fresh);
    assert_eq!(m.read("step-1b/model.safetensors"), want[1]);
    assert_eq!(m.read("step-2/model.safetensors"), want[2]);
    verify_ok(&m.store);
    // Unlinking a base.
    std::fs::remove_file(m.path("step-1b/model.safetensors")).unwrap();
    m.wait_logged("released base removed", 2, 300);
    assert_eq!(names(&m.store.join("step-2")), vec!["model.zstn"]);
    assert_eq!(m.read("step-2/model.safetensors"), want[2]);
    verify_ok(&m.store);
    // Renaming another file onto a base.
    let mut run = Run::new(21);
    run.advance();
    run.advance();
    run.advance();
    let s3 = run.bytes();
    save_based(
        &m,
        "step-3/model.safetensors",
        &s3,
        "../step-2/model.safetensors",
    );
    assert_eq!(names(&m.store.join("step-3")), vec!["model.z4dm"]);
    m.save("other/model.safetensors", &fresh, 120);
    std::fs::rename(
        m.path("other/model.safetensors"),
        m.path("step-2/model.safetensors"),
    )
    .unwrap();
    assert_eq!(m.read("step-2/model.safetensors"), fresh);
    assert_eq!(m.read("step-3/model.safetensors"), s3);
    verify_ok(&m.store);
}

#[test]
fn kill_9_during_a_delta_commit_loses_nothing() {
    let mut m = Mount::with_env(|_| {}, DELTA, &[("CKPTFS_TEST_PAUSE", "delta-commit")]);
    let mut run = Run::new(31);
    let a = run.bytes();
    m.save("step-0/model.safetensors", &a, 120);
    run.advance();
    let b = run.bytes();
    write_based(
        &m,
        "step-1/model.safetensors",
        &b,
        "../step-0/model.safetensors",
    );
    m.wait_logged("test hook: paused at delta-commit", 1, 120);
    m.kill9();
    // The delta is in place and the staged copy still there.
    assert_eq!(names(&m.store.join("step-1")), vec!["model.z4dm"]);
    assert!(!m.spool_entries().is_empty());
    m.remount(DELTA);
    assert_eq!(m.read("step-1/model.safetensors"), b);
    m.wait_committed(120);
    assert_eq!(names(&m.store.join("step-1")), vec!["model.z4dm"]);
    assert_eq!(m.read("step-0/model.safetensors"), a);
    assert_eq!(m.read("step-1/model.safetensors"), b);
    verify_ok(&m.store);
}

#[test]
fn kill_9_while_a_dependent_is_rewritten_loses_nothing() {
    let mut m = Mount::with_env(|_| {}, DELTA, &[("CKPTFS_TEST_PAUSE", "release")]);
    let want = chain(&m, 41);
    // The unlink returns at once: step-0 is released to the spool; the
    // background pauses with step-1's standalone copy installed next to
    // its delta.
    std::fs::remove_file(m.path("step-0/model.safetensors")).unwrap();
    m.wait_logged("test hook: paused at release", 1, 120);
    m.kill9();
    assert_eq!(
        names(&m.store.join("step-1")),
        vec!["model.z4dm", "model.zstn"]
    );
    m.remount(DELTA);
    m.wait_logged("released base removed", 1, 300);
    assert_eq!(names(&m.store.join("step-1")), vec!["model.zstn"]);
    assert!(!m.path("step-0/model.safetensors").exists());
    assert_eq!(m.read("step-1/model.safetensors"), want[1]);
    assert_eq!(m.read("step-2/model.safetensors"), want[2]);
    verify_ok(&m.store);
}

#[test]
fn kill_9_during_a_rename_of_a_base_loses_nothing() {
    let mut m = Mount::with_env(|_| {}, DELTA, &[("CKPTFS_TEST_PAUSE", "rename")]);
    let want = chain(&m, 51);
    let (from, to) = (m.path("step-1"), m.path("moved"));
    let mv = std::thread::spawn(move || std::fs::rename(from, to));
    m.wait_logged("test hook: paused at rename", 1, 120);
    m.kill9();
    let _ = mv.join();
    // The rename happened; the trailers are rewritten at the next start.
    assert!(m.store.join("moved/model.z4dm").exists());
    m.remount(&[]);
    assert_eq!(m.read("step-0/model.safetensors"), want[0]);
    assert_eq!(m.read("moved/model.safetensors"), want[1]);
    assert_eq!(m.read("step-2/model.safetensors"), want[2]);
    assert!(m.spool_entries().is_empty(), "{:?}", m.spool_entries());
    verify_ok(&m.store);
}

/// As nobody: writes standard input's bytes (a file given as argv[2]) to
/// argv[1], naming argv[3] (when given) as its base first.
const WRITE: &str = r#"
import os, sys
data = open(sys.argv[2], "rb").read()
fd = os.open(sys.argv[1], os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
if len(sys.argv) > 3:
    os.setxattr(sys.argv[1], "user.ckptfs.base", sys.argv[3].encode())
os.write(fd, data)
os.close(fd)
"#;

/// As nobody: the SHA-256 of argv[1], or the errno name reading it.
const DIGEST: &str = r#"
import errno, hashlib, sys
try:
    print(hashlib.sha256(open(sys.argv[1], "rb").read()).hexdigest())
except OSError as e:
    print(errno.errorcode.get(e.errno, str(e.errno)))
"#;

fn sha256_hex(b: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

/// Issue 40, item 4: a delta's base must be a file its writer may read
/// and that the writer or root owns, whether the writer names it
/// (`user.ckptfs.base`) or the mount picks it; otherwise the size of the
/// delta would tell the writer whether its bytes equal a file it may not
/// read.
#[test]
fn a_base_the_writer_may_not_read_or_does_not_own_is_never_used() {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mut m = Mount::new(|_| {}, &["--delta", "auto", "--allow-other"]);
    let chmod = |p: &Path, mode| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap()
    };
    // Nobody reaches the mountpoint and may create under run/.
    chmod(m.dir.path(), 0o755);
    std::fs::create_dir(m.path("run")).unwrap();
    chmod(&m.path("run"), 0o777);
    let mut run = Run::new(21);
    // Root's private checkpoint.
    let secret = run.bytes();
    std::fs::create_dir(m.path("run/secret")).unwrap();
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(m.path("run/secret/model.safetensors"))
            .unwrap();
        f.write_all(&secret).unwrap();
    }
    m.wait_committed(120);
    assert_eq!(names(&m.store.join("run/secret")), vec!["model.zstn"]);
    // Nobody names it as the base of a file equal to it but for one step
    // (and it is also the newest sibling of the same name, the automatic
    // choice).
    run.advance();
    let mine = run.bytes();
    let tmp = tempfile::tempdir().unwrap();
    chmod(tmp.path(), 0o755);
    let src = tmp.path().join("mine");
    std::fs::write(&src, &mine).unwrap();
    chmod(&src, 0o644);
    std::fs::create_dir(m.path("run/mine")).unwrap();
    chmod(&m.path("run/mine"), 0o777);
    let target = m.path("run/mine/model.safetensors");
    run_as_nobody(
        WRITE,
        &[&target, &src, Path::new("../secret/model.safetensors")],
    );
    m.wait_committed(120);
    assert_eq!(
        names(&m.store.join("run/mine")),
        vec!["model.zstn"],
        "stored against a base nobody may not read: {}",
        m.log_text()
    );
    assert!(
        m.log_text().contains("is not a base this file may have"),
        "{}",
        m.log_text()
    );
    assert_eq!(run_as_nobody(DIGEST, &[&target]).trim(), sha256_hex(&mine));
    // Root's next step: stored standalone; an earlier file becomes a
    // delta against it only where its owner may read it.
    run.advance();
    let roots = run.bytes();
    m.save("run/root/model.safetensors", &roots, 120);
    m.wait_logged("family settled", 3, 120);
    assert_eq!(
        names(&m.store.join("run/root")),
        vec!["model.zstn"],
        "{}",
        m.log_text()
    );
    // Whatever became a delta is one against root's newest file, which its
    // owner may read; root's secret never became nobody's base.
    for d in ["secret", "mine"] {
        if let Some(b) = getxattr(
            &m.path(&format!("run/{d}/model.safetensors")),
            "user.ckptfs.base",
        ) {
            assert_eq!(b, "../root/model.zstn", "{d}: {}", m.log_text());
        }
    }
    // Every file reads back for its owner, also after a remount.
    m.unmount();
    m.remount(&["--delta", "auto", "--allow-other"]);
    assert_eq!(run_as_nobody(DIGEST, &[&target]).trim(), sha256_hex(&mine));
    assert_eq!(
        run_as_nobody(DIGEST, &[&m.path("run/secret/model.safetensors")]).trim(),
        "EACCES"
    );
    assert!(std::fs::read(m.path("run/root/model.safetensors")).unwrap() == roots);
    assert!(std::fs::read(m.path("run/secret/model.safetensors")).unwrap() == secret);
}

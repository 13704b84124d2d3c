//! Restarting a writable mount, as a service restart or a remount does:
//! `ckptfs umount` waits until the daemon has compressed what was written
//! and exited, a store has at most one writable daemon (the second is
//! refused naming the first's pid; a killed daemon's lock is taken over),
//! read-only mounts run beside the writer, and no listing hides a file.

use crate::common;

use common::{bin, gauss_bf16, safetensors_file, ModelDir, Rng};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// The CLI as a user runs it, with its state (logs) in `state`.
fn cli(state: &Path, args: &[&std::ffi::OsStr]) -> Output {
    Command::new(bin())
        .args(args)
        .env("XDG_STATE_HOME", state)
        .output()
        .expect("run ckptfs")
}

struct Env {
    _dir: tempfile::TempDir,
    state: PathBuf,
    store: PathBuf,
    mnt: PathBuf,
}

impl Env {
    fn new() -> Env {
        let dir = tempfile::tempdir().unwrap();
        let (state, store, mnt) = (
            dir.path().join("state"),
            dir.path().join("store"),
            dir.path().join("mnt"),
        );
        for d in [&state, &store, &mnt] {
            std::fs::create_dir(d).unwrap();
        }
        let mnt = mnt.canonicalize().unwrap();
        Env {
            _dir: dir,
            state,
            store,
            mnt,
        }
    }
    fn mount_at(&self, mnt: &Path, extra: &[&str]) -> Output {
        let mut a: Vec<&std::ffi::OsStr> =
            vec!["mount".as_ref(), self.store.as_os_str(), mnt.as_os_str()];
        a.extend(extra.iter().map(|s| std::ffi::OsStr::new(*s)));
        cli(&self.state, &a)
    }
    /// Mounts in the background; returns the daemon's pid, as `ckptfs
    /// mount` prints it ("... (pid N); log: ...").
    fn mount(&self) -> u32 {
        let o = self.mount_at(&self.mnt, &[]);
        assert!(o.status.success(), "mount: {}", text(&o));
        let out = String::from_utf8_lossy(&o.stdout);
        out.split_once("(pid ")
            .and_then(|(_, r)| r.split_once(')'))
            .and_then(|(n, _)| n.parse().ok())
            .unwrap_or_else(|| panic!("no pid in {out:?}"))
    }
    fn umount_at(&self, mnt: &Path) {
        let o = cli(&self.state, &["umount".as_ref(), mnt.as_os_str()]);
        assert!(o.status.success(), "umount: {}", text(&o));
    }
    fn logs(&self) -> String {
        let mut s = String::new();
        for e in std::fs::read_dir(self.state.join("ckptfs")).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "log") {
                s.push_str(&std::fs::read_to_string(p).unwrap());
            }
        }
        s
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
    }
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Every regular file below `root` (relative path -> bytes), found by
/// listing directories, as `find` and rsync do.
fn walk(root: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let rel = p.strip_prefix(root).unwrap().to_path_buf();
                out.insert(rel, std::fs::read(&p).unwrap());
            }
        }
    }
    out
}

/// Whether process `pid` runs (a zombie has exited).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit_once(')')
            .and_then(|(_, r)| r.split_whitespace().next())
            != Some("Z")
    })
}

#[test]
fn umount_then_mount_again_twenty_times_loses_and_hides_nothing() {
    let env = Env::new();
    let src = tempfile::tempdir().unwrap();
    let mut rng = Rng(16);
    let mut files = Vec::new();
    for i in 0..4 {
        let data = gauss_bf16(&mut rng, 1 << 20, 0.02);
        let f = safetensors_file(&[("w", "BF16", vec![1024, 1024], data)], None);
        let p = src.path().join(format!("m{i}.safetensors"));
        std::fs::write(&p, f).unwrap();
        files.push(p);
    }
    let model = src.path().join("llama");
    std::fs::create_dir(&model).unwrap();
    ModelDir {
        seed: 5,
        embed: [4096, 256],
        twin: true,
        edge_cases: false,
    }
    .write(&model);
    // What one round writes, relative to its directory.
    let mut want = BTreeMap::new();
    for (i, p) in files.iter().enumerate() {
        want.insert(
            PathBuf::from(format!("m{i}.safetensors")),
            std::fs::read(p).unwrap(),
        );
    }
    for (rel, bytes) in walk(&model) {
        want.insert(Path::new("llama").join(rel), bytes);
    }
    for round in 0..20 {
        let pid = env.mount();
        let dir = env.mnt.join(format!("r{round}"));
        std::fs::create_dir(&dir).unwrap();
        for (i, p) in files.iter().enumerate() {
            std::fs::copy(p, dir.join(format!("m{i}.safetensors"))).unwrap();
        }
        let st = Command::new("cp")
            .arg("-r")
            .arg(&model)
            .arg(dir.join("llama"))
            .status()
            .unwrap();
        assert!(st.success());
        let t = Instant::now();
        env.umount_at(&env.mnt);
        // umount returned only once the daemon had exited: nothing runs,
        // nothing is left staged.
        assert!(!alive(pid), "round {round}: the daemon outlives umount");
        let spool: Vec<_> = std::fs::read_dir(env.store.join(".ckptfs-spool"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .filter(|n| n != "writer.lock")
            .collect();
        assert!(
            spool.is_empty(),
            "round {round}: spool after umount: {spool:?}"
        );
        let waited = t.elapsed();
        env.mount();
        let got = walk(&env.mnt);
        for r in 0..=round {
            for (k, v) in &want {
                let p = Path::new(&format!("r{r}")).join(k);
                let g = got.get(&p);
                assert!(
                    g.is_some(),
                    "round {round}: {} not listed ({waited:?})",
                    p.display()
                );
                assert!(g == Some(v), "round {round}: {} differs", p.display());
            }
        }
        env.umount_at(&env.mnt);
    }
    let logs = env.logs();
    for l in logs.lines() {
        assert!(
            !l.contains("ERROR") && !l.contains("WARN") && !l.contains("failed"),
            "daemon log: {l}"
        );
    }
    // Everything written was compressed: the store holds archives.
    let zstn = walk(&env.store)
        .keys()
        .filter(|p| p.extension().is_some_and(|x| x == "zstn"))
        .count();
    assert!(zstn >= 20 * 4, "{zstn} archives");
}

#[test]
fn one_writable_daemon_per_store_readers_beside_it() {
    let env = Env::new();
    std::fs::write(env.store.join("a.txt"), b"hello").unwrap();
    let pid = env.mount();
    // A second writable mount of the same store, elsewhere: refused, one
    // line naming the holder.
    let other = env.state.parent().unwrap().join("mnt2");
    std::fs::create_dir(&other).unwrap();
    let o = env.mount_at(&other, &[]);
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.contains(&format!("pid {pid}")) && e.contains("in use") && e.lines().count() == 1,
        "{e}"
    );
    // The same in the foreground (the daemon's own check).
    let o = env.mount_at(&other, &["--foreground"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains(&format!("pid {pid}")));
    // A read-only mount beside the writer works and sees its files.
    let o = env.mount_at(&other, &["--read-only"]);
    assert!(o.status.success(), "{}", text(&o));
    std::fs::write(env.mnt.join("b.txt"), b"from the writer").unwrap();
    assert_eq!(
        std::fs::read(other.join("b.txt")).unwrap(),
        b"from the writer"
    );
    env.umount_at(&other);
    env.umount_at(&env.mnt);
}

#[test]
fn a_killed_daemons_lock_is_taken_over() {
    let env = Env::new();
    let pid = env.mount();
    let mut rng = Rng(3);
    let f = safetensors_file(
        &[(
            "w",
            "BF16",
            vec![512, 512],
            gauss_bf16(&mut rng, 1 << 18, 0.02),
        )],
        None,
    );
    std::fs::write(env.mnt.join("x.safetensors"), &f).unwrap();
    // SAFETY: kill has no memory effects.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    while Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = Command::new("umount").arg("-l").arg(&env.mnt).status();
    // The lock went with the killed daemon.
    env.mount();
    assert_eq!(std::fs::read(env.mnt.join("x.safetensors")).unwrap(), f);
    env.umount_at(&env.mnt);
}

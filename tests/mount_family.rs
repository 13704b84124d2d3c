//! Checkpoint families under `ckptfs mount --delta auto` (issue 47): the
//! newest checkpoint standalone, older ones reverse deltas against their
//! successor, rewritten in the background. Retention (deleting the
//! oldest) rewrites nothing; readers racing the rewriter read exact bytes;
//! `kill -9` during a rewrite loses nothing; the predecessor is chosen by
//! content, not by modification time.
//!
//! Checkpoints of 16 MiB (bf16, blocks of 1 MiB). Needs root and
//! /dev/fuse, as the other mount tests.

use crate::common;

use common::{ckptfs, gauss_bf16, getxattr, safetensors_file, Mount, Rng};
use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const DELTA: &[&str] = &["--delta", "auto"];

/// A training run of four bf16 tensors of 4 MiB: the first stays frozen,
/// the others move by a low mantissa bit on a third of their elements.
struct Run {
    rng: Rng,
    tensors: Vec<Vec<u8>>,
}

impl Run {
    fn new(seed: u64) -> Run {
        let mut rng = Rng(seed | 1);
        let tensors = (0..4)
            .map(|_| gauss_bf16(&mut rng, 2 << 20, 0.02))
            .collect();
        Run { rng, tensors }
    }

    fn bytes(&self) -> Vec<u8> {
        let names = ["embed", "l0.w", "l1.w", "head"];
        let t: Vec<(&str, &str, Vec<u64>, Vec<u8>)> = self
            .tensors
            .iter()
            .zip(names)
            .map(|(b, n)| (n, "BF16", vec![2048, 1024], b.clone()))
            .collect();
        safetensors_file(&t, None)
    }

    fn advance(&mut self) {
        for t in &mut self.tensors[1..] {
            for e in t.chunks_mut(2) {
                if self.rng.below(3) == 0 {
                    e[0] ^= 1 << self.rng.below(3);
                }
            }
        }
    }
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

fn save(m: &Mount, rel: &str, bytes: &[u8]) {
    let p = m.path(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(&p, bytes).unwrap();
    m.wait_committed(300);
}

fn wait_families(m: &Mount, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(300);
    while m.log_text().matches("family settled").count() < n {
        assert!(Instant::now() < deadline, "{}", m.log_text());
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn wait_log(m: &Mount, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(300);
    while !m.log_text().contains(what) {
        assert!(
            Instant::now() < deadline,
            "never logged {what:?}: {}",
            m.log_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn read(m: &Mount, rel: &str) -> Vec<u8> {
    std::fs::read(m.path(rel)).unwrap_or_else(|e| panic!("{rel}: {e}: {}", m.log_text()))
}

fn verify_ok(store: &Path) -> String {
    let o = ckptfs(&["verify", store.to_str().unwrap()]);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "verify STORE failed:\n{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

/// Every regular file under `dir` with its identity, size and mtime.
fn stamps(dir: &Path) -> HashMap<PathBuf, (u64, u64, i64, i64)> {
    let mut out = HashMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.file_name().is_some_and(|n| n == ".ckptfs-spool") {
                continue;
            }
            let m = std::fs::symlink_metadata(&p).unwrap();
            if m.is_dir() {
                stack.push(p);
            } else {
                out.insert(p, (m.ino(), m.len(), m.mtime(), m.mtime_nsec()));
            }
        }
    }
    out
}

/// The checkpoints kept, with their bytes, shared with the readers.
type Kept = Arc<Mutex<Vec<(String, Arc<Vec<u8>>)>>>;

/// A training run keeping its last 4 checkpoints, with readers reading
/// every kept checkpoint in a loop meanwhile: all reads exact; each
/// deletion is of a leaf, rewrites nothing, and leaves every other stored
/// file as it was.
#[test]
fn retention_deletes_leaves_and_readers_racing_the_rewriter_read_exact() {
    let m = Arc::new(Mount::new(|_| {}, DELTA));
    let kept: Kept = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicUsize::new(0));
    let readers: Vec<_> = (0..2)
        .map(|k| {
            let (m, kept, stop, reads) = (m.clone(), kept.clone(), stop.clone(), reads.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let list = kept.lock().unwrap().clone();
                    for (rel, want) in list.iter().rev().skip(k) {
                        match std::fs::read(m.path(rel)) {
                            Ok(got) => assert!(got == **want, "{rel} differs: {}", m.log_text()),
                            // Deleted by the retention meanwhile.
                            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                            Err(e) => panic!("{rel}: {e}: {}", m.log_text()),
                        }
                        reads.fetch_add(1, Ordering::Relaxed);
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
            })
        })
        .collect();
    let mut run = Run::new(7);
    let mut slowest = Duration::ZERO;
    for step in 0..8 {
        let b = Arc::new(run.bytes());
        let rel = format!("checkpoint-{step}/model.safetensors");
        save(&m, &rel, &b);
        kept.lock().unwrap().push((rel, b));
        run.advance();
        if step >= 4 {
            let old = step - 4;
            // Settled first, so that nothing else changes STORE meanwhile.
            wait_families(&m, step + 1);
            let before = stamps(&m.store);
            let t0 = Instant::now();
            std::fs::remove_dir_all(m.path(&format!("checkpoint-{old}"))).unwrap();
            slowest = slowest.max(t0.elapsed());
            kept.lock().unwrap().remove(0);
            let after = stamps(&m.store);
            for (p, s) in &after {
                assert_eq!(before.get(p), Some(s), "{} changed by the rm", p.display());
            }
            assert!(after.len() < before.len());
        }
    }
    wait_families(&m, 8);
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        r.join().unwrap();
    }
    eprintln!(
        "{} reads raced the rewriter; slowest rm -rf {:.3} s",
        reads.load(Ordering::Relaxed),
        slowest.as_secs_f64()
    );
    assert!(
        !m.log_text().contains("rebased off released"),
        "{}",
        m.log_text()
    );
    // The last 4 kept: checkpoint-7 standalone, 6, 5, 4 deltas behind it.
    assert_eq!(names(&m.store.join("checkpoint-7")), vec!["model.zstn"]);
    for (step, base) in [(4, 5), (5, 6), (6, 7)] {
        assert_eq!(
            names(&m.store.join(format!("checkpoint-{step}"))),
            vec!["model.z4dm"],
            "{}",
            m.log_text()
        );
        let b = getxattr(
            &m.path(&format!("checkpoint-{step}/model.safetensors")),
            "user.ckptfs.base",
        );
        let kind = if base == 7 { "zstn" } else { "z4dm" };
        assert_eq!(b, Some(format!("../checkpoint-{base}/model.{kind}")));
    }
    for (rel, want) in kept.lock().unwrap().iter() {
        assert!(read(&m, rel) == **want, "{rel}");
    }
    verify_ok(&m.store);
}

/// `kill -9` while a predecessor is being rewritten as a delta (its
/// `.z4dm` installed, its `.zstn` not yet removed): every file exact after
/// a remount, and the family goes on.
#[test]
fn kill_9_during_a_family_rewrite_loses_nothing() {
    let mut m = Mount::with_env(|_| {}, DELTA, &[("CKPTFS_TEST_PAUSE", "family")]);
    let mut run = Run::new(11);
    let mut want = Vec::new();
    for step in 0..2 {
        let b = run.bytes();
        save(&m, &format!("step-{step}/model.safetensors"), &b);
        want.push(b);
        run.advance();
    }
    wait_log(&m, "test hook: paused at family");
    m.kill9();
    assert_eq!(
        names(&m.store.join("step-0")),
        vec!["model.z4dm", "model.zstn"]
    );
    m.remount(DELTA);
    for (i, w) in want.iter().enumerate() {
        assert!(
            read(&m, &format!("step-{i}/model.safetensors")) == *w,
            "step {i}"
        );
    }
    // The new daemon removes the shadowed delta (step-0 standalone again)
    // and settles step-1's family, which the killed one left unsettled.
    wait_log(&m, "left shadowed by an interrupted rewrite; removed");
    wait_log(
        &m,
        "step-1/model.safetensors: family left to settle by an earlier daemon",
    );
    wait_families(&m, 2);
    assert_eq!(
        names(&m.store.join("step-0")),
        vec!["model.z4dm"],
        "{}",
        m.log_text()
    );
    verify_ok(&m.store);
    // The family goes on: step-1 becomes a delta against step-2; the old
    // checkpoint is deleted whole.
    let b = run.bytes();
    save(&m, "step-2/model.safetensors", &b);
    want.push(b);
    // The log holds step-0's settling from before the kill too.
    wait_families(&m, 3);
    assert_eq!(
        names(&m.store.join("step-1")),
        vec!["model.z4dm"],
        "{}",
        m.log_text()
    );
    std::fs::remove_dir_all(m.path("step-0")).unwrap();
    for (i, w) in want.iter().enumerate().skip(1) {
        assert!(
            read(&m, &format!("step-{i}/model.safetensors")) == *w,
            "step {i}"
        );
    }
    verify_ok(&m.store);
    m.unmount();
    m.remount(&[]);
    for (i, w) in want.iter().enumerate().skip(1) {
        assert!(
            read(&m, &format!("step-{i}/model.safetensors")) == *w,
            "step {i}"
        );
    }
}

/// The predecessor is the family member most like the new checkpoint by
/// content: a newer file of the same name and tensors but other bytes is
/// passed over, and left standalone.
#[test]
fn the_predecessor_is_chosen_by_content_not_by_time() {
    let m = Mount::new(|_| {}, DELTA);
    let mut run = Run::new(13);
    let a = run.bytes();
    save(&m, "run/a/model.safetensors", &a);
    // Same names, dtypes and shapes; unrelated bytes; saved later.
    let mut rng = Rng(99);
    let mut other = Run::new(5);
    for t in &mut other.tensors {
        for x in t.iter_mut() {
            *x = rng.next() as u8;
        }
    }
    let b = other.bytes();
    save(&m, "run/b/model.safetensors", &b);
    wait_families(&m, 2);
    run.advance();
    let c = run.bytes();
    save(&m, "run/c/model.safetensors", &c);
    wait_families(&m, 3);
    assert_eq!(
        names(&m.store.join("run/a")),
        vec!["model.z4dm"],
        "{}",
        m.log_text()
    );
    assert_eq!(
        getxattr(&m.path("run/a/model.safetensors"), "user.ckptfs.base").as_deref(),
        Some("../c/model.zstn")
    );
    assert_eq!(names(&m.store.join("run/b")), vec!["model.zstn"]);
    assert_eq!(names(&m.store.join("run/c")), vec!["model.zstn"]);
    assert!(read(&m, "run/a/model.safetensors") == a);
    assert!(read(&m, "run/b/model.safetensors") == b);
    assert!(read(&m, "run/c/model.safetensors") == c);
    let o = ckptfs(&["info", m.store.join("run/a/model.z4dm").to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("chain depth 1)"));
    verify_ok(&m.store);
}

/// A checkpoint saved sharded between unsharded ones: once the next
/// unsharded one is committed, both shards and the unsharded one before
/// them are stored as deltas against it (each shard's tensors are all in
/// it), and every file reads back exact.
#[test]
fn shards_and_the_checkpoint_before_them_become_deltas() {
    let m = Mount::new(|_| {}, DELTA);
    let mut run = Run::new(17);
    let s0 = run.bytes();
    save(&m, "c-0/model.safetensors", &s0);
    run.advance();
    let names4 = ["embed", "l0.w", "l1.w", "head"];
    let shard = |run: &Run, part: std::ops::Range<usize>| {
        let t: Vec<(&str, &str, Vec<u64>, Vec<u8>)> = part
            .map(|i| (names4[i], "BF16", vec![2048, 1024], run.tensors[i].clone()))
            .collect();
        safetensors_file(&t, None)
    };
    let (a, b) = (shard(&run, 0..2), shard(&run, 2..4));
    save(&m, "c-1/model-00001-of-00002.safetensors", &a);
    save(&m, "c-1/model-00002-of-00002.safetensors", &b);
    wait_families(&m, 3);
    // Neither shard holds c-0's tensors: c-0 stays standalone for now.
    assert_eq!(names(&m.store.join("c-0")), vec!["model.zstn"]);
    run.advance();
    let s2 = run.bytes();
    save(&m, "c-2/model.safetensors", &s2);
    wait_families(&m, 4);
    assert_eq!(
        names(&m.store.join("c-1")),
        vec!["model-00001-of-00002.z4dm", "model-00002-of-00002.z4dm"],
        "{}",
        m.log_text()
    );
    assert_eq!(
        names(&m.store.join("c-0")),
        vec!["model.z4dm"],
        "{}",
        m.log_text()
    );
    assert_eq!(names(&m.store.join("c-2")), vec!["model.zstn"]);
    assert_eq!(
        getxattr(
            &m.path("c-1/model-00002-of-00002.safetensors"),
            "user.ckptfs.base"
        )
        .as_deref(),
        Some("../c-2/model.zstn")
    );
    assert!(read(&m, "c-0/model.safetensors") == s0);
    assert!(read(&m, "c-1/model-00001-of-00002.safetensors") == a);
    assert!(read(&m, "c-1/model-00002-of-00002.safetensors") == b);
    assert!(read(&m, "c-2/model.safetensors") == s2);
    verify_ok(&m.store);
}

/// Families still queued when the daemon is unmounted are settled by the
/// next daemon, not dropped.
#[test]
fn families_queued_at_unmount_are_settled_at_the_next_mount() {
    let mut m = Mount::with_env(|_| {}, DELTA, &[("CKPTFS_TEST_DELAY", "settle:4000")]);
    let mut run = Run::new(19);
    let mut want = Vec::new();
    for step in 0..2 {
        let b = run.bytes();
        save(&m, &format!("step-{step}/model.safetensors"), &b);
        want.push(b);
        run.advance();
    }
    // Both committed; the family thread is still waiting before settling
    // step-0's family when the mount goes away.
    m.unmount();
    assert_eq!(names(&m.store.join("step-0")), vec!["model.zstn"]);
    let pending = std::fs::read(m.store.join(".ckptfs-spool/family.pending")).unwrap();
    assert!(
        String::from_utf8_lossy(&pending).contains("step-1/model.safetensors"),
        "{pending:?}"
    );
    m.remount(DELTA);
    wait_log(&m, "step-1/model.safetensors: family settled");
    assert_eq!(
        names(&m.store.join("step-0")),
        vec!["model.z4dm"],
        "{}",
        m.log_text()
    );
    assert!(!m.store.join(".ckptfs-spool/family.pending").exists());
    for (i, w) in want.iter().enumerate() {
        assert!(
            read(&m, &format!("step-{i}/model.safetensors")) == *w,
            "step {i}"
        );
    }
    verify_ok(&m.store);
}

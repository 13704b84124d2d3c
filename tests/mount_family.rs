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

use common::{
    ckptfs, getxattr, names, safetensors_file, stamps, verify_ok, Mount, Rng, TrainingRun,
};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const DELTA: &[&str] = &["--delta", "auto"];

/// Saves the next `n` checkpoints of `run` as `step-K/model.safetensors`
/// (K from 0); returns their bytes.
fn save_steps(m: &Mount, run: &mut TrainingRun, n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|step| {
            let b = run.bytes();
            m.save(&format!("step-{step}/model.safetensors"), &b, 300);
            run.advance();
            b
        })
        .collect()
}

/// Asserts that `step-K/model.safetensors` reads as `want[K]` for every K
/// from `from` on.
fn assert_steps(m: &Mount, want: &[Vec<u8>], from: usize) {
    for (i, w) in want.iter().enumerate().skip(from) {
        assert!(
            m.read(&format!("step-{i}/model.safetensors")) == *w,
            "step {i}"
        );
    }
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
    let mut run = TrainingRun::new(7);
    let mut slowest = Duration::ZERO;
    for step in 0..8 {
        let b = Arc::new(run.bytes());
        let rel = format!("checkpoint-{step}/model.safetensors");
        m.save(&rel, &b, 300);
        kept.lock().unwrap().push((rel, b));
        run.advance();
        if step >= 4 {
            let old = step - 4;
            // Settled first, so that nothing else changes STORE meanwhile.
            m.wait_logged("family settled", step + 1, 300);
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
    m.wait_logged("family settled", 8, 300);
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
        assert!(m.read(rel) == **want, "{rel}");
    }
    verify_ok(&m.store);
}

/// `kill -9` while a predecessor is being rewritten as a delta (its
/// `.z4dm` installed, its `.zstn` not yet removed): every file exact after
/// a remount, and the family goes on.
#[test]
fn kill_9_during_a_family_rewrite_loses_nothing() {
    let mut m = Mount::with_env(|_| {}, DELTA, &[("CKPTFS_TEST_PAUSE", "family")]);
    let mut run = TrainingRun::new(11);
    let mut want = save_steps(&m, &mut run, 2);
    m.wait_logged("test hook: paused at family", 1, 300);
    m.kill9();
    assert_eq!(
        names(&m.store.join("step-0")),
        vec!["model.z4dm", "model.zstn"]
    );
    m.remount(DELTA);
    assert_steps(&m, &want, 0);
    // The new daemon removes the shadowed delta (step-0 standalone again)
    // and settles step-1's family, which the killed one left unsettled.
    m.wait_logged("left shadowed by an interrupted rewrite; removed", 1, 300);
    m.wait_logged(
        "step-1/model.safetensors: family left to settle by an earlier daemon",
        1,
        300,
    );
    m.wait_logged("family settled", 2, 300);
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
    m.save("step-2/model.safetensors", &b, 300);
    want.push(b);
    // The log holds step-0's settling from before the kill too.
    m.wait_logged("family settled", 3, 300);
    assert_eq!(
        names(&m.store.join("step-1")),
        vec!["model.z4dm"],
        "{}",
        m.log_text()
    );
    std::fs::remove_dir_all(m.path("step-0")).unwrap();
    assert_steps(&m, &want, 1);
    verify_ok(&m.store);
    m.unmount();
    m.remount(&[]);
    assert_steps(&m, &want, 1);
}

/// The predecessor is the family member most like the new checkpoint by
/// content: a newer file of the same name and tensors but other bytes is
/// passed over, and left standalone.
#[test]
fn the_predecessor_is_chosen_by_content_not_by_time() {
    let m = Mount::new(|_| {}, DELTA);
    let mut run = TrainingRun::new(13);
    let a = run.bytes();
    m.save("run/a/model.safetensors", &a, 300);
    // Same names, dtypes and shapes; unrelated bytes; saved later.
    let mut rng = Rng(99);
    let mut other = TrainingRun::new(5);
    for t in &mut other.tensors {
        for x in t.iter_mut() {
            *x = rng.next() as u8;
        }
    }
    let b = other.bytes();
    m.save("run/b/model.safetensors", &b, 300);
    m.wait_logged("family settled", 2, 300);
    run.advance();
    let c = run.bytes();
    m.save("run/c/model.safetensors", &c, 300);
    m.wait_logged("family settled", 3, 300);
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
    assert!(m.read("run/a/model.safetensors") == a);
    assert!(m.read("run/b/model.safetensors") == b);
    assert!(m.read("run/c/model.safetensors") == c);
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
    let mut run = TrainingRun::new(17);
    let s0 = run.bytes();
    m.save("c-0/model.safetensors", &s0, 300);
    run.advance();
    let names4 = ["embed", "l0.w", "l1.w", "head"];
    let shard = |run: &TrainingRun, part: std::ops::Range<usize>| {
        let t: Vec<(&str, &str, Vec<u64>, Vec<u8>)> = part
            .map(|i| (names4[i], "BF16", vec![2048, 1024], run.tensors[i].clone()))
            .collect();
        safetensors_file(&t, None)
    };
    let (a, b) = (shard(&run, 0..2), shard(&run, 2..4));
    m.save("c-1/model-00001-of-00002.safetensors", &a, 300);
    m.save("c-1/model-00002-of-00002.safetensors", &b, 300);
    m.wait_logged("family settled", 3, 300);
    // Neither shard holds c-0's tensors: c-0 stays standalone for now.
    assert_eq!(names(&m.store.join("c-0")), vec!["model.zstn"]);
    run.advance();
    let s2 = run.bytes();
    m.save("c-2/model.safetensors", &s2, 300);
    m.wait_logged("family settled", 4, 300);
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
    assert!(m.read("c-0/model.safetensors") == s0);
    assert!(m.read("c-1/model-00001-of-00002.safetensors") == a);
    assert!(m.read("c-1/model-00002-of-00002.safetensors") == b);
    assert!(m.read("c-2/model.safetensors") == s2);
    verify_ok(&m.store);
}

/// Families still queued when the daemon is unmounted are settled by the
/// next daemon, not dropped.
#[test]
fn families_queued_at_unmount_are_settled_at_the_next_mount() {
    let mut m = Mount::with_env(|_| {}, DELTA, &[("CKPTFS_TEST_DELAY", "settle:4000")]);
    let mut run = TrainingRun::new(19);
    let want = save_steps(&m, &mut run, 2);
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
    m.wait_logged("step-1/model.safetensors: family settled", 1, 300);
    assert_eq!(
        names(&m.store.join("step-0")),
        vec!["model.z4dm"],
        "{}",
        m.log_text()
    );
    assert!(!m.store.join(".ckptfs-spool/family.pending").exists());
    assert_steps(&m, &want, 0);
    verify_ok(&m.store);
}

//! Deleting a middle checkpoint of a family (issue 47): `rm` only moves
//! the base into the spool and re-points its dependents; the family
//! thread composes each dependent against the base's own base afterwards.
//! Readers racing that read exact bytes; `kill -9` during it loses
//! nothing; the released file is gone once it is done.
//!
//! Checkpoints of 16 MiB (bf16, blocks of 1 MiB). Needs root and
//! /dev/fuse, as the other mount tests.

use crate::common;

use common::{verify_ok, Mount, TrainingRun};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

const DELTA: &[&str] = &["--delta", "auto"];

/// The checkpoints of `steps` steps of a training run.
fn run(seed: u64, steps: usize) -> Vec<Vec<u8>> {
    let mut run = TrainingRun::new(seed);
    (0..steps)
        .map(|_| {
            let b = run.bytes();
            run.advance();
            b
        })
        .collect()
}

fn released(store: &Path) -> Vec<String> {
    std::fs::read_dir(store.join(".ckptfs-spool/released"))
        .map(|d| {
            d.map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect()
        })
        .unwrap_or_default()
}

/// Saves ckpt-0..n and waits until the family is settled: ckpt-(n-1)
/// standalone, the older ones deltas in a chain behind it.
fn family(m: &Mount, want: &[Vec<u8>]) {
    for (i, b) in want.iter().enumerate() {
        m.save(&format!("ckpt-{i}/model.safetensors"), b, 300);
    }
    m.wait_logged("family settled", want.len(), 300);
    for i in 0..want.len() - 1 {
        assert!(
            m.store.join(format!("ckpt-{i}/model.z4dm")).exists(),
            "ckpt-{i} is no delta: {}",
            m.log_text()
        );
    }
}

#[test]
fn rm_of_a_middle_checkpoint_returns_before_its_dependents_are_rewritten() {
    // The background waits 3 s before each release pass: the state right
    // after `rm` can be looked at.
    let m = Mount::with_env(|_| {}, DELTA, &[("CKPTFS_TEST_DELAY", "release:3000")]);
    let want = run(61, 3);
    family(&m, &want);
    // ckpt-0 → ckpt-1 → ckpt-2 (standalone). Remove the middle one.
    let t0 = Instant::now();
    std::fs::remove_file(m.path("ckpt-1/model.safetensors")).unwrap();
    let took = t0.elapsed();
    eprintln!(
        "rm of a middle 16 MiB checkpoint: {:.3} s",
        took.as_secs_f64()
    );
    assert!(
        !m.log_text().contains("rebased off released"),
        "{}",
        m.log_text()
    );
    assert_eq!(released(&m.store).len(), 1);
    assert!(m.log_text().contains("rebased in the background"));
    // Readers race the background release.
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicUsize::new(0));
    let readers: Vec<_> = [0usize, 2]
        .into_iter()
        .map(|i| {
            let (p, w) = (
                m.path(&format!("ckpt-{i}/model.safetensors")),
                want[i].clone(),
            );
            let (stop, reads) = (stop.clone(), reads.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    assert!(std::fs::read(&p).unwrap() == w, "{} differs", p.display());
                    reads.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    m.wait_logged("released base removed", 1, 300);
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        r.join().unwrap();
    }
    eprintln!("{} reads raced the release", reads.load(Ordering::Relaxed));
    let log = m.log_text();
    assert!(log.contains("rebased off released"), "{log}");
    assert!(log.contains("composed against"), "{log}");
    // ckpt-0 is still a delta, now against ckpt-2; the released file is gone.
    assert!(m.store.join("ckpt-0/model.z4dm").exists());
    assert!(released(&m.store).is_empty());
    assert!(!m.path("ckpt-1/model.safetensors").exists());
    assert_eq!(m.read("ckpt-0/model.safetensors"), want[0]);
    assert_eq!(m.read("ckpt-2/model.safetensors"), want[2]);
    verify_ok(&m.store);
}

#[test]
fn kill_9_during_the_background_release_loses_nothing() {
    let mut m = Mount::with_env(|_| {}, DELTA, &[("CKPTFS_TEST_PAUSE", "release")]);
    let want = run(71, 4);
    family(&m, &want);
    // Two middle deletes; the first release pauses after installing a
    // composed dependent, before the deltas under it are re-pointed.
    std::fs::remove_file(m.path("ckpt-2/model.safetensors")).unwrap();
    std::fs::remove_file(m.path("ckpt-1/model.safetensors")).unwrap();
    m.wait_logged("test hook: paused at release", 1, 300);
    m.kill9();
    assert!(!released(&m.store).is_empty());
    m.remount(DELTA);
    for i in [0, 3] {
        assert_eq!(m.read(&format!("ckpt-{i}/model.safetensors")), want[i]);
    }
    m.wait_logged("released base removed", 2, 300);
    assert!(released(&m.store).is_empty(), "{:?}", released(&m.store));
    for i in [0, 3] {
        assert_eq!(m.read(&format!("ckpt-{i}/model.safetensors")), want[i]);
    }
    assert!(m.store.join("ckpt-0/model.z4dm").exists());
    verify_ok(&m.store);
}

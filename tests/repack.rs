//! `ckptfs repack STORE` (issue 47): a store of forward deltas (a newer
//! checkpoint stored against an older one, as `pack --base` and the old
//! `--delta` wrote them) or of standalone files converted to the layout of
//! `mount --delta auto` (the newest of a family standalone, older ones
//! reverse deltas against their successor, a keyframe every 4), every
//! presented file exact; refused while a writable mount serves the store
//! and the other way round; `kill -9` mid-run then a re-run finishes the
//! job; a repack of a repacked store does nothing.
//!
//! Checkpoints of 16 MiB (bf16, blocks of 1 MiB). The mount parts need
//! root and /dev/fuse, as the other mount tests.

use crate::common;

use common::{ckptfs, stamps, Mount, TrainingRun};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

fn run_ok(args: &[&str]) -> String {
    let o = ckptfs(args);
    assert!(
        o.status.success(),
        "ckptfs {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Gives `p` the modification time `t0 + k` seconds (a training run's
/// checkpoints, one after the other).
fn set_mtime(p: &Path, k: u64) {
    let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + 60 * k);
    std::fs::File::options()
        .write(true)
        .open(p)
        .unwrap()
        .set_modified(t)
        .unwrap();
}

/// `n` checkpoints `step-K/model.safetensors` written into `store` as the
/// old `--delta` did: `step-0` standalone, each later one a delta against
/// the one before (`pack --base`, re-based at the chain limit); or, with
/// `forward` false, all standalone. Returns their bytes.
fn fill(store: &Path, n: usize, seed: u64, forward: bool) -> Vec<Vec<u8>> {
    fill_sized(store, n, TrainingRun::new(seed), forward)
}

/// [`fill`] with the checkpoints of `run`.
fn fill_sized(store: &Path, n: usize, mut run: TrainingRun, forward: bool) -> Vec<Vec<u8>> {
    let src = tempfile::tempdir().unwrap();
    let mut want = Vec::new();
    let mut prev: Option<PathBuf> = None;
    for k in 0..n {
        let b = run.bytes();
        let plain = src.path().join(format!("{k}.safetensors"));
        std::fs::write(&plain, &b).unwrap();
        let dir = store.join(format!("step-{k}"));
        std::fs::create_dir_all(&dir).unwrap();
        let out = match &prev {
            Some(base) if forward => {
                let out = dir.join("model.z4dm");
                run_ok(&["pack", s(&plain), "--base", s(base), "-o", s(&out)]);
                out
            }
            _ => {
                let out = dir.join("model.zstn");
                run_ok(&["pack", s(&plain), "-o", s(&out)]);
                out
            }
        };
        set_mtime(&out, k as u64);
        prev = Some(out);
        want.push(b);
        run.advance();
    }
    want
}

/// The archive presenting `step-K/model.safetensors` (`.zstn` shadows
/// `.z4dm`, as in the mount).
fn backing(store: &Path, k: usize) -> PathBuf {
    let d = store.join(format!("step-{k}"));
    ["model.zstn", "model.z4dm"]
        .iter()
        .map(|n| d.join(n))
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("step-{k}: no archive"))
}

/// Every presented checkpoint decoded with `ckptfs unpack`, equal to what
/// was written.
fn assert_exact(store: &Path, want: &[Vec<u8>]) {
    let out = tempfile::tempdir().unwrap();
    for (k, w) in want.iter().enumerate() {
        let o = out.path().join(format!("{k}.safetensors"));
        run_ok(&["unpack", s(&backing(store, k)), "-o", s(&o)]);
        assert!(std::fs::read(&o).unwrap() == *w, "step-{k} differs");
    }
}

/// Each checkpoint's archive names, in step order.
fn layout(store: &Path, n: usize) -> Vec<Vec<String>> {
    (0..n)
        .map(|k| {
            let mut v: Vec<String> = std::fs::read_dir(store.join(format!("step-{k}")))
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            v.sort();
            v
        })
        .collect()
}

fn stored_bytes(store: &Path) -> u64 {
    stamps(store).values().map(|v| v.1).sum()
}

fn verify_ok(store: &Path) -> String {
    run_ok(&["verify", s(store)])
}

fn family_lines(out: &str) -> Vec<&str> {
    out.lines().filter(|l| l.starts_with("FAMILY ")).collect()
}

/// The layout the depth rule (a chain of at most 3 deltas under a
/// keyframe) gives `n` checkpoints replayed in order: the newest
/// standalone, every 4th from it a keyframe, the rest reverse deltas
/// against their successor.
fn expected(n: usize) -> (Vec<Vec<String>>, Vec<String>) {
    let mut names = Vec::new();
    let mut lines = Vec::new();
    for k in 0..n {
        // The replay demotes k against k + 1 unless k already has 3
        // levels under it: k = 3, 7, ... counted from the oldest.
        let keyframe = k == n - 1 || k % 4 == 3;
        names.push(vec![
            if keyframe { "model.zstn" } else { "model.z4dm" }.to_string()
        ]);
    }
    let mut k = 0;
    while k < n {
        let top = (k + 3).min(n - 1);
        let mut l = format!("FAMILY step-{top}/model.zstn");
        for j in (k..top).rev() {
            l.push_str(&format!(" <- step-{j}/model.z4dm"));
        }
        if top > k {
            lines.push(l);
        }
        k = top + 1;
    }
    lines.sort();
    (names, lines)
}

/// Repacks `store` of `n` checkpoints `want` and checks the result: the
/// expected layout, exact files, `verify` passing with the same FAMILY
/// lines as the repack's summary. Returns (summary, seconds).
fn repack_and_check(store: &Path, want: &[Vec<u8>]) -> (String, f64) {
    let n = want.len();
    let t0 = Instant::now();
    let out = run_ok(&["repack", s(store)]);
    let secs = t0.elapsed().as_secs_f64();
    let (names, lines) = expected(n);
    assert_eq!(layout(store, n), names, "{out}");
    let mut got: Vec<String> = family_lines(&out).iter().map(|l| l.to_string()).collect();
    got.sort();
    assert_eq!(got, lines, "{out}");
    let v = verify_ok(store);
    let mut vl: Vec<&str> = family_lines(&v);
    vl.sort();
    assert_eq!(vl, got, "verify and repack disagree:\n{v}\n{out}");
    assert_exact(store, want);
    (out, secs)
}

/// A second repack of a repacked store finds nothing to do and changes
/// no file.
fn assert_second_repack_does_nothing(store: &Path) {
    let before = stamps(store);
    let out = run_ok(&["repack", s(store)]);
    assert!(out.contains("nothing to do"), "{out}");
    assert_eq!(stamps(store), before, "{out}");
    let dry = run_ok(&["repack", "--dry-run", s(store)]);
    assert!(dry.contains(", 0 steps; dry run"), "{dry}");
}

#[test]
fn the_expected_layout_follows_the_depth_rule() {
    let (names, lines) = expected(6);
    let z = |s: &str| vec![s.to_string()];
    assert_eq!(
        names,
        vec![
            z("model.z4dm"),
            z("model.z4dm"),
            z("model.z4dm"),
            z("model.zstn"),
            z("model.z4dm"),
            z("model.zstn")
        ]
    );
    assert_eq!(
        lines,
        vec![
            "FAMILY step-3/model.zstn <- step-2/model.z4dm <- step-1/model.z4dm <- step-0/model.z4dm",
            "FAMILY step-5/model.zstn <- step-4/model.z4dm",
        ]
    );
}

/// Eight checkpoints stored as forward deltas: after the repack the
/// newest is standalone, older ones reverse deltas, a keyframe every 4;
/// every file exact; a second repack does nothing.
#[test]
fn forward_deltas_become_reverse_deltas_with_keyframes() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let want = fill(&store, 8, 3, true);
    assert_eq!(layout(&store, 8)[7], vec!["model.z4dm"]);
    verify_ok(&store);
    let before = stored_bytes(&store);
    let dry = run_ok(&["repack", "--dry-run", s(&store)]);
    assert!(
        dry.contains("step-7/model.z4dm made standalone: a forward delta"),
        "{dry}"
    );
    assert!(dry.contains("1 family (8 checkpoints), 14 steps"), "{dry}");
    assert_eq!(stamps(&store).len(), 8, "a dry run changes nothing");
    let (out, secs) = repack_and_check(&store, &want);
    let after = stored_bytes(&store);
    eprintln!("forward deltas, 8 x 16 MiB: {before} -> {after} bytes in {secs:.2} s\n{out}");
    assert!(
        out.contains("8 checkpoints: 2 standalone, 6 deltas"),
        "{out}"
    );
    assert_second_repack_does_nothing(&store);
}

/// Six standalone checkpoints: the repacked store is smaller, every file
/// exact.
#[test]
fn standalone_checkpoints_become_a_family_and_the_store_shrinks() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let want = fill(&store, 6, 5, false);
    let before = stored_bytes(&store);
    let (out, secs) = repack_and_check(&store, &want);
    let after = stored_bytes(&store);
    eprintln!("standalone, 6 x 16 MiB: {before} -> {after} bytes in {secs:.2} s\n{out}");
    assert!(after < before, "{before} -> {after}");
    assert!(
        out.contains(&format!("archives {before} -> {after} bytes")),
        "{out}"
    );
    assert_second_repack_does_nothing(&store);
}

/// Checkpoints of 80 MiB, above repack's 64 MiB block cache: the family
/// is made, every file exact.
#[test]
fn checkpoints_above_the_cache_size_are_repacked_exact() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let want = fill_sized(&store, 3, TrainingRun::sized(23, 10 << 20), false);
    assert!(want[0].len() > 64 << 20);
    let before = stored_bytes(&store);
    let (out, secs) = repack_and_check(&store, &want);
    let after = stored_bytes(&store);
    eprintln!("standalone, 3 x 80 MiB: {before} -> {after} bytes in {secs:.2} s\n{out}");
    assert!(after < before, "{before} -> {after}");
    assert_second_repack_does_nothing(&store);
}

/// Starts `ckptfs repack STORE` with the test hook `pause`, waits until it
/// stops there and returns it (stderr in `log`).
fn paused_repack(store: &Path, pause: &str, log: &Path) -> std::process::Child {
    let mut child = Command::new(common::bin())
        .args(["repack", s(store)])
        .env("CKPTFS_TEST_PAUSE", pause)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.contains("test hook: paused at") {
            return child;
        }
        if let Some(st) = child.try_wait().unwrap() {
            panic!("repack exited ({st}) before the pause {pause}: {text}");
        }
        assert!(Instant::now() < deadline, "never paused at {pause}: {text}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// While a writable mount serves the store, repack is refused with one
/// line; while a repack runs, a mount is refused; `kill -9` of the repack
/// in the middle of a family rewrite (a `.z4dm` in beside the `.zstn` it
/// replaces, the trailers of the deltas under it re-pointed) leaves every
/// file exact, and a second run finishes the job, read back through a
/// mount.
#[test]
fn refused_while_mounted_and_kill_9_mid_repack_then_rerun_is_exact() {
    let mut want = Vec::new();
    let mut m = Mount::new(|st| want = fill(st, 6, 9, true), &[]);
    let o = ckptfs(&["repack", s(&m.store)]);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!o.status.success());
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("mounted by a writable ckptfs daemon") && err.contains("unmount it first"),
        "{err}"
    );
    assert_eq!(
        layout(&m.store, 6)[5],
        vec!["model.z4dm"],
        "nothing changed"
    );
    m.unmount();

    // The third family rewrite: step-2 against step-3, with step-1 and
    // step-0 under step-2 re-pointed at its new `.z4dm`.
    let log = m.dir.path().join("repack.log");
    let mut child = paused_repack(&m.store, "family@3", &log);
    let o = Command::new(common::bin())
        .args(["mount", s(&m.store), s(&m.mnt)])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!o.status.success(), "a mount during a repack: {err}");
    assert!(err.contains("`ckptfs repack` (pid"), "{err}");
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(
        layout(&m.store, 6)[2],
        vec!["model.z4dm", "model.zstn"],
        "killed between the two: {}",
        std::fs::read_to_string(&log).unwrap()
    );
    assert_exact(&m.store, &want);
    verify_ok(&m.store);

    let (out, _) = repack_and_check(&m.store, &want);
    assert!(out.contains("step-2/model.zstn stored as a delta"), "{out}");
    assert_second_repack_does_nothing(&m.store);
    m.remount(&["--read-only"]);
    for (k, w) in want.iter().enumerate() {
        let got = std::fs::read(m.path(&format!("step-{k}/model.safetensors"))).unwrap();
        assert!(got == *w, "step-{k} through the mount: {}", m.log_text());
    }
}

/// `kill -9` while a forward delta is being made standalone (its `.zstn`
/// in, its `.z4dm` not yet removed): every file exact, a second run
/// finishes.
#[test]
fn kill_9_while_a_forward_delta_is_made_standalone_then_rerun_is_exact() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let want = fill(&store, 6, 21, true);
    let log = dir.path().join("repack.log");
    let mut child = paused_repack(&store, "standalone@2", &log);
    child.kill().unwrap();
    child.wait().unwrap();
    // Newest first: step-5 done, step-4 both.
    assert_eq!(layout(&store, 6)[5], vec!["model.zstn"]);
    assert_eq!(layout(&store, 6)[4], vec!["model.z4dm", "model.zstn"]);
    assert_exact(&store, &want);
    verify_ok(&store);
    repack_and_check(&store, &want);
    assert_second_repack_does_nothing(&store);
}

/// The order is the modification time's, not the names': checkpoints
/// saved in the reverse order of their names are settled newest (by
/// time) standalone, each older one against its successor in time, and
/// never against a newer checkpoint than its successor.
#[test]
fn families_are_ordered_by_modification_time_not_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let want = fill(&store, 3, 17, false);
    for k in 0..3 {
        set_mtime(&backing(&store, k), 2 - k as u64);
    }
    let out = run_ok(&["repack", s(&store)]);
    assert_eq!(
        layout(&store, 3),
        vec![vec!["model.zstn"], vec!["model.z4dm"], vec!["model.z4dm"]],
        "{out}"
    );
    assert_eq!(
        family_lines(&verify_ok(&store)),
        vec!["FAMILY step-0/model.zstn <- step-1/model.z4dm <- step-2/model.z4dm"]
    );
    assert_exact(&store, &want);
}

/// Files a mount staged and did not commit (a daemon killed before its
/// write-back) would be replaced after the repack by the next mount:
/// repack refuses, one line, and changes nothing.
#[test]
fn a_store_with_staged_files_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    fill(&store, 2, 23, false);
    let spool = store.join(".ckptfs-spool");
    std::fs::create_dir(&spool).unwrap();
    std::fs::write(
        spool.join("0000000000000001.path"),
        "step-1/model.safetensors",
    )
    .unwrap();
    std::fs::write(spool.join("0000000000000001.data"), b"new bytes").unwrap();
    let before = stamps(&store);
    let o = ckptfs(&["repack", s(&store)]);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!o.status.success());
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("1 file written through a mount and not committed yet"),
        "{err}"
    );
    assert_eq!(stamps(&store), before);
}

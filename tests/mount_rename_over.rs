//! Real-mount tests of issue 17, items 3 and 4.
//!
//! - Rename-over of an `X.safetensors` name is atomic: while one thread
//!   writes new versions to a temporary name and renames them over
//!   `rep.safetensors` (the way to replace a checkpoint others read), other
//!   threads opening the name always find the old or the new file, never
//!   ENOENT, through the renames and the commits (compression) after them.
//! - Sizes the daemon changes are fresh to the writer at once: a file
//!   closed, reopened and extended by a write reports its new size to
//!   `fstat` and `lseek(SEEK_END)` right away, through the staging and
//!   commit that each close and reopen of an `X.safetensors` causes.
//!
//! Needs root and /dev/fuse, as the other mount tests.

use crate::common;

use common::{safetensors_file, Mount};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Opens required by the acceptance test.
const MIN_OPENS: u64 = 100_000;
/// Close-reopen-extend cycles per file name.
const CYCLES: u64 = 10_000;

/// A valid safetensors file whose one tensor holds `version` (so each
/// version is compressed when committed, as real checkpoints are).
fn version_bytes(version: u64) -> Vec<u8> {
    let mut data = Vec::with_capacity(64 << 10);
    for i in 0..(16u64 << 10) {
        data.extend_from_slice(&((version.wrapping_mul(31) + i) as u32).to_le_bytes());
    }
    safetensors_file(&[("w", "U32", vec![16 << 10], data)], None)
}

#[test]
fn rename_over_a_safetensors_name_never_shows_enoent() {
    let m = Mount::new(|_| {}, &["--cache-size", "64M"]);
    let target = m.path("rep.safetensors");
    std::fs::write(&target, version_bytes(0)).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let opens = Arc::new(AtomicU64::new(0));
    let enoent = Arc::new(AtomicU64::new(0));
    let other = Arc::new(AtomicU64::new(0));
    let eio = Arc::new(AtomicU64::new(0));
    let renames = Arc::new(AtomicU64::new(0));
    let writer = {
        let (stop, renames, mnt) = (stop.clone(), renames.clone(), m.mnt.clone());
        std::thread::spawn(move || {
            let mut v = 1u64;
            while !stop.load(Ordering::Relaxed) {
                // Alternately through a plain temporary name and a staged
                // (`.safetensors`) one: both arms of rename.
                let tmp = if v.is_multiple_of(2) {
                    mnt.join("rep.safetensors.tmp")
                } else {
                    mnt.join("rep.tmp.safetensors")
                };
                std::fs::write(&tmp, version_bytes(v)).unwrap();
                std::fs::rename(&tmp, mnt.join("rep.safetensors")).unwrap();
                renames.fetch_add(1, Ordering::Relaxed);
                v += 1;
                // Leave time for some commits to happen between renames.
                if v.is_multiple_of(8) {
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        })
    };
    let t0 = Instant::now();
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let (stop, opens, enoent, other, eio, target) = (
                stop.clone(),
                opens.clone(),
                enoent.clone(),
                other.clone(),
                eio.clone(),
                target.clone(),
            );
            std::thread::spawn(move || {
                let mut first = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    match std::fs::File::open(&target) {
                        Ok(mut f) => {
                            let mut head = [0u8; 8];
                            if let Err(e) = f.read_exact(&mut head) {
                                other.fetch_add(1, Ordering::Relaxed);
                                if first.len() < 5 {
                                    first.push(format!("read: {e}"));
                                }
                            }
                        }
                        Err(e) => {
                            if e.kind() == std::io::ErrorKind::NotFound {
                                enoent.fetch_add(1, Ordering::Relaxed);
                            } else {
                                if e.raw_os_error() == Some(libc::EIO) {
                                    eio.fetch_add(1, Ordering::Relaxed);
                                }
                                other.fetch_add(1, Ordering::Relaxed);
                            }
                            if first.len() < 5 {
                                first.push(format!("open: {e}"));
                            }
                        }
                    }
                    if opens.fetch_add(1, Ordering::Relaxed) + 1 >= MIN_OPENS {
                        stop.store(true, Ordering::Relaxed);
                    }
                }
                first
            })
        })
        .collect();
    let mut errors = Vec::new();
    for r in readers {
        errors.extend(r.join().unwrap());
    }
    writer.join().unwrap();
    let (o, n, x, r) = (
        opens.load(Ordering::Relaxed),
        enoent.load(Ordering::Relaxed),
        other.load(Ordering::Relaxed),
        renames.load(Ordering::Relaxed),
    );
    println!(
        "rename-over: {o} opens by 3 readers, {r} renames in {:.1} s: {n} ENOENT, {x} other errors {errors:?}",
        t0.elapsed().as_secs_f64()
    );
    if x != 0 {
        for l in m
            .log_text()
            .lines()
            .filter(|l| l.contains("WARN") || l.contains("ERROR"))
            .take(10)
        {
            println!("daemon: {l}");
        }
    }
    // rename(2) promises old or new, never "no such file": ENOENT must be
    // 0, and so must EIO (the kernel's answer to an open whose io mode,
    // passthrough or page cache, differs from the inode's other opens) and
    // every other error of an open or a read: a read failed with ENOENT
    // once in about 20 runs, from a `getattr`; an open failed with ESTALE
    // once in about 6 runs, when a plain or staged file was renamed over
    // twice during the kernel's single lookup retry (the rename now keeps
    // the replaced file for such opens).
    let e = eio.load(Ordering::Relaxed);
    if n != 0 || x != 0 {
        // Keep the daemon log (the Mount's directory goes away with it) and
        // show its warnings: an errno the kernel did not make up is there.
        let log = m.log_text();
        let kept = Path::new(env!("CARGO_TARGET_TMPDIR")).join("rename-over-daemon.log");
        std::fs::write(&kept, &log).unwrap();
        let notable: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("WARN") || l.contains("ERROR"))
            .take(20)
            .collect();
        panic!(
            "{n} ENOENT, {e} EIO and {x} other errors over {o} opens during {r} rename-overs; \
             first: {errors:?}\ndaemon log kept in {}; its warnings and errors:\n{}",
            kept.display(),
            notable.join("\n")
        );
    }
    // The last version renamed is what the name shows.
    m.wait_committed(60);
    // Every version written is valid safetensors: a commit that finds
    // otherwise staged some other bytes (an archive's, once) under the name.
    let log = m.log_text();
    assert!(
        !log.contains("not a valid safetensors file"),
        "a staged version held bytes that were not written to it:\n{}",
        log.lines()
            .filter(|l| l.contains("WARN"))
            .take(5)
            .collect::<Vec<_>>()
            .join("\n")
    );
    let got = std::fs::read(&target).unwrap();
    assert_eq!(
        got,
        version_bytes(r),
        "rep.safetensors is not the last version"
    );
}

/// Opens `path` read-write, appends `chunk` at SEEK_END, closes, `cycles`
/// times, checking after each write that `fstat` and `lseek(SEEK_END)`
/// report the new size. Returns the number of stale sizes seen.
fn close_reopen_extend(path: &std::path::Path, cycles: u64) -> (u64, Vec<String>) {
    let mut expect = 0u64;
    let mut stale = 0u64;
    let mut first = Vec::new();
    std::fs::write(path, b"").unwrap();
    for i in 0..cycles {
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .unwrap_or_else(|e| panic!("{}: open {i}: {e}", path.display()));
        let len = f.metadata().unwrap().len();
        let end = f.seek(SeekFrom::End(0)).unwrap();
        if len != expect || end != expect {
            stale += 1;
            if first.len() < 5 {
                first.push(format!(
                    "cycle {i} after reopen: fstat {len}, SEEK_END {end}, expected {expect}"
                ));
            }
        }
        // Extend by a write at the expected end (not at SEEK_END, so one
        // stale answer does not make every later cycle fail).
        let chunk = vec![(i % 251) as u8; 1 + (i as usize * 7919) % 3000];
        f.write_all_at(&chunk, expect).unwrap();
        expect += chunk.len() as u64;
        let len = f.metadata().unwrap().len();
        let end = f.seek(SeekFrom::End(0)).unwrap();
        if len != expect || end != expect {
            stale += 1;
            if first.len() < 5 {
                first.push(format!(
                    "cycle {i} after write: fstat {len}, SEEK_END {end}, expected {expect}"
                ));
            }
        }
        f.flush().unwrap();
    }
    (stale, first)
}

#[test]
fn close_reopen_extend_reports_fresh_sizes() {
    let m = Mount::new(|_| {}, &["--cache-size", "64M"]);
    for name in ["X.safetensors", "plain.bin"] {
        let path = m.path(name);
        let t0 = Instant::now();
        let (stale, first) = close_reopen_extend(&path, CYCLES);
        println!(
            "close-reopen-extend {name}: {CYCLES} cycles in {:.1} s: {stale} stale sizes",
            t0.elapsed().as_secs_f64()
        );
        assert!(
            stale == 0,
            "{name}: {stale} stale sizes over {CYCLES} cycles; first: {first:?}"
        );
    }
}

/// An open that finds a staged file while the file's commit turns it into
/// an archive (the daemon is made to wait 500 ms in that window) opens
/// what the file is after the commit, and the opens after it work. Before
/// an open chose its io mode under its inode's lock, after checking the
/// inode's kind, the first open was passed through as a plain file and the
/// kernel refused the next open, of the archive, with EIO (the rename-over
/// test above saw it in 5 runs of 42).
#[test]
fn an_open_racing_the_commit_of_its_file_works_and_so_do_the_next() {
    let m = Mount::with_env(|_| {}, &[], &[("CKPTFS_TEST_DELAY", "open-staged:500")]);
    let mut raced = 0;
    for round in 0..4u64 {
        let name = format!("r{round}.safetensors");
        let bytes = version_bytes(round);
        std::fs::write(m.path(&name), &bytes).unwrap();
        // The close above queued the commit; this open finds the file
        // staged and waits in the window while the commit runs.
        let t0 = Instant::now();
        let first = std::fs::File::open(m.path(&name)).expect("the racing open");
        let waited = t0.elapsed() >= Duration::from_millis(500);
        let archive = m.store.join(format!("r{round}.zstn"));
        if waited && archive.exists() {
            raced += 1;
        }
        m.wait_committed(60);
        assert!(archive.exists(), "r{round} was not committed");
        let second = std::fs::File::open(m.path(&name)).expect("an open after the commit");
        for (which, mut f) in [("first", &first), ("second", &second)] {
            let mut got = Vec::new();
            f.read_to_end(&mut got).unwrap();
            assert!(
                got == bytes,
                "round {round}: the {which} open read other bytes"
            );
        }
    }
    // The daemon's wait made the commit land inside the open at least once
    // (else this test did not exercise the race).
    assert!(raced > 0, "no open raced its file's commit");
}

/// `statx` of an open file, forcing the kernel to ask the daemon
/// (`AT_STATX_FORCE_SYNC`): (link count, size), or the errno.
fn statx_forced(f: &std::fs::File) -> Result<(u32, u64), std::io::Error> {
    use std::os::fd::AsRawFd;
    // SAFETY: statx writes one `struct statx` into `st`, which outlives the
    // call; the empty path with AT_EMPTY_PATH names the open descriptor.
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    let r = unsafe {
        libc::statx(
            f.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_STATX_FORCE_SYNC,
            libc::STATX_BASIC_STATS,
            &mut st,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((st.stx_nlink, st.stx_size))
}

/// A `getattr` that finds an archive changed since it was parsed, and the
/// archive removed before the new version is opened (the daemon is made to
/// wait 500 ms in that window), answers what the file last was, with no
/// names left, as for a file removed before the `getattr`. It used to
/// answer ENOENT, which fails the `open` or `read` that asked: 1 read in
/// about 20 runs of the rename-over test above, and an `open` in CI once.
#[test]
fn a_getattr_racing_the_removal_of_a_changed_archive_answers_the_old_file() {
    let m = Mount::with_env(|_| {}, &[], &[("CKPTFS_TEST_DELAY", "archive-parse:500")]);
    let bytes = version_bytes(7);
    std::fs::write(m.path("a.safetensors"), &bytes).unwrap();
    m.wait_committed(60);
    let archive = m.store.join("a.zstn");
    assert!(archive.exists(), "a.safetensors was not committed");
    let mut f = std::fs::File::open(m.path("a.safetensors")).unwrap();
    assert_eq!(statx_forced(&f).unwrap(), (1, bytes.len() as u64));
    // A new change time is a version of the archive not parsed yet.
    let mut p = std::fs::metadata(&archive).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut p, 0o600);
    std::fs::set_permissions(&archive, p).unwrap();
    let remover = {
        let archive = archive.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            std::fs::remove_file(&archive).unwrap();
        })
    };
    let got = statx_forced(&f);
    remover.join().unwrap();
    assert_eq!(
        got.expect("getattr of the open file"),
        (0, bytes.len() as u64),
        "the old file, with no names left"
    );
    // The open handle still reads the version it opened.
    let mut read = Vec::new();
    f.read_to_end(&mut read).unwrap();
    assert!(read == bytes, "the open handle read other bytes");
}

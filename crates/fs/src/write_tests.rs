//! The write path of `CheckpointFs` driven directly, without a mount:
//! staging, compression after close, copy-up, versions, renames, crash
//! recovery. Each test names the doc/SEMANTICS.md rule it backs.

use super::spool::SPOOL_DIR;
use super::*;
use std::ffi::{OsStr, OsString};

const ME: Caller = Caller { uid: 0, gid: 0 };

fn fs_over(store: &Path) -> CheckpointFs {
    CheckpointFs::new(FsConfig {
        store: store.to_path_buf(),
        cache_bytes: 64 << 20,
        ttl: Duration::from_secs(1),
        read_only: false,
        require_checksums: false,
        allow_other: false,
    })
    .unwrap()
}

/// A valid safetensors file: one F32 tensor and one U8 tensor.
fn st_bytes(seed: u32, n: usize) -> Vec<u8> {
    let mut data = Vec::new();
    let mut x = seed.wrapping_mul(2654435761) | 1;
    for _ in 0..n {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        let v = ((x % 2000) as f32 - 1000.0) / 997.0;
        data.extend_from_slice(&v.to_le_bytes());
    }
    let f = data.len();
    data.extend_from_slice(&[7u8; 100]);
    let header = serde_json::json!({
        "w": {"dtype": "F32", "shape": [n], "data_offsets": [0, f]},
        "b": {"dtype": "U8", "shape": [100], "data_offsets": [f, f + 100]},
    });
    let mut h = serde_json::to_vec(&header).unwrap();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    out.extend_from_slice(&data);
    out
}

fn fh_of(o: &Opened) -> u64 {
    match o {
        Opened::Plain { fh, .. } | Opened::Archive { fh, .. } => *fh,
    }
}

fn write_new(fs: &CheckpointFs, parent: u64, name: &str, bytes: &[u8]) -> u64 {
    let (e, o) = fs
        .create(parent, OsStr::new(name), 0o644, libc::O_WRONLY, ME)
        .unwrap();
    let fh = fh_of(&o);
    for (i, c) in bytes.chunks(100_000).enumerate() {
        assert_eq!(
            fs.write(fh, (i * 100_000) as u64, c).unwrap() as usize,
            c.len()
        );
    }
    fs.release(fh);
    e.attr.ino
}

fn read_ino(fs: &CheckpointFs, ino: u64) -> Vec<u8> {
    let fh = fh_of(&fs.open(ino, libc::O_RDONLY).unwrap());
    let out = read_fh(fs, fh);
    fs.release(fh);
    out
}

fn read_fh(fs: &CheckpointFs, fh: u64) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let c = fs.read(fh, out.len() as u64, 65536).unwrap();
        if c.is_empty() {
            return out;
        }
        out.extend_from_slice(&c);
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

fn spool_names(store: &Path) -> Vec<String> {
    names(&store.join(SPOOL_DIR))
}

fn unpack(path: &Path) -> Vec<u8> {
    let a = ckptfs_archive::open(path).unwrap();
    let mut buf = vec![0u8; a.logical_len(0) as usize];
    assert_eq!(a.read_at(0, 0, &mut buf).unwrap(), buf.len());
    buf
}

#[test]
fn written_safetensors_is_staged_then_compressed_after_close() {
    let d = tempfile::tempdir().unwrap();
    let fs = fs_over(d.path());
    let bytes = st_bytes(1, 300_000);
    let ino = write_new(&fs, ROOT_INO, "m.safetensors", &bytes);
    // Closed, not yet compressed: served from the spool, invisible in STORE.
    assert_eq!(names(d.path()), vec![SPOOL_DIR.to_string()]);
    assert_eq!(spool_names(d.path()).len(), 2);
    // The record of the presented path is private to the daemon.
    for n in spool_names(d.path()) {
        if n.ends_with(".path") {
            use std::os::unix::fs::PermissionsExt;
            let m = std::fs::metadata(d.path().join(SPOOL_DIR).join(&n)).unwrap();
            assert_eq!(m.permissions().mode() & 0o777, 0o600, "{n}");
        }
    }
    assert_eq!(read_ino(&fs, ino), bytes);
    fs.run_writeback();
    assert_eq!(names(d.path()), vec![SPOOL_DIR, "m.zstn"]);
    assert!(spool_names(d.path()).is_empty());
    assert_eq!(unpack(&d.path().join("m.zstn")), bytes);
    // Same inode, now an archive, same bytes.
    let e = fs.lookup(ROOT_INO, OsStr::new("m.safetensors")).unwrap();
    assert_eq!(e.attr.ino, ino);
    assert_eq!(e.attr.size, bytes.len() as u64);
    assert!(matches!(
        fs.open(ino, libc::O_RDONLY).unwrap(),
        Opened::Archive { .. }
    ));
    assert_eq!(read_ino(&fs, ino), bytes);
    let listed: Vec<OsString> = {
        struct V(Vec<OsString>);
        impl DirectoryReplier for V {
            fn add(&mut self, _: u64, _: u64, _: FileKind, n: &OsStr) -> bool {
                self.0.push(n.to_os_string());
                false
            }
        }
        let fh = fs.opendir(ROOT_INO).unwrap();
        let mut v = V(Vec::new());
        fs.readdir(fh, 0, &mut v).unwrap();
        v.0
    };
    assert_eq!(listed, vec![".", "..", "m.safetensors"]);
}

#[test]
fn invalid_safetensors_is_kept_as_a_plain_file() {
    let d = tempfile::tempdir().unwrap();
    let fs = fs_over(d.path());
    write_new(&fs, ROOT_INO, "bad.safetensors", b"this is not safetensors");
    fs.run_writeback();
    assert_eq!(names(d.path()), vec![SPOOL_DIR, "bad.safetensors"]);
    assert_eq!(
        std::fs::read(d.path().join("bad.safetensors")).unwrap(),
        b"this is not safetensors"
    );
    assert!(spool_names(d.path()).is_empty());
}

#[test]
fn plain_names_are_written_straight_through() {
    let d = tempfile::tempdir().unwrap();
    let fs = fs_over(d.path());
    write_new(&fs, ROOT_INO, "notes.txt", b"hello");
    assert_eq!(std::fs::read(d.path().join("notes.txt")).unwrap(), b"hello");
    assert!(spool_names(d.path()).is_empty());
}

#[test]
fn incomplete_renamed_to_safetensors_becomes_a_compression_candidate() {
    let d = tempfile::tempdir().unwrap();
    let fs = fs_over(d.path());
    let bytes = st_bytes(2, 50_000);
    write_new(&fs, ROOT_INO, "a.safetensors.incomplete", &bytes);
    // Safetensors content: staged at close whatever the name.
    assert_eq!(names(d.path()), vec![SPOOL_DIR]);
    fs.lookup(ROOT_INO, OsStr::new("a.safetensors.incomplete"))
        .unwrap();
    fs.rename(
        ROOT_INO,
        OsStr::new("a.safetensors.incomplete"),
        ROOT_INO,
        OsStr::new("a.safetensors"),
        0,
    )
    .unwrap();
    fs.run_writeback();
    assert_eq!(names(d.path()), vec![SPOOL_DIR, "a.zstn"]);
    assert_eq!(unpack(&d.path().join("a.zstn")), bytes);
}

#[test]
fn rename_over_a_compressed_file_keeps_old_readers_on_the_old_version() {
    let d = tempfile::tempdir().unwrap();
    let fs = fs_over(d.path());
    let old = st_bytes(3, 40_000);
    let new = st_bytes(4, 60_000);
    write_new(&fs, ROOT_INO, "m.safetensors", &old);
    fs.run_writeback();
    let e = fs.lookup(ROOT_INO, OsStr::new("m.safetensors")).unwrap();
    let reader = fh_of(&fs.open(e.attr.ino, libc::O_RDONLY).unwrap());
    // safetensors.save_file / huggingface_hub: temporary name, then rename.
    write_new(&fs, ROOT_INO, "tmpXYZ", &new);
    fs.lookup(ROOT_INO, OsStr::new("tmpXYZ")).unwrap();
    fs.rename(
        ROOT_INO,
        OsStr::new("tmpXYZ"),
        ROOT_INO,
        OsStr::new("m.safetensors"),
        0,
    )
    .unwrap();
    let e2 = fs.lookup(ROOT_INO, OsStr::new("m.safetensors")).unwrap();
    assert_ne!(e2.attr.ino, e.attr.ino, "a new version is a new inode");
    assert_eq!(read_ino(&fs, e2.attr.ino), new);
    assert_eq!(
        read_fh(&fs, reader),
        old,
        "the old reader keeps its version"
    );
    fs.run_writeback();
    assert_eq!(read_fh(&fs, reader), old);
    fs.release(reader);
    assert_eq!(names(d.path()), vec![SPOOL_DIR, "m.zstn"]);
    assert_eq!(unpack(&d.path().join("m.zstn")), new);
}

/// Descriptors of this process open on deleted files under `dir`.
fn deleted_files_open_under(dir: &Path) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter(|t| t.starts_with(dir) && t.to_string_lossy().ends_with(" (deleted)"))
        .count()
}

/// An open that resolved a name before a rename replaced the plain or
/// staged file there (the kernel asks for the inode it found) reads the
/// replaced file, which rename(2) allows, instead of failing with ESTALE;
/// the replaced file is let go when the kernel forgets its inode.
#[test]
fn an_open_racing_a_rename_over_a_plain_or_staged_file_reads_the_replaced_file() {
    let d = tempfile::tempdir().unwrap();
    let fs = fs_over(d.path());
    for (name, tmp) in [("s.safetensors", "s.tmp.safetensors"), ("p.bin", "p.tmp")] {
        let (old, new) = (st_bytes(5, 1000), st_bytes(6, 2000));
        write_new(&fs, ROOT_INO, name, &old);
        let e = fs.lookup(ROOT_INO, OsStr::new(name)).unwrap();
        write_new(&fs, ROOT_INO, tmp, &new);
        fs.rename(ROOT_INO, OsStr::new(tmp), ROOT_INO, OsStr::new(name), 0)
            .unwrap();
        assert_eq!(read_ino(&fs, e.attr.ino), old, "{name}: the racing open");
        let e2 = fs.lookup(ROOT_INO, OsStr::new(name)).unwrap();
        assert_ne!(e2.attr.ino, e.attr.ino);
        assert_eq!(read_ino(&fs, e2.attr.ino), new, "{name}: a new open");
        assert_eq!(deleted_files_open_under(d.path()), 1, "{name}");
        // `create` and `lookup` each counted one lookup.
        fs.forget(e.attr.ino, 2);
        assert_eq!(deleted_files_open_under(d.path()), 0, "{name}");
        assert!(matches!(
            fs.open(e.attr.ino, libc::O_RDONLY),
            Err(FsError::Stale)
        ));
        fs.forget(e2.attr.ino, 2);
    }
}

#[test]
fn truncating_open_of_an_archive_stages_a_new_version() {
    let d = tempfile::tempdir().unwrap();
    let fs = fs_over(d.path());
    let old = st_bytes(5, 40_000);
    let new = st_bytes(6, 10_000);
    write_new(&fs, ROOT_INO, "m.safetensors", &old);
    fs.run_writeback();
    let e = fs.lookup(ROOT_INO, OsStr::new("m.safetensors")).unwrap();
    let reader = fh_of(&fs.open(e.attr.ino, libc::O_RDONLY).unwrap());
    let w = fh_of(&fs.open(e.attr.ino, libc::O_WRONLY | libc::O_TRUNC).unwrap());
    // The old archive stays in STORE until the new version is committed.
    assert!(d.path().join("m.zstn").exists());
    assert_eq!(fs.getattr(e.attr.ino).unwrap().size, 0);
    fs.write(w, 0, &new).unwrap();
    fs.release(w);
    // The handle opened before still serves the old archive's bytes.
    assert_eq!(read_fh(&fs, reader), old);
    assert_eq!(read_ino(&fs, e.attr.ino), new);
    fs.run_writeback();
    assert_eq!(unpack(&d.path().join("m.zstn")), new);
    assert_eq!(read_fh(&fs, reader), old);
    fs.release(reader);
}

#[test]
fn partial_overwrite_of_an_archive_copies_it_up() {
    let d = tempfile::tempdir().unwrap();
    let fs = fs_over(d.path());
    let old = st_bytes(7, 100_000);
    write_new(&fs, ROOT_INO, "m.safetensors", &old);
    fs.run_writeback();
    let e = fs.lookup(ROOT_INO, OsStr::new("m.safetensors")).unwrap();
    let w = fh_of(&fs.open(e.attr.ino, libc::O_RDWR).unwrap());
    let at = old.len() as u64 - 5000;
    fs.write(w, at, &[0x3f; 64]).unwrap();
    fs.release(w);
    let mut want = old.clone();
    want[at as usize..at as usize + 64].fill(0x3f);
    assert_eq!(read_ino(&fs, e.attr.ino), want);
    fs.run_writeback();
    assert_eq!(unpack(&d.path().join("m.zstn")), want);
    assert!(spool_names(d.path()).is_empty());
}

#[test]
fn truncate_without_open_stages_and_compresses() {
    let d = tempfile::tempdir().unwrap();
    let fs = fs_over(d.path());
    let old = st_bytes(8, 1000);
    write_new(&fs, ROOT_INO, "m.safetensors", &old);
    fs.run_writeback();
    let e = fs.lookup(ROOT_INO, OsStr::new("m.safetensors")).unwrap();
    let a = fs
        .setattr(
            e.attr.ino,
            SetAttr {
                size: Some(10),
                ..Default::default()
            },
            None,
        )
        .unwrap();
    assert_eq!(a.size, 10);
    assert_eq!(read_ino(&fs, e.attr.ino), old[..10]);
    fs.run_writeback();
    // Ten bytes are not safetensors: kept as a plain file, the archive gone.
    assert_eq!(names(d.path()), vec![SPOOL_DIR, "m.safetensors"]);
}

#[test]
fn unlink_removes_every_backing_of_the_name() {
    let d = tempfile::tempdir().unwrap();
    let fs = fs_over(d.path());
    write_new(&fs, ROOT_INO, "m.safetensors", &st_bytes(9, 1000));
    fs.run_writeback();
    let e = fs.lookup(ROOT_INO, OsStr::new("m.safetensors")).unwrap();
    // Stage a new version over the archive, then unlink: both go.
    let w = fh_of(&fs.open(e.attr.ino, libc::O_WRONLY | libc::O_TRUNC).unwrap());
    fs.release(w);
    fs.unlink(ROOT_INO, OsStr::new("m.safetensors")).unwrap();
    assert_eq!(names(d.path()), vec![SPOOL_DIR]);
    assert!(spool_names(d.path()).is_empty());
    assert!(matches!(
        fs.lookup(ROOT_INO, OsStr::new("m.safetensors")),
        Err(FsError::NotFound)
    ));
    fs.run_writeback();
    assert_eq!(names(d.path()), vec![SPOOL_DIR]);
}

#[test]
fn renames_keep_the_name_mapping_and_refuse_what_cannot_be_presented() {
    let d = tempfile::tempdir().unwrap();
    let fs = fs_over(d.path());
    let bytes = st_bytes(10, 1000);
    write_new(&fs, ROOT_INO, "m.safetensors", &bytes);
    fs.run_writeback();
    let sub = fs.mkdir(ROOT_INO, OsStr::new("run"), 0o755, ME).unwrap();
    fs.lookup(ROOT_INO, OsStr::new("m.safetensors")).unwrap();
    fs.rename(
        ROOT_INO,
        OsStr::new("m.safetensors"),
        sub.attr.ino,
        OsStr::new("n.safetensors"),
        0,
    )
    .unwrap();
    assert_eq!(names(&d.path().join("run")), vec!["n.zstn"]);
    // Under a name that is not `X.safetensors` an archive keeps that name
    // exactly, as `N.zsame`, and back.
    fs.lookup(sub.attr.ino, OsStr::new("n.safetensors"))
        .unwrap();
    fs.rename(
        sub.attr.ino,
        OsStr::new("n.safetensors"),
        ROOT_INO,
        OsStr::new("n.bin"),
        0,
    )
    .unwrap();
    assert!(names(&d.path().join("run")).is_empty());
    assert_eq!(names(d.path()), vec![SPOOL_DIR, "n.bin.zsame", "run"]);
    let e = fs.lookup(ROOT_INO, OsStr::new("n.bin")).unwrap();
    assert_eq!(read_ino(&fs, e.attr.ino), bytes);
    fs.rename(
        ROOT_INO,
        OsStr::new("n.bin"),
        sub.attr.ino,
        OsStr::new("n.safetensors"),
        0,
    )
    .unwrap();
    assert_eq!(names(&d.path().join("run")), vec!["n.zstn"]);
    // A staged file inside a renamed directory follows it.
    write_new(&fs, sub.attr.ino, "s.safetensors", &bytes);
    fs.rename(ROOT_INO, OsStr::new("run"), ROOT_INO, OsStr::new("run2"), 0)
        .unwrap();
    fs.run_writeback();
    assert_eq!(names(&d.path().join("run2")), vec!["n.zstn", "s.zstn"]);
    assert_eq!(unpack(&d.path().join("run2/s.zstn")), bytes);
    // Reserved names.
    for reserved in ["x.zstn", "x.blz", "x.zsame"] {
        let r = fs.create(ROOT_INO, OsStr::new(reserved), 0o644, libc::O_WRONLY, ME);
        assert_eq!(r.unwrap_err().errno(), libc::EPERM, "{reserved}");
    }
    let r = fs.mkdir(ROOT_INO, OsStr::new(SPOOL_DIR), 0o755, ME);
    assert_eq!(r.unwrap_err().errno(), libc::EPERM);
}

#[test]
fn rmdir_of_a_directory_with_a_staged_file_is_enotempty() {
    let d = tempfile::tempdir().unwrap();
    let fs = fs_over(d.path());
    let sub = fs.mkdir(ROOT_INO, OsStr::new("run"), 0o755, ME).unwrap();
    write_new(&fs, sub.attr.ino, "s.safetensors", &st_bytes(11, 100));
    let r = fs.rmdir(ROOT_INO, OsStr::new("run"));
    assert_eq!(r.unwrap_err().errno(), libc::ENOTEMPTY);
    fs.unlink(sub.attr.ino, OsStr::new("s.safetensors"))
        .unwrap();
    fs.rmdir(ROOT_INO, OsStr::new("run")).unwrap();
}

#[test]
fn a_crash_before_compression_is_recovered_at_the_next_start() {
    let d = tempfile::tempdir().unwrap();
    let bytes = st_bytes(12, 20_000);
    {
        let fs = fs_over(d.path());
        let sub = fs.mkdir(ROOT_INO, OsStr::new("run"), 0o755, ME).unwrap();
        write_new(&fs, sub.attr.ino, "s.safetensors", &bytes);
        write_new(&fs, ROOT_INO, "junk.safetensors", b"junk");
        // "kill -9": the fs goes away without compressing anything.
    }
    // A half-written compression result and a lone record, as a crash
    // mid-commit would leave them.
    std::fs::write(
        d.path().join(SPOOL_DIR).join("00000000000000ff.zstn.tmp"),
        b"half",
    )
    .unwrap();
    std::fs::write(
        d.path().join(SPOOL_DIR).join("00000000000000fe.path"),
        b"gone.safetensors",
    )
    .unwrap();
    let fs = fs_over(d.path());
    // Served from the spool before it is compressed.
    let sub = fs.lookup(ROOT_INO, OsStr::new("run")).unwrap();
    let e = fs
        .lookup(sub.attr.ino, OsStr::new("s.safetensors"))
        .unwrap();
    assert_eq!(read_ino(&fs, e.attr.ino), bytes);
    fs.run_writeback();
    assert_eq!(unpack(&d.path().join("run/s.zstn")), bytes);
    assert_eq!(
        std::fs::read(d.path().join("junk.safetensors")).unwrap(),
        b"junk"
    );
    assert!(spool_names(d.path()).is_empty());
}

#[test]
fn a_writer_that_opens_again_delays_compression_until_its_close() {
    let d = tempfile::tempdir().unwrap();
    let fs = fs_over(d.path());
    let bytes = st_bytes(13, 1000);
    let ino = write_new(&fs, ROOT_INO, "m.safetensors", &bytes);
    let w = fh_of(&fs.open(ino, libc::O_RDWR).unwrap());
    fs.run_writeback();
    // Still open for writing: not compressed.
    assert_eq!(names(d.path()), vec![SPOOL_DIR]);
    fs.write(w, 0, &bytes).unwrap();
    fs.fsync(w, false).unwrap();
    fs.release(w);
    fs.run_writeback();
    assert_eq!(names(d.path()), vec![SPOOL_DIR, "m.zstn"]);
}

/// The write-back thread compresses what is queued without being polled,
/// returns on `stop_writeback` with nothing queued, and leaves what is
/// queued after that to `run_writeback` (as the unmount does).
#[test]
fn writeback_thread_wakes_for_work_and_for_stop() {
    let d = tempfile::tempdir().unwrap();
    let fs = std::sync::Arc::new(fs_over(d.path()));
    let thread = {
        let fs = fs.clone();
        std::thread::spawn(move || fs.writeback_loop())
    };
    let bytes = st_bytes(14, 1000);
    write_new(&fs, ROOT_INO, "m.safetensors", &bytes);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !d.path().join("m.zstn").exists() {
        assert!(std::time::Instant::now() < deadline, "not compressed");
        std::thread::sleep(Duration::from_millis(10));
    }
    fs.stop_writeback();
    thread.join().unwrap();
    write_new(&fs, ROOT_INO, "n.safetensors", &bytes);
    // Stopped: returns at once and compresses nothing.
    fs.writeback_loop();
    assert_eq!(names(d.path()), vec![SPOOL_DIR, "m.zstn"]);
    fs.run_writeback();
    assert_eq!(names(d.path()), vec![SPOOL_DIR, "m.zstn", "n.zstn"]);
    assert_eq!(unpack(&d.path().join("n.zstn")), bytes);
}

fn listing(fs: &CheckpointFs, dir: u64) -> Vec<OsString> {
    struct V(Vec<OsString>);
    impl DirectoryReplier for V {
        fn add(&mut self, _: u64, _: u64, _: FileKind, n: &OsStr) -> bool {
            self.0.push(n.to_os_string());
            false
        }
    }
    let fh = fs.opendir(dir).unwrap();
    let mut v = V(Vec::new());
    fs.readdir(fh, 0, &mut v).unwrap();
    fs.releasedir(fh);
    v.0.retain(|n| n != "." && n != "..");
    v.0
}

const SHA: &str = "3f1e9c0a5b7d2e4f6a8c0b2d4e6f8a1c3e5b7d9f0a2c4e6b8d0f1a3c5e7b9d2f";

/// huggingface_hub's cache write, in its order: `blobs/<sha>.<rnd>.incomplete`
/// written and closed (when `close_first`; else the rename arrives before
/// the release, as FUSE may deliver them), a probe file touched and removed,
/// chmod, rename to `blobs/<sha>`, and a relative symlink from the snapshot.
fn hf_cache_write(fs: &CheckpointFs, bytes: &[u8], close_first: bool) -> (u64, u64) {
    let hub = fs
        .mkdir(ROOT_INO, OsStr::new("models--o--m"), 0o755, ME)
        .unwrap();
    let hub = hub.attr.ino;
    let blobs = fs
        .mkdir(hub, OsStr::new("blobs"), 0o755, ME)
        .unwrap()
        .attr
        .ino;
    let snaps = fs
        .mkdir(hub, OsStr::new("snapshots"), 0o755, ME)
        .unwrap()
        .attr
        .ino;
    let rev = fs
        .mkdir(snaps, OsStr::new("0123abcd"), 0o755, ME)
        .unwrap()
        .attr
        .ino;
    let tmp = format!("{SHA}.1a2b3c4d.incomplete");
    let (_, o) = fs
        .create(
            blobs,
            OsStr::new(&tmp),
            0o644,
            libc::O_WRONLY | libc::O_TRUNC,
            ME,
        )
        .unwrap();
    let fh = fh_of(&o);
    for (i, c) in bytes.chunks(65_536).enumerate() {
        fs.write(fh, (i * 65_536) as u64, c).unwrap();
    }
    if close_first {
        fs.release(fh);
    }
    let probe = write_new(fs, blobs, "tmp_5e0f", b"");
    assert!(probe > 0);
    fs.unlink(blobs, OsStr::new("tmp_5e0f")).unwrap();
    let e = fs.lookup(blobs, OsStr::new(&tmp)).unwrap();
    fs.setattr(
        e.attr.ino,
        SetAttr {
            mode: Some(0o640),
            ..Default::default()
        },
        None,
    )
    .unwrap();
    fs.rename(blobs, OsStr::new(&tmp), blobs, OsStr::new(SHA), 0)
        .unwrap();
    if !close_first {
        fs.release(fh);
    }
    let target = format!("../../blobs/{SHA}");
    fs.symlink(rev, OsStr::new("model.safetensors"), Path::new(&target), ME)
        .unwrap();
    (blobs, rev)
}

#[test]
fn hf_cache_blob_is_compressed_under_its_own_name() {
    for close_first in [true, false] {
        let d = tempfile::tempdir().unwrap();
        let fs = fs_over(d.path());
        let bytes = st_bytes(21, 200_000);
        let (blobs, rev) = hf_cache_write(&fs, &bytes, close_first);
        fs.run_writeback();
        let hub = d.path().join("models--o--m");
        assert_eq!(names(&hub.join("blobs")), vec![format!("{SHA}.zsame")]);
        assert!(spool_names(d.path()).is_empty());
        let stored = hub.join("blobs").join(format!("{SHA}.zsame"));
        assert_eq!(unpack(&stored), bytes);
        assert!(std::fs::metadata(&stored).unwrap().len() < bytes.len() as u64);
        // Presented under its own name, with its bytes, mode and size.
        assert_eq!(listing(&fs, blobs), vec![OsString::from(SHA)]);
        let e = fs.lookup(blobs, OsStr::new(SHA)).unwrap();
        assert_eq!(e.attr.size, bytes.len() as u64);
        assert_eq!(e.attr.perm & 0o7777, 0o640);
        assert_eq!(read_ino(&fs, e.attr.ino), bytes);
        // The snapshot's symlink is stored and presented as written.
        let link = hub.join("snapshots/0123abcd/model.safetensors");
        assert_eq!(
            std::fs::read_link(&link).unwrap(),
            Path::new(&format!("../../blobs/{SHA}"))
        );
        let l = fs.lookup(rev, OsStr::new("model.safetensors")).unwrap();
        assert_eq!(
            fs.readlink(l.attr.ino).unwrap(),
            format!("../../blobs/{SHA}").as_bytes()
        );
        // Removing the blob removes its archive.
        fs.unlink(blobs, OsStr::new(SHA)).unwrap();
        assert!(names(&hub.join("blobs")).is_empty());
    }
}

#[test]
fn files_of_any_name_are_kept_plain_unless_safetensors() {
    let d = tempfile::tempdir().unwrap();
    let fs = fs_over(d.path());
    let cfg = br#"{"architectures": ["BertModel"], "hidden_size": 32}"#;
    write_new(&fs, ROOT_INO, "config.json", cfg);
    // A length prefix that fits, then no JSON.
    let mut fake = 16u64.to_le_bytes().to_vec();
    fake.extend_from_slice(&[0xAB; 40]);
    write_new(&fs, ROOT_INO, "weights.bin", &fake);
    // Data one byte short of what the header says.
    let mut short = st_bytes(5, 1000);
    short.pop();
    write_new(&fs, ROOT_INO, "short", &short);
    fs.run_writeback();
    assert_eq!(
        names(d.path()),
        vec![SPOOL_DIR, "config.json", "short", "weights.bin"]
    );
    assert_eq!(std::fs::read(d.path().join("short")).unwrap(), short);
    // A git-lfs object: written in a temporary directory, moved to its
    // place; a plain file already there of that name is what it replaces.
    let lfs = fs
        .mkdir(ROOT_INO, OsStr::new("lfs"), 0o755, ME)
        .unwrap()
        .attr
        .ino;
    let bytes = st_bytes(6, 30_000);
    write_new(&fs, ROOT_INO, "lfs-tmp", &bytes);
    write_new(&fs, lfs, "d4c2", b"old plain bytes");
    fs.lookup(ROOT_INO, OsStr::new("lfs-tmp")).unwrap();
    fs.rename(ROOT_INO, OsStr::new("lfs-tmp"), lfs, OsStr::new("d4c2"), 0)
        .unwrap();
    fs.run_writeback();
    assert_eq!(names(&d.path().join("lfs")), vec!["d4c2.zsame"]);
    let e = fs.lookup(lfs, OsStr::new("d4c2")).unwrap();
    assert_eq!(read_ino(&fs, e.attr.ino), bytes);
    // Written again in place: copied up, recompressed under the same name.
    let fh = fh_of(&fs.open(e.attr.ino, libc::O_WRONLY).unwrap());
    fs.write(fh, 0, &bytes[..8]).unwrap();
    fs.release(fh);
    fs.run_writeback();
    assert_eq!(names(&d.path().join("lfs")), vec!["d4c2.zsame"]);
    assert_eq!(unpack(&d.path().join("lfs/d4c2.zsame")), bytes);
    // Truncated to nothing: no longer safetensors, put back plain.
    fs.setattr(
        e.attr.ino,
        SetAttr {
            size: Some(0),
            ..Default::default()
        },
        None,
    )
    .unwrap();
    fs.run_writeback();
    assert_eq!(names(&d.path().join("lfs")), vec!["d4c2"]);
    assert_eq!(std::fs::read(d.path().join("lfs/d4c2")).unwrap(), b"");
}

#[test]
fn a_plain_file_beside_a_kept_archive_wins() {
    let d = tempfile::tempdir().unwrap();
    let bytes = st_bytes(7, 1000);
    let mut packed = Vec::new();
    ckptfs_pack::pack(&bytes, &mut packed, Default::default(), &|_| {}).unwrap();
    std::fs::write(d.path().join("blob.zsame"), &packed).unwrap();
    std::fs::write(d.path().join("other.zsame"), &packed).unwrap();
    std::fs::write(d.path().join("blob"), b"plain").unwrap();
    let fs = fs_over(d.path());
    let e = fs.lookup(ROOT_INO, OsStr::new("blob")).unwrap();
    assert_eq!(read_ino(&fs, e.attr.ino), b"plain");
    let e = fs.lookup(ROOT_INO, OsStr::new("other")).unwrap();
    assert_eq!(read_ino(&fs, e.attr.ino), bytes);
    assert!(matches!(
        fs.lookup(ROOT_INO, OsStr::new("other.zsame")),
        Err(FsError::NotFound)
    ));
    assert_eq!(listing(&fs, ROOT_INO), vec!["blob", "other"]);
}

/// The spool is the daemon's own, mode 0700, also when it was found open
/// to others (issue 40, item 5; doc/SEMANTICS.md, "The spool").
#[test]
fn an_existing_spool_is_made_private_at_every_open() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let d = tempfile::tempdir().unwrap();
    let spool = d.path().join(SPOOL_DIR);
    std::fs::create_dir(&spool).unwrap();
    std::fs::set_permissions(&spool, std::fs::Permissions::from_mode(0o755)).unwrap();
    if super::sys::is_root() {
        std::os::unix::fs::chown(&spool, Some(4242), Some(4242)).unwrap();
    }
    drop(fs_over(d.path()));
    let m = std::fs::metadata(&spool).unwrap();
    assert_eq!(m.mode() & 0o7777, 0o700);
    // SAFETY: geteuid has no preconditions.
    assert_eq!(m.uid(), unsafe { libc::geteuid() });
    // A symlink in its place is refused, not followed.
    std::fs::remove_dir(&spool).unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(elsewhere.path(), &spool).unwrap();
    let e = CheckpointFs::new(FsConfig {
        store: d.path().to_path_buf(),
        cache_bytes: 64 << 20,
        ttl: Duration::from_secs(1),
        read_only: false,
        require_checksums: false,
        allow_other: false,
    })
    .expect_err("a symlinked spool is refused");
    assert!(e.to_string().contains(SPOOL_DIR), "{e}");
}

//! The mount's open-and-read path over arbitrary archive bytes: the input
//! is written as `x.zstn` and as `y.blz` into a store, and a read-only
//! `CheckpointFs` (the mount's logic without FUSE) is driven as the kernel
//! would: lookup, getattr, getxattr, open, reads at a few offsets (and a
//! sequential scan of small files, which starts prefetching), opendir and
//! readdir of the `.blz` directory, then the same for its files. Errors
//! are the expected answer; a panic, a hang, an abort or an allocation past
//! `-malloc_limit_mb` is a bug.
//!
//! Files presented larger than 256 MiB are only opened and read within
//! their first 64 KiB (the header): a valid archive may hold blocks up to
//! `MAX_BLOCK_BYTES` (1 GiB), which a read legitimately decodes;
//! `tests/hostile.rs` covers that bound. Seed with real archives:
//! `cargo +nightly fuzz run mount_read fuzz/corpus/mount_read tests/vectors
//! tests/data/golden -- -rss_limit_mb=1024 -malloc_limit_mb=1024`.
#![no_main]
use ckptfs::fs::{CheckpointFs, DirectoryReplier, FileKind, FsConfig, Opened, ROOT_INO};
use libfuzzer_sys::fuzz_target;
use std::ffi::{OsStr, OsString};
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

const MIB: u64 = 1 << 20;
/// Presented files larger than this are read only within their header.
const READ_WHOLE_BELOW: u64 = 256 * MIB;

/// One store per fuzzing process.
fn store() -> &'static PathBuf {
    static STORE: OnceLock<PathBuf> = OnceLock::new();
    STORE.get_or_init(|| {
        let p = std::env::temp_dir().join(format!("ckptfs-fuzz-mount-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        p
    })
}

/// Replaces `name` in the store by rename, as ckptfs expects archives to
/// be replaced (never rewritten in place while mapped).
fn put(name: &str, data: &[u8]) {
    let tmp = store().join(format!(".{name}.tmp"));
    std::fs::write(&tmp, data).unwrap();
    std::fs::rename(&tmp, store().join(name)).unwrap();
}

#[derive(Default)]
struct Listing(Vec<(u64, FileKind, OsString)>);

impl DirectoryReplier for Listing {
    fn add(&mut self, ino: u64, _offset: u64, kind: FileKind, name: &OsStr) -> bool {
        self.0.push((ino, kind, name.to_owned()));
        self.0.len() >= 256
    }
}

/// What the kernel does with a regular file: getattr, xattrs, open, reads.
fn read_file(fs: &CheckpointFs, ino: u64) {
    let Ok(attr) = fs.getattr(ino) else { return };
    for name in [
        "user.ckptfs.stored_size",
        "user.ckptfs.format",
        "user.ckptfs.error",
    ] {
        let _ = fs.getxattr(ino, OsStr::new(name));
    }
    let _ = fs.listxattr(ino);
    let Ok(Opened::Archive { fh, .. }) = fs.open(ino, libc::O_RDONLY) else {
        return;
    };
    let size = attr.size;
    let _ = fs.read(fh, 0, 64 << 10);
    if size <= READ_WHOLE_BELOW {
        for off in [size / 3, size / 2, size.saturating_sub(4096), size, size + 1] {
            let _ = fs.read(fh, off, 128 << 10);
        }
        if size <= 16 * MIB {
            let mut off = 0;
            while off < size {
                if fs.read(fh, off, MIB as u32).is_err() {
                    break;
                }
                off += MIB;
            }
        }
    }
    fs.release(fh);
}

/// opendir/readdir, then every entry (directories to `depth` levels).
fn walk(fs: &CheckpointFs, dir: u64, depth: u32) {
    let Ok(fh) = fs.opendir(dir) else { return };
    let mut l = Listing::default();
    let _ = fs.readdir(fh, 0, &mut l);
    fs.releasedir(fh);
    for (_, kind, name) in l.0.iter().filter(|e| e.2 != "." && e.2 != "..") {
        let Ok(e) = fs.lookup(dir, name) else { continue };
        match kind {
            FileKind::Directory if depth > 0 => walk(fs, e.attr.ino, depth - 1),
            FileKind::RegularFile => read_file(fs, e.attr.ino),
            _ => {}
        }
    }
}

fuzz_target!(|data: &[u8]| {
    put("x.zstn", data);
    put("y.blz", data);
    let fs = CheckpointFs::new(FsConfig {
        store: store().clone(),
        cache_bytes: 32 * MIB,
        ttl: Duration::ZERO,
        read_only: true,
    })
    .unwrap();
    if let Ok(e) = fs.lookup(ROOT_INO, OsStr::new("x.safetensors")) {
        read_file(&fs, e.attr.ino);
    }
    if let Ok(e) = fs.lookup(ROOT_INO, OsStr::new("y")) {
        walk(&fs, e.attr.ino, 3);
    }
    walk(&fs, ROOT_INO, 0);
});

//! `CheckpointFs` driven directly, without a mount, over a store built from
//! the shared test vectors.

use super::attr::to_time;
use super::*;
use crate::test_support::{vector_stems, vectors_dir as vectors};
use std::ffi::{OsStr, OsString};

fn store() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    for s in vector_stems() {
        std::fs::copy(
            vectors().join(format!("{s}.zstn")),
            d.path().join(format!("{s}.zstn")),
        )
        .unwrap();
    }
    std::fs::write(d.path().join("config.json"), b"{\"a\": 1}\n").unwrap();
    std::fs::create_dir(d.path().join("sub")).unwrap();
    std::fs::copy(
        vectors().join("tiny.zstn"),
        d.path().join("sub/tiny.safetensors.zstn"),
    )
    .unwrap();
    d
}

fn fs_over(store: &Path, cache: u64) -> CheckpointFs {
    CheckpointFs::new(FsConfig {
        store: store.to_path_buf(),
        cache_bytes: cache,
        ttl: Duration::from_secs(1),
        read_only: false,
        require_checksums: false,
        allow_other: false,
    })
    .unwrap()
}

fn fs_read_only(store: &Path) -> CheckpointFs {
    CheckpointFs::new(FsConfig {
        store: store.to_path_buf(),
        cache_bytes: 1 << 20,
        ttl: Duration::from_secs(1),
        read_only: true,
        require_checksums: false,
        allow_other: false,
    })
    .unwrap()
}

struct VecReplier(Vec<(u64, u64, FileKind, OsString)>);

impl DirectoryReplier for VecReplier {
    fn add(&mut self, ino: u64, offset: u64, kind: FileKind, name: &OsStr) -> bool {
        self.0.push((ino, offset, kind, name.to_os_string()));
        false
    }
}

fn list(fs: &CheckpointFs, ino: u64) -> Vec<(u64, u64, FileKind, OsString)> {
    let fh = fs.opendir(ino).unwrap();
    let mut r = VecReplier(Vec::new());
    fs.readdir(fh, 0, &mut r).unwrap();
    fs.releasedir(fh);
    r.0
}

fn read_all(fs: &CheckpointFs, ino: u64) -> Result<Vec<u8>> {
    let Opened::Archive { fh, .. } = fs.open(ino, libc::O_RDONLY)? else {
        panic!("not an archive")
    };
    let mut out = Vec::new();
    loop {
        let chunk = fs.read(fh, out.len() as u64, 200_000)?;
        if chunk.is_empty() {
            break;
        }
        out.extend_from_slice(&chunk);
    }
    fs.release(fh);
    Ok(out)
}

#[test]
fn lists_archives_as_safetensors_and_passes_the_rest_through() {
    let d = store();
    let fs = fs_over(d.path(), 64 << 20);
    let names: Vec<String> = list(&fs, ROOT_INO)
        .into_iter()
        .map(|e| e.3.into_string().unwrap())
        .collect();
    let mut expected: Vec<String> = vector_stems()
        .iter()
        .map(|s| format!("{s}.safetensors"))
        .collect();
    expected.extend([".", "..", "config.json", "sub"].map(String::from));
    expected.sort();
    let mut got = names.clone();
    got.sort();
    assert_eq!(got, expected);
    let sub = fs.lookup(ROOT_INO, OsStr::new("sub")).unwrap();
    let sub_names: Vec<_> = list(&fs, sub.attr.ino).into_iter().map(|e| e.3).collect();
    assert!(sub_names.contains(&OsString::from("tiny.safetensors")));
    // The backing name is not presented.
    assert!(matches!(
        fs.lookup(ROOT_INO, OsStr::new("tiny.zstn")),
        Err(FsError::NotFound)
    ));
}

#[test]
fn attributes_size_from_index_blocks_owner_mode_times_from_backing() {
    let d = store();
    let fs = fs_over(d.path(), 64 << 20);
    for s in vector_stems() {
        let e = fs
            .lookup(ROOT_INO, OsStr::new(&format!("{s}.safetensors")))
            .unwrap();
        let orig = std::fs::metadata(vectors().join(format!("{s}.safetensors"))).unwrap();
        let backing = std::fs::metadata(d.path().join(format!("{s}.zstn"))).unwrap();
        assert_eq!(e.attr.size, orig.len(), "{s}");
        assert_eq!(e.attr.blocks, backing.blocks(), "{s}");
        assert_eq!(e.attr.uid, backing.uid());
        assert_eq!(e.attr.perm as u32, backing.mode() & 0o7777);
        assert_eq!(
            e.attr.mtime,
            to_time(backing.mtime(), backing.mtime_nsec()),
            "{s}"
        );
        assert_eq!(e.attr.kind, FileKind::RegularFile);
        // Stable: a second lookup gives the same inode.
        let again = fs
            .lookup(ROOT_INO, OsStr::new(&format!("{s}.safetensors")))
            .unwrap();
        assert_eq!(again.attr.ino, e.attr.ino);
        // (atime may move: parsing the index reads the backing file.)
        let mut now = fs.getattr(e.attr.ino).unwrap();
        now.atime = e.attr.atime;
        assert_eq!(now, e.attr);
    }
}

#[test]
fn every_vector_reads_back_identical_through_the_cache() {
    let d = store();
    let fs = fs_over(d.path(), 64 << 20);
    let mut failures = Vec::new();
    for s in vector_stems() {
        let e = fs
            .lookup(ROOT_INO, OsStr::new(&format!("{s}.safetensors")))
            .unwrap();
        let orig = std::fs::read(vectors().join(format!("{s}.safetensors"))).unwrap();
        match read_all(&fs, e.attr.ino) {
            Ok(got) => assert!(got == orig, "{s}: bytes differ"),
            Err(err) => failures.push(format!("{s}: {err}")),
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn random_ranges_match_and_a_second_pass_hits_the_cache() {
    let d = store();
    let fs = fs_over(d.path(), 64 << 20);
    let e = fs
        .lookup(ROOT_INO, OsStr::new("fp16_dense.safetensors"))
        .unwrap();
    let orig = std::fs::read(vectors().join("fp16_dense.safetensors")).unwrap();
    let Opened::Archive { fh, keep_cache } = fs.open(e.attr.ino, libc::O_RDONLY).unwrap() else {
        panic!()
    };
    assert!(!keep_cache, "first open of a version");
    let mut x: u64 = 0x9e3779b97f4a7c15;
    for _ in 0..200 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let off = x % orig.len() as u64;
        let len = (x >> 32) % 300_000;
        let got = fs.read(fh, off, len as u32).unwrap();
        let end = (off + len).min(orig.len() as u64);
        assert_eq!(got, &orig[off as usize..end as usize]);
    }
    assert!(fs.cache_stats().hits > 0);
    fs.release(fh);
    let Opened::Archive { keep_cache, fh } = fs.open(e.attr.ino, libc::O_RDONLY).unwrap() else {
        panic!()
    };
    assert!(keep_cache, "same version opened again keeps the page cache");
    fs.release(fh);
}

#[test]
fn read_only_mount_refuses_writes_and_leaves_store_untouched() {
    let d = store();
    let before: Vec<_> = std::fs::read_dir(d.path()).unwrap().collect();
    let fs = fs_read_only(d.path());
    assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), before.len());
    assert!(matches!(
        fs.create(
            ROOT_INO,
            OsStr::new("x.safetensors"),
            0o644,
            libc::O_WRONLY,
            Caller { uid: 0, gid: 0 }
        ),
        Err(FsError::ReadOnly)
    ));
    assert!(matches!(
        fs.unlink(ROOT_INO, OsStr::new("config.json")),
        Err(FsError::ReadOnly)
    ));
    let e = fs.lookup(ROOT_INO, OsStr::new("tiny.safetensors")).unwrap();
    assert!(matches!(
        fs.open(e.attr.ino, libc::O_RDWR),
        Err(FsError::ReadOnly)
    ));
    // Nothing shows write bits (issue 40, item 10): archives, plain files
    // and directories alike, though the store's files have them.
    use std::os::unix::fs::MetadataExt;
    assert_ne!(
        std::fs::metadata(d.path().join("tiny.zstn"))
            .unwrap()
            .mode()
            & 0o200,
        0
    );
    let mut shown = vec![("tiny.safetensors", e.attr.perm)];
    shown.push(("/", fs.getattr(ROOT_INO).unwrap().perm));
    for (_, _, _, n) in list(&fs, ROOT_INO) {
        if n == "." || n == ".." {
            continue;
        }
        let a = fs.lookup(ROOT_INO, &n).unwrap().attr;
        assert_eq!(a.perm & 0o222, 0, "{n:?} shows write bits");
    }
    for (n, perm) in shown {
        assert_eq!(perm & 0o222, 0, "{n} shows write bits: {perm:o}");
    }
}

#[test]
fn bad_archive_is_listed_with_stored_size_and_open_fails_with_eio() {
    let d = store();
    std::fs::write(d.path().join("broken.zstn"), b"ZSTNgarbage-not-an-archive").unwrap();
    let fs = fs_over(d.path(), 1 << 20);
    let names: Vec<_> = list(&fs, ROOT_INO).into_iter().map(|e| e.3).collect();
    assert!(names.contains(&OsString::from("broken.safetensors")));
    let e = fs
        .lookup(ROOT_INO, OsStr::new("broken.safetensors"))
        .unwrap();
    assert_eq!(e.attr.size, 26);
    let err = fs.open(e.attr.ino, libc::O_RDONLY).unwrap_err();
    assert_eq!(err.errno(), libc::EIO);
    assert!(err.to_string().contains("broken.zstn"), "{err}");
    assert!(fs.getxattr(e.attr.ino, OsStr::new(XATTR_ERROR)).is_ok());
    // Neighbours are fine.
    let t = fs.lookup(ROOT_INO, OsStr::new("tiny.safetensors")).unwrap();
    assert!(read_all(&fs, t.attr.ino).is_ok());
}

#[test]
fn corrupt_block_fails_that_read_only() {
    let d = store();
    // Flip bytes in the middle of the frames of a checksum-less archive:
    // some reads must fail with EIO, and the header stays readable.
    let p = d.path().join("fp16_dense.zstn");
    let mut bytes = std::fs::read(&p).unwrap();
    let mid = bytes.len() / 2;
    for b in &mut bytes[mid..mid + 64] {
        *b ^= 0x5a;
    }
    std::fs::write(&p, &bytes).unwrap();
    let fs = fs_over(d.path(), 1 << 20);
    let e = fs
        .lookup(ROOT_INO, OsStr::new("fp16_dense.safetensors"))
        .unwrap();
    let orig = std::fs::read(vectors().join("fp16_dense.safetensors")).unwrap();
    let Opened::Archive { fh, .. } = fs.open(e.attr.ino, libc::O_RDONLY).unwrap() else {
        panic!()
    };
    assert_eq!(fs.read(fh, 0, 8).unwrap(), &orig[..8]);
    let whole = fs.read(fh, 0, orig.len() as u32);
    match whole {
        Err(err) => assert_eq!(err.errno(), libc::EIO),
        // zstd without checksums may decode garbage; it must not match.
        Ok(b) => assert_ne!(b, orig),
    }
    fs.release(fh);
}

#[test]
fn plain_file_shadows_archive_and_plain_files_pass_through() {
    let d = store();
    std::fs::write(d.path().join("tiny.safetensors"), b"plain wins").unwrap();
    let fs = fs_over(d.path(), 1 << 20);
    let e = fs.lookup(ROOT_INO, OsStr::new("tiny.safetensors")).unwrap();
    assert_eq!(e.attr.size, 10);
    let Opened::Plain { fh, .. } = fs.open(e.attr.ino, libc::O_RDONLY).unwrap() else {
        panic!()
    };
    assert_eq!(fs.read(fh, 0, 100).unwrap(), b"plain wins");
    let names: Vec<_> = list(&fs, ROOT_INO).into_iter().map(|e| e.3).collect();
    assert_eq!(
        names
            .iter()
            .filter(|n| n.as_os_str() == "tiny.safetensors")
            .count(),
        1
    );
    assert_eq!(fs.listxattr(e.attr.ino).unwrap(), b"");
}

#[test]
fn files_added_or_replaced_in_store_show_up_and_open_handles_keep_their_version() {
    let d = store();
    let fs = fs_over(d.path(), 64 << 20);
    assert!(matches!(
        fs.lookup(ROOT_INO, OsStr::new("late.safetensors")),
        Err(FsError::NotFound)
    ));
    std::fs::copy(vectors().join("tiny.zstn"), d.path().join("late.zstn")).unwrap();
    let e = fs.lookup(ROOT_INO, OsStr::new("late.safetensors")).unwrap();
    let tiny = std::fs::read(vectors().join("tiny.safetensors")).unwrap();
    assert_eq!(e.attr.size, tiny.len() as u64);
    let Opened::Archive { fh, .. } = fs.open(e.attr.ino, libc::O_RDONLY).unwrap() else {
        panic!()
    };
    // Replace it by rename with another archive.
    let tmp = d.path().join(".late.tmp");
    std::fs::copy(vectors().join("ints.zstn"), &tmp).unwrap();
    std::fs::rename(&tmp, d.path().join("late.zstn")).unwrap();
    // The open handle still reads the old version.
    assert_eq!(fs.read(fh, 0, 1 << 20).unwrap(), tiny);
    // A new lookup sees the new file, under a new inode.
    let e2 = fs.lookup(ROOT_INO, OsStr::new("late.safetensors")).unwrap();
    let ints = std::fs::read(vectors().join("ints.safetensors")).unwrap();
    assert_ne!(e2.attr.ino, e.attr.ino);
    assert_eq!(e2.attr.size, ints.len() as u64);
    assert_eq!(read_all(&fs, e2.attr.ino).unwrap(), ints);
    // The old inode answers its last attributes, and an open of it (one
    // that raced the rename) is served the version it showed.
    assert_eq!(fs.getattr(e.attr.ino).unwrap().size, tiny.len() as u64);
    assert_eq!(read_all(&fs, e.attr.ino).unwrap(), tiny);
    fs.release(fh);
}

#[test]
fn xattrs_report_stored_size_ratio_and_format() {
    let d = store();
    let fs = fs_over(d.path(), 1 << 20);
    let e = fs
        .lookup(ROOT_INO, OsStr::new("fp16_dense.safetensors"))
        .unwrap();
    // Answered by name, never listed (cp -a would copy them).
    assert_eq!(fs.listxattr(e.attr.ino).unwrap(), b"");
    let stored = fs
        .getxattr(e.attr.ino, OsStr::new(XATTR_STORED_SIZE))
        .unwrap();
    let backing = std::fs::metadata(d.path().join("fp16_dense.zstn")).unwrap();
    assert_eq!(stored, backing.len().to_string().into_bytes());
    let ratio: f64 = String::from_utf8(fs.getxattr(e.attr.ino, OsStr::new(XATTR_RATIO)).unwrap())
        .unwrap()
        .parse()
        .unwrap();
    assert!(ratio > 1.0);
    assert_eq!(
        fs.getxattr(e.attr.ino, OsStr::new(XATTR_FORMAT)).unwrap(),
        b"zstn-v3"
    );
    assert!(matches!(
        fs.getxattr(e.attr.ino, OsStr::new("user.other")),
        Err(FsError::NoXattr)
    ));
}

#[test]
fn statfs_reports_the_backing_filesystem() {
    let d = store();
    let fs = fs_over(d.path(), 1 << 20);
    let s = fs.statfs().unwrap();
    assert!(s.blocks > 0 && s.bsize > 0);
}

#[test]
fn concurrent_readers_of_one_handle_get_correct_bytes() {
    let d = store();
    let fs = Arc::new(fs_over(d.path(), 2 << 20));
    let e = fs
        .lookup(ROOT_INO, OsStr::new("fp16_dense.safetensors"))
        .unwrap();
    let orig = Arc::new(std::fs::read(vectors().join("fp16_dense.safetensors")).unwrap());
    let Opened::Archive { fh, .. } = fs.open(e.attr.ino, libc::O_RDONLY).unwrap() else {
        panic!()
    };
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let (fs, orig) = (fs.clone(), orig.clone());
            std::thread::spawn(move || {
                let mut x = 0x1234_5678_9abc_def0u64 ^ (t * 0x9e37_79b9);
                for _ in 0..100 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let off = x % orig.len() as u64;
                    let len = (x >> 40) % 100_000;
                    let got = fs.read(fh, off, len as u32).unwrap();
                    let end = (off + len).min(orig.len() as u64) as usize;
                    assert_eq!(got, &orig[off as usize..end]);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

/// A safetensors file of U8 tensors.
fn st_file(tensors: &[(&str, &[u8])]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (name, bytes) in tensors {
        header.insert(
            name.to_string(),
            serde_json::json!({"dtype": "U8", "shape": [bytes.len()],
                "data_offsets": [data.len(), data.len() + bytes.len()]}),
        );
        data.extend_from_slice(bytes);
    }
    let mut h = serde_json::to_vec(&header).unwrap();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    out.extend_from_slice(&data);
    out
}

#[test]
fn blz_is_a_read_only_directory_sharing_tied_blocks_in_the_cache() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    let tied: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let own: Vec<u8> = (0..100_000u32).map(|i| (i % 13) as u8).collect();
    let a = st_file(&[("embed", &tied), ("w", &own)]);
    let b = st_file(&[("lm_head", &tied)]);
    std::fs::write(src.join("a.safetensors"), &a).unwrap();
    std::fs::write(src.join("b.safetensors"), &b).unwrap();
    std::fs::write(src.join("sub/tok.bin"), [0u8, 255, 1, 254]).unwrap();
    let store = tmp.path().join("store");
    std::fs::create_dir(&store).unwrap();
    ckptfs_pack::pack_dir(
        &src,
        &store.join("m.blz"),
        Default::default(),
        false,
        &|_| {},
    )
    .unwrap();
    std::fs::write(store.join("junk.blz"), b"not a blz").unwrap();
    let fs = fs_over(&store, 64 << 20);

    let names: Vec<OsString> = list(&fs, ROOT_INO).into_iter().map(|e| e.3).collect();
    assert!(names.contains(&"m".into()) && names.contains(&"junk".into()));
    assert!(!names.contains(&"m.blz".into()));
    let m = fs.lookup(ROOT_INO, OsStr::new("m")).unwrap().attr;
    assert_eq!(m.kind, FileKind::Directory);
    assert_eq!(m.perm & 0o222, 0);
    let kids: Vec<(FileKind, OsString)> = list(&fs, m.ino)
        .into_iter()
        .skip(2)
        .map(|e| (e.2, e.3))
        .collect();
    assert_eq!(
        kids,
        vec![
            (FileKind::RegularFile, "a.safetensors".into()),
            (FileKind::RegularFile, "b.safetensors".into()),
            (FileKind::Directory, "sub".into()),
        ]
    );
    let ea = fs.lookup(m.ino, OsStr::new("a.safetensors")).unwrap().attr;
    assert_eq!(ea.size, a.len() as u64);
    assert_eq!(
        fs.lookup(m.ino, OsStr::new("a.safetensors"))
            .unwrap()
            .attr
            .ino,
        ea.ino,
        "stable inode numbers"
    );
    assert_eq!(fs.getattr(ea.ino).unwrap().size, a.len() as u64);
    let eb = fs.lookup(m.ino, OsStr::new("b.safetensors")).unwrap().attr;
    assert!(matches!(
        fs.open(ea.ino, libc::O_RDWR),
        Err(FsError::ReadOnly)
    ));
    assert!(matches!(
        fs.open(m.ino, libc::O_RDONLY),
        Err(FsError::IsADirectory)
    ));
    assert_eq!(read_all(&fs, ea.ino).unwrap(), a);
    let before = fs.cache_stats();
    // b holds only the tensor tied to a's: every block is already cached.
    assert_eq!(read_all(&fs, eb.ino).unwrap(), b);
    let after = fs.cache_stats();
    assert_eq!(after.misses, before.misses, "tied tensor decoded once");
    assert!(after.hits > before.hits);
    let sub = fs.lookup(m.ino, OsStr::new("sub")).unwrap().attr;
    assert_eq!(sub.kind, FileKind::Directory);
    let tok = fs.lookup(sub.ino, OsStr::new("tok.bin")).unwrap().attr;
    assert_eq!(tok.size, 4);
    assert_eq!(read_all(&fs, tok.ino).unwrap(), [0u8, 255, 1, 254]);
    assert!(matches!(
        fs.lookup(m.ino, OsStr::new("nope")),
        Err(FsError::NotFound)
    ));

    // An unparseable .blz: a directory whose listing and lookups are EIO.
    let junk = fs.lookup(ROOT_INO, OsStr::new("junk")).unwrap().attr;
    assert_eq!(junk.kind, FileKind::Directory);
    assert_eq!(fs.opendir(junk.ino).unwrap_err().errno(), libc::EIO);
    assert_eq!(
        fs.lookup(junk.ino, OsStr::new("a")).unwrap_err().errno(),
        libc::EIO
    );
}

/// A block larger than the cache (z4ai writes a tensor as one block) is
/// decoded once for a sequential read of it, not once per kernel request.
#[test]
fn a_block_larger_than_the_cache_is_decoded_once_per_pass() {
    use crate::test_support::{z4ai_opaque_frame, zstd_rle_frame, zstn_of_frames};
    let d = tempfile::tempdir().unwrap();
    let len = 64u64 << 20;
    let frame = z4ai_opaque_frame(1, len, &zstd_rle_frame(len, 7));
    std::fs::write(
        d.path().join("big.zstn"),
        zstn_of_frames(&[("t", len, frame)]),
    )
    .unwrap();
    let fs = fs_over(d.path(), 16 << 20);
    let e = fs.lookup(ROOT_INO, OsStr::new("big.safetensors")).unwrap();
    let Opened::Archive { fh, .. } = fs.open(e.attr.ino, libc::O_RDONLY).unwrap() else {
        panic!("not an archive")
    };
    let size = e.attr.size;
    let (mut off, mut sevens) = (0u64, 0u64);
    while off < size {
        let chunk = fs.read(fh, off, 1 << 20).unwrap();
        sevens += chunk.iter().filter(|&&b| b == 7).count() as u64;
        off += chunk.len() as u64;
    }
    assert_eq!(sevens, len);
    let s = fs.cache_stats();
    assert_eq!(s.misses, 1, "{s:?}");
    assert!(s.bytes <= 16 << 20, "{s:?}");
}

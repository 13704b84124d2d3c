//! `.blz` model archives through a real mount: `STORE/model.blz` appears as
//! the read-only directory `MNT/model` holding the original files (names,
//! sizes, bytes, subdirectories), Python `safetensors` loads every tensor
//! of every shard, writes answer EROFS, a corrupted tensor fails only the
//! reads that need it, and an unparseable `.blz` is a directory whose
//! listing fails with EIO and a log line naming it.

use crate::common;

use ckptfs::format::blz::{self as blzfmt, Content, Stored};
use common::{vectors_dir, ModelDir, Mount, SHARD1, SHARD2};
use std::collections::BTreeMap;
use std::fs;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Every entry under `dir`: relative path -> Some(bytes) for files, None
/// for directories.
fn tree(dir: &Path) -> BTreeMap<String, Option<Vec<u8>>> {
    let mut m = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(dir).unwrap().to_string_lossy().into_owned();
            let meta = fs::metadata(&p).unwrap();
            if meta.is_dir() {
                stack.push(p);
                m.insert(rel, None);
            } else {
                let bytes = fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
                assert_eq!(meta.len(), bytes.len() as u64, "{rel}: size");
                m.insert(rel, Some(bytes));
            }
        }
    }
    m
}

/// Every entry under `dir` (relative paths, sorted).
fn tree_names(dir: &Path) -> Vec<String> {
    let mut v = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let p = e.unwrap().path();
            v.push(p.strip_prefix(dir).unwrap().to_string_lossy().into_owned());
            if fs::symlink_metadata(&p).unwrap().is_dir() {
                stack.push(p);
            }
        }
    }
    v.sort();
    v
}

struct Fixture {
    _tmp: tempfile::TempDir,
    src: PathBuf,
    /// The archives the store holds, by store name (for `ckptfs verify`).
    archives: PathBuf,
    m: Mount,
}

impl Fixture {
    /// A copy of store archive `name` outside the mount.
    fn archive(&self, name: &str) -> PathBuf {
        self.archives.join(name)
    }
}

/// Content of the plain file the store holds beside the archives.
const PLAIN: &[u8] = b"a plain file, passed through\n";

/// The header JSON of archive `bytes`, as a byte range of the file.
fn header_json(bytes: &[u8]) -> Range<usize> {
    let p = blzfmt::parse(bytes).unwrap();
    p.header_json.start as usize..p.header_json.end as usize
}

/// The unique position of `needle` inside `range` of `bytes`.
fn find_in(bytes: &[u8], range: Range<usize>, needle: &[u8]) -> usize {
    let hits: Vec<usize> = bytes[range.clone()]
        .windows(needle.len())
        .enumerate()
        .filter(|(_, w)| *w == needle)
        .map(|(i, _)| range.start + i)
        .collect();
    assert_eq!(
        hits.len(),
        1,
        "{:?} found {} times",
        String::from_utf8_lossy(needle),
        hits.len()
    );
    hits[0]
}

/// Where sidecar `path`'s stored content lies in archive `bytes`: the
/// inside of the JSON string of its `text` or `base64` member, found from
/// the parsed header.
fn embedded_range(bytes: &[u8], path: &str) -> Range<usize> {
    let p = blzfmt::parse(bytes).unwrap();
    let f = p.header.files.iter().find(|f| f.path == path).unwrap();
    let (member, value) = match &f.content {
        Content::Plain {
            stored: Stored::Text(t),
            ..
        } => ("text", t),
        Content::Plain {
            stored: Stored::Base64(b),
            ..
        } => ("base64", b),
        _ => panic!("{path} is not embedded"),
    };
    let literal = serde_json::to_string(value).unwrap();
    let needle = format!("\"{member}\":{literal}");
    let at = find_in(bytes, header_json(bytes), needle.as_bytes());
    let start = at + needle.len() - literal.len() + 1;
    start..start + literal.len() - 2
}

/// Flips the case of one letter of sidecar `path`'s stored content (not
/// part of an escape): the header stays valid, the content differs.
fn damage_sidecar(bytes: &mut [u8], path: &str) {
    let r = embedded_range(bytes, path);
    let mid = (r.start + r.end) / 2;
    let at = (mid..r.end)
        .chain(r.start..mid)
        .find(|&i| bytes[i].is_ascii_alphabetic() && bytes[i - 1] != b'\\')
        .unwrap();
    let before = blzfmt::parse(bytes).unwrap().header.files;
    bytes[at] ^= 0x20;
    let after = blzfmt::parse(bytes)
        .expect("still a valid archive")
        .header
        .files;
    let changed: Vec<&str> = before
        .iter()
        .zip(&after)
        .filter(|(a, b)| a != b)
        .map(|(a, _)| a.path.as_str())
        .collect();
    assert_eq!(changed, [path], "only {path}'s entry changes");
}

/// Flips the `[` opening the `files` array into `{`: the header is no
/// longer valid JSON for a .blz.
fn damage_header(bytes: &mut [u8]) {
    let at = find_in(bytes, header_json(bytes), b"\"files\":[") + 8;
    assert_eq!(bytes[at], b'[');
    bytes[at] ^= 0x20;
    assert!(
        matches!(blzfmt::parse(bytes), Err(blzfmt::BlzError::InvalidJson(_))),
        "header still parses"
    );
}

/// Flips one byte in the middle of the stored bytes of `tensor`'s blob.
fn damage_tensor(bytes: &mut [u8], tensor: &str) {
    let p = blzfmt::parse(bytes).unwrap();
    let t = p
        .header
        .files
        .iter()
        .flat_map(|f| f.tensors().to_vec())
        .find(|t| t.name == tensor)
        .unwrap();
    let b = &p.header.blobs[t.blob.unwrap() as usize];
    bytes[(p.data_start + b.offset + b.length / 2) as usize] ^= 0x40;
}

/// Points `tensor`'s `blob` at the blob of `other` (same length) by
/// changing the one byte where their indices differ. Every block of every
/// blob is intact; only the header (and so `header_xxh3`) is damaged.
fn swap_tensor_blob(bytes: &mut [u8], tensor: &str, other: &str) {
    let p = blzfmt::parse(bytes).unwrap();
    let tensors: Vec<_> = p
        .header
        .files
        .iter()
        .flat_map(|f| f.tensors().to_vec())
        .collect();
    let t = tensors.iter().find(|t| t.name == tensor).unwrap();
    let o = tensors.iter().find(|t| t.name == other).unwrap();
    assert_eq!(t.len(), o.len(), "{tensor} and {other} differ in length");
    let (from, to) = (t.blob.unwrap().to_string(), o.blob.unwrap().to_string());
    assert_eq!(from.len(), to.len());
    let diff: Vec<usize> = (0..from.len())
        .filter(|&i| from.as_bytes()[i] != to.as_bytes()[i])
        .collect();
    assert_eq!(diff.len(), 1, "blob {from} and {to} differ in one digit");
    let entry = serde_json::to_string(t).unwrap();
    let at = find_in(bytes, header_json(bytes), entry.as_bytes());
    let digit = at + entry.len() - 1 - from.len() + diff[0];
    assert_eq!(&bytes[digit - 7 - diff[0]..digit - diff[0]], b"\"blob\":");
    bytes[digit] = to.as_bytes()[diff[0]];
    let q = blzfmt::parse(bytes).expect("still a valid archive");
    let moved = q
        .header
        .files
        .iter()
        .flat_map(|f| f.tensors().to_vec())
        .find(|x| x.name == tensor)
        .unwrap();
    assert_eq!(moved.blob, o.blob);
}

/// Packs the model, and mounts a store holding `model.blz` and, each with
/// one damage: `bad.blz` (one byte of tensor `model.layers.1.w` flipped),
/// `badcfg.blz` (config.json's stored text), `badtok.blz`
/// (tokenizer.model's stored base64), `badhdr.blz` (header JSON structure),
/// `swap.blz` (tensor `model.layers.0.w` pointed at the blob of
/// `model.layers.0.v`), `junk.blz` (not a .blz); beside them a plain file
/// `plain.txt` and `tiny.zstn` (shown as `tiny.safetensors`).
fn fixture() -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("model");
    fs::create_dir(&src).unwrap();
    // Two shards (one tensor tied across them), an index, config, a binary
    // tokenizer model and a nested subdirectory; model.layers.0.v has the
    // shape of model.layers.0.w (for swap.blz).
    ModelDir {
        seed: 11,
        embed: [512, 384],
        twin: true,
        edge_cases: false,
    }
    .write(&src);
    let archives = tmp.path().join("archives");
    fs::create_dir(&archives).unwrap();
    let blz = archives.join("model.blz");
    let out = common::ckptfs(&["pack", src.to_str().unwrap(), "-o", blz.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let good = fs::read(&blz).unwrap();
    type Damage<'a> = (&'a str, &'a dyn Fn(&mut Vec<u8>));
    let damaged: [Damage; 5] = [
        ("bad.blz", &|b| damage_tensor(b, "model.layers.1.w")),
        ("badcfg.blz", &|b| damage_sidecar(b, "config.json")),
        ("badtok.blz", &|b| damage_sidecar(b, "tokenizer.model")),
        ("badhdr.blz", &|b| damage_header(b)),
        ("swap.blz", &|b| {
            swap_tensor_blob(b, "model.layers.0.w", "model.layers.0.v")
        }),
    ];
    for (name, damage) in damaged {
        let mut b = good.clone();
        damage(&mut b);
        assert_ne!(b, good, "{name}");
        fs::write(archives.join(name), &b).unwrap();
    }
    fs::write(
        archives.join("junk.blz"),
        b"this is not a blz archive at all",
    )
    .unwrap();
    let m = Mount::new(
        |store| {
            for e in fs::read_dir(&archives).unwrap() {
                let e = e.unwrap();
                fs::copy(e.path(), store.join(e.file_name())).unwrap();
            }
            fs::write(store.join("plain.txt"), PLAIN).unwrap();
            fs::copy(vectors_dir().join("tiny.zstn"), store.join("tiny.zstn")).unwrap();
        },
        &["--cache-size", "64M"],
    );
    Fixture {
        _tmp: tmp,
        src,
        archives,
        m,
    }
}

/// The rest of the mount still serves: the intact archive, the plain file
/// and the .zstn.
fn others_still_work(f: &Fixture) {
    let want = tree(&f.src);
    for k in ["config.json", SHARD1, SHARD2, "tokenizer.model"] {
        let got = fs::read(f.m.path("model").join(k)).unwrap_or_else(|e| panic!("model/{k}: {e}"));
        assert!(got == *want[k].as_ref().unwrap(), "model/{k} differs");
    }
    assert_eq!(fs::read(f.m.path("plain.txt")).unwrap(), PLAIN);
    let tiny = fs::read(vectors_dir().join("tiny.safetensors")).unwrap();
    assert!(fs::read(f.m.path("tiny.safetensors")).unwrap() == tiny);
}

/// `ckptfs verify` of `p` fails with one line naming `p` and holding every
/// string of `needles`; returns the line.
fn verify_fails(p: &Path, needles: &[&str]) -> String {
    let out = common::ckptfs(&["verify", p.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(text.lines().count(), 1, "one verdict line: {text}");
    assert!(text.starts_with("FAIL"), "{text}");
    assert!(text.contains(p.to_str().unwrap()), "{text}");
    for n in needles {
        assert!(text.contains(n), "{n:?} not in {text}");
    }
    text
}

/// The byte range of every tensor of a safetensors file, in file order.
fn tensor_ranges(file: &[u8]) -> Vec<(String, Range<usize>)> {
    let hlen = u64::from_le_bytes(file[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&file[8..8 + hlen]).unwrap();
    let mut v: Vec<(String, Range<usize>)> = header
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| *k != "__metadata__")
        .map(|(k, t)| {
            let o = t["data_offsets"].as_array().unwrap();
            let (a, b) = (
                o[0].as_u64().unwrap() as usize,
                o[1].as_u64().unwrap() as usize,
            );
            (k.clone(), 8 + hlen + a..8 + hlen + b)
        })
        .collect();
    v.sort_by_key(|(_, r)| r.start);
    v
}

fn eio(r: std::io::Result<impl std::fmt::Debug>, what: &str) {
    match r {
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EIO), "{what}: {e}"),
        Ok(v) => panic!("{what}: expected EIO, got {v:?}"),
    }
}

fn sha256sums(files: &[PathBuf]) -> Vec<String> {
    let out = std::process::Command::new("sha256sum")
        .args(files)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| l.split_whitespace().next().unwrap().to_string())
        .collect()
}

#[test]
fn blz_mounts_as_the_original_directory() {
    let f = fixture();
    let mnt = f.m.path("model");
    assert!(fs::metadata(&mnt).unwrap().is_dir());
    // The archive itself is not shown under its own name.
    assert!(fs::symlink_metadata(f.m.path("model.blz")).is_err());
    let names: Vec<String> = fs::read_dir(&f.m.mnt)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    for n in ["model", "bad", "junk"] {
        assert!(names.iter().any(|x| x == n), "{n} not in {names:?}");
    }
    let want = tree(&f.src);
    let got = tree(&mnt);
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>()
    );
    for (k, v) in &want {
        assert!(got[k] == *v, "{k}: differs from the original");
    }
    // sha256sum of every file, mounted against original.
    let files: Vec<&String> = want
        .iter()
        .filter(|(_, v)| v.is_some())
        .map(|(k, _)| k)
        .collect();
    let a = sha256sums(&files.iter().map(|k| mnt.join(k)).collect::<Vec<_>>());
    let b = sha256sums(&files.iter().map(|k| f.src.join(k)).collect::<Vec<_>>());
    assert_eq!(a, b);

    // Python safetensors loads every tensor of every shard.
    let python = common::venv_python();
    let out = std::process::Command::new(&python)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mount_safetensors_check.py"))
        .arg(mnt.join(SHARD1))
        .arg(f.src.join(SHARD1))
        .arg(mnt.join(SHARD2))
        .arg(f.src.join(SHARD2))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout.lines().filter(|l| l.starts_with("ok ")).count(),
        2,
        "{stdout}"
    );

    // Nothing inside can be written.
    let e = fs::OpenOptions::new()
        .write(true)
        .open(mnt.join("config.json"))
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS));
    let e = fs::write(mnt.join("new.txt"), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS));
    let e = fs::write(mnt.join("1_Pooling/nested/new.txt"), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS));
    let e = fs::create_dir(mnt.join("sub")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS));
    let e = fs::remove_file(mnt.join("config.json")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS));
    // Missing names are ENOENT, files are not directories.
    let e = fs::metadata(mnt.join("nope")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
    let e = fs::read_dir(mnt.join("config.json")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOTDIR));
}

#[test]
fn damaged_blz_fails_only_what_is_damaged() {
    let f = fixture();
    let bad = f.m.path("bad");
    // Everything but the damaged shard reads fine.
    let want = tree(&f.src);
    for (k, v) in &want {
        let Some(v) = v else { continue };
        if k == SHARD2 {
            continue;
        }
        assert!(fs::read(bad.join(k)).unwrap() == *v, "{k}");
    }
    // The damaged shard: its header and the undamaged tensors read, the
    // damaged tensor's region answers EIO.
    let orig = &want[SHARD2].as_ref().unwrap()[..];
    let hlen = u64::from_le_bytes(orig[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&orig[8..8 + hlen]).unwrap();
    let range = |name: &str| {
        let o = header[name]["data_offsets"].as_array().unwrap();
        let (a, b) = (
            o[0].as_u64().unwrap() as usize,
            o[1].as_u64().unwrap() as usize,
        );
        8 + hlen + a..8 + hlen + b
    };
    let file = fs::File::open(bad.join(SHARD2)).unwrap();
    assert_eq!(file.metadata().unwrap().len(), orig.len() as u64);
    let mut head = vec![0u8; 8 + hlen];
    file.read_exact_at(&mut head, 0).unwrap();
    assert_eq!(head, orig[..8 + hlen]);
    // Page by page (the kernel reads whole pages): a page that shares no
    // byte with the damaged tensor reads correctly; one that does either
    // reads correctly or (needing the damaged block) fails with EIO.
    let damaged = range("model.layers.1.w");
    let (mut good, mut failed) = (0, 0);
    for start in (0..orig.len()).step_by(4096) {
        let end = (start + 4096).min(orig.len());
        let mut buf = vec![0u8; end - start];
        let r = file.read_exact_at(&mut buf, start as u64);
        if end <= damaged.start || start >= damaged.end {
            r.unwrap_or_else(|e| panic!("page at {start}: {e}"));
            assert!(buf == orig[start..end], "page at {start}");
            good += 1;
        } else if let Err(e) = r {
            // Inside the damaged tensor: the damaged block's pages fail.
            assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
            failed += 1;
        } else {
            assert!(buf == orig[start..end], "page at {start}");
        }
    }
    assert!(
        good > 10 && failed > 0,
        "{good} good pages, {failed} failed"
    );
    let e = fs::read(bad.join(SHARD2)).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    // The intact archive is unaffected.
    assert!(fs::read(f.m.path("model").join(SHARD2)).unwrap() == orig);
}

#[test]
fn unparseable_blz_is_a_directory_that_fails_with_eio() {
    let f = fixture();
    let junk = f.m.path("junk");
    assert!(fs::metadata(&junk).unwrap().is_dir());
    let e = fs::read_dir(&junk).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    let e = fs::metadata(junk.join("config.json")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    let log = f.m.log_text();
    assert!(
        log.lines()
            .any(|l| l.contains("junk.blz") && l.contains("not a .blz archive")),
        "{log}"
    );
    // The rest of the mount is unaffected.
    assert!(fs::read(f.m.path("model/config.json")).is_ok());
}

#[test]
fn damaged_sidecar_fails_only_that_file() {
    let f = fixture();
    let want = tree(&f.src);
    for (name, sidecar) in [("badcfg", "config.json"), ("badtok", "tokenizer.model")] {
        let blz = format!("{name}.blz");
        verify_fails(
            &f.archive(&blz),
            &[&format!("{blz}: {sidecar}: checksum mismatch")],
        );
        let dir = f.m.path(name);
        // The listing and the sizes are intact: only the content is damaged.
        assert_eq!(
            tree_names(&dir),
            want.keys().cloned().collect::<Vec<_>>(),
            "{name}"
        );
        let p = dir.join(sidecar);
        let orig = want[sidecar].as_ref().unwrap();
        assert_eq!(fs::metadata(&p).unwrap().len(), orig.len() as u64);
        eio(fs::read(&p), &format!("{name}/{sidecar}"));
        let file = fs::File::open(&p).unwrap();
        let mut buf = [0u8; 16];
        eio(
            file.read_at(&mut buf, 0),
            &format!("{name}/{sidecar} pread"),
        );
        eio(
            file.read_at(&mut buf, orig.len() as u64 / 2),
            &format!("{name}/{sidecar} pread in the middle"),
        );
        // Every other file of the archive, shards and sidecars, is intact.
        for (k, v) in &want {
            let Some(v) = v else { continue };
            if k == sidecar {
                continue;
            }
            let got = fs::read(dir.join(k)).unwrap_or_else(|e| panic!("{name}/{k}: {e}"));
            assert!(got == *v, "{name}/{k} differs");
        }
        let log = f.m.log_text();
        assert!(
            log.lines()
                .any(|l| l.contains(&blz) && l.contains(&format!(": {sidecar}: checksum"))),
            "{log}"
        );
    }
    others_still_work(&f);
}

#[test]
fn damaged_tensor_fails_only_its_byte_range() {
    let f = fixture();
    verify_fails(
        &f.archive("bad.blz"),
        &[SHARD2, "tensor \"model.layers.1.w\""],
    );
    let want = tree(&f.src);
    let orig = want[SHARD2].as_ref().unwrap();
    let file = fs::File::open(f.m.path("bad").join(SHARD2)).unwrap();
    let tensors = tensor_ranges(orig);
    let damaged = tensors
        .iter()
        .find(|(n, _)| n == "model.layers.1.w")
        .unwrap()
        .1
        .clone();
    // Reads of the damaged tensor fail.
    let mut buf = vec![0u8; damaged.len()];
    eio(
        file.read_exact_at(&mut buf, damaged.start as u64),
        "the damaged tensor",
    );
    // The kernel reads whole pages: a page shared with the damaged tensor
    // may fail too, so the other tensors are read without those pages.
    let page = 4096;
    let (lo, hi) = (
        damaged.start / page * page,
        damaged.end.div_ceil(page) * page,
    );
    let mut checked = Vec::new();
    // The shard's own header, up to its first tensor, too.
    let head = ("header".to_string(), 0..tensors[0].1.start);
    for (name, r) in tensors.iter().chain([&head]) {
        if *r == damaged {
            continue;
        }
        let r = if r.end <= lo || r.start >= hi {
            r.clone()
        } else if r.start < lo {
            r.start..lo
        } else {
            hi.min(r.end)..r.end
        };
        if r.is_empty() {
            continue;
        }
        let mut buf = vec![0u8; r.len()];
        file.read_exact_at(&mut buf, r.start as u64)
            .unwrap_or_else(|e| panic!("{name} {r:?}: {e}"));
        assert!(buf == orig[r.clone()], "{name} {r:?} differs");
        checked.push(name.clone());
    }
    assert!(
        checked.iter().any(|n| n == "lm_head.weight"),
        "checked {checked:?}"
    );
    // The other shard and the sidecars of the same archive are intact.
    for (k, v) in &want {
        let Some(v) = v else { continue };
        if k != SHARD2 {
            assert!(fs::read(f.m.path("bad").join(k)).unwrap() == *v, "bad/{k}");
        }
    }
    others_still_work(&f);
}

#[test]
fn damaged_header_fails_that_archive_only() {
    let f = fixture();
    let line = verify_fails(&f.archive("badhdr.blz"), &["not valid .blz JSON"]);
    assert!(!line.contains("panicked"), "{line}");
    // Listed as a directory; entering it fails with EIO.
    let names: Vec<String> = fs::read_dir(&f.m.mnt)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(names.iter().any(|n| n == "badhdr"), "{names:?}");
    let dir = f.m.path("badhdr");
    assert!(fs::metadata(&dir).unwrap().is_dir());
    eio(fs::read_dir(&dir), "opendir badhdr");
    eio(
        fs::metadata(dir.join("config.json")),
        "lookup badhdr/config.json",
    );
    eio(fs::File::open(dir.join(SHARD1)), "open badhdr/shard");
    eio(
        fs::read(dir.join("1_Pooling/config.json")),
        "badhdr/1_Pooling",
    );
    let log = f.m.log_text();
    assert!(
        log.lines()
            .any(|l| l.contains("badhdr.blz") && l.contains("not valid .blz JSON")),
        "{log}"
    );
    // The other archives and entries of the mount keep working.
    others_still_work(&f);
    assert!(
        fs::read(f.m.path("badcfg").join(SHARD1)).unwrap()
            == *tree(&f.src)[SHARD1].as_ref().unwrap()
    );
}

/// One damaged byte in the header, a tensor's `"blob":N` turned into the
/// index of another blob of the same length: the blocks of that other blob
/// check out, so only the header digest (checked at open) and the tensor's
/// own xxh3 can tell. The mount must answer EIO for that tensor, never the
/// other tensor's bytes (this once served them; see `trusted` in
/// crates/archive/src/blz.rs).
#[test]
fn damaged_blob_reference_in_header_gives_eio_not_other_bytes() {
    let f = fixture();
    verify_fails(&f.archive("swap.blz"), &["tensor \"model.layers.0.w\""]);
    let want = tree(&f.src);
    let orig = want[SHARD1].as_ref().unwrap();
    let tensors = tensor_ranges(orig);
    let range = |n: &str| tensors.iter().find(|(x, _)| x == n).unwrap().1.clone();
    let (w, v) = (range("model.layers.0.w"), range("model.layers.0.v"));
    let file = fs::File::open(f.m.path("swap").join(SHARD1)).unwrap();
    let mut buf = vec![0u8; w.len()];
    match file.read_exact_at(&mut buf, w.start as u64) {
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}"),
        Ok(()) => {
            assert!(
                buf != orig[v.clone()],
                "swap/{SHARD1} serves model.layers.0.v's bytes as model.layers.0.w, without an error"
            );
            assert!(buf == orig[w.clone()], "wrong bytes for model.layers.0.w");
        }
    }
    others_still_work(&f);
}

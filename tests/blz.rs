//! `.blz` model archives: round trips of a multi-shard model directory
//! (default and --raw), dedup across shards, reads of single files and
//! tensors, corruption detected by verify and by reads of only what is
//! damaged, hostile headers refused by name, the raw layout read by a
//! stdlib-only Python script, and golden bytes.

use crate::common;
use ckptfs::archive::{plan, verify, ArchiveView, BlzArchive};
use ckptfs::format::blz::{
    self, BlobEntry, BlockEntry, BlzError, Content, Digest, Encoding, FileEntry, Header, Stored,
};
use ckptfs::pack::{pack_dir, BlzOptions};
use common::*;
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use xxhash_rust::xxh3::xxh3_64;

/// Every file under `dir`, relative path -> bytes.
fn tree(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut m = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let rel = p.strip_prefix(dir).unwrap().to_string_lossy().into_owned();
                m.insert(rel, fs::read(&p).unwrap());
            }
        }
    }
    m
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

struct Fixture {
    _tmp: tempfile::TempDir,
    src: PathBuf,
    blz: PathBuf,
    root: PathBuf,
}

fn packed(raw: bool) -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().to_path_buf();
    let src = root.join("model");
    fs::create_dir(&src).unwrap();
    // A two-shard model directory with an index, a binary tokenizer model,
    // a nested subdirectory, an empty file and a tensor tied across shards;
    // no two blobs of equal length.
    ModelDir {
        seed: 7,
        embed: [1024, 640],
        twin: false,
        edge_cases: true,
    }
    .write(&src);
    let blz = root.join("model.blz");
    let mut args = vec!["pack", s(&src), "-o", s(&blz)];
    if raw {
        args.push("--raw");
    }
    let out = ckptfs(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Fixture {
        _tmp: tmp,
        src,
        blz,
        root,
    }
}

fn roundtrip(raw: bool) {
    let f = packed(raw);
    let out_dir = f.root.join("unpacked");
    let out = ckptfs(&["unpack", s(&f.blz), "-o", s(&out_dir)]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (a, b) = (tree(&f.src), tree(&out_dir));
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
    for (k, v) in &a {
        assert!(b[k] == *v, "{k} differs");
    }
    // Refuses to overwrite without --force; succeeds with it.
    let out = ckptfs(&["unpack", s(&f.blz), "-o", s(&out_dir)]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("exists"));
    assert!(ckptfs(&["unpack", s(&f.blz), "-o", s(&out_dir), "--force"])
        .status
        .success());

    let ar = BlzArchive::open(&f.blz).unwrap();
    // The tied tensor is stored once: 8 tensors, 7 blobs (+ no file blobs).
    let tensors: Vec<_> = ar
        .entries()
        .iter()
        .flat_map(|f| f.tensors().to_vec())
        .collect();
    assert_eq!(tensors.len(), 8);
    assert_eq!(ar.units(), 7);
    let blob_of = |n: &str| tensors.iter().find(|t| t.name == n).unwrap().blob;
    assert_eq!(
        blob_of("model.embed_tokens.weight"),
        blob_of("lm_head.weight")
    );
    let enc = if raw {
        Encoding::Raw
    } else {
        Encoding::Z4aiFrame
    };
    assert!((0..ar.units() as u32).all(|u| ar.blob(u).encoding == enc));
    // Text and binary sidecars are embedded as such.
    let entry = |p: &str| ar.entries()[ar.find(p).unwrap()].clone();
    assert!(matches!(
        entry("config.json").content,
        Content::Plain {
            stored: Stored::Text(_),
            ..
        }
    ));
    assert!(matches!(
        entry("tokenizer.model").content,
        Content::Plain {
            stored: Stored::Base64(_),
            ..
        }
    ));
    assert_eq!(ar.directories(), vec!["1_Pooling", "1_Pooling/nested"]);

    // Arbitrary ranges of a shard through the Archive-like read API.
    let i = ar.find("model-00002-of-00002.safetensors").unwrap();
    let orig = &a["model-00002-of-00002.safetensors"];
    assert_eq!(ar.logical_len(i), orig.len() as u64);
    let mut rng = Rng(3);
    for _ in 0..40 {
        let off = rng.below(orig.len() as u64);
        let len = rng.below(3 << 20) as usize;
        let mut buf = vec![0u8; len];
        let n = ar.read_at(i, off, &mut buf).unwrap();
        assert_eq!(&buf[..n], &orig[off as usize..off as usize + n]);
    }
    let out = ckptfs(&["verify", s(&f.blz)]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("OK"));
}

#[test]
fn roundtrip_default() {
    roundtrip(false);
}

#[test]
fn roundtrip_raw() {
    roundtrip(true);
}

#[test]
fn reads_touch_only_the_covered_blocks() {
    let f = packed(false);
    let ar = BlzArchive::open(&f.blz).unwrap();
    let i = ar.find("model-00001-of-00002.safetensors").unwrap();
    let whole = plan(&ar, i, 0..ar.logical_len(i)).unwrap();
    let blocks: Vec<_> = whole
        .iter()
        .filter_map(|p| match p.source {
            ckptfs::archive::PieceSource::Block(k) => Some(k),
            _ => None,
        })
        .collect();
    assert!(blocks.len() > 2, "the embedding should span several blocks");
    // A small read in the middle of the embedding plans one block.
    let sub = plan(&ar, i, 100_000..100_100).unwrap();
    assert_eq!(sub.len(), 1);
    for k in blocks {
        assert_eq!(
            ar.decode_block(k).unwrap().len() as u64,
            ar.block_len(k).unwrap()
        );
    }
}

#[test]
fn list_and_extract() {
    let f = packed(false);
    let out = ckptfs(&["list", s(&f.blz), "--filter", "layers.0"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.lines().count(), 2, "{text}");
    assert!(
        text.contains("model.layers.0.w") && text.contains("[256, 256]") && text.contains("262144")
    );

    let dir = f.root.join("x");
    let out = ckptfs(&[
        "extract",
        s(&f.blz),
        "--tensor",
        "model.layers.1.w",
        "lm_head.weight",
        "-o",
        s(&dir),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let src = tree(&f.src);
    let (h, data) =
        ckptfs::format::safetensors::split_file(&src["model-00002-of-00002.safetensors"]).unwrap();
    for name in ["model.layers.1.w", "lm_head.weight"] {
        let t = h.tensors.iter().find(|t| t.name == name).unwrap();
        let got = fs::read(dir.join(format!("{name}.bin"))).unwrap();
        assert_eq!(got, &data[t.begin as usize..t.end as usize]);
    }
    let out = ckptfs(&[
        "extract",
        s(&f.blz),
        "--tensor",
        "model.norm.weight",
        "model.pos_ids",
        "-o",
        s(&dir),
        "--safetensors",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let st = fs::read(dir.join("model.safetensors")).unwrap();
    let (h2, d2) = ckptfs::format::safetensors::split_file(&st).unwrap();
    assert_eq!(h2.tensors.len(), 2);
    let t = h2
        .tensors
        .iter()
        .find(|t| t.name == "model.norm.weight")
        .unwrap();
    let o = h
        .tensors
        .iter()
        .find(|t| t.name == "model.norm.weight")
        .unwrap();
    assert_eq!(
        &d2[t.begin as usize..t.end as usize],
        &data[o.begin as usize..o.end as usize]
    );
    let out = ckptfs(&["extract", s(&f.blz), "--tensor", "nope", "-o", s(&dir)]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no tensor \"nope\""));
}

/// Where a tensor's blob lies in the archive file.
fn blob_range(ar: &BlzArchive, bytes: &[u8], tensor: &str) -> std::ops::Range<usize> {
    let t = ar
        .entries()
        .iter()
        .flat_map(|f| f.tensors().to_vec())
        .find(|t| t.name == tensor)
        .unwrap();
    let b = ar.blob(t.blob.unwrap());
    let data_start = bytes.len() - ar.header().data_length as usize;
    data_start + b.offset as usize..data_start + (b.offset + b.length) as usize
}

fn read_file(ar: &BlzArchive, path: &str) -> Result<Vec<u8>, String> {
    let i = ar.find(path).unwrap();
    let mut buf = vec![0u8; ar.logical_len(i) as usize];
    ar.read_at(i, 0, &mut buf).map_err(|e| e.to_string())?;
    Ok(buf)
}

fn corrupt(f: &Fixture, edit: impl FnOnce(&BlzArchive, &mut Vec<u8>)) -> PathBuf {
    let mut bytes = fs::read(&f.blz).unwrap();
    let ar = BlzArchive::open(&f.blz).unwrap();
    edit(&ar, &mut bytes);
    let p = f.root.join("bad.blz");
    fs::write(&p, &bytes).unwrap();
    p
}

fn verify_fails(p: &Path, needle: &str) {
    let out = ckptfs(&["verify", s(p)]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.starts_with("FAIL") && text.contains(needle), "{text}");
    assert_eq!(text.lines().count(), 1, "one verdict line: {text}");
}

#[test]
fn corrupt_tensor_fails_only_its_reads() {
    for raw in [false, true] {
        let f = packed(raw);
        let p = corrupt(&f, |ar, b| {
            let r = blob_range(ar, b, "model.layers.1.w");
            b[r.start + r.len() / 2] ^= 0x40;
        });
        verify_fails(&p, "model.layers.1.w");
        let ar = BlzArchive::open(&p).unwrap();
        let e = read_file(&ar, "model-00002-of-00002.safetensors").unwrap_err();
        assert!(
            e.contains("model.layers.1.w") && e.contains("checksum"),
            "{e}"
        );
        // Everything else still reads.
        let src = tree(&f.src);
        for path in [
            "model-00001-of-00002.safetensors",
            "config.json",
            "tokenizer.model",
        ] {
            assert_eq!(read_file(&ar, path).unwrap(), src[path], "{path}");
        }
        let i = ar.find("model-00002-of-00002.safetensors").unwrap();
        let t = ar.entries()[i]
            .tensors()
            .iter()
            .position(|t| t.name == "model.norm.weight")
            .unwrap();
        ar.tensor_bytes(i, t).unwrap();
        // unpack refuses rather than writing wrong bytes.
        let out = ckptfs(&["unpack", s(&p), "-o", s(&f.root.join("u"))]);
        assert!(!out.status.success());
    }
}

/// Replaces `from` by `to` (same length) inside the header JSON.
fn edit_header(b: &mut [u8], from: &str, to: &str) {
    assert_eq!(from.len(), to.len());
    let hlen = u64::from_le_bytes(b[12..20].try_into().unwrap()) as usize;
    let json = &mut b[20..20 + hlen];
    let at = json
        .windows(from.len())
        .position(|w| w == from.as_bytes())
        .expect("found");
    json[at..at + to.len()].copy_from_slice(to.as_bytes());
}

#[test]
fn corrupt_sidecar_fails_only_its_reads() {
    let f = packed(false);
    let p = corrupt(&f, |_, b| {
        edit_header(b, "tie_word_embeddings", "tie_word_embeddingZ")
    });
    verify_fails(&p, "config.json: checksum mismatch");
    let ar = BlzArchive::open(&p).unwrap();
    let e = read_file(&ar, "config.json").unwrap_err();
    assert!(e.contains("config.json") && e.contains("checksum"), "{e}");
    let src = tree(&f.src);
    for path in [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "tokenizer.model",
    ] {
        assert_eq!(read_file(&ar, path).unwrap(), src[path], "{path}");
    }
    // A renamed file is covered by the header digest alone.
    let p = corrupt(&f, |_, b| edit_header(b, "\"empty.txt\"", "\"emptz.txt\""));
    verify_fails(&p, "header checksum mismatch");
}

/// Flips the case of one letter inside the stored content of embedded
/// file `path` (its `text` or `base64` JSON string, found from the parsed
/// header; never part of an escape): the header stays valid JSON and only
/// that file's entry changes.
fn damage_embedded(b: &mut [u8], path: &str) {
    let p = blz::parse(b).unwrap();
    let f = p.header.files.iter().find(|f| f.path == path).unwrap();
    let (member, value) = match &f.content {
        Content::Plain {
            stored: Stored::Text(t),
            ..
        } => ("text", t),
        Content::Plain {
            stored: Stored::Base64(x),
            ..
        } => ("base64", x),
        _ => panic!("{path} is not embedded"),
    };
    let needle = format!("\"{member}\":{}", serde_json::to_string(value).unwrap());
    let json = p.header_json.start as usize..p.header_json.end as usize;
    let hits: Vec<usize> = b[json.clone()]
        .windows(needle.len())
        .enumerate()
        .filter(|(_, w)| *w == needle.as_bytes())
        .map(|(i, _)| json.start + i)
        .collect();
    assert_eq!(hits.len(), 1, "{needle}");
    let r = hits[0] + member.len() + 4..hits[0] + needle.len() - 1;
    let mid = (r.start + r.end) / 2;
    let at = (mid..r.end)
        .chain(r.start..mid)
        .find(|&i| b[i].is_ascii_alphabetic() && b[i - 1] != b'\\')
        .unwrap();
    b[at] ^= 0x20;
    let q = blz::parse(b).expect("still a valid archive");
    let changed: Vec<&str> = p
        .header
        .files
        .iter()
        .zip(&q.header.files)
        .filter(|(x, y)| x != y)
        .map(|(x, _)| x.path.as_str())
        .collect();
    assert_eq!(changed, [path]);
}

#[test]
fn corrupt_binary_sidecar_fails_only_its_reads() {
    let f = packed(false);
    let p = corrupt(&f, |_, b| damage_embedded(b, "tokenizer.model"));
    verify_fails(&p, "tokenizer.model: checksum mismatch");
    let ar = BlzArchive::open(&p).unwrap();
    let e = read_file(&ar, "tokenizer.model").unwrap_err();
    assert!(
        e.contains("tokenizer.model") && e.contains("checksum"),
        "{e}"
    );
    // The size is still known; every other file reads back intact.
    let src = tree(&f.src);
    let i = ar.find("tokenizer.model").unwrap();
    assert_eq!(ar.logical_len(i), src["tokenizer.model"].len() as u64);
    for (path, want) in &src {
        if path != "tokenizer.model" {
            assert_eq!(&read_file(&ar, path).unwrap(), want, "{path}");
        }
    }
    // unpack refuses rather than writing wrong bytes.
    let out = ckptfs(&["unpack", s(&p), "-o", s(&f.root.join("u"))]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("tokenizer.model"));
}

#[test]
fn corrupt_header_json_fails_verify_in_one_line() {
    let f = packed(false);
    let bytes = fs::read(&f.blz).unwrap();
    let json = blz::parse(&bytes).unwrap().header_json;
    let (lo, hi) = (json.start as usize, json.end as usize);
    let key =
        |k: &[u8]| lo + bytes[lo..hi].windows(k.len()).position(|w| w == k).unwrap() + k.len() - 1;
    // Each breaks the JSON structure: refused at open, by name, one line.
    let cases = [
        ("opening brace", lo, 0x20),
        ("files array", key(b"\"files\":["), 0x20),
        ("blobs array", key(b"\"blobs\":["), 0x20),
        ("a colon", key(b"\"data_length\":"), 0x01),
        ("closing brace", hi - 1, 0x20),
        // header_len in the prelude: the JSON ends one byte off.
        ("header length", 12, 0x01),
    ];
    for (what, at, mask) in cases {
        let p = corrupt(&f, |_, b| b[at] ^= mask);
        let e = BlzArchive::open(&p).unwrap_err().to_string();
        assert!(e.contains("not valid .blz JSON"), "{what}: {e}");
        verify_fails(&p, "not valid .blz JSON");
        let out = ckptfs(&["verify", s(&p)]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains(s(&p)), "{what}: {text}");
        assert!(
            !String::from_utf8_lossy(&out.stderr).contains("panicked"),
            "{what}"
        );
    }
}

/// One bit flipped at sampled positions all over the header JSON: `verify`
/// always fails, and the reader either refuses the archive or answers every
/// read of a file it still lists under its original path with an error or
/// the original bytes. (This directory has no two blobs of equal length, so
/// a damaged blob reference is caught by the length checks at open; see
/// tests/mount_blz.rs for the case where it is not.)
#[test]
fn header_flips_never_yield_wrong_bytes() {
    let f = packed(false);
    let bytes = fs::read(&f.blz).unwrap();
    let src = tree(&f.src);
    let json = blz::parse(&bytes).unwrap().header_json;
    let (lo, hi) = (json.start as usize, json.end as usize);
    let step = ((hi - lo) / 250).max(1);
    let (mut refused, mut opened, mut failed_reads) = (0, 0, 0);
    for at in (lo..hi).step_by(step).chain([hi - 3]) {
        let mut b = bytes.clone();
        b[at] ^= 0x01;
        let Ok(ar) = BlzArchive::from_bytes(b, Path::new("flipped.blz")) else {
            refused += 1;
            continue;
        };
        opened += 1;
        assert!(verify(&ar, &|_| {}).is_err(), "flip at {at} passes verify");
        for (i, fe) in ar.entries().iter().enumerate() {
            let Some(want) = src.get(&fe.path) else {
                continue;
            };
            let mut buf = vec![0u8; ar.logical_len(i) as usize];
            match ar.read_at(i, 0, &mut buf) {
                Ok(n) => assert!(
                    buf[..n] == want[..],
                    "flip at {at}: {} reads back other bytes",
                    fe.path
                ),
                Err(_) => failed_reads += 1,
            }
        }
    }
    assert!(
        refused > 10 && opened > 10 && failed_reads > 10,
        "{refused} refused, {opened} opened, {failed_reads} failed reads"
    );
}

#[test]
fn corrupt_shard_header_fails_only_that_shard() {
    let f = packed(false);
    // The shard header of model-00002 names lm_head.weight; the tensor list
    // names it too, so edit inside the verbatim header string only.
    let p = corrupt(&f, |_, b| {
        edit_header(b, "\\\"lm_head.weight\\\"", "\\\"lm_head.weighs\\\"")
    });
    verify_fails(&p, "model-00002-of-00002.safetensors");
    let ar = BlzArchive::open(&p).unwrap();
    ar.verify_header().unwrap_err();
    let e = read_file(&ar, "model-00002-of-00002.safetensors").unwrap_err();
    assert!(e.contains("model-00002-of-00002.safetensors"), "{e}");
    assert!(read_file(&ar, "model-00001-of-00002.safetensors").is_ok());
    // Broken JSON structure: refused at open, with a message.
    let p = corrupt(&f, |_, b| edit_header(b, "\"blobs\":[", "\"blobs\":{"));
    let out = ckptfs(&["verify", s(&p)]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stdout).contains("not valid .blz JSON"));
    // A flip in the last data byte.
    let p = corrupt(&f, |_, b| {
        let n = b.len();
        b[n - 1] ^= 1;
    });
    verify_fails(&p, "");
}

fn file_entry(path: &str, text: &str) -> FileEntry {
    FileEntry {
        path: path.into(),
        size: text.len() as u64,
        content: Content::Plain {
            xxh3: Digest(xxh3_64(text.as_bytes())),
            stored: Stored::Text(text.into()),
        },
    }
}

fn raw_blob(offset: u64, data: &[u8]) -> BlobEntry {
    BlobEntry {
        offset,
        length: data.len() as u64,
        encoding: Encoding::Raw,
        decoded_length: data.len() as u64,
        xxh3: Digest(xxh3_64(data)),
        meta: None,
        blocks: vec![BlockEntry {
            end: data.len() as u64,
            payload: None,
            data: Digest(xxh3_64(data)),
        }],
    }
}

fn build(h: &Header, data: &[u8]) -> Vec<u8> {
    let json = blz::render_header(h);
    let mut v = blz::render_prelude(json.len() as u64).to_vec();
    v.extend_from_slice(&json);
    v.extend_from_slice(data);
    v
}

fn base_header(files: Vec<FileEntry>, blobs: Vec<BlobEntry>, data_len: u64) -> Header {
    Header {
        data_length: data_len,
        data_sha256: "0".repeat(64),
        files,
        blobs,
        header_xxh3: Digest(0),
    }
}

#[test]
fn hostile_headers_are_refused_by_name() {
    let cases: Vec<(&str, Header, Vec<u8>, &str)> = vec![
        (
            "traversal",
            base_header(vec![file_entry("../evil", "x")], vec![], 0),
            vec![],
            "\"../evil\"",
        ),
        (
            "inner traversal",
            base_header(vec![file_entry("a/../../evil", "x")], vec![], 0),
            vec![],
            "\"a/../../evil\"",
        ),
        (
            "absolute",
            base_header(vec![file_entry("/etc/passwd", "x")], vec![], 0),
            vec![],
            "\"/etc/passwd\": is absolute",
        ),
        (
            "nul",
            base_header(vec![file_entry("a\0b", "x")], vec![], 0),
            vec![],
            "contains NUL",
        ),
        (
            "empty component",
            base_header(vec![file_entry("a//b", "x")], vec![], 0),
            vec![],
            "empty component",
        ),
        (
            "duplicate",
            base_header(
                vec![file_entry("a.txt", "x"), file_entry("a.txt", "y")],
                vec![],
                0,
            ),
            vec![],
            "\"a.txt\" appears twice",
        ),
        (
            "file as dir",
            base_header(
                vec![file_entry("a", "x"), file_entry("a/b", "y")],
                vec![],
                0,
            ),
            vec![],
            "\"a\" to be a directory",
        ),
        (
            "overlap",
            base_header(vec![], vec![raw_blob(0, b"abcd"), raw_blob(2, b"cdef")], 6),
            b"abcdef".to_vec(),
            "blobs 0 and 1 overlap",
        ),
        (
            "huge blob",
            {
                let mut b = raw_blob(0, b"abcd");
                b.length = u64::MAX;
                b.decoded_length = u64::MAX;
                base_header(vec![], vec![b], 4)
            },
            b"abcd".to_vec(),
            "runs past",
        ),
        (
            "data length",
            base_header(vec![], vec![], 1 << 40),
            vec![],
            "declares 1099511627776 data bytes",
        ),
        (
            "dangling blob",
            {
                let mut f = file_entry("big.bin", "");
                f.content = Content::Plain {
                    xxh3: Digest(0),
                    stored: Stored::Blob(9),
                };
                base_header(vec![f], vec![], 0)
            },
            vec![],
            "big.bin: refers to blob 9",
        ),
        (
            "size lie",
            {
                let mut f = file_entry("c.json", "{}");
                f.size = 1 << 50;
                base_header(vec![f], vec![], 0)
            },
            vec![],
            "c.json: size",
        ),
    ];
    let tmp = tempfile::tempdir().unwrap();
    for (what, h, data, needle) in cases {
        let bytes = build(&h, &data);
        let e = blz::parse(&bytes).unwrap_err().to_string();
        assert!(e.contains(needle), "{what}: {e}");
        // And through the CLI, under an address-space limit: no panic, no
        // allocation from a lying field, a named error.
        let p = tmp.path().join("h.blz");
        fs::write(&p, &bytes).unwrap();
        let out = ckptfs_limited(&["verify", s(&p)], 1 << 30);
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            out.status.code(),
            Some(1),
            "{what}: {text} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(text.contains(needle), "{what}: {text}");
        assert!(
            !String::from_utf8_lossy(&out.stderr).contains("panicked"),
            "{what}"
        );
    }
    // Lying prelude lengths.
    let mut v = build(&base_header(vec![], vec![], 0), &[]);
    v[12..20].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
    assert!(matches!(
        blz::parse(&v),
        Err(BlzError::HeaderTooLarge { .. })
    ));
    v[12..20].copy_from_slice(&(1u64 << 20).to_le_bytes());
    assert!(matches!(
        blz::parse(&v),
        Err(BlzError::HeaderPastEnd { .. })
    ));
    let mut v = build(&base_header(vec![], vec![], 0), &[]);
    v[8..12].copy_from_slice(&7u32.to_le_bytes());
    let e = blz::parse(&v).unwrap_err().to_string();
    assert!(e.contains("version 7") && e.contains("version 1"), "{e}");
}

#[test]
fn refuses_malformed_shard_before_writing() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("m");
    fs::create_dir(&src).unwrap();
    let mut bad = safetensors_file(&[("w", "F32", vec![4], vec![0u8; 16])], None);
    bad.truncate(bad.len() - 4);
    fs::write(src.join("model.safetensors"), bad).unwrap();
    let out_path = tmp.path().join("m.blz");
    let out = ckptfs(&["pack", s(&src), "-o", s(&out_path)]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("model.safetensors"), "{err}");
    assert!(!out_path.exists());
    assert_eq!(
        fs::read_dir(tmp.path()).unwrap().count(),
        1,
        "no temporary left behind"
    );
}

#[test]
fn raw_archive_reads_with_the_documented_layout_only() {
    let f = packed(true);
    let py = common::venv_python();
    let out_dir = f.root.join("py");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/blz_raw_reader.py");
    let out = std::process::Command::new(&py)
        .arg(&script)
        .arg(&f.blz)
        .arg(&out_dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(tree(&f.src), tree(&out_dir));
}

/// A fixed tiny directory, packed with the default encoding.
#[test]
fn golden_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("m");
    fs::create_dir_all(src.join("sub")).unwrap();
    let mut rng = Rng(42);
    let w = gauss_bf16(&mut rng, 4096, 0.02);
    fs::write(
        src.join("a.safetensors"),
        safetensors_file(
            &[
                ("w", "BF16", vec![64, 64], w.clone()),
                ("b", "F32", vec![16], gauss_f32(&mut rng, 16, 0.02)),
            ],
            Some(r#"{"format":"pt"}"#),
        ),
    )
    .unwrap();
    fs::write(
        src.join("b.safetensors"),
        safetensors_file(&[("w_tied", "BF16", vec![64, 64], w)], None),
    )
    .unwrap();
    fs::write(src.join("config.json"), "{\"x\": 1}\n").unwrap();
    fs::write(src.join("sub/tok.bin"), [0u8, 255, 1, 254]).unwrap();
    let out = tmp.path().join("g.blz");
    let mut opts = BlzOptions::default();
    for raw in [false, true] {
        opts.raw = raw;
        pack_dir(&src, &out, opts, true, &|_| {}).unwrap();
        let bytes = fs::read(&out).unwrap();
        // Structure, field by field, as doc/FORMAT.md §3 describes it.
        assert_eq!(&bytes[..8], b"CKPTBLZ\0");
        assert_eq!(
            u32::from_le_bytes(bytes[8..12].try_into().unwrap()),
            1,
            "version"
        );
        let hlen = u64::from_le_bytes(bytes[12..20].try_into().unwrap()) as usize;
        let h: serde_json::Value = serde_json::from_slice(&bytes[20..20 + hlen]).unwrap();
        assert_eq!(
            h["data_length"].as_u64().unwrap() as usize,
            bytes.len() - 20 - hlen
        );
        assert_eq!(h["files"].as_array().unwrap().len(), 4);
        assert_eq!(h["blobs"].as_array().unwrap().len(), 2, "w stored once");
        assert_eq!(h["files"][3]["path"], "sub/tok.bin");
        assert_eq!(h["files"][3]["base64"], "AP8B/g==");
        let digest = format!("{:016x}", xxh3_64(&bytes));
        let expected = if raw { GOLDEN_RAW } else { GOLDEN };
        assert_eq!(
            (bytes.len(), digest.as_str()),
            expected,
            "the .blz bytes ckptfs writes changed: bump the .blz format version if intended (raw = {raw})"
        );
    }
}

// 2026-12-02: the bf16 tensor's frame is split-float (doc/FORMAT.md §1),
// the default layout since then; the .blz container is unchanged (version
// 1), and a reader that predates split-float refuses the frame by its
// transform ("unknown transform 3"), as it would in a .zstn.
const GOLDEN: (usize, &str) = (7359, "19b43ee605baac3a");
const GOLDEN_RAW: (usize, &str) = (9794, "d6e3c4f017459216");

//! BLAZE-X `.blz` archives (the `blazex` tool's own layout) through the
//! CLI. The archives come from tests/blazex_tool.py, a writer and reader
//! written from the layout alone (stdlib + xxhash), never from ckptfs's
//! code: `verify`, `unpack` and `info` must agree with it byte for byte,
//! and every hostile header of issue 12 must fail in one line naming what
//! is wrong, with nothing written outside the output directory.

use crate::common;

use common::{blazex_tool, ckptfs, ckptfs_limited, ModelDir};
use serde_json::{json, Value};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Output;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `blazex_tool.py CMD A B`, which must succeed.
fn py(cmd: &str, a: &Path, b: &Path) -> Output {
    blazex_tool(cmd, &[a, b], &[])
}

/// A model directory with two shards, a tokenizer.json and a sidecar,
/// packed by the independent writer: (tempdir, model dir, archive).
fn fixture() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    fs::create_dir(&src).unwrap();
    ModelDir {
        seed: 12,
        embed: [64, 32],
        twin: true,
        edge_cases: true,
    }
    .write(&src);
    fs::write(
        src.join("tokenizer.json"),
        "{\"model\": {\"type\": \"BPE\"}}\n",
    )
    .unwrap();
    fs::write(src.join("special_tokens_map.json"), "{\"unk\": \"<unk>\"}").unwrap();
    let blz = tmp.path().join("m.blz");
    py("pack", &src, &blz);
    (tmp, src, blz)
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `o`, which must have succeeded (what it printed in the failure).
fn ok(o: Output) -> Output {
    assert!(o.status.success(), "{}", text(&o));
    o
}

/// The length of an archive's (or a patch's) header JSON, which starts at
/// byte 20.
fn header_len(bytes: &[u8]) -> usize {
    u64::from_le_bytes(bytes[12..20].try_into().unwrap()) as usize
}

/// Header JSON and data section of an archive.
fn split(bytes: &[u8]) -> (Value, Vec<u8>) {
    let hl = header_len(bytes);
    (
        serde_json::from_slice(&bytes[20..20 + hl]).unwrap(),
        bytes[20 + hl..].to_vec(),
    )
}

/// An archive of `header` (rendered as JSON text `h`) and `data`.
fn join_raw(h: &[u8], data: &[u8]) -> Vec<u8> {
    let mut v = b"BLAZXPK\n".to_vec();
    v.extend_from_slice(&1u32.to_le_bytes());
    v.extend_from_slice(&(h.len() as u64).to_le_bytes());
    v.extend_from_slice(h);
    v.extend_from_slice(data);
    v
}

fn join(header: &Value, data: &[u8]) -> Vec<u8> {
    join_raw(&serde_json::to_vec_pretty(header).unwrap(), data)
}

fn files_under(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = walk(dir)
        .into_iter()
        .map(|p| p.strip_prefix(dir).unwrap().display().to_string())
        .collect();
    v.sort();
    v
}

/// Asserts that every file under `want` is under `got` with the same
/// bytes (`why` follows the file's name in a failure).
fn same_files(got: &Path, want: &Path, why: &str) {
    for f in files_under(want) {
        assert!(
            fs::read(got.join(&f)).unwrap() == fs::read(want.join(&f)).unwrap(),
            "{f}{why}"
        );
    }
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = fs::read_dir(dir) {
        for e in rd {
            let p = e.unwrap().path();
            if p.is_dir() {
                out.extend(walk(&p));
            }
            out.push(p);
        }
    }
    out
}

#[test]
fn verify_unpack_and_info_agree_with_the_independent_reader() {
    let (tmp, _src, blz) = fixture();
    let v = ok(ckptfs(&["verify", s(&blz)]));
    let line = String::from_utf8_lossy(&v.stdout);
    assert_eq!(line.lines().count(), 1, "{line}");
    assert!(line.starts_with("OK") && line.contains("xxh3") && line.contains("SHA-256"));

    // xxh3 values above 2^53 are read exactly (most of them are).
    let (h, _) = split(&fs::read(&blz).unwrap());
    assert!(h["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .any(|t| t["xxh3"].as_u64().unwrap() > 1 << 53));

    let reference = tmp.path().join("ref");
    py("export", &blz, &reference);
    let out = tmp.path().join("out");
    ok(ckptfs(&["unpack", s(&blz), "-o", s(&out)]));
    assert_eq!(files_under(&out), files_under(&reference));
    assert_eq!(
        files_under(&out),
        [
            "config.json",
            "model.safetensors",
            "special_tokens_map.json",
            "tokenizer.json",
            "tokenizer.model"
        ]
    );
    same_files(&out, &reference, " differs from the independent reader's");

    let i = ok(ckptfs(&["info", s(&blz)]));
    let info = String::from_utf8_lossy(&i.stdout);
    assert!(
        info.contains("BLAZE-X") && info.contains("model.layers.1.w"),
        "{info}"
    );
    let j = ckptfs(&["info", "--json", s(&blz)]);
    let j: Value = serde_json::from_slice(&j.stdout).unwrap();
    assert_eq!(
        j[0]["tensors"],
        json!(h["tensors"].as_array().unwrap().len())
    );
}

#[test]
fn a_damaged_tensor_is_named_by_verify_and_unpack_writes_no_model() {
    let (tmp, _src, blz) = fixture();
    let bytes = fs::read(&blz).unwrap();
    let (h, _) = split(&bytes);
    let hl = 20 + header_len(&bytes);
    let t = h["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["data_len"].as_u64().unwrap() > 16)
        .unwrap();
    let name = t["name"].as_str().unwrap();
    let mut bad = bytes.clone();
    bad[hl + t["data_offset"].as_u64().unwrap() as usize + 3] ^= 0x40;
    let p = tmp.path().join("bad.blz");
    fs::write(&p, &bad).unwrap();
    let v = ckptfs(&["verify", s(&p)]);
    assert_eq!(v.status.code(), Some(1), "{}", text(&v));
    let line = String::from_utf8_lossy(&v.stdout);
    assert_eq!(line.lines().count(), 1, "{line}");
    assert!(
        line.contains(&format!("tensor {name:?}")) && line.contains("xxh3"),
        "{line}"
    );
    let out = tmp.path().join("out");
    let u = ckptfs(&["unpack", s(&p), "-o", s(&out)]);
    assert_eq!(u.status.code(), Some(1), "{}", text(&u));
    assert_eq!(String::from_utf8_lossy(&u.stderr).lines().count(), 1);
    assert!(text(&u).contains(name), "{}", text(&u));
    assert!(!out.join("model.safetensors").exists());
    // Nothing left behind: no output directory, no temporary one.
    assert!(!out.exists(), "a failed unpack left its output directory");
    let left: Vec<String> = fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".out."))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// Each hostile variant of the fixture: what to change, and what the one
/// error line must say.
fn hostile_cases(bytes: &[u8]) -> Vec<(&'static str, Vec<u8>, &'static str)> {
    let (h, data) = split(bytes);
    let with = |f: &dyn Fn(&mut Value)| {
        let mut h = h.clone();
        f(&mut h);
        join(&h, &data)
    };
    let sidecar = |name: &'static str| {
        with(&move |h: &mut Value| {
            h["sidecar_files"]
                .as_array_mut()
                .unwrap()
                .push(json!({"filename": name, "content_b64": "ZXZpbA=="}))
        })
    };
    let mut v = vec![
        (
            "lying data_len",
            with(&|h| {
                let n = h["tensors"][0]["data_len"].as_u64().unwrap();
                h["tensors"][0]["data_len"] = json!(n + 2);
            }),
            "does not match dtype",
        ),
        (
            "offset past the end",
            with(&|h| h["tensors"][2]["data_offset"] = json!(u64::MAX - 3)),
            "past the end of the data section",
        ),
        (
            "overlapping tensors",
            with(&|h| {
                // Tensors 0 and 2 hold bytes (1 is model.empty).
                let o = h["tensors"][0]["data_offset"].as_u64().unwrap();
                h["tensors"][2]["data_offset"] = json!(o + 2);
            }),
            "overlap",
        ),
        (
            "duplicate names",
            with(&|h| h["tensors"][1]["name"] = h["tensors"][0]["name"].clone()),
            "appears twice",
        ),
        (
            "NUL in a tensor name",
            with(&|h| h["tensors"][0]["name"] = json!("a\u{0}b")),
            "control character",
        ),
        ("sidecar ..", sidecar(".."), "directory"),
        (
            "sidecar escaping the directory",
            sidecar("../escaped"),
            "escape",
        ),
        ("absolute sidecar", sidecar("/tmp/escaped"), "absolute"),
        ("sidecar with a /", sidecar("sub/x"), "escape"),
        ("sidecar with NUL", sidecar("x\u{0}y"), "control character"),
        (
            "sidecar shadowing config.json",
            sidecar("config.json"),
            "already presents",
        ),
        (
            "base64 that does not decode",
            with(&|h| h["sidecar_files"][0]["content_b64"] = json!("@@@@")),
            "does not decode",
        ),
        (
            "base64 of a bad length",
            with(&|h| h["sidecar_files"][0]["content_b64"] = json!("abc")),
            "base64",
        ),
        (
            "xxh3 as a float",
            join_raw(
                &serde_json::to_vec_pretty(&h)
                    .unwrap()
                    .replacen_xxh3_with_float(),
                &data,
            ),
            "not valid BLAZE-X JSON",
        ),
        (
            "unknown dtype",
            with(&|h| h["tensors"][0]["dtype"] = json!("f64")),
            "not valid BLAZE-X JSON",
        ),
        (
            "damaged data SHA-256",
            with(&|h| h["data_sha256"] = json!("00".repeat(32))),
            "SHA-256",
        ),
        (
            "truncated data",
            bytes[..bytes.len() - 5].to_vec(),
            "past the end of the data section",
        ),
    ];
    let mut near = bytes.to_vec();
    near[12..20].copy_from_slice(&(u64::MAX - 7).to_le_bytes());
    v.push(("header_len near 2^64", near, "header length"));
    v
}

/// Replaces the first tensor's `"xxh3": N` with a float spelling.
trait FloatXxh3 {
    fn replacen_xxh3_with_float(self) -> Vec<u8>;
}

impl FloatXxh3 for Vec<u8> {
    fn replacen_xxh3_with_float(self) -> Vec<u8> {
        let s = String::from_utf8(self).unwrap();
        let at = s.find("\"xxh3\": ").unwrap() + 8;
        let end = at + s[at..].find(|c: char| !c.is_ascii_digit()).unwrap();
        let n: u64 = s[at..end].parse().unwrap();
        format!("{}{:e}{}", &s[..at], n as f64, &s[end..]).into_bytes()
    }
}

#[test]
fn hostile_headers_fail_in_one_line_and_write_nothing_outside() {
    let (tmp, _src, blz) = fixture();
    let bytes = fs::read(&blz).unwrap();
    for (what, bad, needle) in hostile_cases(&bytes) {
        let dir = tmp.path().join("h");
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir(&dir).unwrap();
        let p = dir.join("bad.blz");
        fs::write(&p, &bad).unwrap();
        // Under an address-space limit: nothing is sized by a lying length.
        let v = ckptfs_limited(&["verify", s(&p)], 2 << 30);
        assert_eq!(v.status.code(), Some(1), "{what}: {}", text(&v));
        let line = String::from_utf8_lossy(&v.stdout);
        assert_eq!(line.lines().count(), 1, "{what}: {line}");
        assert!(
            line.contains("bad.blz") && line.contains(needle),
            "{what}: {line:?} should say {needle:?}"
        );
        let out = dir.join("out");
        if what == "damaged data SHA-256" {
            continue; // unpack serves tensors by their own xxh3, as blazex export does
        }
        let u = ckptfs_limited(&["unpack", s(&p), "-o", s(&out)], 2 << 30);
        assert_ne!(u.status.code(), Some(0), "{what}: unpack succeeded");
        assert!(!text(&u).contains("panicked"), "{what}: {}", text(&u));
        assert_eq!(
            String::from_utf8_lossy(&u.stderr).trim().lines().count(),
            1,
            "{what}: {}",
            text(&u)
        );
        // Nothing but the archive and files inside out/.
        for f in files_under(&dir) {
            assert!(
                f == "bad.blz" || f == "out" || f.starts_with("out/"),
                "{what}: wrote {f}"
            );
        }
        assert!(
            !tmp.path().join("escaped").exists() && !Path::new("/tmp/escaped").exists(),
            "{what}"
        );
    }
}

/// `ckptfs pack SRC -o OUT --format blazex`.
fn pack_blazex(src: &Path, out: &Path) -> Output {
    ckptfs(&["pack", s(src), "-o", s(out), "--format", "blazex"])
}

#[test]
fn pack_format_blazex_is_read_by_the_independent_reader_and_matches_its_writer() {
    let (tmp, src, theirs) = fixture();
    let ours = tmp.path().join("ours.blz");
    ok(pack_blazex(&src, &ours));
    let bytes = fs::read(&ours).unwrap();
    assert_eq!(&bytes[..12], b"BLAZXPK\n\x01\0\0\0");
    let (mut h, data) = split(&bytes);
    let (mut h2, data2) = split(&fs::read(&theirs).unwrap());
    assert!(data == data2, "data sections differ");
    // ckptfs's header digest: the last member, which blazex skips.
    let digest = h
        .as_object_mut()
        .unwrap()
        .shift_remove("ckptfs_header_xxh3")
        .expect("a header digest");
    assert_eq!(digest.as_str().unwrap().len(), 16, "{digest}");
    h["created_at"] = json!(0);
    h2["created_at"] = json!(0);
    assert_eq!(h, h2);
    // Pretty-printed, members in blazex's order.
    let text_h = std::str::from_utf8(&bytes[20..20 + header_len(&bytes)]).unwrap();
    assert!(
        text_h.starts_with("{\n  \"version\": 1,\n  \"created_at\": \""),
        "{text_h:.80}"
    );
    let order: Vec<usize> = [
        "\"model_config\"",
        "\"tokenizer\"",
        "\"sidecar_files\"",
        "\"tensors\"",
        "\"data_sha256\"",
        "\"ckptfs_header_xxh3\"",
    ]
    .iter()
    .map(|k| text_h.find(k).unwrap())
    .collect();
    assert!(order.windows(2).all(|w| w[0] < w[1]), "{order:?}");

    let a = tmp.path().join("a");
    let b = tmp.path().join("b");
    py("export", &ours, &a);
    py("export", &theirs, &b);
    same_files(&a, &b, "");
    // Written atomically with a plain file's mode; refused when it exists.
    let again = pack_blazex(&src, &ours);
    assert_eq!(again.status.code(), Some(1), "{}", text(&again));
}

#[test]
fn pack_format_blazex_refuses_a_dtype_it_cannot_name() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    fs::create_dir(&src).unwrap();
    let f64s: Vec<u8> = (0..4u64).flat_map(|i| (i as f64).to_le_bytes()).collect();
    fs::write(
        src.join("model.safetensors"),
        common::safetensors_file(
            &[
                ("ok", "F32", vec![2], vec![0u8; 8]),
                ("model.double", "F64", vec![4], f64s),
            ],
            None,
        ),
    )
    .unwrap();
    let out = tmp.path().join("x.blz");
    let p = pack_blazex(&src, &out);
    assert_eq!(p.status.code(), Some(1), "{}", text(&p));
    let e = String::from_utf8_lossy(&p.stderr);
    assert_eq!(e.trim().lines().count(), 1, "{e}");
    assert!(e.contains("\"model.double\"") && e.contains("F64"), "{e}");
    assert!(!out.exists());
    assert_eq!(files_under(tmp.path()), ["src", "src/model.safetensors"]);
}

/// A base and a target BLAZE-X archive from the independent writer: the
/// target has 4 tensors modified (BF16, F32, I64 a few bytes, F16), one
/// added (U16), one removed (`model.norm.weight`). Returns (tempdir,
/// base.blz, target.blz, a tensor that is modified).
fn patch_pair() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("base");
    let target = tmp.path().join("target");
    fs::create_dir(&base).unwrap();
    fs::create_dir(&target).unwrap();
    ModelDir {
        seed: 77,
        embed: [64, 32],
        twin: false,
        edge_cases: false,
    }
    .write(&base);
    let shard = |name: &str| common::tensors_in(&fs::read(base.join(name)).unwrap());
    let write = |name: &str, ts: &[(String, String, Vec<u64>, Vec<u8>)]| {
        let v: Vec<(&str, &str, Vec<u64>, Vec<u8>)> = ts
            .iter()
            .map(|(n, d, s, b)| (n.as_str(), d.as_str(), s.clone(), b.clone()))
            .collect();
        fs::write(target.join(name), common::safetensors_file(&v, None)).unwrap();
    };
    let mut s1 = shard(common::SHARD1);
    for (name, _, _, bytes) in &mut s1 {
        match name.as_str() {
            "model.embed_tokens.weight" => bytes.iter_mut().step_by(3).for_each(|b| *b ^= 0x21),
            "model.layers.0.w" => bytes.iter_mut().step_by(4).for_each(|b| *b ^= 1),
            "model.pos_ids" => bytes[16] ^= 0x7f,
            _ => {}
        }
    }
    write(common::SHARD1, &s1);
    let mut s2: Vec<_> = shard(common::SHARD2)
        .into_iter()
        .filter(|t| t.0 != "model.norm.weight")
        .collect();
    for (name, _, _, bytes) in &mut s2 {
        if name == "model.layers.1.w" {
            bytes.iter_mut().step_by(2).for_each(|b| *b ^= 0x40);
        }
    }
    write(common::SHARD2, &s2);
    let added: Vec<u8> = (0..100u16).flat_map(|i| (i * 7).to_le_bytes()).collect();
    write(
        "model-extra.safetensors",
        &[("added.t".into(), "U16".into(), vec![100], added)],
    );
    fs::copy(base.join("config.json"), target.join("config.json")).unwrap();
    fs::write(target.join("tokenizer.json"), "{\"v\": 2}").unwrap();
    let (b, t) = (tmp.path().join("base.blz"), tmp.path().join("target.blz"));
    py("pack", &base, &b);
    py("pack", &target, &t);
    (tmp, b, t)
}

fn same_export(tmp: &Path, a: &Path, b: &Path) {
    let (ea, eb) = (tmp.join("ea"), tmp.join("eb"));
    let _ = fs::remove_dir_all(&ea);
    let _ = fs::remove_dir_all(&eb);
    py("export", a, &ea);
    py("export", b, &eb);
    assert_eq!(files_under(&ea), files_under(&eb));
    same_files(&ea, &eb, "");
}

/// `ckptfs diff A B -o PATCH`, which must succeed.
fn diff(a: &Path, b: &Path, patch: &Path) -> Output {
    ok(ckptfs(&["diff", s(a), s(b), "-o", s(patch)]))
}

/// `ckptfs apply BASE PATCH -o OUT`.
fn apply(base: &Path, patch: &Path, out: &Path) -> Output {
    ckptfs(&["apply", s(base), s(patch), "-o", s(out)])
}

/// Applies `patch` to `base` as `out`, which must succeed (`what` starts
/// the failure message), and checks that `out` exports as `target` does
/// (the exports go beside `out`).
fn apply_matches(base: &Path, patch: &Path, out: &Path, target: &Path, what: &str) {
    let a = apply(base, patch, out);
    assert!(a.status.success(), "{what}{}", text(&a));
    same_export(out.parent().unwrap(), out, target);
}

/// The independent writer's patch from `base` to `target` as `out`;
/// `args`: FORMAT [SPLIT_NAME [BAD_NAME]] (a tensor to store as a
/// SplitStream blob, one to give a wrong xxh3_new).
fn patch_py(base: &Path, target: &Path, out: &Path, args: &[&str]) {
    blazex_tool("patch", &[base, target, out], args);
}

/// The BLXD encoding bytes of a patch's blobs.
fn encodings(patch: &Path) -> Vec<u8> {
    let b = fs::read(patch).unwrap();
    let ml = header_len(&b);
    let m: Value = serde_json::from_slice(&b[20..20 + ml]).unwrap();
    m["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["op"] == "Modified" || e["op"] == "Added")
        .map(|e| b[20 + ml + e["blob_offset"].as_u64().unwrap() as usize + 4])
        .collect()
}

#[test]
fn v1_and_v2_patches_with_every_open_encoding_apply_exactly() {
    let (tmp, base, target) = patch_pair();
    for fmt in ["1", "2"] {
        let patch = tmp.path().join(format!("v{fmt}.blzdiff"));
        patch_py(&base, &target, &patch, &[fmt]);
        if fmt == "2" {
            let mut e = encodings(&patch);
            e.sort();
            e.dedup();
            assert_eq!(e, [0, 1, 2, 3, 5], "every open BLXD encoding");
        }
        let out = tmp.path().join(format!("out{fmt}.blz"));
        apply_matches(&base, &patch, &out, &target, &format!("v{fmt}: "));
        ok(ckptfs(&["verify", s(&out)]));
    }
}

#[test]
fn diff_then_apply_round_trips_with_open_encodings_and_a_summary() {
    let (tmp, base, target) = patch_pair();
    let patch = tmp.path().join("p.blzdiff");
    let d = diff(&base, &target, &patch);
    let summary = String::from_utf8_lossy(&d.stderr);
    assert!(
        summary.contains("unchanged, 4 modified, 1 added, 1 removed")
            && summary.contains("% of the full model"),
        "{summary}"
    );
    assert_eq!(&fs::read(&patch).unwrap()[..12], b"BZXPTCH\n\x02\0\0\0");
    assert!(encodings(&patch).iter().all(|&e| e != 4), "no SplitStream");
    let out = tmp.path().join("out.blz");
    apply_matches(&base, &patch, &out, &target, "");
}

#[test]
fn a_split_stream_blob_or_a_wrong_xxh3_new_fails_in_one_line_and_writes_nothing() {
    let (tmp, base, target) = patch_pair();
    for (args, needle) in [
        (["2", "model.layers.0.w", "-"], "closed codec"),
        (["2", "-", "model.pos_ids"], "xxh3_new"),
        (["1", "-", "added.t"], "xxh3_new"),
    ] {
        let patch = tmp.path().join("bad.blzdiff");
        patch_py(&base, &target, &patch, &args);
        let out = tmp.path().join("never.blz");
        let a = apply(&base, &patch, &out);
        assert_eq!(a.status.code(), Some(1), "{args:?}: {}", text(&a));
        let e = String::from_utf8_lossy(&a.stderr);
        assert_eq!(e.trim().lines().count(), 1, "{e}");
        let name = if args[1] != "-" { args[1] } else { args[2] };
        assert!(
            e.contains(&format!("{name:?}")) && e.contains(needle),
            "{e}"
        );
        assert!(!out.exists(), "{args:?}: output written");
        let left: Vec<String> = files_under(tmp.path())
            .into_iter()
            .filter(|f| f.contains("never"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }
}

#[test]
fn diff_and_apply_take_model_directories_and_ckptfs_archives_too() {
    let (tmp, base, target) = patch_pair();
    // The two sides as the directories they came from.
    let (bdir, tdir) = (tmp.path().join("base"), tmp.path().join("target"));
    let patch = tmp.path().join("dirs.blzdiff");
    diff(&bdir, &tdir, &patch);
    // Applied to the base as a ckptfs .blz.
    let cblz = tmp.path().join("base.ckptfs.blz");
    common::pack(&bdir, &cblz);
    let out = tmp.path().join("out.blz");
    apply_matches(&cblz, &patch, &out, &target, "");
    // No scratch directory is left beside the output.
    assert!(files_under(tmp.path())
        .iter()
        .all(|f| !f.starts_with(".ckptfs-patch-")));
    let _ = base;
}

/// Every presented file of `a`, read whole (None where a read fails).
fn read_all(a: &dyn ckptfs::archive::ArchiveView) -> Vec<(String, Option<Vec<u8>>)> {
    (0..a.files())
        .map(|i| {
            let mut buf = vec![0u8; a.logical_len(i) as usize];
            let r = a.read_at(i, 0, &mut buf).ok().filter(|&n| n == buf.len());
            (a.file_path(i).to_string(), r.map(|_| buf))
        })
        .collect()
}

#[test]
fn every_flipped_header_byte_of_a_ckptfs_written_archive_fails_or_reads_the_original() {
    use ckptfs::archive::BlazexArchive;
    let (tmp, src, _) = fixture();
    let ours = tmp.path().join("ours.blz");
    ok(pack_blazex(&src, &ours));
    let bytes = fs::read(&ours).unwrap();
    let good = read_all(&BlazexArchive::from_bytes(bytes.clone(), &ours).unwrap());
    assert!(good.iter().all(|(_, b)| b.is_some()));
    let header_end = 20 + header_len(&bytes);
    let (mut refused, mut wrong) = (0, Vec::new());
    for at in 0..header_end {
        for mask in [0x01u8, 0xff] {
            let mut v = bytes.clone();
            v[at] ^= mask;
            let Ok(a) = BlazexArchive::from_bytes(v, &ours) else {
                refused += 1;
                continue;
            };
            for (path, got) in read_all(&a) {
                let want = good.iter().find(|(p, _)| *p == path);
                match (got, want) {
                    (None, _) => {}
                    (Some(g), Some((_, Some(w)))) if g == *w => {}
                    _ => wrong.push(format!("byte {at} ^ {mask:#04x}: {path}")),
                }
            }
        }
    }
    eprintln!("{refused} of {} flips refused at open", 2 * header_end);
    assert!(
        wrong.is_empty(),
        "{} wrong files served: {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(10)]
    );
}

#[test]
fn an_archive_without_a_header_digest_says_so_and_seal_adds_one_blazex_still_reads() {
    let (tmp, _src, theirs) = fixture();
    let before = fs::read(&theirs).unwrap();
    // Written as blazex writes: verify says what no checksum covers.
    let v = ok(ckptfs(&["verify", s(&theirs)]));
    let out = String::from_utf8_lossy(&v.stdout);
    assert!(out.contains("NOT verified: the header"), "{out}");
    let i = ckptfs(&["info", s(&theirs)]);
    assert!(
        String::from_utf8_lossy(&i.stdout).contains("tensors only (xxh3)"),
        "{}",
        text(&i)
    );
    let a = ckptfs::archive::open(&theirs).unwrap();
    let e = ckptfs::archive::require_checksums(&*a)
        .unwrap_err()
        .to_string();
    assert!(e.contains("ckptfs seal"), "{e}");

    let sealed = ok(ckptfs(&["seal", s(&theirs)]));
    assert!(
        String::from_utf8_lossy(&sealed.stdout).contains("sealed (BLAZE-X"),
        "{}",
        text(&sealed)
    );
    let after = fs::read(&theirs).unwrap();
    // Only the header grew: blazex's bytes, the digest member, the same data.
    let (h0, d0) = split(&before);
    let (mut h1, d1) = split(&after);
    assert!(d0 == d1);
    h1.as_object_mut()
        .unwrap()
        .shift_remove("ckptfs_header_xxh3")
        .unwrap();
    assert_eq!(h0, h1);
    let v = ckptfs(&["verify", s(&theirs)]);
    let out = String::from_utf8_lossy(&v.stdout);
    assert!(
        v.status.success() && out.contains("header digest (ckptfs_header_xxh3) verified"),
        "{out}"
    );
    let a = ckptfs::archive::open(&theirs).unwrap();
    ckptfs::archive::require_checksums(&*a).unwrap();
    // The independent reader (which skips unknown members, as blazex's
    // serde header does) exports the same directory.
    let x = tmp.path().join("x");
    py("export", &theirs, &x);
    // Sealing again changes nothing.
    let again = ckptfs(&["seal", s(&theirs)]);
    assert!(
        String::from_utf8_lossy(&again.stdout).contains("already sealed"),
        "{}",
        text(&again)
    );
    assert!(fs::read(&theirs).unwrap() == after);
    // A flipped byte of the sealed header now fails the open, in one line.
    let mut bad = after.clone();
    bad[40] ^= 0x20;
    fs::write(&theirs, &bad).unwrap();
    let v = ckptfs(&["verify", s(&theirs)]);
    assert_eq!(v.status.code(), Some(1), "{}", text(&v));
    assert!(
        String::from_utf8_lossy(&v.stdout).contains("header digest"),
        "{}",
        text(&v)
    );
}

#[test]
fn apply_reproduces_the_target_archive_byte_for_byte() {
    let (tmp, base, target) = patch_pair();
    // Spellings serde_json would change: a float as Python writes it, an
    // escaped character, and the writer's own created_at.
    fs::write(
        tmp.path().join("target/config.json"),
        "{\"model_type\": \"llama\", \"rms_norm_eps\": 1e-05, \"name\": \"mod\\u00e8le/\\\\x\"}",
    )
    .unwrap();
    py("pack", &tmp.path().join("target"), &target);
    let want = fs::read(&target).unwrap();
    assert!(String::from_utf8_lossy(&want).contains("1e-05"));
    let patch = tmp.path().join("p.blzdiff");
    patch_py(&base, &target, &patch, &["2"]);
    let out = tmp.path().join("out.blz");
    ok(apply(&base, &patch, &out));
    let got = fs::read(&out).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&got[20..20 + header_len(&got)]),
        String::from_utf8_lossy(&want[20..20 + header_len(&want)])
    );
    assert!(got == want, "the data sections differ");
}

//! z4ai's deltas read against their base: `unpack/verify/info --base` on
//! z4ai's own vectors (tests/vectors: finetune.z4dm, delta_plain.z4dl) and
//! on deltas z4ai 0.2.0 makes at test time (tests/z4ai_delta.py: BF16,
//! F16, F32 pairs with moved, renamed, added, removed and reshaped
//! tensors, and a re-upload). Exact with the right base; with a wrong,
//! missing, truncated or damaged input, a one-line error, exit 1 and no
//! output file.

use crate::common;
use common::{ckptfs, ckptfs_limited, pack, run_generator};
use std::path::{Path, PathBuf};
use std::process::Output;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn vec_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/vectors")
        .join(name)
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Asserts a clean failure: exit 1, one line of stderr containing every
/// `needle`, no `out`, and no temporary file left in its directory.
fn assert_clean_failure(o: &Output, out: &Path, needles: &[&str]) {
    let e = stderr(o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert_eq!(e.lines().count(), 1, "{e}");
    for n in needles {
        assert!(e.contains(n), "{n:?} not in: {e}");
    }
    assert!(!out.exists(), "{} was left behind", out.display());
    let dir = out.parent().unwrap();
    let stray: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(stray.is_empty(), "temporary files left: {stray:?}");
}

fn unpack(delta: &Path, base: &Path, out: &Path) -> Output {
    ckptfs(&["unpack", s(delta), "--base", s(base), "-o", s(out)])
}

fn assert_unpacks_to(delta: &Path, base: &Path, want: &Path, out: &Path) {
    let o = unpack(delta, base, out);
    assert!(o.status.success(), "{}: {}", delta.display(), stderr(&o));
    assert!(
        std::fs::read(out).unwrap() == std::fs::read(want).unwrap(),
        "{} against {} differs from {}",
        delta.display(),
        base.display(),
        want.display()
    );
}

#[test]
fn z4ais_vectors_are_exact_with_the_right_base() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let base = vec_path("finetune.base.safetensors");
    assert_unpacks_to(
        &vec_path("finetune.z4dm"),
        &base,
        &vec_path("finetune.target.safetensors"),
        &d.join("a.safetensors"),
    );
    // The base as an archive ckptfs reads: its presented file is the base.
    let zbase = d.join("base.zstn");
    pack(&base, &zbase);
    assert_unpacks_to(
        &vec_path("finetune.z4dm"),
        &zbase,
        &vec_path("finetune.target.safetensors"),
        &d.join("b.safetensors"),
    );
    assert_unpacks_to(
        &vec_path("delta_plain.z4dl"),
        &vec_path("delta_plain.ref.bin"),
        &vec_path("delta_plain.cur.bin"),
        &d.join("c.bin"),
    );
    // verify decodes and checks; info shows the records and the base.
    let o = ckptfs(&["verify", s(&vec_path("finetune.z4dm")), "--base", s(&zbase)]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}");
    assert!(
        out.starts_with("OK") && out.contains("2 FULL, 2 DELTA, 1 COPY"),
        "{out}"
    );
    let o = ckptfs(&[
        "info",
        "--json",
        s(&vec_path("finetune.z4dm")),
        "--base",
        s(&base),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let v = &v[0];
    assert_eq!(v["format"], "z4ai-z4dm-v1");
    assert_eq!(v["records"]["FULL"]["records"], 2);
    assert_eq!(v["records"]["DELTA"]["records"], 2);
    assert_eq!(v["records"]["COPY"]["records"], 1);
    assert_eq!(
        v["target_bytes"],
        std::fs::metadata(vec_path("finetune.target.safetensors"))
            .unwrap()
            .len()
    );
    assert_eq!(v["base"]["matches"], true);
}

#[test]
fn a_wrong_base_is_one_line_naming_both_files_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let out = d.join("out.safetensors");
    let delta = vec_path("finetune.z4dm");
    let wrong = vec_path("finetune.target.safetensors");
    let o = unpack(&delta, &wrong, &out);
    assert_clean_failure(
        &o,
        &out,
        &[
            s(&delta),
            s(&wrong),
            "not the base this delta was built against",
        ],
    );
    // An existing output is left as it was.
    std::fs::write(&out, b"keep").unwrap();
    let o = ckptfs(&[
        "unpack",
        s(&delta),
        "--base",
        s(&wrong),
        "-o",
        s(&out),
        "--force",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(std::fs::read(&out).unwrap(), b"keep");
    std::fs::remove_file(&out).unwrap();
    // Not a safetensors at all, and a safetensors without the tensors.
    let o = unpack(&delta, &vec_path("delta_plain.ref.bin"), &out);
    assert_clean_failure(&o, &out, &[s(&delta), "delta_plain.ref.bin"]);
    let o = unpack(&delta, &vec_path("tiny.safetensors"), &out);
    assert_clean_failure(&o, &out, &[s(&delta), "tiny.safetensors", "has no tensor"]);
    // A Z4DL against the wrong reference: same length, another digest.
    let dl = vec_path("delta_plain.z4dl");
    let cur = vec_path("delta_plain.cur.bin");
    let o = unpack(&dl, &cur, &out);
    assert_clean_failure(&o, &out, &[s(&dl), s(&cur), "digest mismatch"]);
    // verify and info say so too.
    let o = ckptfs(&["verify", s(&delta), "--base", s(&wrong)]);
    let so = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1));
    assert!(so.starts_with("FAIL") && so.contains(s(&wrong)), "{so}");
    let o = ckptfs(&["info", "--json", s(&delta), "--base", s(&wrong)]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v[0]["base"]["matches"], false);
}

#[test]
fn a_delta_without_its_base_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    for (f, needle) in [("finetune.z4dm", "Z4DM"), ("delta_plain.z4dl", "Z4DL")] {
        let o = ckptfs(&["unpack", s(&vec_path(f)), "-o", s(&out)]);
        assert_clean_failure(&o, &out, &[f, needle, "--base"]);
        let o = ckptfs(&["verify", s(&vec_path(f))]);
        assert_eq!(o.status.code(), Some(1));
        assert!(String::from_utf8_lossy(&o.stdout).contains("--base"));
    }
    // --base with something that is not a delta.
    let o = ckptfs(&[
        "unpack",
        s(&vec_path("tiny.zstn")),
        "--base",
        s(&vec_path("tiny.safetensors")),
        "-o",
        s(&out),
    ]);
    assert_clean_failure(&o, &out, &["tiny.zstn", "--base applies only"]);
}

#[test]
fn truncated_or_damaged_deltas_fail_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let out = d.join("out.safetensors");
    let base = vec_path("finetune.base.safetensors");
    let blob = std::fs::read(vec_path("finetune.z4dm")).unwrap();
    let bad = d.join("bad.z4dm");
    for n in [
        4,
        5,
        12,
        100,
        440,
        460,
        1000,
        blob.len() / 2,
        blob.len() - 1,
    ] {
        std::fs::write(&bad, &blob[..n]).unwrap();
        let o = unpack(&bad, &base, &out);
        assert_clean_failure(&o, &out, &["bad.z4dm"]);
    }
    // Trailing garbage, an unknown record kind, a lying frame length.
    let hlen = u64::from_le_bytes(blob[5..13].try_into().unwrap()) as usize;
    let first = 13 + hlen + 8 + 8 + 4;
    let name_len = u16::from_le_bytes(blob[first..first + 2].try_into().unwrap()) as usize;
    let kind_at = first + 2 + name_len + 16;
    let cases: Vec<(Vec<u8>, &str)> = vec![
        ([&blob[..], b"x"].concat(), "follow the last record"),
        (
            {
                let mut b = blob.clone();
                b[kind_at] = 9;
                b
            },
            "unknown kind 9",
        ),
        (
            {
                let mut b = blob.clone();
                b[kind_at + 1..kind_at + 9].copy_from_slice(&u64::MAX.to_le_bytes());
                b
            },
            "frame",
        ),
        (
            {
                // data_len: far more than the records fill.
                let mut b = blob.clone();
                b[13 + hlen..13 + hlen + 8].copy_from_slice(&(1u64 << 62).to_le_bytes());
                b
            },
            "belong to no record",
        ),
    ];
    for (bytes, needle) in cases {
        std::fs::write(&bad, &bytes).unwrap();
        // Under an address-space limit: nothing is allocated from a lie.
        let o = ckptfs_limited(
            &["unpack", s(&bad), "--base", s(&base), "-o", s(&out)],
            1 << 30,
        );
        assert_clean_failure(&o, &out, &["bad.z4dm", needle]);
    }
    // A Z4DL cut short, or with its reference length changed.
    let dl = std::fs::read(vec_path("delta_plain.z4dl")).unwrap();
    let bad = d.join("bad.z4dl");
    let reference = vec_path("delta_plain.ref.bin");
    for n in [3, 20, 40, dl.len() - 1] {
        std::fs::write(&bad, &dl[..n]).unwrap();
        let o = unpack(&bad, &reference, &out);
        assert_clean_failure(&o, &out, &["bad.z4dl"]);
    }
    let mut b = dl.clone();
    b[8..16].copy_from_slice(&1u64.to_le_bytes());
    std::fs::write(&bad, &b).unwrap();
    let o = unpack(&bad, &reference, &out);
    assert_clean_failure(&o, &out, &["bad.z4dl"]);
}

/// Every byte of a delta flipped in turn: decoding never panics, and
/// whatever it does not refuse is a file of the target's length. (z4ai's
/// deltas carry no digest of the target, so a flip inside an entropy-coded
/// payload can decode to other bytes: doc/FORMAT.md says so.)
#[test]
fn byte_flips_never_panic() {
    use ckptfs::z4delta::{Base, Z4dlReader, Z4dmReader};
    let base = Base::open(&vec_path("finetune.base.safetensors")).unwrap();
    let blob = std::fs::read(vec_path("finetune.z4dm")).unwrap();
    let target_len = std::fs::metadata(vec_path("finetune.target.safetensors"))
        .unwrap()
        .len();
    let p = Path::new("flipped.z4dm");
    for at in (0..blob.len()).step_by(31) {
        let mut b = blob.clone();
        b[at] ^= 0x5a;
        if let Ok(r) = Z4dmReader::open(p, &b, &base) {
            let mut out = Vec::new();
            if r.write_to(&mut out, &|_| {}).is_ok() {
                assert_eq!(out.len() as u64, r.target_len(), "flip at {at}");
                assert_eq!(r.target_len(), target_len, "flip at {at}");
            }
        }
    }
    let reference = Base::open(&vec_path("delta_plain.ref.bin")).unwrap();
    let dl = std::fs::read(vec_path("delta_plain.z4dl")).unwrap();
    for at in 0..dl.len() {
        let mut b = dl.clone();
        b[at] ^= 0x5a;
        let r = Z4dlReader::open(Path::new("flipped.z4dl"), &b, &reference);
        // The header (magic, version, length, digest) is always checked.
        if at < 32 && at != 5 && !(6..8).contains(&at) {
            assert!(r.is_err(), "header flip at {at} accepted");
        }
        if let Ok(r) = r {
            let mut out = Vec::new();
            if r.write_to(&mut out).is_ok() {
                assert_eq!(out.len() as u64, reference.len());
            }
        }
    }
}

#[test]
fn deltas_z4ai_makes_are_exact() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    run_generator("z4ai_delta.py", d);
    for name in ["bf16", "f16", "f32", "reupload"] {
        let f = |suffix: &str| d.join(format!("{name}.{suffix}"));
        assert_unpacks_to(
            &f("z4dm"),
            &f("base.safetensors"),
            &f("target.safetensors"),
            &f("out.safetensors"),
        );
        assert_unpacks_to(&f("z4dl"), &f("ref.bin"), &f("cur.bin"), &f("out.bin"));
        let o = ckptfs(&["verify", s(&f("z4dm")), "--base", s(&f("base.safetensors"))]);
        assert!(o.status.success(), "{name}: {}", stderr(&o));
        // The base as a .zstn.
        pack(&f("base.safetensors"), &f("base.zstn"));
        assert_unpacks_to(
            &f("z4dm"),
            &f("base.zstn"),
            &f("target.safetensors"),
            &f("out2.safetensors"),
        );
        // What the records are, as z4ai aligns tensors (name, byte length
        // and dtype; shape not compared).
        let o = ckptfs(&["info", "--json", s(&f("z4dm"))]);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let counts: Vec<u64> = ["FULL", "DELTA", "COPY"]
            .iter()
            .map(|k| v[0]["records"][k]["records"].as_u64().unwrap())
            .collect();
        let want = if name == "reupload" {
            vec![0, 0, 8]
        } else {
            // FULL: renamed, added, reshaped to another length; DELTA:
            // changed, nudged, reshaped to the same length; COPY:
            // unchanged, empty.
            vec![3, 3, 2]
        };
        assert_eq!(counts, want, "{name}");
    }
    // The default output name: X.z4dm -> X.safetensors.
    let o = ckptfs(&[
        "unpack",
        s(&d.join("bf16.z4dm")),
        "--base",
        s(&d.join("bf16.base.safetensors")),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        std::fs::read(d.join("bf16.safetensors")).unwrap(),
        std::fs::read(d.join("bf16.target.safetensors")).unwrap()
    );
}

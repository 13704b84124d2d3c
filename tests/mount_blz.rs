//! `.blz` model archives through a real mount: `STORE/model.blz` appears as
//! the read-only directory `MNT/model` holding the original files (names,
//! sizes, bytes, subdirectories), Python `safetensors` loads every tensor
//! of every shard, writes answer EROFS, a corrupted tensor fails only the
//! reads that need it, and an unparseable `.blz` is a directory whose
//! listing fails with EIO and a log line naming it.

mod common;
mod mount_util;

use ckptfs::blz::BlzArchive;
use common::{gauss_bf16, gauss_f16, gauss_f32, safetensors_file};
use mount_util::Mount;
use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

const SHARD1: &str = "model-00001-of-00002.safetensors";
const SHARD2: &str = "model-00002-of-00002.safetensors";

/// Two shards (one tensor tied across them), an index, config, a binary
/// tokenizer model and a nested subdirectory.
fn model_dir(dir: &Path) {
    let mut rng = common::Rng(11);
    let embed = gauss_bf16(&mut rng, 512 * 384, 0.02);
    let s1 = safetensors_file(
        &[
            (
                "model.embed_tokens.weight",
                "BF16",
                vec![512, 384],
                embed.clone(),
            ),
            (
                "model.layers.0.w",
                "F32",
                vec![256, 256],
                gauss_f32(&mut rng, 65536, 0.02),
            ),
            (
                "model.layers.0.b",
                "F32",
                vec![256],
                gauss_f32(&mut rng, 256, 0.02),
            ),
            (
                "model.pos_ids",
                "I64",
                vec![100],
                (0..100u64).flat_map(|i| i.to_le_bytes()).collect(),
            ),
        ],
        Some(r#"{"format":"pt"}"#),
    );
    let s2 = safetensors_file(
        &[
            ("lm_head.weight", "BF16", vec![512, 384], embed),
            (
                "model.layers.1.w",
                "F16",
                vec![300, 301],
                gauss_f16(&mut rng, 300 * 301, 0.02),
            ),
            (
                "model.norm.weight",
                "BF16",
                vec![384],
                gauss_bf16(&mut rng, 384, 1.0),
            ),
        ],
        Some(r#"{"format":"pt"}"#),
    );
    fs::write(dir.join(SHARD1), s1).unwrap();
    fs::write(dir.join(SHARD2), s2).unwrap();
    let mut map = BTreeMap::new();
    for n in [
        "model.embed_tokens.weight",
        "model.layers.0.w",
        "model.layers.0.b",
        "model.pos_ids",
    ] {
        map.insert(n, SHARD1);
    }
    for n in ["lm_head.weight", "model.layers.1.w", "model.norm.weight"] {
        map.insert(n, SHARD2);
    }
    let index = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": map});
    fs::write(
        dir.join("model.safetensors.index.json"),
        serde_json::to_string_pretty(&index).unwrap(),
    )
    .unwrap();
    fs::write(
        dir.join("config.json"),
        "{\n  \"model_type\": \"llama\",\n  \"tie_word_embeddings\": true\n}\n",
    )
    .unwrap();
    let tok: Vec<u8> = (0..5000u64)
        .map(|i| (rng.next() as u8) | ((i % 2) as u8) << 7)
        .collect();
    fs::write(dir.join("tokenizer.model"), tok).unwrap();
    fs::create_dir_all(dir.join("1_Pooling/nested")).unwrap();
    fs::write(
        dir.join("1_Pooling/config.json"),
        "{\"pooling_mode_mean_tokens\": true}",
    )
    .unwrap();
    fs::write(dir.join("1_Pooling/nested/notes.txt"), "nested\n").unwrap();
}

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

struct Fixture {
    _tmp: tempfile::TempDir,
    src: PathBuf,
    m: Mount,
}

/// Packs the model, and mounts a store with `model.blz`, `bad.blz` (one
/// byte of tensor `model.layers.1.w` flipped) and `junk.blz` (not a .blz).
fn fixture() -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("model");
    fs::create_dir(&src).unwrap();
    model_dir(&src);
    let blz = tmp.path().join("model.blz");
    let out = common::ckptfs(&["pack", src.to_str().unwrap(), "-o", blz.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut bad = fs::read(&blz).unwrap();
    {
        let ar = BlzArchive::open(&blz).unwrap();
        let t = ar
            .files()
            .iter()
            .flat_map(|f| f.tensors.clone().unwrap_or_default())
            .find(|t| t.name == "model.layers.1.w")
            .unwrap();
        let b = ar.blob(t.blob.unwrap());
        let data_start = bad.len() - ar.header().data_length as usize;
        bad[data_start + (b.offset + b.length / 2) as usize] ^= 0x40;
    }
    let m = Mount::new(
        |store| {
            fs::copy(&blz, store.join("model.blz")).unwrap();
            fs::write(store.join("bad.blz"), &bad).unwrap();
            fs::write(store.join("junk.blz"), b"this is not a blz archive at all").unwrap();
        },
        &["--cache-size", "64M"],
    );
    Fixture { _tmp: tmp, src, m }
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
    let venv = std::env::var_os("CKPTFS_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv"));
    let python = venv.join("bin/python");
    assert!(
        python.exists(),
        "{} missing: run scripts/setup-test-env.sh",
        python.display()
    );
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

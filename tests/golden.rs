//! Golden bytes of the on-disk formats ckptfs writes: ZSTN v3 + CKX1 v1
//! (a digest) and `.blz` v1 (committed files in tests/data/golden). If this
//! fails after a change, the bytes on disk changed: if that was intended,
//! bump that format's version (crates/format/src/ckx.rs or crates/format/src/blz/mod.rs, and
//! doc/FORMAT.md) and update the expected digest or files; readers must keep
//! reading the old version.

use crate::common;
use ckptfs::pack::{pack, Compat, PackOptions};
use common::*;
use std::fs;
use std::path::{Path, PathBuf};
use xxhash_rust::xxh3::xxh3_64;

fn fixture() -> Vec<u8> {
    let mut rng = Rng(42);
    safetensors_file(
        &[
            ("w", "BF16", vec![64, 64], gauss_bf16(&mut rng, 4096, 0.02)),
            ("b", "F32", vec![256], gauss_f32(&mut rng, 256, 0.02)),
            (
                "ids",
                "I32",
                vec![100],
                (0..100u32).flat_map(|i| (i % 10).to_le_bytes()).collect(),
            ),
            (
                "w_tied",
                "BF16",
                vec![64, 64],
                gauss_bf16(&mut Rng(42), 4096, 0.02),
            ),
        ],
        Some(r#"{"format":"pt"}"#),
    )
}

/// `--compat z4ai`: the frames z4ai 0.2.0 reads, byte for byte as before
/// split-float frames existed.
#[test]
fn packed_bytes_are_stable() {
    let mut out = Vec::new();
    let opts = PackOptions {
        compat: Compat::Z4ai,
        ..PackOptions::default()
    };
    pack(&fixture(), &mut out, opts, &|_| {}).unwrap();
    // Structure, field by field, as doc/FORMAT.md describes it.
    assert_eq!(&out[..4], b"ZSTN");
    assert_eq!(out[4], 3, "ZSTN version");
    assert_eq!(out[5], 1, "contiguous");
    let n = out.len();
    assert_eq!(&out[n - 4..], b"ZSTN");
    let index_offset = u64::from_le_bytes(out[n - 20..n - 12].try_into().unwrap()) as usize;
    // The CKX1 block ends right before the index.
    assert_eq!(&out[index_offset - 4..index_offset], b"CKX1");
    let ext_len =
        u64::from_le_bytes(out[index_offset - 12..index_offset - 4].try_into().unwrap()) as usize;
    let ext = &out[index_offset - ext_len..index_offset];
    assert_eq!(&ext[..4], b"CKX1");
    assert_eq!(u16::from_le_bytes([ext[4], ext[5]]), 1, "CKX1 version");
    assert_eq!(
        u32::from_le_bytes(ext[8..12].try_into().unwrap()),
        3,
        "three unique frames"
    );
    let body_digest = u64::from_le_bytes(ext[ext_len - 20..ext_len - 12].try_into().unwrap());
    assert_eq!(body_digest, xxh3_64(&ext[..ext_len - 20]));
    let hlen = u64::from_le_bytes(out[6..14].try_into().unwrap()) as usize;
    let frames_start = 14 + hlen + 8;
    assert_eq!(
        u64::from_le_bytes(ext[12..20].try_into().unwrap()),
        xxh3_64(&out[..frames_start]),
        "head digest"
    );
    assert_eq!(
        u64::from_le_bytes(ext[20..28].try_into().unwrap()),
        xxh3_64(&out[index_offset..]),
        "index digest"
    );
    let digest = xxh3_64(&out);
    assert_eq!(
        (out.len(), format!("{digest:016x}")),
        (GOLDEN_LEN, GOLDEN_DIGEST.to_string()),
        "the bytes ckptfs writes changed: bump the CKX1 format version if intended"
    );
}

const GOLDEN_LEN: usize = 7380;
const GOLDEN_DIGEST: &str = "2c77464e47612b4b";

/// Float tensors large enough for split-float frames (doc/FORMAT.md §1):
/// bf16, fp16 and fp32, element counts that are not multiples of the 32
/// rANS states.
fn split_fixture() -> Vec<u8> {
    let mut rng = Rng(7);
    safetensors_file(
        &[
            ("bf16", "BF16", vec![6001], gauss_bf16(&mut rng, 6001, 0.02)),
            ("fp16", "F16", vec![4099], gauss_f16(&mut rng, 4099, 0.05)),
            ("fp32", "F32", vec![3001], gauss_f32(&mut rng, 3001, 0.02)),
        ],
        None,
    )
}

/// The default writer's split-float frames: packing the fixture writes
/// exactly the committed `split-float.zstn`, whose frames are split-float
/// (rANS-32 top bytes), and the committed file unpacks to the fixture.
/// `CKPTFS_BLESS=1` rewrites it (after a version bump, see above).
#[test]
fn split_float_bytes_are_stable() {
    use ckptfs::archive::{ArchiveView, ZstnArchive};
    let input = split_fixture();
    let mut out = Vec::new();
    pack(&input, &mut out, PackOptions::default(), &|_| {}).unwrap();
    let path = golden_path("split-float.zstn");
    if std::env::var_os("CKPTFS_BLESS").is_some_and(|v| v == "1") {
        fs::write(&path, &out).unwrap();
    }
    let want = fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let a = ZstnArchive::open(&path).unwrap();
    let mut kinds = Vec::new();
    for u in 0..a.units() as u32 {
        let f = ckptfs::format::frame::Frame::parse(a.frame_bytes(u)).unwrap();
        kinds.push((f.kind_tag(), f.plane_methods()));
    }
    assert_eq!(
        kinds,
        [
            ("Z4AI/split-float/w2".to_string(), vec![6, 0]),
            // This fp16 tensor's top bytes (5.6 bits of 132 symbols) cost
            // more than SPLIT_SLACK more with 12-bit probabilities than
            // with method 4's 14-bit ones: the writer keeps byte-plane.
            ("Z4AI/byteplane/w2".to_string(), vec![0, 4]),
            ("Z4AI/split-float/w4".to_string(), vec![6, 0]),
        ],
        "frame layouts of the golden file"
    );
    let mut back = Vec::new();
    ckptfs::commands::unpack_to(&a, &mut back).unwrap();
    assert!(
        back == input,
        "the golden split-float file unpacks to other bytes"
    );
    assert!(
        out == want,
        "the bytes ckptfs writes changed: bump the CKX1 format version if intended"
    );
}

/// A fixed small model directory: two shards with BF16, F32 and I64
/// tensors (one BF16 tensor tied across them), config.json and a binary
/// sidecar.
fn blz_fixture(dir: &Path) {
    let mut rng = Rng(42);
    let w = gauss_bf16(&mut rng, 4096, 0.02);
    let meta = Some(r#"{"format":"pt"}"#);
    let s1 = safetensors_file(
        &[
            ("w", "BF16", vec![64, 64], w.clone()),
            ("b", "F32", vec![256], gauss_f32(&mut rng, 256, 0.02)),
            (
                "pos",
                "I64",
                vec![64],
                (0..64u64).flat_map(|i| i.to_le_bytes()).collect(),
            ),
        ],
        meta,
    );
    let s2 = safetensors_file(
        &[
            ("w_tied", "BF16", vec![64, 64], w),
            ("norm", "F32", vec![64], gauss_f32(&mut rng, 64, 1.0)),
        ],
        meta,
    );
    fs::write(dir.join(SHARD1), s1).unwrap();
    fs::write(dir.join(SHARD2), s2).unwrap();
    fs::write(dir.join("config.json"), "{\"model_type\": \"llama\"}\n").unwrap();
    let tok: Vec<u8> = (0..64).map(|_| rng.next() as u8 | 0x80).collect();
    fs::write(dir.join("tokenizer.model"), tok).unwrap();
}

/// The committed golden archive `name`.
fn golden_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/golden")
        .join(name)
}

/// `ckptfs pack DIR -o X.blz` (default and `--raw`, each also with one
/// thread) writes exactly the committed bytes. `CKPTFS_BLESS=1` rewrites
/// the golden files instead (only after bumping the version, see above).
#[test]
fn blz_packed_bytes_are_stable() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("model");
    fs::create_dir(&src).unwrap();
    blz_fixture(&src);
    let bless = std::env::var_os("CKPTFS_BLESS").is_some_and(|v| v == "1");
    for (golden, extra) in [("model.blz", &[][..]), ("model.raw.blz", &["--raw"][..])] {
        let mut packed = Vec::new();
        for threads in [&[][..], &["--threads", "1"][..]] {
            let out = tmp.path().join(golden);
            let mut args = threads.to_vec();
            args.extend(["pack", src.to_str().unwrap(), "-o", out.to_str().unwrap()]);
            args.extend(extra);
            args.push("--force");
            let o = ckptfs(&args);
            assert!(
                o.status.success(),
                "ckptfs {args:?}: {}",
                String::from_utf8_lossy(&o.stderr)
            );
            packed.push(fs::read(&out).unwrap());
        }
        assert!(
            packed[0] == packed[1],
            "{golden}: the bytes depend on the thread count"
        );
        let got = &packed[0];
        // The layout doc/FORMAT.md §3 gives: magic, version, header length.
        assert_eq!(&got[..8], b"CKPTBLZ\0");
        assert_eq!(u32::from_le_bytes(got[8..12].try_into().unwrap()), 1);
        let path = golden_path(golden);
        if bless {
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(&path, got).unwrap();
            continue;
        }
        let want = fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        // The committed archive still reads back as the fixture.
        let unpacked = tmp.path().join(format!("{golden}.unpacked"));
        let o = ckptfs(&[
            "unpack",
            path.to_str().unwrap(),
            "-o",
            unpacked.to_str().unwrap(),
        ]);
        assert!(
            o.status.success(),
            "unpack {golden}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let mut names: Vec<_> = fs::read_dir(&src)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        let mut back: Vec<_> = fs::read_dir(&unpacked)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        back.sort();
        assert_eq!(names, back, "{golden}: unpacked file names");
        for n in &names {
            assert!(
                fs::read(src.join(n)).unwrap() == fs::read(unpacked.join(n)).unwrap(),
                "{golden}: {} unpacks to other bytes",
                n.to_string_lossy()
            );
        }
        if *got != want {
            let at = got.iter().zip(&want).position(|(a, b)| a != b);
            panic!(
                "the .blz bytes changed: bump the format version (crates/format/src/blz/mod.rs, \
                 doc/FORMAT.md) if intended, then rewrite the golden files with \
                 CKPTFS_BLESS=1 cargo test --test golden. {golden}: {} bytes, \
                 golden {} bytes, first difference at {}",
                got.len(),
                want.len(),
                at.unwrap_or(got.len().min(want.len()))
            );
        }
    }
}

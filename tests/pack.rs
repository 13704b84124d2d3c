//! The writer: exact round trips for every dtype and shape, bounded size,
//! sub-tensor random access, atomic and validated CLI packing.

use crate::common;
use ckptfs::archive::{read_with, ArchiveError, ArchiveView, BlockKey, ZstnArchive};
use ckptfs::format::safetensors::Dtype;
use ckptfs::pack::{pack, PackOptions};
use common::{bf16_bits, ckptfs, gauss_bf16, gauss_f16, gauss_f32, safetensors_file, Rng};
use proptest::prelude::*;
use std::path::Path;
use std::sync::Arc;

fn packed(file: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    pack(file, &mut out, PackOptions::default(), &|_| {}).unwrap();
    out
}

fn roundtrip(file: &[u8]) -> Vec<u8> {
    let z = packed(file);
    let a = ZstnArchive::from_bytes(z.clone(), Path::new("p.zstn")).unwrap();
    assert!(a.extension().is_some());
    let mut out = vec![0u8; a.len() as usize];
    assert_eq!(a.read_at(0, 0, &mut out).unwrap(), file.len());
    assert_eq!(out, file);
    // Size bound: never more than 0.1% + 4 KiB above the input.
    assert!(
        z.len() as f64 <= file.len() as f64 * 1.001 + 4096.0,
        "{} > {}",
        z.len(),
        file.len()
    );
    z
}

/// Element bytes drawn from a mix of distributions, so that every plane
/// method gets exercised: gaussian floats, constants, zeros, noise.
fn tensor_bytes(rng: &mut Rng, dtype: Dtype, n: u64, style: u8) -> Vec<u8> {
    let bytes = (n * dtype.bits()).div_ceil(8) as usize;
    match (style % 4, dtype) {
        (0, Dtype::BF16) => gauss_bf16(rng, bytes / 2, 0.02),
        (0, Dtype::F32) => gauss_f32(rng, bytes / 4, 0.02),
        (0, Dtype::F16) => gauss_f16(rng, bytes / 2, 0.02),
        (1, _) => vec![0u8; bytes],
        (2, _) => (0..bytes).map(|i| (i % 7) as u8 * 3).collect(),
        _ => (0..bytes).map(|_| rng.next() as u8).collect(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn roundtrip_every_dtype_and_shape(
        specs in prop::collection::vec((0usize..20, prop::collection::vec(0u64..40, 0..3), 0u8..4), 0..6),
        seed in any::<u64>(),
    ) {
        let mut rng = Rng(seed | 1);
        let mut tensors = Vec::new();
        for (i, (d, shape, style)) in specs.iter().enumerate() {
            let dtype = Dtype::ALL[*d];
            let mut shape = shape.clone();
            // Sub-byte dtypes need whole bytes.
            if !(shape.iter().product::<u64>() * dtype.bits()).is_multiple_of(8) {
                shape.push(8);
            }
            let numel: u64 = shape.iter().product();
            tensors.push((format!("t{i}"), dtype.name(), shape, tensor_bytes(&mut rng, dtype, numel, *style)));
        }
        let refs: Vec<(&str, &str, Vec<u64>, Vec<u8>)> =
            tensors.iter().map(|(n, d, s, b)| (n.as_str(), *d, s.clone(), b.clone())).collect();
        roundtrip(&safetensors_file(&refs, Some(r#"{"k":"v"}"#)));
    }

    #[test]
    fn roundtrip_large_float_tensors_with_odd_sizes(
        n in 1u64..300_000, d in 0usize..4, seed in any::<u64>()
    ) {
        let dtype = [Dtype::BF16, Dtype::F16, Dtype::F32, Dtype::F64][d];
        let mut rng = Rng(seed | 1);
        let b = tensor_bytes(&mut rng, dtype, n, 0);
        let f = safetensors_file(&[("w", dtype.name(), vec![n], b)], None);
        roundtrip(&f);
    }
}

#[test]
fn files_with_gaps_roundtrip() {
    // A hole between tensors and trailing bytes after the last one.
    let header = r#"{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"BF16","shape":[8],"data_offsets":[20,36]}}"#;
    let mut f = (header.len() as u64).to_le_bytes().to_vec();
    f.extend_from_slice(header.as_bytes());
    f.extend((0..40u8).map(|i| i.wrapping_mul(37)));
    let z = roundtrip(&f);
    assert_eq!(z[5], 0, "non-tiling files use the opaque layout");
}

#[test]
fn identical_tensors_are_stored_once() {
    let mut rng = Rng(3);
    let w = gauss_bf16(&mut rng, 65536, 0.02);
    let f = safetensors_file(
        &[
            ("lm_head.weight", "BF16", vec![256, 256], w.clone()),
            ("embed.weight", "BF16", vec![256, 256], w),
        ],
        None,
    );
    let z = roundtrip(&f);
    let a = ZstnArchive::from_bytes(z, Path::new("t")).unwrap();
    assert!(matches!(
        a.records()[1].kind,
        ckptfs::format::zstn::RecordKind::Ref(0)
    ));
    assert_eq!(a.units(), 1);
}

#[test]
fn no_tensor_grows_beyond_a_small_constant() {
    let mut rng = Rng(5);
    let noise: Vec<u8> = (0..100_000).map(|_| rng.next() as u8).collect();
    let f = safetensors_file(
        &[
            ("noise", "BF16", vec![50_000], noise.clone()),
            ("n8", "U8", vec![100_000], noise),
        ],
        None,
    );
    let z = packed(&f);
    let a = ZstnArchive::from_bytes(z, Path::new("t")).unwrap();
    for r in a.records() {
        if let ckptfs::format::zstn::RecordKind::Frame { len, .. } = r.kind {
            assert!(len <= r.len() + 64, "{}: {len} for {}", r.name, r.len());
        }
    }
}

#[test]
fn bf16_gaussian_weights_reach_the_entropy_limit() {
    let mut rng = Rng(9);
    let f = safetensors_file(
        &[(
            "w",
            "BF16",
            vec![1024, 1024],
            gauss_bf16(&mut rng, 1 << 20, 0.02),
        )],
        None,
    );
    let z = roundtrip(&f);
    let ratio = f.len() as f64 / z.len() as f64;
    // Order-0 entropy of N(0, 0.02) bf16 gives about 1.51.
    assert!(ratio > 1.49, "ratio {ratio}");
}

/// Reading 4 KiB from the middle of a 256 MiB tensor decodes at most 2 MiB.
#[test]
fn a_small_read_decodes_only_its_blocks() {
    let n: usize = 128 << 20; // bf16 elements: 256 MiB
    let lut: Vec<[u8; 2]> = {
        let mut rng = Rng(1);
        (0..4096)
            .map(|_| bf16_bits((rng.normal() * 0.02) as f32).to_le_bytes())
            .collect()
    };
    let mut data = vec![0u8; n * 2];
    let mut rng = Rng(2);
    for e in data.chunks_exact_mut(8) {
        let r = rng.next();
        e[..2].copy_from_slice(&lut[(r & 4095) as usize]);
        e[2..4].copy_from_slice(&lut[((r >> 12) & 4095) as usize]);
        e[4..6].copy_from_slice(&lut[((r >> 24) & 4095) as usize]);
        e[6..8].copy_from_slice(&lut[((r >> 36) & 4095) as usize]);
    }
    let f = safetensors_file(&[("big", "BF16", vec![8192, 16384], data)], None);
    drop(lut);
    let z = packed(&f);
    let a = ZstnArchive::from_bytes(z, Path::new("big.zstn")).unwrap();
    let mid = a.len() / 2 + 12345;
    // The fetcher counts what the read path asks to decode.
    let mut decoded = 0u64;
    let mut fetch = |k: BlockKey| -> Result<Arc<Vec<u8>>, ArchiveError> {
        let d = a.decode_block(k)?;
        decoded += d.len() as u64;
        Ok(Arc::new(d))
    };
    let mut buf = vec![0u8; 4096];
    read_with(&a, 0, mid, &mut buf, &mut fetch).unwrap();
    assert_eq!(&buf[..], &f[mid as usize..mid as usize + 4096]);
    assert!(
        decoded <= 2 << 20,
        "decoded {decoded} bytes for a 4 KiB read"
    );
    assert!(decoded > 0);
}

#[test]
fn cli_pack_default_name_refusal_and_tree() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    std::fs::create_dir_all(model.join("sub")).unwrap();
    let mut rng = Rng(4);
    let st = safetensors_file(
        &[("w", "BF16", vec![128, 64], gauss_bf16(&mut rng, 8192, 0.02))],
        None,
    );
    std::fs::write(model.join("model.safetensors"), &st).unwrap();
    std::fs::write(model.join("config.json"), b"{\"a\": 1}").unwrap();
    std::fs::write(model.join("sub/tokenizer.model"), [0u8, 1, 2, 255]).unwrap();
    std::os::unix::fs::symlink("config.json", model.join("link.json")).unwrap();

    // Single file, default output name.
    let src = model.join("model.safetensors");
    let out = ckptfs(&["pack", "-q", src.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let z = model.join("model.zstn");
    assert!(z.exists());
    // Outputs get the mode a plain create would (0666 minus the umask), not
    // the 0600 of a temporary file.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&z).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode & 0o044, 0o044, "mode {mode:o}");
    // Refuses to overwrite without --force.
    let out = ckptfs(&["pack", "-q", src.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    std::fs::remove_file(&z).unwrap();

    // A tree becomes a store.
    let store = dir.path().join("store");
    let out = ckptfs(&[
        "pack",
        "-q",
        "-r",
        model.to_str().unwrap(),
        "-o",
        store.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read(store.join("config.json")).unwrap(),
        b"{\"a\": 1}"
    );
    assert_eq!(
        std::fs::read(store.join("sub/tokenizer.model")).unwrap(),
        [0u8, 1, 2, 255]
    );
    assert_eq!(
        std::fs::read_link(store.join("link.json")).unwrap(),
        Path::new("config.json")
    );
    assert!(!store.join("model.safetensors").exists());
    let back = dir.path().join("back.safetensors");
    let out = ckptfs(&[
        "unpack",
        store.join("model.zstn").to_str().unwrap(),
        "-o",
        back.to_str().unwrap(),
    ]);
    assert!(out.status.success());
    assert_eq!(std::fs::read(back).unwrap(), st);
    // No temporary files anywhere in the store.
    for e in std::fs::read_dir(&store).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        assert!(!name.ends_with(".tmp"), "{name}");
    }
}

#[test]
fn cli_pack_refuses_malformed_input_before_writing() {
    let dir = tempfile::tempdir().unwrap();
    for (name, bytes) in [
        ("short.safetensors", vec![1u8, 2, 3]),
        ("json.safetensors", {
            let mut v = 5u64.to_le_bytes().to_vec();
            v.extend_from_slice(b"{\"a\":");
            v
        }),
        ("overlap.safetensors", {
            let h = r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}}"#;
            let mut v = (h.len() as u64).to_le_bytes().to_vec();
            v.extend_from_slice(h.as_bytes());
            v.extend_from_slice(&[0u8; 6]);
            v
        }),
    ] {
        let p = dir.path().join(name);
        std::fs::write(&p, &bytes).unwrap();
        let out = ckptfs(&["pack", p.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(1), "{name}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(name) && err.lines().count() == 1,
            "{name}: {err}"
        );
        assert!(!dir
            .path()
            .join(name.replace(".safetensors", ".zstn"))
            .exists());
    }
}

/// A missing input is reported with its cause, once, not only its name:
/// `info` and `verify` used to print the path alone, `list` the cause twice.
#[test]
fn cli_reports_a_missing_input_with_its_cause() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("gone.zstn");
    let p = missing.to_str().unwrap();
    for args in [
        vec!["info", p],
        vec!["verify", p],
        vec!["list", p],
        vec!["unpack", p],
    ] {
        let out = ckptfs(&args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let text = String::from_utf8_lossy(&out.stderr).to_string()
            + &String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains(p)
                && text.matches("No such file").count() == 1
                && text.trim().lines().count() == 1,
            "{args:?}: {text}"
        );
    }
}

#[test]
fn info_shows_per_tensor_transform_methods_and_ratio() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng(8);
    let st = safetensors_file(
        &[
            (
                "w",
                "BF16",
                vec![256, 256],
                gauss_bf16(&mut rng, 65536, 0.02),
            ),
            (
                "ids",
                "I64",
                vec![1000],
                (0..1000u64).flat_map(|i| i.to_le_bytes()).collect(),
            ),
        ],
        None,
    );
    let p = dir.path().join("m.safetensors");
    std::fs::write(&p, &st).unwrap();
    assert!(ckptfs(&["pack", "-q", p.to_str().unwrap()])
        .status
        .success());
    let out = ckptfs(&["info", dir.path().join("m.zstn").to_str().unwrap()]);
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(s.contains("checksums     ckx1 (ckptfs-written)"), "{s}");
    let w = s
        .lines()
        .find(|l| l.trim_start().starts_with("w "))
        .unwrap();
    // The default layout: split-float, top bytes rANS-32, low bytes stored.
    assert!(
        w.contains("Z4AI/split-float/w2") && w.contains("[rans32,store]"),
        "{w}"
    );
    // `--compat z4ai`, repacking the archive: z4ai's bit-field layout.
    let z4 = dir.path().join("m.z4ai.zstn");
    let zstn = dir.path().join("m.zstn");
    let o = ckptfs(&[
        "pack",
        "-q",
        zstn.to_str().unwrap(),
        "--compat",
        "z4ai",
        "-o",
        z4.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out4 = ckptfs(&["info", z4.to_str().unwrap()]);
    let s4 = String::from_utf8_lossy(&out4.stdout);
    let w4 = s4
        .lines()
        .find(|l| l.trim_start().starts_with("w "))
        .unwrap();
    assert!(
        w4.contains("Z4AI/bitfield/bfloat16")
            && w4.contains("rans_o0_adaptive")
            && w4.contains("zstd_blocks"),
        "{w4}"
    );
    let ids = s
        .lines()
        .find(|l| l.trim_start().starts_with("ids "))
        .unwrap();
    assert!(ids.contains("Z4AI/opaque"), "{ids}");
}

//! Every z4ai-written vector decodes byte-identical to its original: through
//! `ckptfs unpack`, tensor by tensor, and through random byte-range reads.

use crate::common;
use ckptfs::archive::{ArchiveView, ZstnArchive};
use common::*;

#[test]
fn unpack_reproduces_every_vector() {
    let out = tempfile::tempdir().unwrap();
    for (name, orig, zstn) in zstn_vectors() {
        let dst = out.path().join(format!("{name}.safetensors"));
        let o = ckptfs(&[
            "unpack",
            zstn.to_str().unwrap(),
            "-o",
            dst.to_str().unwrap(),
        ]);
        assert!(
            o.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert_eq!(
            std::fs::read(&dst).unwrap(),
            std::fs::read(&orig).unwrap(),
            "{name}"
        );
    }
}

#[test]
fn verify_passes_on_every_vector() {
    for (name, _, zstn) in zstn_vectors() {
        let o = ckptfs(&["verify", zstn.to_str().unwrap()]);
        let stdout = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "{name}: {stdout}");
        assert!(stdout.starts_with("OK"), "{name}: {stdout}");
    }
}

#[test]
fn every_tensor_decodes_alone() {
    for (name, orig, zstn) in zstn_vectors() {
        let original = std::fs::read(&orig).unwrap();
        let a = ZstnArchive::open(&zstn).unwrap();
        let data_start = a.container().data_start() as usize;
        for (i, r) in a.records().iter().enumerate() {
            let got = a.decode_record(i).unwrap();
            let want = &original[data_start + r.begin as usize..data_start + r.end as usize];
            assert_eq!(got, want, "{name}: tensor {}", r.name);
        }
    }
}

#[test]
fn random_byte_ranges_match() {
    let mut rng = Rng(0x5eed);
    for (name, orig, zstn) in zstn_vectors() {
        let original = std::fs::read(&orig).unwrap();
        let a = ZstnArchive::open(&zstn).unwrap();
        assert_eq!(a.len(), original.len() as u64, "{name}");
        for _ in 0..60 {
            let off = rng.below(original.len() as u64 + 10);
            let len = match rng.below(3) {
                0 => rng.below(16),
                1 => rng.below(70_000),
                _ => rng.below(original.len() as u64 + 1),
            } as usize;
            let mut buf = vec![0xAAu8; len];
            let n = a.read_at(0, off, &mut buf).unwrap();
            let want: &[u8] = if off as usize >= original.len() {
                &[]
            } else {
                &original[off as usize..(off as usize + len).min(original.len())]
            };
            assert_eq!(n, want.len(), "{name} @{off}+{len}");
            assert_eq!(&buf[..n], want, "{name} @{off}+{len}");
        }
        let mut whole = vec![0u8; original.len()];
        a.read_at(0, 0, &mut whole).unwrap();
        assert_eq!(whole, original, "{name}");
    }
}

#[test]
fn bare_frames_from_the_z4ai_cli_unpack() {
    let out = tempfile::tempdir().unwrap();
    for name in ["cli_bf16", "cli_fp32", "cli_sparse_fp32"] {
        let src = vectors_dir().join(format!("{name}.bin.z4ai"));
        let dst = out.path().join(format!("{name}.bin"));
        let o = ckptfs(&["unpack", src.to_str().unwrap(), "-o", dst.to_str().unwrap()]);
        assert!(
            o.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert_eq!(
            std::fs::read(&dst).unwrap(),
            std::fs::read(vectors_dir().join(format!("{name}.bin"))).unwrap()
        );
        let o = ckptfs(&["verify", src.to_str().unwrap()]);
        assert!(o.status.success());
    }
}

#[test]
fn unpack_default_name_and_refusal_to_overwrite() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("tied.zstn");
    std::fs::copy(vectors_dir().join("tied.zstn"), &src).unwrap();
    let o = ckptfs(&["unpack", src.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let dst = dir.path().join("tied.safetensors");
    assert_eq!(
        std::fs::read(&dst).unwrap(),
        std::fs::read(vectors_dir().join("tied.safetensors")).unwrap()
    );
    // A second unpack must refuse, and leave the file alone.
    std::fs::write(&dst, b"keep me").unwrap();
    let o = ckptfs(&["unpack", src.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--force"));
    assert_eq!(std::fs::read(&dst).unwrap(), b"keep me");
    let o = ckptfs(&["unpack", "--force", src.to_str().unwrap()]);
    assert!(o.status.success());
    assert_eq!(
        std::fs::read(&dst).unwrap(),
        std::fs::read(vectors_dir().join("tied.safetensors")).unwrap()
    );
    // No temporary files are left behind.
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
    // `X.safetensors.zstn` unpacks to `X.safetensors`.
    let src2 = dir.path().join("m.safetensors.zstn");
    std::fs::copy(vectors_dir().join("tiny.zstn"), &src2).unwrap();
    assert!(ckptfs(&["unpack", src2.to_str().unwrap()]).status.success());
    assert!(dir.path().join("m.safetensors").exists());
}

#[test]
fn info_reports_kinds_and_json() {
    let v = vectors_dir();
    let o = ckptfs(&[
        "info",
        "--json",
        v.join("tied.zstn").to_str().unwrap(),
        v.join("sparse50.zstn").to_str().unwrap(),
    ]);
    assert!(o.status.success());
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j[0]["records"]["REF"], 2);
    assert_eq!(j[0]["tensors"], 5);
    assert!(j[1]["frame_kinds"]["ZSP1/w4"].as_u64().unwrap() >= 1);
    let o = ckptfs(&["info", v.join("bf16_dense.zstn").to_str().unwrap()]);
    let s = String::from_utf8_lossy(&o.stdout);
    assert!(s.contains("Z4AI/bitfield/bfloat16"), "{s}");
    assert!(s.contains("rans_o0_adaptive"), "{s}");
    assert!(s.contains("ratio"), "{s}");
}

#[test]
fn bad_usage_exits_2() {
    assert_eq!(ckptfs(&["unpack"]).status.code(), Some(2));
    assert_eq!(ckptfs(&["frobnicate"]).status.code(), Some(2));
}

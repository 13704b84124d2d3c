//! z4ai 0.2.0 (PyPI, in the venv that scripts/setup-test-env.sh builds)
//! decodes every file ckptfs writes with `--compat z4ai`, byte for byte,
//! and ckptfs reads its default files (split-float frames) exactly.

use crate::common;
use common::*;
use std::path::PathBuf;
use std::process::Command;

#[test]
fn z4ai_decodes_every_file_ckptfs_writes() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // Every vector original (except the one that is not strict safetensors),
    // plus generated files that exercise every path of the writer.
    let mut inputs: Vec<(String, Vec<u8>)> = Vec::new();
    for (name, orig, _) in zstn_vectors() {
        if name != "edge_tails" {
            inputs.push((name, std::fs::read(orig).unwrap()));
        }
    }
    for extra in ["finetune.base", "finetune.target"] {
        inputs.push((
            extra.into(),
            std::fs::read(vectors_dir().join(format!("{extra}.safetensors"))).unwrap(),
        ));
    }
    let mut rng = Rng(21);
    let big = gauss_bf16(&mut rng, 3 << 20, 0.02); // 6 MiB: several blocks
    inputs.push((
        "big_bf16".into(),
        safetensors_file(&[("w", "BF16", vec![3072, 1024], big.clone())], None),
    ));
    inputs.push((
        "odd_bf16".into(),
        safetensors_file(
            &[(
                "w",
                "BF16",
                vec![1_000_003],
                gauss_bf16(&mut rng, 1_000_003, 0.02),
            )],
            None,
        ),
    ));
    inputs.push((
        "mixed".into(),
        safetensors_file(
            &[
                (
                    "a",
                    "F32",
                    vec![300_000],
                    gauss_f32(&mut rng, 300_000, 0.02),
                ),
                (
                    "b",
                    "F16",
                    vec![700_001],
                    gauss_f16(&mut rng, 700_001, 0.02),
                ),
                (
                    "c",
                    "I64",
                    vec![200_000],
                    (0..200_000u64)
                        .flat_map(|i| (i / 3).to_le_bytes())
                        .collect(),
                ),
                ("d", "BOOL", vec![9], vec![1, 0, 1, 1, 0, 0, 1, 0, 1]),
                ("e", "F64", vec![0], vec![]),
                (
                    "f",
                    "F8_E4M3",
                    vec![1000],
                    (0..1000u32).map(|i| (i * 7) as u8).collect(),
                ),
                ("tied", "BF16", vec![3072, 1024], big),
            ],
            Some(r#"{"format":"pt","note":"é"}"#),
        ),
    ));
    // Each file is packed with the default layouts (split-float frames,
    // which z4ai does not read) into `own`, which ckptfs unpacks exactly;
    // then that archive is repacked with `--compat z4ai` beside the
    // original, for z4ai to decode.
    let own = tempfile::tempdir().unwrap();
    for (name, bytes) in &inputs {
        let src = d.join(format!("{name}.safetensors"));
        std::fs::write(&src, bytes).unwrap();
        let default = own.path().join(format!("{name}.zstn"));
        let back = own.path().join(format!("{name}.safetensors"));
        let z4 = d.join(format!("{name}.zstn"));
        for args in [
            vec![
                "pack",
                "-q",
                src.to_str().unwrap(),
                "-o",
                default.to_str().unwrap(),
            ],
            vec![
                "unpack",
                "-q",
                default.to_str().unwrap(),
                "-o",
                back.to_str().unwrap(),
            ],
            vec![
                "pack",
                "-q",
                default.to_str().unwrap(),
                "--compat",
                "z4ai",
                "-o",
                z4.to_str().unwrap(),
            ],
        ] {
            let out = ckptfs(&args);
            assert!(
                out.status.success(),
                "{name}: ckptfs {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        assert!(
            std::fs::read(&back).unwrap() == *bytes,
            "{name}: the default archive unpacks to other bytes"
        );
    }
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/z4ai_decode.py");
    let out = Command::new(venv_python())
        .arg(script)
        .arg(d)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(&format!("{0}/{0} decoded identically", inputs.len())),
        "{stdout}"
    );
    eprintln!("{stdout}");
}

//! `list`, `extract` and `export` on every kind of model ckptfs reads: a
//! model directory, a `.blz`, a `.zstn` and a plain `.safetensors`.

mod common;

use common::*;
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A model directory and the same model as .blz, one shard as .zstn.
struct Kinds {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    dir: PathBuf,
    blz: PathBuf,
    zstn: PathBuf,
}

fn kinds() -> Kinds {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().to_path_buf();
    let dir = root.join("model");
    fs::create_dir(&dir).unwrap();
    ModelDir {
        seed: 13,
        embed: [512, 64],
        twin: false,
        edge_cases: true,
    }
    .write(&dir);
    let blz = root.join("model.blz");
    pack(&dir, &blz);
    let zstn = root.join("shard2.zstn");
    pack(&dir.join(SHARD2), &zstn);
    Kinds {
        _tmp: tmp,
        root,
        dir,
        blz,
        zstn,
    }
}

fn ok(out: &std::process::Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The bytes of every tensor of a safetensors file, by name.
fn tensors_of(file: &Path) -> BTreeMap<String, (String, Vec<u64>, Vec<u8>)> {
    let bytes = fs::read(file).unwrap();
    let (h, data) = ckptfs::format::safetensors::split_file(&bytes).unwrap();
    h.tensors
        .iter()
        .map(|t| {
            (
                t.name.clone(),
                (
                    t.dtype.clone(),
                    t.shape.clone(),
                    data[t.begin as usize..t.end as usize].to_vec(),
                ),
            )
        })
        .collect()
}

#[test]
fn list_works_on_every_kind() {
    let k = kinds();
    let expect1 = tensors_of(&k.dir.join(SHARD1));
    let expect2 = tensors_of(&k.dir.join(SHARD2));
    for input in [&k.dir, &k.blz] {
        let text = ok(&ckptfs(&["list", s(input), "--json"]));
        let v: Vec<serde_json::Value> = serde_json::from_str(&text).unwrap();
        assert_eq!(
            v.len(),
            expect1.len() + expect2.len(),
            "{}",
            input.display()
        );
        for t in &v {
            let name = t["name"].as_str().unwrap();
            let (file, exp) = if t["file"] == SHARD1 {
                (SHARD1, &expect1)
            } else {
                (SHARD2, &expect2)
            };
            let (dtype, shape, bytes) = &exp[name];
            assert_eq!(t["dtype"], dtype.as_str(), "{name} in {file}");
            assert_eq!(t["shape"], serde_json::json!(shape));
            assert_eq!(t["bytes"], bytes.len() as u64);
        }
    }
    for input in [k.zstn.clone(), k.dir.join(SHARD2)] {
        let text = ok(&ckptfs(&["list", s(&input), "--filter", "layers"]));
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(text.contains("model.layers.1.w") && text.contains("[300, 301]"));
        assert!(text.contains("F16") && text.contains("180600"), "{text}");
    }
}

#[test]
fn extract_decodes_the_chosen_tensors_of_every_kind() {
    let k = kinds();
    let expect = tensors_of(&k.dir.join(SHARD2));
    let inputs = [
        k.dir.clone(),
        k.blz.clone(),
        k.zstn.clone(),
        k.dir.join(SHARD2),
    ];
    for (n, input) in inputs.iter().enumerate() {
        let out = k.root.join(format!("x{n}"));
        ok(&ckptfs(&[
            "extract",
            s(input),
            "--tensor",
            "model.layers.1.w",
            "model.norm.weight",
            "-o",
            s(&out),
        ]));
        for name in ["model.layers.1.w", "model.norm.weight"] {
            let got = fs::read(out.join(format!("{name}.bin"))).unwrap();
            assert_eq!(got, expect[name].2, "{name} of {}", input.display());
        }
        ok(&ckptfs(&[
            "extract",
            s(input),
            "--tensor",
            "model.norm.weight",
            "model.layers.1.w",
            "-o",
            s(&out),
            "--safetensors",
        ]));
        let st = fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.extension().is_some_and(|e| e == "safetensors"))
            .unwrap();
        let got = tensors_of(&st);
        assert_eq!(got.len(), 2);
        for (name, t) in &got {
            assert_eq!(t, &expect[name], "{name} of {}", input.display());
        }
        // An existing output is refused, and left as it was.
        let again = ckptfs(&[
            "extract",
            s(input),
            "--tensor",
            "model.norm.weight",
            "-o",
            s(&out),
        ]);
        assert!(!again.status.success());
        let err = String::from_utf8_lossy(&again.stderr);
        assert!(
            err.contains("model.norm.weight.bin") && err.contains("--force"),
            "{err}"
        );
        assert_eq!(err.lines().count(), 1, "{err}");
    }
}

#[test]
fn extract_names_what_is_missing_or_ambiguous() {
    let k = kinds();
    let out = ckptfs(&[
        "extract",
        s(&k.zstn),
        "--tensor",
        "nope",
        "-o",
        s(&k.root.join("y")),
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("shard2.zstn") && err.contains("no tensor \"nope\""),
        "{err}"
    );
    // A file that is not safetensors.
    let bad = k.root.join("bad.safetensors");
    fs::write(&bad, [0xffu8; 64]).unwrap();
    let out = ckptfs(&["list", s(&bad)]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.safetensors") && err.contains("header"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
}

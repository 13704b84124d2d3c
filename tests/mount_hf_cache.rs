//! The Hugging Face cache on the mount (issue 16, item 2): huggingface_hub's
//! own download code (`hf_hub_download`, against a Hub served on 127.0.0.1
//! by `tests/hf_cache_client.py` with the Hub's headers) writes
//! `HF_HUB_CACHE` into a mount; the blob is compressed under its own name
//! (`blobs/<sha256>.zsame` in STORE), its symlink and bytes stay exactly as
//! written, `du` of STORE shows it compressed, and `from_pretrained(repo_id)`
//! with `HF_HUB_OFFLINE=1` loads from the mounted cache, after a remount too.
//! Backs doc/SEMANTICS.md's "Safetensors content under any name".

use crate::common;

use common::Mount;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Command, Output};

fn client(args: &[&str]) -> Output {
    let out = Command::new(common::venv_python())
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/hf_cache_client.py"))
        .args(args)
        .env("CUDA_VISIBLE_DEVICES", "")
        .env("TOKENIZERS_PARALLELISM", "false")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "hf_cache_client {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn du_kib(path: &Path, apparent: bool) -> u64 {
    let mut c = Command::new("du");
    c.arg("-sk");
    if apparent {
        c.arg("--apparent-size");
    }
    let out = c.arg(path).output().unwrap();
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn huggingface_hub_cache_on_the_mount_is_compressed_and_loads_offline() {
    let src_dir = tempfile::tempdir().unwrap();
    let src = src_dir.path().join("tiny-bert");
    client(&["make", src.to_str().unwrap()]);
    let mut m = Mount::new(|_| {}, &[]);
    let cache = m.path("hub");
    let out = client(&["download", src.to_str().unwrap(), cache.to_str().unwrap()]);
    let info: serde_json::Value = serde_json::from_slice(
        out.stdout
            .split(|&b| b == b'\n')
            .find(|l| l.starts_with(b"{"))
            .expect("download prints its blob names"),
    )
    .unwrap();
    let commit = info["commit"].as_str().unwrap();
    let weights = info["blobs"]["model.safetensors"].as_str().unwrap();
    let config = info["blobs"]["config.json"].as_str().unwrap();
    m.wait_committed(120);

    let repo = "models--ckptfs--tiny-bert";
    let blobs = m.store.join("hub").join(repo).join("blobs");
    let mut stored: Vec<String> = std::fs::read_dir(&blobs)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    stored.sort();
    let mut want = vec![format!("{weights}.zsame"), config.to_string()];
    want.sort();
    assert_eq!(stored, want, "{}", m.log_text());

    // Symlinks as huggingface_hub wrote them, in STORE and in the mount.
    let snap = format!("hub/{repo}/snapshots/{commit}");
    for (name, blob) in [("model.safetensors", weights), ("config.json", config)] {
        let want = format!("../../blobs/{blob}");
        let in_store = m.store.join(&snap).join(name);
        assert_eq!(std::fs::read_link(&in_store).unwrap(), Path::new(&want));
        let in_mnt = m.path(&snap).join(name);
        assert_eq!(std::fs::read_link(&in_mnt).unwrap(), Path::new(&want));
        // Bytes exact through the symlink and under the blob's name.
        let orig = std::fs::read(src.join(name)).unwrap();
        assert_eq!(std::fs::read(&in_mnt).unwrap(), orig, "{name}");
        let b = m.path(&format!("hub/{repo}/blobs/{blob}"));
        assert_eq!(std::fs::metadata(&b).unwrap().len(), orig.len() as u64);
    }
    // `ckptfs unpack` of what STORE holds gives the original bytes.
    let zsame = blobs.join(format!("{weights}.zsame"));
    let unpacked = src_dir.path().join("unpacked");
    let o = common::ckptfs(&[
        "unpack",
        zsame.to_str().unwrap(),
        "-o",
        unpacked.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let orig = std::fs::read(src.join("model.safetensors")).unwrap();
    assert_eq!(std::fs::read(&unpacked).unwrap(), orig);

    // du: STORE holds less than the files it presents.
    let store_kib = du_kib(&m.store.join("hub"), false);
    let mnt_kib = du_kib(&cache, true);
    let src_kib = du_kib(&src, false);
    println!(
        "du -sk: store {store_kib} KiB, mount (apparent) {mnt_kib} KiB, original files {src_kib} KiB; {} stored as {} bytes",
        orig.len(),
        std::fs::metadata(&zsame).unwrap().len()
    );
    assert!(
        store_kib * 10 < src_kib * 8,
        "bf16 weights should shrink: store {store_kib} KiB, original {src_kib} KiB"
    );
    assert!(std::fs::metadata(&zsame).unwrap().blocks() * 512 < orig.len() as u64);

    // from_pretrained(repo_id), offline, from the mounted cache; again
    // after a remount (nothing left staged, everything from STORE).
    let o = client(&["load", src.to_str().unwrap(), cache.to_str().unwrap()]);
    println!("{}", String::from_utf8_lossy(&o.stdout).trim());
    m.unmount();
    m.remount(&[]);
    let o = client(&["load", src.to_str().unwrap(), cache.to_str().unwrap()]);
    println!(
        "after remount: {}",
        String::from_utf8_lossy(&o.stdout).trim()
    );
    assert!(!m.log_text().contains("ERROR"), "{}", m.log_text());
}

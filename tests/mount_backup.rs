//! Backing up a live store (issue 16): an rsync of STORE taken under
//! `ckptfs hold` while the daemon keeps compressing and committing files
//! restores a store that mounts, serves every file closed before the backup
//! began byte for byte, and verifies. Backs doc/SEMANTICS.md's "Backing up
//! a live store". The same copy without the hold is taken beside it and its
//! result printed (not asserted: whether it loses a file is a race).

use crate::common;

use common::{ckptfs, gauss_bf16, safetensors_file, Mount, Rng};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};

/// Name and bytes of each file closed through the mount.
type Closed = BTreeMap<String, Vec<u8>>;

fn model(seed: u64) -> Vec<u8> {
    let mut rng = Rng(seed);
    let n = 1_000_000 + (seed as usize % 7) * 100_000;
    safetensors_file(
        &[
            ("w", "BF16", vec![n as u64], gauss_bf16(&mut rng, n, 0.02)),
            ("b", "BF16", vec![64], gauss_bf16(&mut rng, 64, 0.02)),
        ],
        None,
    )
}

/// The backup rule of doc/SEMANTICS.md: under `ckptfs hold`, everything
/// but the spool (exit 24 accepted: a file staged meanwhile left its
/// directory for the spool), then the spool.
fn backup_held(store: &Path, dest: &Path) -> std::process::Output {
    let s = store.display();
    let d = dest.display();
    ckptfs(&[
        "hold",
        store.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        &format!(
            "rsync -a --exclude=/.ckptfs-spool {s}/ {d}/; r=$?; [ $r = 0 ] || [ $r = 24 ] || exit $r; mkdir -p {d}/.ckptfs-spool && rsync -a --exclude=*.tmp {s}/.ckptfs-spool/ {d}/.ckptfs-spool/"
        ),
    ])
}

fn copy_into(from: &Path, to: &Path) {
    let st = Command::new("cp")
        .arg("-a")
        .arg(format!("{}/.", from.display()))
        .arg(to)
        .status()
        .unwrap();
    assert!(st.success());
}

#[test]
fn rsync_under_hold_of_a_store_that_is_committing_restores_every_closed_file() {
    let m = Mount::new(|_| {}, &[]);
    let mnt = m.mnt.clone();
    // (name, bytes) of each file once its writer has closed it.
    let closed: Arc<Mutex<Closed>> = Arc::default();
    let writer = {
        let closed = closed.clone();
        std::thread::spawn(move || {
            for i in 0..30u64 {
                let bytes = model(i);
                // Half under .safetensors names, half under blob names.
                let name = if i % 2 == 0 {
                    format!("m{i:02}.safetensors")
                } else {
                    format!("blob{i:02}")
                };
                let tmp = mnt.join(format!("{name}.incomplete"));
                std::fs::write(&tmp, &bytes).unwrap_or_else(|e| panic!("{}: {e}", tmp.display()));
                std::fs::rename(&tmp, mnt.join(&name)).unwrap();
                closed.lock().unwrap().insert(name, bytes);
            }
        })
    };
    let work = tempfile::tempdir().unwrap();
    let mut backups = Vec::new();
    let mut unheld = Vec::new();
    for k in 0..4 {
        // Wait for a few more files to be closed, so that commits run
        // during each copy.
        while closed.lock().unwrap().len() < 3 + 6 * k && !writer.is_finished() {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let before = closed.lock().unwrap().clone();
        let dest = work.path().join(format!("held{k}"));
        let o = backup_held(&m.store, &dest);
        assert!(
            o.status.success(),
            "backup {k}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        backups.push((dest, before));
        // The reference: one rsync of STORE, no hold.
        let before = closed.lock().unwrap().clone();
        let dest = work.path().join(format!("plain{k}"));
        let o = Command::new("rsync")
            .arg("-a")
            .arg(format!("{}/", m.store.display()))
            .arg(format!("{}/", dest.display()))
            .output()
            .unwrap();
        unheld.push((dest, before, o.status.code()));
    }
    writer.join().unwrap();
    m.wait_committed(120);

    let mut report = Vec::new();
    let all: Vec<(bool, &Path, &Closed)> = backups
        .iter()
        .map(|(d, b)| (true, d.as_path(), b))
        .chain(unheld.iter().map(|(d, b, _)| (false, d.as_path(), b)))
        .collect();
    for (held, dest, before) in all {
        let r = Mount::new(|s| copy_into(dest, s), &[]);
        r.wait_committed(120);
        let mut missing = 0;
        for (name, bytes) in before {
            match std::fs::read(r.path(name)) {
                Ok(b) if b == *bytes => {}
                _ => missing += 1,
            }
        }
        let mut archives = Vec::new();
        for e in std::fs::read_dir(&r.store).unwrap() {
            let p = e.unwrap().path();
            let n = p.file_name().unwrap().to_string_lossy().to_string();
            assert!(
                !n.starts_with("ckptfs-recovered-") || !held,
                "{}: {n}",
                dest.display()
            );
            if n.ends_with(".zstn") || n.ends_with(".zsame") {
                archives.push(p);
            }
        }
        let mut args = vec!["verify"];
        args.extend(archives.iter().map(|p| p.to_str().unwrap()));
        let v = ckptfs(&args);
        report.push(format!(
            "{} {}: {} files closed before it, {missing} missing or different, {} archives, verify {}",
            if held { "held" } else { "plain rsync" },
            dest.file_name().unwrap().to_string_lossy(),
            before.len(),
            archives.len(),
            if v.status.success() { "ok" } else { "FAILED" }
        ));
        if held {
            assert_eq!(missing, 0, "{}", report.last().unwrap());
            assert!(v.status.success(), "{}", String::from_utf8_lossy(&v.stderr));
            assert!(!archives.is_empty());
        }
    }
    for (_, _, code) in &unheld {
        report.push(format!("plain rsync exit code {code:?}"));
    }
    println!("{}", report.join("\n"));
}

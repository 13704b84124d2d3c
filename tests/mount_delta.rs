//! Delta archives through a real mount (issue 14): `X.z4dm` appears as the
//! full `X.safetensors`, byte-identical through read, mmap, O_DIRECT at
//! random offsets and safetensors' `safe_open`; `du` counts its own stored
//! bytes; `user.ckptfs.base` names the base. A missing or swapped base
//! gives EIO for that file and a log line naming both files, while every
//! other file keeps working.
//!
//! Needs root and /dev/fuse, as the other mount tests.

use crate::common;

use common::{ckptfs, daemon_stats, delta_pair, getxattr, Aligned, Mount, Rng};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

fn run(args: &[&std::ffi::OsStr]) {
    let o = std::process::Command::new(common::bin())
        .args(args)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// STORE: s1/model.zstn (the base), s2/model.z4dm (a delta of it),
/// s3/model.z4dm (a delta of s2's: a chain), other.zstn (unrelated).
/// Returns the target bytes.
fn fill(store: &Path, src: &Path) -> Vec<u8> {
    let (base, target) = delta_pair(11, 6, 1 << 19);
    std::fs::write(src.join("base.safetensors"), &base).unwrap();
    std::fs::write(src.join("target.safetensors"), &target).unwrap();
    for d in ["s1", "s2", "s3"] {
        std::fs::create_dir(store.join(d)).unwrap();
    }
    let o = |p: &Path| p.as_os_str().to_owned();
    run(&[
        "pack".as_ref(),
        &o(&src.join("base.safetensors")),
        "-o".as_ref(),
        &o(&store.join("s1/model.zstn")),
    ]);
    run(&[
        "pack".as_ref(),
        &o(&src.join("target.safetensors")),
        "--base".as_ref(),
        &o(&store.join("s1/model.zstn")),
        "-o".as_ref(),
        &o(&store.join("s2/model.z4dm")),
    ]);
    run(&[
        "pack".as_ref(),
        &o(&src.join("target.safetensors")),
        "--base".as_ref(),
        &o(&store.join("s2/model.z4dm")),
        "-o".as_ref(),
        &o(&store.join("s3/model.z4dm")),
    ]);
    run(&[
        "pack".as_ref(),
        &o(&src.join("base.safetensors")),
        "-o".as_ref(),
        &o(&store.join("other.zstn")),
    ]);
    target
}

#[test]
fn a_delta_reads_as_the_full_file_every_way() {
    let src = tempfile::tempdir().unwrap();
    let mut target = Vec::new();
    let m = Mount::new(|s| target = fill(s, src.path()), &["--read-only"]);
    for name in ["s2/model.safetensors", "s3/model.safetensors"] {
        let p = m.path(name);
        assert_eq!(std::fs::read(&p).unwrap(), target, "{name}: read");
        let st = std::fs::metadata(&p).unwrap();
        assert_eq!(st.len(), target.len() as u64);
        let backing =
            std::fs::metadata(m.store.join(name.replace(".safetensors", ".z4dm"))).unwrap();
        assert_eq!(
            st.blocks(),
            backing.blocks(),
            "{name}: du counts the delta's own bytes"
        );
        let f = std::fs::File::open(&p).unwrap();
        // SAFETY: read-only map of a file nobody truncates during the test.
        let map = unsafe { memmap2::Mmap::map(&f) }.unwrap();
        assert!(map[..] == target[..], "{name}: mmap");
        let fd = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(&p)
            .unwrap();
        let mut rng = Rng(5);
        let mut buf = Aligned::new(8192);
        for _ in 0..64 {
            let off = rng.below(target.len() as u64 / 4096) * 4096;
            let n = fd.read_at(buf.as_mut(), off).unwrap();
            let want = &target[off as usize..(off as usize + 8192).min(target.len())];
            assert_eq!(&buf.as_mut()[..n], want, "{name}: O_DIRECT at {off}");
        }
    }
    assert_eq!(
        getxattr(&m.path("s2/model.safetensors"), "user.ckptfs.base").as_deref(),
        Some("../s1/model.zstn")
    );
    assert_eq!(
        getxattr(&m.path("s3/model.safetensors"), "user.ckptfs.base").as_deref(),
        Some("../s2/model.z4dm")
    );
    assert_eq!(
        getxattr(&m.path("s2/model.safetensors"), "user.ckptfs.format").as_deref(),
        Some("ckptfs-delta-v1")
    );
    // safetensors' safe_open loads every tensor exactly.
    let out = std::process::Command::new(common::venv_python())
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mount_safetensors_check.py"))
        .arg(m.path("s2/model.safetensors"))
        .arg(src.path().join("target.safetensors"))
        .arg(m.path("s3/model.safetensors"))
        .arg(src.path().join("target.safetensors"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // verify STORE checks both relations.
    let v = ckptfs(&["verify", m.store.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&v.stdout);
    assert!(
        v.status.success() && text.contains("2 delta relations checked, 0 failed"),
        "{text}"
    );
}

#[test]
fn a_missing_or_swapped_base_is_eio_for_that_file_only() {
    let src = tempfile::tempdir().unwrap();
    let mut target = Vec::new();
    let m = Mount::new(
        |s| {
            target = fill(s, src.path());
            // Swap s2's base for another checkpoint of the same tensors
            // (s3, a delta of s2, then fails as well).
            let (other, _) = delta_pair(12, 6, 1 << 19);
            std::fs::write(src.path().join("other.safetensors"), other).unwrap();
            let o = |p: &Path| p.as_os_str().to_owned();
            run(&[
                "pack".as_ref(),
                &o(&src.path().join("other.safetensors")),
                "-o".as_ref(),
                &o(&s.join("s1/model.zstn")),
                "--force".as_ref(),
            ]);
        },
        &["--read-only"],
    );
    for name in ["s2/model.safetensors", "s3/model.safetensors"] {
        let e = std::fs::read(m.path(name)).expect_err(name);
        assert_eq!(e.raw_os_error(), Some(libc::EIO), "{name}: {e}");
    }
    let log = m.log_text();
    assert!(
        log.contains("s2/model.z4dm") && log.contains("s1/model.zstn") && log.contains("digest"),
        "{log}"
    );
    // Other files keep working.
    assert_eq!(
        std::fs::read(m.path("other.safetensors")).unwrap(),
        std::fs::read(src.path().join("base.safetensors")).unwrap()
    );
    assert_eq!(
        std::fs::read(m.path("s1/model.safetensors")).unwrap(),
        std::fs::read(src.path().join("other.safetensors")).unwrap()
    );
}

#[test]
fn a_missing_base_is_eio_and_the_file_is_still_listed() {
    let src = tempfile::tempdir().unwrap();
    let mut target = Vec::new();
    let m = Mount::new(
        |s| {
            target = fill(s, src.path());
            // The base disappears.
            std::fs::remove_file(s.join("s1/model.zstn")).unwrap();
        },
        &["--read-only"],
    );
    let e = std::fs::read(m.path("s2/model.safetensors")).expect_err("no base");
    assert_eq!(e.raw_os_error(), Some(libc::EIO));
    let log = m.log_text();
    assert!(
        log.contains("s2/model.z4dm") && log.contains("s1/model.zstn"),
        "{log}"
    );
    // Listed with the size of the file it presents (from the delta's own
    // head: issue 40, item 9), not its stored size; the unrelated archive
    // reads.
    let stored = std::fs::metadata(m.store.join("s2/model.z4dm"))
        .unwrap()
        .len();
    let shown = std::fs::metadata(m.path("s2/model.safetensors"))
        .unwrap()
        .len();
    assert_ne!(stored, target.len() as u64);
    assert_eq!(shown, target.len() as u64, "stored {stored}");
    assert_eq!(
        std::fs::read(m.path("other.safetensors")).unwrap(),
        std::fs::read(src.path().join("base.safetensors")).unwrap()
    );
}

/// Two fine-tunes of one `.zstn` base, read one after the other: the
/// base's decoded blocks are kept in the mount's block cache under the
/// base file's identity and version, so the second delta decodes only its
/// own blocks. Both read byte-exact. The daemon counts every block it
/// decodes, base blocks too.
#[test]
fn deltas_over_one_base_decode_each_base_block_once() {
    let src = tempfile::tempdir().unwrap();
    let mut targets = Vec::new();
    let m = Mount::new(
        |store| {
            let target = fill(store, src.path());
            // A second fine-tune: the first with its last tensor's bytes
            // changed a little more.
            let mut t2 = target.clone();
            let n = t2.len();
            for b in &mut t2[n - 4096..] {
                *b ^= 1;
            }
            std::fs::write(src.path().join("t2.safetensors"), &t2).unwrap();
            std::fs::create_dir(store.join("s4")).unwrap();
            let o = |p: &Path| p.as_os_str().to_owned();
            run(&[
                "pack".as_ref(),
                &o(&src.path().join("t2.safetensors")),
                "--base".as_ref(),
                &o(&store.join("s1/model.zstn")),
                "-o".as_ref(),
                &o(&store.join("s4/model.z4dm")),
            ]);
            targets = vec![target, t2];
        },
        &["--read-only", "--cache-size", "256M"],
    );
    let blocks = |rel: &str| {
        let a = ckptfs::archive::open(&m.store.join(rel)).unwrap();
        ckptfs::archive::blocks_of(&*a, 0).unwrap().len() as u64
    };
    let base_blocks = blocks("s1/model.zstn");
    let (blocks2, blocks4) = (blocks("s2/model.z4dm"), blocks("s4/model.z4dm"));
    let before = daemon_stats(&m.mnt);
    assert_eq!(
        std::fs::read(m.path("s2/model.safetensors")).unwrap(),
        targets[0]
    );
    let first = daemon_stats(&m.mnt);
    let base_decoded = first["blocks_decoded"] - before["blocks_decoded"] - blocks2;
    assert!(
        base_decoded > 0 && base_decoded <= base_blocks,
        "the first delta decodes its own {blocks2} blocks and some of the base's \
         {base_blocks}: {first:?}"
    );
    assert_eq!(
        std::fs::read(m.path("s4/model.safetensors")).unwrap(),
        targets[1]
    );
    let second = daemon_stats(&m.mnt);
    assert_eq!(
        second["blocks_decoded"] - first["blocks_decoded"],
        blocks4,
        "the second delta decodes its own {blocks4} blocks, no base block again: {second:?}"
    );
    assert_eq!(second["decoded_again"], 0, "{second:?}");
}

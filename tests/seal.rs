//! `ckptfs seal`: a z4ai-written `.zstn` gains ckptfs's CKX1 checksums with
//! its frames untouched. The sealed file still decodes to the original (in
//! ckptfs and in z4ai 0.2.0), every flipped byte of it is detected, and the
//! ways seal refuses leave the file as it was.

use crate::common;
use ckptfs::archive::{self, ArchiveView, ZstnArchive};
use ckptfs::format::frame::Frame;
use ckptfs::format::zstn::{self, Layout, RecordKind};
use ckptfs::pack::seal::Seal;
use ckptfs::pack::{pack, PackOptions};
use common::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Seals an archive held in memory, as `ckptfs seal` does (`None`: it
/// already has checksums).
fn sealed(bytes: Vec<u8>) -> Option<Vec<u8>> {
    let a = ZstnArchive::from_bytes(bytes, Path::new("mem.zstn")).unwrap();
    let seal = Seal::prepare(&a, None, &|_| {}).unwrap()?;
    let mut out = Vec::new();
    seal.write(&a, &mut out).unwrap();
    assert_eq!(out.len() as u64, seal.stats.stored_bytes);
    Some(out)
}

fn packed(file: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    pack(file, &mut out, PackOptions::default(), &|_| {}).unwrap();
    out
}

/// A ckptfs-written file with its CKX1 block cut out (and the footer moved
/// back): a file without checksums whose frames have sub-tensor blocks,
/// which no z4ai-written vector has.
fn without_checksums(bytes: &[u8]) -> Vec<u8> {
    let a = ZstnArchive::from_bytes(bytes.to_vec(), Path::new("p")).unwrap();
    let ext = a.extension().expect("ckptfs-written").range.clone();
    let mut out = bytes[..ext.start as usize].to_vec();
    out.extend_from_slice(&bytes[ext.end as usize..]);
    if let Layout::Indexed {
        index_offset,
        index_len,
        ..
    } = a.container().layout
    {
        let n = out.len();
        let footer = zstn::render_footer(index_offset - (ext.end - ext.start), index_len);
        out[n - 20..].copy_from_slice(&footer);
    }
    out
}

/// What `ckptfs verify` runs, on bytes.
fn verify(bytes: Vec<u8>) -> Result<String, archive::ArchiveError> {
    let a = archive::from_bytes(bytes, Path::new("mem.zstn"))?;
    archive::verify(&*a, &|_| {})
}

/// A small model with every kind of frame ckptfs writes, several blocks
/// in one of them, a REF, an empty tensor and a tiny one.
fn mixed_model() -> Vec<u8> {
    let mut rng = Rng(13);
    let w = gauss_bf16(&mut rng, 1 << 20, 0.02); // 2 MiB: several blocks
    safetensors_file(
        &[
            ("a.weight", "BF16", vec![1024, 1024], w.clone()),
            (
                "b.weight",
                "F32",
                vec![1024],
                gauss_f32(&mut rng, 1024, 0.02),
            ),
            (
                "c.weight",
                "F16",
                vec![2048],
                gauss_f16(&mut rng, 2048, 0.02),
            ),
            (
                "ids",
                "I32",
                vec![3000],
                (0..3000u32).flat_map(|i| (i % 97).to_le_bytes()).collect(),
            ),
            ("empty", "F32", vec![0], vec![]),
            ("tied", "BF16", vec![1024, 1024], w),
            ("tiny", "U8", vec![5], vec![1, 2, 3, 4, 5]),
        ],
        Some(r#"{"format":"pt"}"#),
    )
}

/// A file whose tensors do not tile the data buffer (a hole): stored as
/// one opaque frame (`contiguous = 0`).
fn model_with_a_hole() -> Vec<u8> {
    let mut f = safetensors_file(&[("a", "U8", vec![100], vec![7u8; 100])], None);
    let hlen = u64::from_le_bytes(f[..8].try_into().unwrap()) as usize;
    let header = std::str::from_utf8(&f[8..8 + hlen])
        .unwrap()
        .trim_end()
        .replace(
            "[0,100]",
            "[0,100]},\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[104,108]",
        );
    let mut g = (header.len() as u64).to_le_bytes().to_vec();
    g.extend_from_slice(header.as_bytes());
    g.extend(f.split_off(8 + hlen));
    g.extend_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
    g
}

fn sha256_hex(path: &Path) -> String {
    let out = Command::new("sha256sum").arg(path).output().unwrap();
    String::from_utf8(out.stdout).unwrap()[..64].to_string()
}

fn stdout(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Runs `ckptfs seal ARGS`, expecting success; returns stdout.
fn seal_ok(args: &[&str]) -> String {
    let mut all = vec!["seal"];
    all.extend_from_slice(args);
    let o = ckptfs(&all);
    assert!(o.status.success(), "seal {args:?}: {}", stderr(&o));
    stdout(&o)
}

fn info_json(path: &Path) -> serde_json::Value {
    let o = ckptfs(&["info", "--json", "--summary", path.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()[0].clone()
}

#[test]
fn sealing_every_z4ai_vector_keeps_frames_and_content() {
    let dir = tempfile::tempdir().unwrap();
    let vectors = zstn_vectors();
    for (name, orig, zstn) in &vectors {
        let original = std::fs::read(zstn).unwrap();
        let before = ZstnArchive::open(zstn).unwrap();
        assert!(before.extension().is_none(), "{name}: not z4ai-written");
        let path = dir.path().join(format!("{name}.zstn"));
        std::fs::copy(zstn, &path).unwrap();
        std::fs::copy(orig, dir.path().join(format!("{name}.safetensors"))).unwrap();
        assert_eq!(
            info_json(&path)["checksum_kind"],
            "none (z4ai-written; `ckptfs seal` adds checksums)"
        );

        let out = seal_ok(&[path.to_str().unwrap()]);
        assert!(out.contains(": sealed ("), "{name}: {out}");

        // Every frame byte-identical at the same offset; the index too.
        let after = ZstnArchive::open(&path).unwrap();
        let sealed = std::fs::read(&path).unwrap();
        let ext = after.extension().expect("a CKX1 block").clone();
        assert!(ext.sealed(), "{name}");
        let insert = ext.range.start as usize;
        let added = (ext.range.end - ext.range.start) as usize;
        assert_eq!(sealed.len(), original.len() + added, "{name}");
        assert_eq!(sealed[..insert], original[..insert], "{name}: head, frames");
        match after.container().layout {
            Layout::Indexed { .. } => {
                let n = original.len();
                assert_eq!(
                    sealed[insert + added..sealed.len() - 20],
                    original[insert..n - 20]
                );
            }
            Layout::Opaque { .. } => assert_eq!(insert, original.len(), "{name}"),
        }
        assert_eq!(before.records(), after.records(), "{name}: index records");
        for u in 0..before.units() as u32 {
            assert_eq!(before.frame_bytes(u), after.frame_bytes(u), "{name}");
        }

        let o = ckptfs(&["verify", path.to_str().unwrap()]);
        assert!(o.status.success(), "{name}: {}", stdout(&o));
        assert!(
            stdout(&o).contains("all checksums verified"),
            "{name}: {}",
            stdout(&o)
        );
        let un = dir.path().join(format!("{name}.unpacked"));
        let o = ckptfs(&["unpack", path.to_str().unwrap(), "-o", un.to_str().unwrap()]);
        assert!(o.status.success(), "{name}: {}", stderr(&o));
        assert_eq!(
            std::fs::read(&un).unwrap(),
            std::fs::read(orig).unwrap(),
            "{name}"
        );
        std::fs::remove_file(&un).unwrap();
        assert_eq!(info_json(&path)["checksum_kind"], "ckx1 (sealed)");
    }

    // z4ai 0.2.0 reads every sealed file as it read the original.
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/z4ai_decode.py");
    let out = Command::new(venv_python())
        .arg(script)
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}\n{}", stdout(&out), stderr(&out));
    let n = vectors.len();
    assert!(
        stdout(&out).contains(&format!("{n}/{n} decoded identically")),
        "{}",
        stdout(&out)
    );
}

#[test]
fn a_sealed_file_is_laid_out_as_ckptfs_writes_it() {
    // Cut the checksums out of files ckptfs wrote and seal them again: the
    // result is what the writer wrote, but for the sealed flag and the
    // digest of the block's body.
    for model in [mixed_model(), model_with_a_hole()] {
        let ours = packed(&model);
        let resealed = sealed(without_checksums(&ours)).expect("no checksums to find");
        assert_eq!(resealed.len(), ours.len());
        let a = ZstnArchive::from_bytes(ours.clone(), Path::new("p")).unwrap();
        let ext = a.extension().unwrap().range.clone();
        let flags = ext.start as usize + 6;
        let body_digest = ext.end as usize - 20;
        let differ: Vec<usize> = (0..ours.len())
            .filter(|&i| ours[i] != resealed[i])
            .collect();
        assert!(
            differ
                .iter()
                .all(|&i| i == flags || (body_digest..body_digest + 8).contains(&i)),
            "bytes differ at {differ:?} (flags at {flags}, body digest at {body_digest})"
        );
        assert_eq!(resealed[flags], 1, "the sealed flag");
        assert!(ZstnArchive::from_bytes(resealed.clone(), Path::new("s"))
            .unwrap()
            .extension()
            .unwrap()
            .sealed());
        assert!(verify(resealed).is_ok());
    }
}

#[test]
fn every_flipped_byte_of_a_sealed_file_is_detected() {
    // Two z4ai-written vectors (indexed with every small dtype, a REF and
    // an empty tensor; the opaque layout) and a file whose frames have
    // block-structured planes (a ckptfs file without its checksums), where
    // the digests split frame metadata from block payloads.
    let mut files: Vec<(String, Vec<u8>)> = ["tiny", "noncontiguous"]
        .iter()
        .map(|n| {
            let z = std::fs::read(vectors_dir().join(format!("{n}.zstn"))).unwrap();
            (n.to_string(), z)
        })
        .collect();
    let mut rng = Rng(5);
    let small = safetensors_file(
        &[
            ("w", "BF16", vec![64, 64], gauss_bf16(&mut rng, 4096, 0.02)),
            ("b", "F32", vec![1024], gauss_f32(&mut rng, 1024, 0.02)),
            (
                "ids",
                "I64",
                vec![64],
                (0..64u64).flat_map(|i| i.to_le_bytes()).collect(),
            ),
        ],
        None,
    );
    let blocks = without_checksums(&packed(&small));
    let a = ZstnArchive::from_bytes(blocks.clone(), Path::new("b")).unwrap();
    assert!(
        (0..a.units() as u32).any(|u| {
            let f = Frame::parse(a.frame_bytes(u)).unwrap();
            f.element_access().unwrap().is_some()
        }),
        "no block-structured frame"
    );
    files.push(("blocks".into(), blocks));
    for (name, z) in files {
        let s = sealed(z).expect("no checksums yet");
        assert!(verify(s.clone()).is_ok(), "{name}");
        assert_every_flip_detected(&name, &s, |b| verify(b).is_err());
    }
}

#[test]
fn a_multi_block_frame_without_checksums_is_sealed_block_by_block() {
    let z = without_checksums(&packed(&mixed_model()));
    let a = ZstnArchive::from_bytes(z.clone(), Path::new("m")).unwrap();
    assert!((0..a.units() as u32).any(|u| a.grid(u).unwrap().blocks() > 1));
    let s = sealed(z).unwrap();
    let b = ZstnArchive::from_bytes(s.clone(), Path::new("s")).unwrap();
    for u in 0..a.units() as u32 {
        assert_eq!(
            b.extension().unwrap().unit_blocks(u as usize).len(),
            a.grid(u).unwrap().blocks()
        );
    }
    assert_eq!(verify(s).unwrap(), verify(packed(&mixed_model())).unwrap());
}

#[test]
fn sha256_is_checked_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tied.zstn");
    std::fs::copy(vectors_dir().join("tied.zstn"), &path).unwrap();
    let before = std::fs::read(&path).unwrap();
    let mtime = std::fs::metadata(&path).unwrap().mtime_nsec();
    let right = sha256_hex(&vectors_dir().join("tied.safetensors"));
    let mut wrong = right.clone().into_bytes();
    wrong[0] = if wrong[0] == b'0' { b'1' } else { b'0' };
    let wrong = String::from_utf8(wrong).unwrap();

    let o = ckptfs(&["seal", path.to_str().unwrap(), "--sha256", &wrong]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    let err = stderr(&o);
    assert!(
        err.contains("tied.zstn") && err.contains(&right) && err.contains(&wrong),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    assert_eq!(std::fs::read(&path).unwrap(), before, "file unchanged");
    assert_eq!(std::fs::metadata(&path).unwrap().mtime_nsec(), mtime);
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        1,
        "no temporary file left"
    );

    // Malformed: a usage error. Several files: one sha256 cannot name them.
    let o = ckptfs(&["seal", path.to_str().unwrap(), "--sha256", "abc"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let o = ckptfs(&[
        "seal",
        path.to_str().unwrap(),
        path.to_str().unwrap(),
        "--sha256",
        &right,
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert_eq!(std::fs::read(&path).unwrap(), before, "file unchanged");

    let out = seal_ok(&[path.to_str().unwrap(), "--sha256", &right.to_uppercase()]);
    assert!(
        out.contains("sealed") && out.contains("sha256 matched"),
        "{out}"
    );
    assert!(verify(std::fs::read(&path).unwrap()).is_ok());
}

#[test]
fn sealing_twice_and_sealing_a_ckptfs_file_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.zstn");
    std::fs::copy(vectors_dir().join("tiny.zstn"), &path).unwrap();
    seal_ok(&[path.to_str().unwrap()]);
    let once = std::fs::read(&path).unwrap();
    let ino = std::fs::metadata(&path).unwrap().ino();
    let out = seal_ok(&[path.to_str().unwrap()]);
    assert!(out.contains("already sealed (ckx1, sealed)"), "{out}");
    assert_eq!(std::fs::read(&path).unwrap(), once);
    assert_eq!(
        std::fs::metadata(&path).unwrap().ino(),
        ino,
        "not rewritten"
    );
    assert!(sealed(once).is_none());

    let ours = dir.path().join("ours.zstn");
    std::fs::write(&ours, packed(&mixed_model())).unwrap();
    let written = std::fs::read(&ours).unwrap();
    let out = seal_ok(&[ours.to_str().unwrap()]);
    assert!(
        out.contains("already sealed (ckx1, ckptfs-written)"),
        "{out}"
    );
    assert_eq!(std::fs::read(&ours).unwrap(), written);
    assert_eq!(info_json(&ours)["checksum_kind"], "ckx1 (ckptfs-written)");
}

#[test]
fn the_sealed_file_keeps_its_mode_and_the_symlink_stays() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tied.zstn");
    std::fs::copy(vectors_dir().join("tied.zstn"), &path).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
    let link = dir.path().join("link.zstn");
    std::os::unix::fs::symlink("tied.zstn", &link).unwrap();
    seal_ok(&[link.to_str().unwrap()]);
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    let m = std::fs::metadata(&path).unwrap();
    assert_eq!(m.mode() & 0o7777, 0o640);
    assert!(ZstnArchive::open(&path)
        .unwrap()
        .extension()
        .unwrap()
        .sealed());
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        2,
        "no temporary file left"
    );
}

#[test]
fn a_file_with_other_hard_links_needs_force() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.zstn");
    let other = dir.path().join("other.zstn");
    std::fs::copy(vectors_dir().join("tiny.zstn"), &path).unwrap();
    std::fs::hard_link(&path, &other).unwrap();
    let before = std::fs::read(&path).unwrap();
    let o = ckptfs(&["seal", path.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("hard links"), "{}", stderr(&o));
    assert_eq!(std::fs::read(&path).unwrap(), before);
    seal_ok(&[path.to_str().unwrap(), "--force"]);
    assert!(ZstnArchive::open(&path).unwrap().extension().is_some());
    assert_eq!(
        std::fs::read(&other).unwrap(),
        before,
        "the other name keeps the old file"
    );
}

#[test]
fn bytes_no_frame_covers_are_refused() {
    // tiny.zstn with three bytes slipped in before the first frame: z4ai
    // would read it, but no checksum could cover those bytes.
    let tiny = std::fs::read(vectors_dir().join("tiny.zstn")).unwrap();
    let a = ZstnArchive::from_bytes(tiny.clone(), Path::new("t")).unwrap();
    let Layout::Indexed {
        frames_start,
        index_offset,
        ..
    } = a.container().layout
    else {
        unreachable!()
    };
    let mut recs = a.records().to_vec();
    for r in &mut recs {
        if let RecordKind::Frame { offset, .. } = &mut r.kind {
            *offset += 3;
        }
    }
    let mut b = tiny[..frames_start as usize].to_vec();
    b.extend_from_slice(&[0, 0, 0]);
    b.extend_from_slice(&tiny[frames_start as usize..index_offset as usize]);
    let idx = zstn::render_index(&recs);
    b.extend_from_slice(&idx);
    b.extend_from_slice(&zstn::render_footer(index_offset + 3, idx.len() as u64));
    assert!(verify(b.clone()).is_ok(), "readable without checksums");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gap.zstn");
    std::fs::write(&path, &b).unwrap();
    let o = ckptfs(&["seal", path.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains(&format!(
            "3 bytes at offset {frames_start} belong to no frame"
        )),
        "{}",
        stderr(&o)
    );
    assert_eq!(std::fs::read(&path).unwrap(), b);
}

#[test]
fn a_damaged_file_is_not_sealed() {
    // Seal certifies the content as it decodes now: a frame that does not
    // decode is an error, and nothing is written.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tied.zstn");
    let mut b = std::fs::read(vectors_dir().join("tied.zstn")).unwrap();
    let a = ZstnArchive::from_bytes(b.clone(), Path::new("t")).unwrap();
    let RecordKind::Frame { offset, .. } = a.records()[0].kind else {
        unreachable!()
    };
    b[offset as usize] ^= 0xff; // the frame magic
    std::fs::write(&path, &b).unwrap();
    let o = ckptfs(&["seal", path.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("tied.zstn"), "{}", stderr(&o));
    assert_eq!(std::fs::read(&path).unwrap(), b);
}

#[test]
fn require_checksums_refuses_only_files_without_them() {
    let z4ai = std::fs::read(vectors_dir().join("tied.zstn")).unwrap();
    let a = archive::from_bytes(z4ai.clone(), Path::new("tied.zstn")).unwrap();
    let err = archive::require_checksums(&*a).unwrap_err().to_string();
    assert!(
        err.contains("tied.zstn")
            && err.contains("no checksums (z4ai-written)")
            && err.contains("ckptfs seal"),
        "{err}"
    );
    for ok in [sealed(z4ai).unwrap(), packed(&mixed_model())] {
        let a = archive::from_bytes(ok, Path::new("ok.zstn")).unwrap();
        assert!(archive::require_checksums(&*a).is_ok());
    }
}

#[test]
fn info_says_how_a_file_is_checksummed() {
    let o = ckptfs(&[
        "info",
        "--summary",
        vectors_dir().join("tiny.zstn").to_str().unwrap(),
    ]);
    assert!(o.status.success());
    assert!(
        stdout(&o).contains("checksums     none (z4ai-written; `ckptfs seal` adds checksums)"),
        "{}",
        stdout(&o)
    );
}

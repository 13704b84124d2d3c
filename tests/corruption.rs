//! Corrupt input gives a clean error: no panic, no hang, no allocation from
//! a lying length. ckptfs-written files detect every flipped byte.

use crate::common;
use ckptfs::archive::{ArchiveError, ArchiveView, ZstnArchive};
use ckptfs::pack::{pack, PackOptions};
use common::*;
use std::path::Path;

/// Opens and fully decodes an archive held in memory, like `verify`.
fn check(bytes: Vec<u8>) -> Result<(), ArchiveError> {
    let a = ZstnArchive::from_bytes(bytes, Path::new("mem.zstn"))?;
    for u in 0..a.units() as u32 {
        a.verify_unit(u, 0)?; // the whole-frame checksum (ZSTN ignores the digest)
        a.decode_unit(u)?;
    }
    let mut buf = vec![0u8; a.len().min(1 << 24) as usize];
    a.read_at(0, 0, &mut buf)?;
    Ok(())
}

fn packed(file: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    pack(file, &mut out, PackOptions::default(), &|_| {}).unwrap();
    out
}

/// Offsets where the ZSTN structure changes: head fields, header end, data
/// length, every frame start and end, index, every record, footer.
fn boundaries(bytes: &[u8]) -> Vec<usize> {
    let a = ZstnArchive::from_bytes(bytes.to_vec(), Path::new("b")).unwrap();
    let z = a.container();
    let mut v = vec![
        0,
        4,
        5,
        6,
        14,
        z.header.end as usize,
        z.header.end as usize + 8,
    ];
    for r in z.records() {
        if let ckptfs::format::zstn::RecordKind::Frame { offset, len } = r.kind {
            v.extend([
                offset as usize,
                (offset + len) as usize,
                offset as usize + 16,
            ]);
        }
    }
    if let ckptfs::format::zstn::Layout::Indexed { index_offset, .. } = z.layout {
        v.push(index_offset as usize);
    }
    v.extend([
        bytes.len() - 20,
        bytes.len() - 12,
        bytes.len() - 4,
        bytes.len() - 1,
    ]);
    v.retain(|&o| o < bytes.len());
    v
}

#[test]
fn truncation_at_every_boundary_is_an_error() {
    for (name, _, zstn) in zstn_vectors() {
        let bytes = std::fs::read(&zstn).unwrap();
        let mut cuts = boundaries(&bytes);
        cuts.extend((0..bytes.len()).step_by(997));
        for cut in cuts {
            assert!(
                check(bytes[..cut].to_vec()).is_err(),
                "{name}: truncated at {cut} decoded"
            );
        }
    }
}

#[test]
fn flipped_bytes_in_z4ai_files_never_panic() {
    // z4ai files carry no checksums, so some flips decode to other bytes;
    // what must hold is a clean result: an error or output, never a panic.
    let mut rng = Rng(7);
    for (_, _, zstn) in zstn_vectors() {
        let bytes = std::fs::read(&zstn).unwrap();
        let mut spots = boundaries(&bytes);
        spots.extend((0..80).map(|_| rng.below(bytes.len() as u64) as usize));
        for at in spots {
            for mask in [0x01u8, 0xff] {
                let mut b = bytes.clone();
                b[at] ^= mask;
                let _ = check(b);
            }
        }
    }
}

/// A small file with every kind of frame ckptfs writes.
fn mixed_model() -> Vec<u8> {
    let mut rng = Rng(11);
    let ints: Vec<u8> = (0..3000u32).flat_map(|i| (i % 97).to_le_bytes()).collect();
    safetensors_file(
        &[
            (
                "a.weight",
                "BF16",
                vec![64, 64],
                gauss_bf16(&mut rng, 4096, 0.02),
            ),
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
            ("ids", "I32", vec![3000], ints),
            ("tied", "BF16", vec![64, 64], Vec::new()),
            ("tiny", "U8", vec![5], vec![1, 2, 3, 4, 5]),
        ]
        .into_iter()
        .map(|(n, d, s, mut b)| {
            if n == "tied" {
                b = gauss_bf16(&mut Rng(11), 4096, 0.02);
            }
            (n, d, s, b)
        })
        .collect::<Vec<_>>(),
        Some(r#"{"format":"pt"}"#),
    )
}

#[test]
fn every_flipped_byte_of_a_ckptfs_file_is_detected() {
    let z = packed(&mixed_model());
    assert!(check(z.clone()).is_ok());
    // Flip every byte in turn: each must fail at open or at decode.
    assert_every_flip_detected("packed", &z, |b| check(b).is_err());
}

#[test]
fn every_flipped_byte_of_an_opaque_layout_file_is_detected() {
    // A file with a hole between tensors is stored as one opaque frame.
    let mut f = safetensors_file(&[("a", "U8", vec![100], vec![7u8; 100])], None);
    let hlen = u64::from_le_bytes(f[..8].try_into().unwrap()) as usize;
    let header = std::str::from_utf8(&f[8..8 + hlen])
        .unwrap()
        .trim_end()
        .to_string();
    let header = header.replace(
        "[0,100]",
        "[0,100]},\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[104,108]",
    );
    let mut g = (header.len() as u64).to_le_bytes().to_vec();
    g.extend_from_slice(header.as_bytes());
    g.extend(f.split_off(8 + hlen));
    g.extend_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
    let z = packed(&g);
    assert_eq!(z[5], 0, "expected the contiguous=0 layout");
    assert!(check(z.clone()).is_ok());
    for at in 0..z.len() {
        let mut b = z.clone();
        b[at] ^= 0x04;
        assert!(check(b).is_err(), "flip at {at} went unnoticed");
    }
}

fn set_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// Lying length fields must fail cleanly within a 1 GiB address space.
#[test]
fn lying_lengths_fail_without_huge_allocations() {
    let dir = tempfile::tempdir().unwrap();
    let tied = std::fs::read(vectors_dir().join("tied.zstn")).unwrap();
    let a = ZstnArchive::from_bytes(tied.clone(), Path::new("t")).unwrap();
    let z = a.container().clone();
    let hend = z.header.end as usize;
    let (first_frame, _) = match z.records()[0].kind {
        ckptfs::format::zstn::RecordKind::Frame { offset, len } => (offset as usize, len),
        _ => unreachable!(),
    };
    let mut cases: Vec<(&str, Vec<u8>)> = Vec::new();
    let mut b = tied.clone();
    set_u64(&mut b, 6, 1 << 60);
    cases.push(("header length", b));
    let mut b = tied.clone();
    set_u64(&mut b, hend, 1 << 50);
    cases.push(("data length", b));
    let mut b = tied.clone();
    let n = b.len();
    set_u64(&mut b, n - 12, 1 << 40);
    cases.push(("index length", b));
    let mut b = tied.clone();
    // n_records in the index
    let idx = u64::from_le_bytes(tied[n - 20..n - 12].try_into().unwrap()) as usize;
    b[idx..idx + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    cases.push(("record count", b));
    let mut b = tied.clone();
    // first plane orig_len of the first frame (Z4AI header is 16 + dcode bytes)
    let dlen = tied[first_frame + 10] as usize;
    let plane = first_frame + 16 + dlen;
    set_u64(&mut b, plane + 1, 1 << 45);
    cases.push(("plane length", b));
    // A ckptfs file: method-2 block count and rANS symbol count.
    let mut ours = packed(&mixed_model());
    let o = ZstnArchive::from_bytes(ours.clone(), Path::new("o")).unwrap();
    let off = match o.container().records()[0].kind {
        ckptfs::format::zstn::RecordKind::Frame { offset, .. } => offset as usize,
        _ => unreachable!(),
    };
    let dlen = ours[off + 10] as usize;
    let exp_plane = off + 16 + dlen + 17 + 512; // sign plane of 4096 elements is 512 stored bytes
    set_u64(&mut ours, exp_plane + 17, (1u64 << 61) | (1 << 62));
    cases.push(("rANS symbol count", ours));
    // A bare ZSP1 frame with a huge element count.
    let mut sp = std::fs::read(vectors_dir().join("cli_sparse_fp32.bin.z4ai")).unwrap();
    set_u64(&mut sp, 8, 1 << 50);
    cases.push(("sparse element count", sp));

    for (what, bytes) in cases {
        if what != "sparse element count" {
            assert!(check(bytes.clone()).is_err(), "{what}: decoded");
        }
        let path = dir.path().join("bad.zstn");
        std::fs::write(&path, &bytes).unwrap();
        let out = ckptfs_limited(&["verify", path.to_str().unwrap()], 1 << 30);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            out.status.code(),
            Some(1),
            "{what}: {stdout} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            stdout.contains("FAIL") && stdout.contains("bad.zstn"),
            "{what}: {stdout}"
        );
        let out = ckptfs_limited(
            &[
                "unpack",
                path.to_str().unwrap(),
                "-o",
                dir.path().join("x").to_str().unwrap(),
            ],
            1 << 30,
        );
        assert_eq!(out.status.code(), Some(1), "{what}");
        assert!(!dir.path().join("x").exists());
    }
}

/// Builds an index for `tied.zstn` with record 1 rewritten as `kind`.
fn with_ref(target: u32) -> Vec<u8> {
    let tied = std::fs::read(vectors_dir().join("tied.zstn")).unwrap();
    let a = ZstnArchive::from_bytes(tied.clone(), Path::new("t")).unwrap();
    let mut recs = a.records().to_vec();
    // Make record 0 a REF too (to `target`), keeping its span.
    recs[0].kind = ckptfs::format::zstn::RecordKind::Ref(target);
    let idx = ckptfs::format::zstn::render_index(&recs);
    let ckptfs::format::zstn::Layout::Indexed { index_offset, .. } = a.container().layout else {
        unreachable!()
    };
    let mut b = tied[..index_offset as usize].to_vec();
    b.extend_from_slice(&idx);
    b.extend_from_slice(&ckptfs::format::zstn::render_footer(
        index_offset,
        idx.len() as u64,
    ));
    b
}

#[test]
fn ref_loops_and_forward_refs_are_refused() {
    for (target, want) in [
        (0u32, "does not precede"),
        (1, "does not precede"),
        (4, "does not precede"),
        (999, "does not precede"),
    ] {
        let err = check(with_ref(target)).unwrap_err().to_string();
        assert!(err.contains(want), "ref to {target}: {err}");
        assert!(err.contains("lm_head.weight"), "names the tensor: {err}");
    }
}

#[test]
fn ref_to_a_ref_is_refused() {
    // tied.zstn: record 1 (embed_tokens) is REF 0; point record 2 at record 1.
    let tied = std::fs::read(vectors_dir().join("tied.zstn")).unwrap();
    let a = ZstnArchive::from_bytes(tied.clone(), Path::new("t")).unwrap();
    let mut recs = a.records().to_vec();
    assert!(matches!(
        recs[1].kind,
        ckptfs::format::zstn::RecordKind::Ref(0)
    ));
    recs[2].kind = ckptfs::format::zstn::RecordKind::Ref(1);
    let idx = ckptfs::format::zstn::render_index(&recs);
    let ckptfs::format::zstn::Layout::Indexed { index_offset, .. } = a.container().layout else {
        unreachable!()
    };
    let mut b = tied[..index_offset as usize].to_vec();
    b.extend_from_slice(&idx);
    b.extend_from_slice(&ckptfs::format::zstn::render_footer(
        index_offset,
        idx.len() as u64,
    ));
    let err = check(b).unwrap_err().to_string();
    assert!(err.contains("itself a REF"), "{err}");
}

#[test]
fn absurd_shapes_are_refused_by_pack() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.safetensors");
    let f = safetensors_file(&[("w", "F32", vec![u64::MAX, 4], vec![0u8; 16])], None);
    std::fs::write(&bad, &f).unwrap();
    let out = ckptfs(&["pack", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.safetensors") && err.contains("\"w\"") && err.contains("overflows"),
        "{err}"
    );
    assert!(
        !dir.path().join("bad.zstn").exists(),
        "nothing written for a malformed input"
    );
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        1,
        "no temporary file left"
    );
}

#[test]
fn verify_names_the_file_and_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.zstn");
    let bad = dir.path().join("bad.zstn");
    let z = packed(&mixed_model());
    std::fs::write(&good, &z).unwrap();
    let mut b = z.clone();
    let mid = b.len() / 2;
    b[mid] ^= 1;
    std::fs::write(&bad, &b).unwrap();
    let out = ckptfs(&["verify", good.to_str().unwrap(), bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let s = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = s.lines().collect();
    assert_eq!(lines.len(), 2, "{s}");
    assert!(
        lines[0].starts_with("OK") && lines[0].contains("good.zstn"),
        "{s}"
    );
    assert!(
        lines[1].starts_with("FAIL")
            && lines[1].contains("bad.zstn")
            && lines[1].contains("checksum"),
        "{s}"
    );
    assert!(!String::from_utf8_lossy(&out.stderr).contains("panicked"));
}

#[test]
fn a_damaged_block_is_blamed_on_its_compressed_bytes() {
    // Reads check the decoded bytes and hash the compressed bytes only
    // after a failure, to say which side is damaged. (A flip in bytes the
    // decoder does not use leaves the decoded bytes intact, so a read
    // serves them; `verify`'s whole-frame checksum finds it, as
    // `every_flipped_byte_of_a_ckptfs_file_is_detected` shows.)
    let z = packed(&mixed_model());
    let a = ZstnArchive::from_bytes(z.clone(), Path::new("b")).unwrap();
    let frames: Vec<(u64, u64)> = a
        .container()
        .records()
        .iter()
        .filter_map(|r| match r.kind {
            ckptfs::format::zstn::RecordKind::Frame { offset, len } => Some((offset, len)),
            _ => None,
        })
        .collect();
    // (The 38-byte frame of "tiny" is all plane headers: a flip there is a
    // frame error, found before any checksum.)
    let frames: Vec<_> = frames.into_iter().filter(|&(_, len)| len > 100).collect();
    assert_eq!(frames.len(), 4);
    for (offset, len) in frames {
        let mut b = z.clone();
        b[(offset + len / 2) as usize] ^= 0x10;
        let a = ZstnArchive::from_bytes(b, Path::new("bad.zstn")).unwrap();
        let mut buf = vec![0u8; a.len() as usize];
        let err = a.read_at(0, 0, &mut buf).unwrap_err().to_string();
        assert!(
            err.contains("bad.zstn") && err.contains("compressed bytes of block"),
            "frame at {offset}: {err}"
        );
    }
}

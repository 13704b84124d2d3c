//! ckptfs's delta archives (`.z4dm`, doc/FORMAT.md §6) through the CLI:
//! `pack --base` against a `.safetensors`, a `.zstn` and a delta, exact
//! through `unpack` and through z4ai's own `model_delta.decompress`;
//! chains re-based at the depth limit; `pack --standalone`; `verify STORE`;
//! a missing, different or damaged base and a damaged delta give a clean
//! error, never wrong bytes.

use crate::common;

use common::{ckptfs, delta_pair, venv_python};
use std::path::{Path, PathBuf};
use std::process::Command;

fn ok(args: &[&str]) -> String {
    let o = ckptfs(args);
    assert!(
        o.status.success(),
        "ckptfs {args:?}: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn fails(args: &[&str]) -> String {
    let o = ckptfs(args);
    assert_eq!(o.status.code(), Some(1), "ckptfs {args:?} should fail");
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A directory with base.safetensors, base.zstn and target.safetensors.
fn setup(n: usize, scale: usize) -> (tempfile::TempDir, Vec<u8>) {
    let d = tempfile::tempdir().unwrap();
    let (base, target) = delta_pair(7, n, scale);
    std::fs::write(d.path().join("base.safetensors"), &base).unwrap();
    std::fs::write(d.path().join("target.safetensors"), &target).unwrap();
    ok(&[
        "pack",
        s(&d.path().join("base.safetensors")),
        "-o",
        s(&d.path().join("base.zstn")),
    ]);
    (d, target)
}

/// `ckptfs pack DIR/target.safetensors --base BASE -o OUT`; its output.
fn pack_delta(dir: &Path, base: &Path, out: &Path) -> String {
    ok(&[
        "pack",
        s(&dir.join("target.safetensors")),
        "--base",
        s(base),
        "-o",
        s(out),
    ])
}

fn unpack(delta: &Path) -> Vec<u8> {
    let out = delta.with_extension("out");
    ok(&["unpack", s(delta), "-o", s(&out), "--force"]);
    std::fs::read(out).unwrap()
}

fn z4ai_decodes(delta: &Path, base: &Path, target: &Path) {
    let o = Command::new(venv_python())
        .arg("-c")
        .arg(
            "import sys\nfrom z4ai import model_delta\n\
             b = open(sys.argv[1],'rb').read(); base = open(sys.argv[2],'rb').read()\n\
             out = model_delta.decompress(b, base)\n\
             assert out == open(sys.argv[3],'rb').read(), 'z4ai decoded other bytes'\n",
        )
        .args([delta, base, target])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "z4ai: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn a_delta_against_a_zstn_or_a_safetensors_unpacks_exact_and_z4ai_reads_it() {
    let (d, target) = setup(6, 1 << 19);
    let p = |n: &str| d.path().join(n);
    let standalone = p("target.zstn");
    ok(&["pack", s(&p("target.safetensors")), "-o", s(&standalone)]);
    for base in ["base.zstn", "base.safetensors"] {
        let out = p(&format!("t-{base}.z4dm"));
        let msg = pack_delta(d.path(), &p(base), &out);
        assert!(msg.contains("DELTA") && msg.contains("COPY"), "{msg}");
        assert_eq!(unpack(&out), target, "against {base}");
        let v = ok(&["verify", s(&out)]);
        assert!(v.contains("OK") && v.contains(base), "{v}");
        // Unchanged tensors cost nothing: far below the standalone archive.
        let (dl, sl) = (
            std::fs::metadata(&out).unwrap().len(),
            std::fs::metadata(&standalone).unwrap().len(),
        );
        assert!(dl * 2 < sl, "delta {dl} vs standalone {sl}");
        // Its frames may be split-float, which z4ai does not read; with
        // --compat z4ai, z4ai decodes it with the base's presented bytes.
        let compat = p(&format!("t-{base}.z4ai.z4dm"));
        ok(&[
            "pack",
            s(&p("target.safetensors")),
            "--base",
            s(&p(base)),
            "--compat",
            "z4ai",
            "-o",
            s(&compat),
        ]);
        assert_eq!(unpack(&compat), target, "against {base}, --compat z4ai");
        z4ai_decodes(&compat, &p("base.safetensors"), &p("target.safetensors"));
    }
}

#[test]
fn an_identical_reupload_costs_almost_nothing() {
    let (d, _) = setup(4, 1 << 18);
    let p = |n: &str| d.path().join(n);
    let out = p("same.z4dm");
    let msg = ok(&[
        "pack",
        s(&p("base.safetensors")),
        "--base",
        s(&p("base.zstn")),
        "-o",
        s(&out),
    ]);
    assert!(msg.contains("0 DELTA, 0 FULL"), "{msg}");
    let len = std::fs::metadata(&out).unwrap().len();
    assert!(len < 4096, "{len} bytes");
    assert_eq!(unpack(&out), std::fs::read(p("base.safetensors")).unwrap());
    z4ai_decodes(&out, &p("base.safetensors"), &p("base.safetensors"));
}

/// Deltas written before trailer version 2 (doc/FORMAT.md §6) still read:
/// the same delta with its trailer rendered as version 1 (a digest per
/// record, offsets and block ends in full) unpacks exact, verifies, and a
/// damaged record head is still refused; version 2 is the smaller.
#[test]
fn a_version_1_trailer_still_reads() {
    use ckptfs::format::delta::{parse_record, DeltaKind, Trailer};
    use ckptfs::format::digest::xxh3_64;
    let (d, target) = setup(4, 1 << 18);
    let p = |n: &str| d.path().join(n);
    let v2 = p("t.z4dm");
    pack_delta(d.path(), &p("base.zstn"), &v2);
    let bytes = std::fs::read(&v2).unwrap();
    let t = Trailer::find(&bytes).unwrap().unwrap();
    assert!(t.records_digest.is_some(), "pack writes version 2");
    let body = &bytes[..t.z4dm_len as usize];
    let mut old = t.clone();
    old.records_digest = None;
    for u in &mut old.units {
        let r = parse_record(body, u.record_offset as usize).unwrap();
        let head_end = if r.kind == DeltaKind::Copy {
            r.end_offset
        } else {
            r.frame.start
        };
        u.record_digest = xxh3_64(&body[u.record_offset as usize..head_end]);
    }
    let trailer = old.render();
    assert_eq!(u16::from_le_bytes([trailer[4], trailer[5]]), 1);
    let mut v1_bytes = body.to_vec();
    v1_bytes.extend_from_slice(&trailer);
    assert!(
        v1_bytes.len() > bytes.len(),
        "version 1 {} against version 2 {}",
        v1_bytes.len(),
        bytes.len()
    );
    let v1 = p("t1.z4dm");
    std::fs::write(&v1, &v1_bytes).unwrap();
    assert_eq!(unpack(&v1), target);
    let v = ok(&["verify", s(&v1)]);
    assert!(v.contains("OK"), "{v}");
    // A flipped byte in the first record's name: version 1's per-record
    // digest refuses it, as version 2's digest of all records does.
    let name_at = t.units[0].record_offset as usize + 2;
    for (file, mut b) in [(&v1, v1_bytes), (&v2, bytes)] {
        b[name_at] ^= 0x01;
        let e = ckptfs::archive::from_bytes(b, file).err().expect("refused");
        assert!(e.to_string().contains("checksum mismatch"), "{e}");
    }
}

#[test]
fn chains_are_bounded_and_pack_rebases_past_the_limit() {
    let (d, target) = setup(3, 1 << 16);
    let p = |n: &str| d.path().join(n);
    // base.zstn <- c1 <- c2 <- c3 <- c4 (depth 4, the limit).
    let mut prev = p("base.zstn");
    for i in 1..=4 {
        let out = p(&format!("c{i}.z4dm"));
        let msg = pack_delta(d.path(), &prev, &out);
        assert!(msg.contains(&format!("chain depth {i}")), "{msg}");
        assert_eq!(unpack(&out), target);
        prev = out;
    }
    // A fifth would be depth 5: packed against c4's base (c3) instead.
    let msg = ok(&[
        "pack",
        s(&p("target.safetensors")),
        "--base",
        s(&prev),
        "-o",
        s(&p("c5.z4dm")),
    ]);
    assert!(
        msg.contains("re-basing") && msg.contains("chain depth 4"),
        "{msg}"
    );
    assert_eq!(unpack(&p("c5.z4dm")), target);
    let v = ok(&["verify", s(d.path())]);
    assert!(v.contains("5 delta relations checked, 0 failed"), "{v}");
    assert!(
        v.contains("c5.z4dm: based on c3.z4dm (chain depth 4)"),
        "{v}"
    );
    // pack --standalone turns the deepest into a plain .zstn.
    ok(&[
        "pack",
        "--standalone",
        s(&p("c4.z4dm")),
        "-o",
        s(&p("c4.zstn")),
    ]);
    std::fs::remove_file(p("base.zstn")).unwrap();
    assert_eq!(unpack(&p("c4.zstn")), target);
}

#[test]
fn a_missing_or_different_base_is_one_line_naming_both_files() {
    let (d, _) = setup(3, 1 << 16);
    let p = |n: &str| d.path().join(n);
    let delta = p("t.z4dm");
    pack_delta(d.path(), &p("base.zstn"), &delta);
    std::fs::rename(p("base.zstn"), p("moved.zstn")).unwrap();
    let e = fails(&["unpack", s(&delta), "-o", s(&p("x.safetensors"))]);
    assert!(e.contains("t.z4dm") && e.contains("base.zstn"), "{e}");
    assert_eq!(e.trim().lines().count(), 1, "{e}");
    assert_eq!(e.matches("t.z4dm").count(), 1, "the delta named once: {e}");
    assert!(!p("x.safetensors").exists());
    // `info` shows what the delta says of itself and names the missing
    // base (issue 40, item 9), exiting non-zero.
    let o = common::ckptfs(&["info", s(&delta)]);
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    let target_len = std::fs::metadata(p("target.safetensors")).unwrap().len();
    assert!(
        out.contains("t.z4dm")
            && out.contains("against base.zstn")
            && out.contains(&format!("{target_len} -> ")),
        "{out}"
    );
    assert!(err.contains("base.zstn"), "{err}");
    // Another checkpoint with the same tensors in the base's place: its
    // digest differs, so nothing is served.
    let (other, _) = delta_pair(99, 3, 1 << 16);
    std::fs::write(p("other.safetensors"), &other).unwrap();
    ok(&["pack", s(&p("other.safetensors")), "-o", s(&p("base.zstn"))]);
    let e = fails(&["unpack", s(&delta), "-o", s(&p("x.safetensors"))]);
    assert!(
        e.contains("t.z4dm") && e.contains("base.zstn") && e.contains("digest"),
        "{e}"
    );
    assert!(!p("x.safetensors").exists());
    let v = fails(&["verify", s(d.path())]);
    assert!(v.contains("FAIL") && v.contains("1 failed"), "{v}");
    // A plain .safetensors base changed in one byte of a COPY tensor.
    let delta2 = p("t2.z4dm");
    let mut base = std::fs::read(p("other.safetensors")).unwrap();
    std::fs::write(p("b2.safetensors"), &base).unwrap();
    ok(&[
        "pack",
        s(&p("other.safetensors")),
        "--base",
        s(&p("b2.safetensors")),
        "-o",
        s(&delta2),
    ]);
    let n = base.len();
    base[n - 1000] ^= 1;
    std::fs::write(p("b2.safetensors"), &base).unwrap();
    let e = fails(&["unpack", s(&delta2), "-o", s(&p("y.safetensors"))]);
    assert!(e.contains("b2.safetensors") && e.contains("digest"), "{e}");
}

#[test]
fn a_z4ai_written_z4dm_is_named_and_refused() {
    let (d, _) = setup(2, 1 << 12);
    let p = |n: &str| d.path().join(n);
    let o = Command::new(venv_python())
        .arg("-c")
        .arg(
            "import sys\nfrom z4ai import model_delta\n\
             open(sys.argv[3],'wb').write(model_delta.compress(open(sys.argv[1],'rb').read(), open(sys.argv[2],'rb').read()))\n",
        )
        .args([p("target.safetensors"), p("base.safetensors"), p("z.z4dm")])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // The CLI asks for its base (z4ai deltas are read with --base); the
    // archive layer (the mount) names it and refuses it.
    let e = fails(&["verify", s(&p("z.z4dm"))]);
    assert!(e.contains("--base"), "{e}");
    let e = ckptfs::archive::open(&p("z.z4dm")).err().expect("refused");
    assert!(
        e.to_string().contains("without ckptfs's CKD1 trailer"),
        "{e}"
    );
}

/// Every damaged copy of a delta either fails to open or read, or reads
/// exactly the target: never other bytes.
#[test]
fn a_damaged_delta_never_serves_wrong_bytes() {
    let (d, target) = setup(3, 1 << 13);
    let p = |n: &str| d.path().join(n);
    let delta = p("t.z4dm");
    pack_delta(d.path(), &p("base.zstn"), &delta);
    let bytes = std::fs::read(&delta).unwrap();
    let at: PathBuf = p("damaged.z4dm");
    let mut detected = 0;
    let step = (bytes.len() / 1500).max(1);
    for i in (0..bytes.len()).step_by(step) {
        let mut b = bytes.clone();
        b[i] ^= 0x10;
        match ckptfs::archive::from_bytes(b, &at) {
            Err(_) => detected += 1,
            Ok(a) => {
                let mut out = Vec::new();
                match ckptfs::archive::write_to(&*a, 0, &mut out, &|_| {}) {
                    Err(_) => detected += 1,
                    Ok(()) => assert_eq!(out, target, "flip at {i} served wrong bytes"),
                }
            }
        }
    }
    assert!(detected > 0);
}

/// A damaged base archive: reads that need the damaged block fail.
#[test]
fn a_damaged_base_never_serves_wrong_bytes() {
    let (d, target) = setup(3, 1 << 13);
    let p = |n: &str| d.path().join(n);
    let delta = p("t.z4dm");
    pack_delta(d.path(), &p("base.zstn"), &delta);
    base_flips_never_serve_wrong_bytes(&delta, &p("base.zstn"), &target, 300, 0x10);
}

/// Flips one bit of `base` at `n` evenly spaced offsets, one at a time:
/// reading the whole of `delta` then either fails or gives `target`.
fn base_flips_never_serve_wrong_bytes(delta: &Path, base: &Path, target: &[u8], n: usize, bit: u8) {
    let good = std::fs::read(base).unwrap();
    let step = (good.len() / n).max(1);
    for i in (0..good.len()).step_by(step) {
        let mut b = good.clone();
        b[i] ^= bit;
        std::fs::write(base, &b).unwrap();
        if let Ok(a) = ckptfs::archive::open(delta) {
            let mut out = Vec::new();
            if ckptfs::archive::write_to(&*a, 0, &mut out, &|_| {}).is_ok() {
                assert_eq!(out, target, "base flip at {i} served wrong bytes");
            }
        }
    }
    std::fs::write(base, &good).unwrap();
}

#[test]
fn blocks_decoded_while_the_base_is_checked_are_exact_or_errors() {
    // Block decoders do not wait for a base check another thread is
    // running (the mount decodes ahead meanwhile): what they return must
    // still be the target's bytes or an error, and the check must fail.
    let (d, target) = setup(3, 1 << 13);
    let p = |n: &str| d.path().join(n);
    let delta = p("t.z4dm");
    pack_delta(d.path(), &p("base.safetensors"), &delta);
    let a = ckptfs::archive::open(&delta).unwrap();
    assert!(a.check_pending(), "not checked before the first data read");
    a.check_range(0, 0..a.logical_len(0)).unwrap();
    assert!(!a.check_pending());

    // Another base of the same layout, with other values.
    let (other, _) = delta_pair(8, 3, 1 << 13);
    assert_eq!(
        other.len() as u64,
        std::fs::metadata(p("base.safetensors")).unwrap().len()
    );
    std::fs::write(p("base.safetensors"), &other).unwrap();
    for _ in 0..4 {
        let a = ckptfs::archive::open(&delta).unwrap();
        let keys = ckptfs::archive::blocks_of(&*a, 0).unwrap();
        let at = |k: ckptfs::archive::BlockKey| {
            let seg = a.segments(0).iter().find(|s| s.unit == k.unit).unwrap();
            let span = a.grid(k.unit).unwrap().span(k.block as usize);
            (seg.start + span.start) as usize..(seg.start + span.end) as usize
        };
        let served = std::thread::scope(|sc| {
            let checker = sc.spawn(|| a.check_range(0, 0..a.logical_len(0)));
            let decoders: Vec<_> = keys
                .chunks(keys.len().div_ceil(3))
                .map(|part| {
                    sc.spawn(|| {
                        part.iter()
                            .filter_map(|&k| a.decode_block(k).ok().map(|b| (k, b)))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            assert!(checker.join().unwrap().is_err(), "a different base passed");
            decoders
                .into_iter()
                .flat_map(|h| h.join().unwrap())
                .collect::<Vec<_>>()
        });
        for (k, b) in served {
            assert_eq!(b, target[at(k)], "block {k:?} decoded to wrong bytes");
        }
    }
}

/// A token embedding of 8 MiB where a step moved 24 rows: its XOR is a
/// sparse frame, which decodes only whole, listed in blocks of 1 MiB that
/// decode one at a time from its index. Reads at any offset are exact, a
/// damaged base gives an error, never wrong bytes, and a delta written
/// with the frame as one block (before blocks were listed) still reads.
#[test]
fn a_sparse_delta_reads_block_by_block_over_a_base_archive() {
    use common::{gauss_bf16, safetensors_file, Rng};
    let (rows, cols) = (16384usize, 256usize);
    let mut rng = Rng(11);
    let embed = gauss_bf16(&mut rng, rows * cols, 0.02);
    let norm = gauss_bf16(&mut rng, 4096, 1.0);
    let mut moved = embed.clone();
    for _ in 0..24 {
        let r = rng.below(rows as u64) as usize;
        let row = &mut moved[r * cols * 2..(r + 1) * cols * 2];
        row.copy_from_slice(&gauss_bf16(&mut rng, cols, 0.02));
    }
    let file = |e: &[u8]| {
        safetensors_file(
            &[
                (
                    "embed.weight",
                    "BF16",
                    vec![rows as u64, cols as u64],
                    e.to_vec(),
                ),
                ("norm.weight", "BF16", vec![4096], norm.clone()),
            ],
            None,
        )
    };
    let (base, target) = (file(&embed), file(&moved));
    let d = tempfile::tempdir().unwrap();
    let p = |n: &str| d.path().join(n);
    std::fs::write(p("base.safetensors"), &base).unwrap();
    std::fs::write(p("target.safetensors"), &target).unwrap();
    ok(&["pack", s(&p("base.safetensors")), "-o", s(&p("base.zstn"))]);
    let delta = p("t.z4dm");
    pack_delta(d.path(), &p("base.zstn"), &delta);

    let bytes = std::fs::read(&delta).unwrap();
    let frame = {
        use ckptfs::format::delta::{parse_record, Trailer};
        let t = Trailer::find(&bytes).unwrap().unwrap();
        let u = (0..t.units.len())
            .find(|&u| {
                parse_record(&bytes, t.units[u].record_offset as usize)
                    .unwrap()
                    .name
                    == "embed.weight"
            })
            .unwrap();
        let r = parse_record(&bytes, t.units[u].record_offset as usize).unwrap();
        r.frame
    };
    let (frame_at, frame) = (frame.start, bytes[frame].to_vec());
    assert_eq!(&frame[..4], b"ZSP1", "the XOR is a sparse frame");
    let a = ckptfs::archive::open(&delta).unwrap();
    let unit = (0..a.units() as u32)
        .find(|&u| a.unit_name(u) == "embed.weight")
        .unwrap();
    let grid = a.grid(unit).unwrap();
    let len = (rows * cols * 2) as u64;
    assert_eq!(grid.blocks(), 8, "1 MiB blocks of the 8 MiB tensor");
    assert!((0..8).all(|b| grid.span(b).end - grid.span(b).start == 1 << 20));
    // One block decodes to its MiB, from the frame's index (its 4 Mi-bit
    // bitmap and 24 rows of values), kept beside the block cache.
    let key = ckptfs::archive::BlockKey { unit, block: 5 };
    let block = a.decode_block(key).unwrap();
    let at = a.segments(0).iter().find(|s| s.unit == unit).unwrap().start as usize;
    assert_eq!(block[..], target[at + (5 << 20)..at + (6 << 20)]);
    let held = ckptfs::archive::sparse_cache::held_bytes();
    assert!(held >= (len / 16) as usize, "index of {held} bytes");
    drop(a);
    let mut rng = Rng(5);
    for _ in 0..8 {
        let a = ckptfs::archive::open(&delta).unwrap();
        let at = rng.below(target.len() as u64 - 4096) as usize;
        let mut buf = vec![0u8; 4096];
        assert_eq!(a.read_at(0, at as u64, &mut buf).unwrap(), 4096);
        assert_eq!(buf, target[at..at + 4096], "4 KiB at {at}");
    }
    assert_eq!(unpack(&delta), target);

    base_flips_never_serve_wrong_bytes(&delta, &p("base.zstn"), &target, 40, 0x04);

    // A flipped bit anywhere in the sparse frame (bitmap, values, their
    // lengths): an error or the exact target, never other bytes.
    let step = (frame.len() / 150).max(1);
    for i in (frame_at..frame_at + frame.len()).step_by(step) {
        let mut b = bytes.clone();
        b[i] ^= 0x08;
        if let Ok(a) = ckptfs::archive::from_bytes(b, &p("damaged.z4dm")) {
            let mut out = Vec::new();
            if ckptfs::archive::write_to(&*a, 0, &mut out, &|_| {}).is_ok() {
                assert_eq!(out, target, "flip at {i} served wrong bytes");
            }
        }
    }

    // The same delta with the sparse unit listed as one block (as ckptfs
    // wrote it before): it still reads, whole.
    use ckptfs::format::ckx::BlockDigest;
    use ckptfs::format::delta::Trailer;
    use ckptfs::format::digest::xxh3_64;
    let t = Trailer::find(&bytes).unwrap().unwrap();
    let mut old = t.clone();
    let u = &mut old.units[unit as usize];
    assert_eq!(u.blocks.len(), 8);
    u.blocks = vec![BlockDigest {
        end: len,
        payload: xxh3_64(&frame),
        data: xxh3_64(&target[at..at + len as usize]),
    }];
    let mut one = bytes[..t.z4dm_len as usize].to_vec();
    one.extend_from_slice(&old.render());
    let one_path = p("one.z4dm");
    std::fs::write(&one_path, &one).unwrap();
    let a = ckptfs::archive::open(&one_path).unwrap();
    assert_eq!(a.grid(unit).unwrap().blocks(), 1);
    assert_eq!(unpack(&one_path), target);
    let v = ok(&["verify", s(&one_path)]);
    assert!(v.contains("OK"), "{v}");
}

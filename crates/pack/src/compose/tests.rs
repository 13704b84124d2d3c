//! Composition is exact: `A` read through `compose(A, B, C)` equals `A`,
//! for every pair of record kinds, tensors added, removed, resized and
//! retyped between steps, and tensors above the 1 MiB block.

use super::*;
use crate::delta::{pack_delta, DeltaBase};
use std::path::Path;

/// A `.safetensors` of (name, dtype, bytes), 1-D.
fn file(tensors: &[(&str, &str, Vec<u8>)]) -> Vec<u8> {
    let mut json = String::from("{");
    let mut at = 0usize;
    for (i, (n, d, b)) in tensors.iter().enumerate() {
        let w = match *d {
            "F32" => 4,
            "BF16" => 2,
            _ => 1,
        };
        if i > 0 {
            json.push(',');
        }
        json.push_str(&format!(
            r#""{n}":{{"dtype":"{d}","shape":[{}],"data_offsets":[{at},{}]}}"#,
            b.len() / w,
            at + b.len()
        ));
        at += b.len();
    }
    json.push('}');
    while json.len() % 8 != 0 {
        json.push(' ');
    }
    let mut v = (json.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(json.as_bytes());
    for (_, _, b) in tensors {
        v.extend_from_slice(b);
    }
    v
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    /// bf16 weights near 0.02.
    fn weights(&mut self, bytes: usize) -> Vec<u8> {
        (0..bytes / 2)
            .flat_map(|_| {
                let f = ((self.next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.04;
                let b = f.to_bits();
                [(b >> 16) as u8, (b >> 24) as u8]
            })
            .collect()
    }
    /// Flips a low mantissa bit of one element in `every`.
    fn step(&mut self, t: &[u8], every: u64) -> Vec<u8> {
        let mut t = t.to_vec();
        for e in t.chunks_mut(2) {
            if self.below(every) == 0 {
                e[0] ^= 1 << self.below(3);
            }
        }
        t
    }
}

/// Writes C, B (delta vs C), A (delta vs B) and the composition A→C into
/// `dir`; returns A→C's bytes and stats after checking that it reads
/// back as A (ckptfs's reader and verify, and the z4ai-compatible
/// reader).
fn check(
    dir: &Path,
    c: &[u8],
    b: &[u8],
    a: &[u8],
) -> (Vec<u8>, ComposeStats, Vec<(RecordKind, RecordKind)>) {
    let opts = PackOptions::default();
    std::fs::write(dir.join("C.safetensors"), c).unwrap();
    let mut bd = Vec::new();
    pack_delta(
        b,
        &DeltaBase {
            bytes: c,
            rel_path: "C.safetensors".into(),
            depth: 0,
            fingerprint: 0,
        },
        &mut bd,
        opts,
        &|_| {},
    )
    .unwrap();
    std::fs::write(dir.join("B.z4dm"), &bd).unwrap();
    let mut ad = Vec::new();
    pack_delta(
        a,
        &DeltaBase {
            bytes: b,
            rel_path: "B.z4dm".into(),
            depth: 1,
            fingerprint: 0,
        },
        &mut ad,
        opts,
        &|_| {},
    )
    .unwrap();
    std::fs::write(dir.join("A.z4dm"), &ad).unwrap();
    // The pairs of kinds the composition met.
    let kinds = {
        let (pa, pb) = (parse(&ad, "A").unwrap(), parse(&bd, "B").unwrap());
        pa.records
            .iter()
            .map(|r| {
                let k = pb
                    .records
                    .iter()
                    .find(|x| x.name == r.name)
                    .map_or(RecordKind::Full, |x| x.kind);
                (r.kind, k)
            })
            .collect()
    };
    let mut out = Vec::new();
    let stats = compose(&ad, &bd, &c, "C.safetensors", &mut out, opts).unwrap();
    assert_eq!(stats.stored_bytes, out.len() as u64);
    let p = dir.join("AC.z4dm");
    std::fs::write(&p, &out).unwrap();
    let arch = ckptfs_archive::open(&p).unwrap();
    ckptfs_archive::verify(&*arch, &|_| {}).unwrap();
    let mut got = Vec::new();
    ckptfs_archive::write_to(&*arch, 0, &mut got, &|_| {}).unwrap();
    assert!(got == a, "A read through A→C differs from A");
    // z4ai's reading: the Z4DM body against C.
    let t = Trailer::find(&out).unwrap().unwrap();
    assert_eq!(t.depth, 1);
    let base = ckptfs_archive::z4delta::Base::open(&dir.join("C.safetensors")).unwrap();
    let r =
        ckptfs_archive::z4delta::Z4dmReader::open(&p, &out[..t.z4dm_len as usize], &base).unwrap();
    let mut z = Vec::new();
    r.write_to(&mut z, &|_| {}).unwrap();
    assert!(z == a, "the z4ai-compatible reader differs");
    (out, stats, kinds)
}

#[test]
fn every_kind_pair_composes_exactly() {
    let mut g = Rng(0x9e3779b97f4a7c15);
    let big = 3 << 20; // above the 1 MiB block
    let w = |g: &mut Rng, n| g.weights(n);
    let same = w(&mut g, 256 << 10);
    let c_moves = w(&mut g, big);
    let a_moves = w(&mut g, big);
    let both = w(&mut g, big);
    let sparse = w(&mut g, 2 << 20);
    let dense_c = w(&mut g, 512 << 10);
    let resized_c = w(&mut g, 64 << 10);
    let dropped = w(&mut g, 32 << 10);
    let retyped_c = w(&mut g, 64 << 10);

    let c = file(&[
        ("same", "BF16", same.clone()),
        ("c_moves", "BF16", c_moves.clone()),
        ("a_moves", "BF16", a_moves.clone()),
        ("both", "BF16", both.clone()),
        ("sparse", "BF16", sparse.clone()),
        ("rewritten", "BF16", dense_c.clone()),
        ("resized", "BF16", resized_c.clone()),
        ("dropped", "BF16", dropped),
        ("retyped", "BF16", retyped_c.clone()),
    ]);
    let b_c_moves = g.step(&c_moves, 3);
    let b_both = g.step(&both, 3);
    let b_sparse = g.step(&sparse, 50_000);
    let b_rewritten = w(&mut g, 512 << 10);
    let b_resized = w(&mut g, 96 << 10);
    let b_retyped = w(&mut g, 64 << 10);
    let b_new = w(&mut g, 1100 << 10);
    let b_new_moves = w(&mut g, 128 << 10);
    let b = file(&[
        ("same", "BF16", same.clone()),
        ("c_moves", "BF16", b_c_moves.clone()),
        ("a_moves", "BF16", a_moves.clone()),
        ("both", "BF16", b_both.clone()),
        ("sparse", "BF16", b_sparse.clone()),
        ("rewritten", "BF16", b_rewritten.clone()),
        ("resized", "BF16", b_resized.clone()),
        ("retyped", "F32", b_retyped.clone()),
        ("new_in_b", "BF16", b_new.clone()),
        ("new_in_b_moves", "BF16", b_new_moves.clone()),
    ]);
    let a = file(&[
        ("same", "BF16", same),
        ("c_moves", "BF16", b_c_moves),
        ("a_moves", "BF16", g.step(&a_moves, 3)),
        ("both", "BF16", g.step(&b_both, 3)),
        ("sparse", "BF16", g.step(&b_sparse, 50_000)),
        ("rewritten", "BF16", g.step(&b_rewritten, 4)),
        ("resized", "BF16", b_resized),
        ("retyped", "F32", g.step(&b_retyped, 4)),
        ("new_in_b", "BF16", b_new),
        ("new_in_b_moves", "BF16", g.step(&b_new_moves, 4)),
        ("new_in_a", "BF16", w(&mut g, 64 << 10)),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let (_, stats, kinds) = check(dir.path(), &c, &b, &a);
    use RecordKind::*;
    for pair in [
        (Copy, Copy),
        (Copy, Delta),
        (Delta, Copy),
        (Delta, Delta),
        (Copy, Full),
        (Delta, Full),
        (Full, Full),
    ] {
        assert!(kinds.contains(&pair), "{pair:?} not met: {kinds:?}");
    }
    assert!(
        stats.reused >= 3 && stats.xored >= 2 && stats.recoded >= 1,
        "{stats:?}"
    );
}

#[test]
fn a_chain_of_three_composes_twice() {
    // D → A → B → C: compose twice, each result read back exactly.
    let mut g = Rng(77);
    let t0 = g.weights(1 << 20);
    let c = file(&[("w", "BF16", t0.clone())]);
    let t1 = g.step(&t0, 3);
    let b = file(&[("w", "BF16", t1.clone())]);
    let a = file(&[("w", "BF16", g.step(&t1, 3))]);
    let dir = tempfile::tempdir().unwrap();
    let (ac, ..) = check(dir.path(), &c, &b, &a);
    // A→C is a delta like any other: it composes on.
    assert!(parse(&ac, "A→C").is_ok());
}

#[test]
fn refuses_a_mismatched_middle() {
    let mut g = Rng(5);
    let c = file(&[("w", "BF16", g.weights(4096))]);
    let b = file(&[("w", "BF16", g.weights(4096))]);
    let a = file(&[("w", "BF16", g.weights(8192))]);
    let pack = |t: &[u8], base: &[u8]| {
        let mut v = Vec::new();
        pack_delta(
            t,
            &DeltaBase {
                bytes: base,
                rel_path: "x".into(),
                depth: 0,
                fingerprint: 0,
            },
            &mut v,
            PackOptions::default(),
            &|_| {},
        )
        .unwrap();
        v
    };
    // A packed against another file than B: its recorded base length
    // is not B's.
    let other = file(&[("w", "BF16", g.weights(2048))]);
    let ad = pack(&a, &other);
    let bd = pack(&b, &c);
    let e = compose(&ad, &bd, &c, "C", &mut Vec::new(), PackOptions::default());
    assert!(e.unwrap_err().to_string().contains("its base is"));
    let e = compose(
        &ad[..10],
        &bd,
        &c,
        "C",
        &mut Vec::new(),
        PackOptions::default(),
    );
    assert!(e.unwrap_err().to_string().contains("upper delta"));
    assert!(compose(
        &ad,
        b"Z4DM",
        &c,
        "C",
        &mut Vec::new(),
        PackOptions::default()
    )
    .is_err());
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(12))]
    /// Random families of a few tensors, each step keeping, nudging,
    /// rewriting, resizing, dropping or adding each: always exact.
    #[test]
    fn random_families_compose_exactly(seed in 1u64.., n in 1usize..6) {
        let mut g = Rng(seed | 1);
        let sizes = [64usize, 4096, 70 << 10, 1 << 20, (1 << 20) + 4098];
        let mut cur: Vec<(String, Vec<u8>)> = (0..n)
            .map(|i| (format!("t{i}"), { let k = g.below(5) as usize; g.weights(sizes[k]) }))
            .collect();
        let mut files = vec![file(&cur.iter().map(|(n, b)| (n.as_str(), "BF16", b.clone())).collect::<Vec<_>>())];
        for _ in 0..2 {
            let mut next = Vec::new();
            for (name, b) in &cur {
                match g.below(7) {
                    0 | 1 => next.push((name.clone(), b.clone())),
                    2 | 3 => next.push((name.clone(), { let e = 1 + g.below(1000); g.step(b, e) })),
                    4 => next.push((name.clone(), g.weights(b.len()))),
                    5 => next.push((name.clone(), { let k = g.below(5) as usize; g.weights(sizes[k]) })),
                    _ => {}
                }
            }
            if g.below(2) == 0 || next.is_empty() {
                let nm = format!("n{}", g.below(1000));
                let k = g.below(5) as usize;
                next.push((nm, g.weights(sizes[k])));
            }
            next.sort_by(|x, y| x.0.cmp(&y.0));
            next.dedup_by(|x, y| x.0 == y.0);
            files.push(file(&next.iter().map(|(n, b)| (n.as_str(), "BF16", b.clone())).collect::<Vec<_>>()));
            cur = next;
        }
        let dir = tempfile::tempdir().unwrap();
        check(dir.path(), &files[0], &files[1], &files[2]);
    }
}

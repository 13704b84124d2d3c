use super::planes::sum_histograms;
use super::xor::{non_stationary, small_planes_frame, sparse_frame, xor_byteplane_frame};
use super::*;
use ckptfs_codec::frame::DecodeFrame;
use ckptfs_codec::rans;
use ckptfs_codec::rans::adaptive::AdaptiveDecode;
use ckptfs_codec::rans::AdaptivePayload;
use ckptfs_format::frame::Frame;

/// bf16 N(0, 0.02) weights, `n` elements (deterministic).
fn weights(n: usize) -> Vec<u8> {
    let mut s = 0x9E37_79B9_7F4A_7C15u64;
    let mut unit = || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((s >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    (0..n)
        .flat_map(|_| {
            // Box-Muller
            let g = (-2.0 * unit().ln()).sqrt() * (std::f64::consts::TAU * unit()).cos();
            let b = ((g * 0.02) as f32).to_bits();
            (((b + 0x7FFF + ((b >> 16) & 1)) >> 16) as u16).to_le_bytes()
        })
        .collect()
}

#[test]
fn float_weights_get_split_float_frames_by_default() {
    use ckptfs_format::frame::Transform;
    let raw = weights(3 << 20);
    {
        let (dtype, w) = (Dtype::BF16, 2u8);
        let frame = encode_tensor(Some(dtype), &raw, PackOptions::default());
        let parsed = Frame::parse(&frame).unwrap();
        let Frame::Z4ai(f) = &parsed else {
            panic!("not a Z4AI frame");
        };
        assert_eq!(f.transform, Transform::Split(w), "{dtype:?}");
        assert_eq!(
            (f.planes[0].method, f.planes[1].method),
            (plane::RANS32, plane::STORE)
        );
        // 1 MiB blocks, each decoded alone.
        let (bounds, _, _) = block_grid(&parsed, raw.len() as u64).unwrap();
        let want: Vec<u64> = (0..=6).map(|b| b << 20).collect();
        assert_eq!(bounds, want);
        let mut out = vec![0u8; raw.len()];
        parsed.decode(&mut out).unwrap();
        assert!(out == raw, "{dtype:?}");
    }
}

#[test]
fn bf16_weights_get_zstd_mantissa_blocks_and_one_exponent_table_per_block() {
    let raw = weights(3 << 20); // 6 blocks of 512 Ki elements
    let z4ai = PackOptions {
        compat: Compat::Z4ai,
        ..PackOptions::default()
    };
    let frame = encode_tensor(Some(Dtype::BF16), &raw, z4ai);
    let parsed = Frame::parse(&frame).unwrap();
    let Frame::Z4ai(f) = &parsed else {
        panic!("not a Z4AI frame");
    };
    assert_eq!(f.planes.len(), 3);
    let (exp, mant) = (&f.planes[1], &f.planes[2]);
    assert_eq!(
        (exp.method, mant.method),
        (plane::RANS_ADAPT, plane::ZSTD_BLOCKS)
    );
    let e = AdaptivePayload::parse(exp.payload).unwrap();
    let et = e.freq_tables().unwrap();
    let per_block = e.chunks() / 6;
    assert!(per_block > 1);
    for blk in et.chunks(per_block) {
        assert!(blk.iter().all(|t| t == &blk[0]), "one table per block");
    }
    // The mantissa's zstd blocks cut where the exponent's blocks do:
    // six blocks of 1 MiB, each decoded alone.
    let (bounds, _, _) = block_grid(&parsed, raw.len() as u64).unwrap();
    let want: Vec<u64> = (0..=6).map(|b| b << 20).collect();
    assert_eq!(bounds, want);
    // Huffman codes a near-uniform 7-bit mantissa in 7 bits at most,
    // plus each block's header and table.
    let n = raw.len() / 2;
    assert!(mant.payload.len() <= n * 7 / 8 + 6 * 1024);
    let mut out = vec![0u8; raw.len()];
    parsed.decode(&mut out).unwrap();
    assert_eq!(out, raw);
}

/// The XOR of `weights(n)` with a copy where every `stride`-th element
/// moved in its low four bits.
fn sparse_xor(n: usize, stride: usize) -> Vec<u8> {
    let a = weights(n);
    let mut b = a.clone();
    for (i, e) in b.chunks_exact_mut(2).step_by(stride).enumerate() {
        e[0] ^= 1 + (i * 7 % 15) as u8;
    }
    a.iter().zip(&b).map(|(x, y)| x ^ y).collect()
}

fn planes_of(frame: &[u8]) -> Vec<(u8, usize)> {
    let Frame::Z4ai(f) = Frame::parse(frame).unwrap() else {
        panic!("not a Z4AI frame");
    };
    f.planes
        .iter()
        .map(|p| {
            let chunks = match p.method {
                plane::RANS_ADAPT => AdaptivePayload::parse(p.payload).unwrap().chunks(),
                _ => 0,
            };
            (p.method, chunks)
        })
        .collect()
}

#[test]
fn a_small_xor_has_enough_rans_chunks_for_the_simd_decoder() {
    // A 384x384 bf16 projection, half of its low bytes changed (more
    // than a bit a symbol: no zstd): one block, 9 chunks of 16 Ki
    // symbols sharing one table.
    let n = 384 * 384;
    let xor = sparse_xor(n, 2);
    let frame = xor_byteplane_frame(&xor, 2);
    let planes = planes_of(&frame);
    assert_eq!(planes[0], (plane::RANS_ADAPT, 9));
    let Frame::Z4ai(f) = Frame::parse(&frame).unwrap() else {
        unreachable!()
    };
    let t = AdaptivePayload::parse(f.planes[0].payload)
        .unwrap()
        .freq_tables()
        .unwrap();
    assert!(t.iter().all(|x| x == &t[0]), "one table per block");
    let mut out = vec![0u8; xor.len()];
    Frame::parse(&frame).unwrap().decode(&mut out).unwrap();
    assert_eq!(out, xor);
}

#[test]
fn mostly_zero_xor_planes_go_to_zstd_blocks_one_per_block() {
    // 4 blocks of 512 Ki elements; one element in 500 changed: both
    // planes are mostly zeros.
    let n = 4 << 19;
    let xor = sparse_xor(n, 500);
    let frame = xor_byteplane_frame(&xor, 2);
    let Frame::Z4ai(f) = Frame::parse(&frame).unwrap() else {
        panic!("not a Z4AI frame");
    };
    for p in &f.planes {
        assert!(
            p.method == plane::ZSTD_BLOCKS || p.method == plane::STORE,
            "method {}",
            p.method
        );
    }
    assert_eq!(f.planes[0].method, plane::ZSTD_BLOCKS);
    let (bounds, _, _) = block_grid(&Frame::parse(&frame).unwrap(), xor.len() as u64).unwrap();
    assert_eq!(bounds.len(), 5, "four blocks");
    assert!(frame.len() < xor.len() / 50);
    let mut out = vec![0u8; xor.len()];
    Frame::parse(&frame).unwrap().decode(&mut out).unwrap();
    assert_eq!(out, xor);
}

fn decodes_to(frame: &[u8], want: &[u8]) {
    let mut out = vec![0u8; want.len()];
    Frame::parse(frame).unwrap().decode(&mut out).unwrap();
    assert_eq!(out, want);
}

#[test]
fn a_xor_of_a_few_moved_rows_is_a_sparse_frame_smaller_than_byte_planes() {
    // A 2048x64 bf16 embedding of which three rows moved.
    let moved = weights(3 * 64);
    let mut xor = vec![0u8; 2048 * 64 * 2];
    for (k, row) in [5usize, 300, 1201].into_iter().enumerate() {
        xor[row * 128..(row + 1) * 128].copy_from_slice(&moved[k * 128..(k + 1) * 128]);
    }
    let frame = encode_xor(Some(Dtype::BF16), &xor, PackOptions::default());
    let Frame::Sparse(f) = Frame::parse(&frame).unwrap() else {
        panic!("not a ZSP1 frame");
    };
    assert_eq!((f.width, f.count), (2, 2048 * 64));
    assert!(frame.len() < xor_byteplane_frame(&xor, 2).len());
    decodes_to(&frame, &xor);
    // One block: the whole tensor, with its digest.
    let unit = digests(&frame, &xor).unwrap();
    assert_eq!(unit.blocks.len(), 1);
    // All zero: a bitmap and no values.
    let zero = vec![0u8; 4096];
    let z = sparse_frame(&zero, 4).unwrap();
    decodes_to(&z, &zero);
}

#[test]
fn a_dense_or_oversized_xor_is_not_tried_sparse() {
    // Half of the elements moved.
    assert!(sparse_frame(&sparse_xor(1 << 16, 2), 2).is_none());
    // One in 500 moved, but past the bound.
    let mut big = vec![0u8; SPARSE_MAX + 2];
    big[10] = 1;
    assert!(sparse_frame(&big, 2).is_none());
    // One in 500 below the bound: sparse, exact, with a tail byte.
    let mut x = sparse_xor(1 << 16, 500);
    x.push(7);
    let f = sparse_frame(&x, 2).unwrap();
    decodes_to(&f, &x);
}

#[test]
fn small_xors_try_one_zstd_frame_per_plane() {
    // A 768-element bias, every element moved in its low byte.
    let a = weights(768);
    let xor: Vec<u8> = a
        .chunks_exact(2)
        .flat_map(|e| [e[0] | 1, e[1] & 0x01])
        .collect();
    let f = encode_xor(Some(Dtype::BF16), &xor, PackOptions::default());
    assert!(f.len() <= small_planes_frame(&xor, 2).len());
    assert!(f.len() <= opaque_frame(&xor, PackOptions::default()).len());
    decodes_to(&f, &xor);
    decodes_to(&small_planes_frame(&xor, 2), &xor);
}

#[test]
fn a_plane_whose_statistics_change_gets_a_table_per_chunk() {
    let mut x = 7u64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    // First quarter uniform bytes, the rest mostly 0 and 1.
    let n = 1 << 18;
    let shifting: Vec<u8> = (0..n)
        .map(|i| {
            if i < n / 4 {
                next() as u8
            } else {
                (next() % 3 == 0) as u8
            }
        })
        .collect();
    // 16 chunks, as one run of 16 or 16 runs of one.
    let check = |p: &[u8], group: usize| {
        let chunks = rans::run_histograms(p, 16, 1);
        let runs: Vec<_> = chunks.chunks(group).map(sum_histograms).collect();
        non_stationary(p.len(), &chunks, &runs)
    };
    assert!(check(&shifting, 16));
    let steady: Vec<u8> = (0..n).map(|_| next() as u8 & 0x3F).collect();
    assert!(!check(&steady, 16));
    // Already a table per chunk, or too large to check.
    assert!(!check(&shifting, 1));
    let long: Vec<u8> = shifting.iter().cycle().take(5 * n).copied().collect();
    assert!(!check(&long, 16));
}

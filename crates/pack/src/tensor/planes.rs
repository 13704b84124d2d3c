//! One plane's coding, shared by every layout: rANS chunk counts and
//! tables, order-0 entropy estimates that decide between rANS and stored,
//! zstd blocks, and the byte-plane split of whole elements.

use ckptfs_codec::plane::{self, encode_zstd_blocks};
use ckptfs_codec::rans;
use ckptfs_codec::transform;
use ckptfs_format::frame::{PlaneOut, BLOCK_BYTES};
use rayon::prelude::*;

/// The element-wise sum of byte histograms.
pub(super) fn sum_histograms(hs: &[[u64; 256]]) -> [u64; 256] {
    let mut sum = [0u64; 256];
    for h in hs {
        sum.iter_mut().zip(h).for_each(|(a, b)| *a += b);
    }
    sum
}

/// Order-0 entropy in bytes of the bytes a histogram counted.
pub(super) fn counted_o0_bytes(h: &[u64; 256]) -> f64 {
    hist_o0_bytes(h, h.iter().sum::<u64>() as usize)
}

/// Elements per block for an element size.
pub(super) fn block_elems(elem_bytes: usize) -> usize {
    (BLOCK_BYTES as usize / elem_bytes).max(8)
}

/// Entropy-codes a plane with `k` rANS chunks, runs of `group` chunks
/// sharing one table (1: a table per chunk), or stores it if that is not
/// smaller.
pub(super) fn encode_plane(data: &[u8], k: usize, group: usize) -> PlaneOut {
    if data.is_empty() {
        return stored_plane(data);
    }
    // Shared tables come from the runs' histograms, which for a plane of
    // at most the estimate's sample also give its estimate (one count of
    // the plane, not two).
    let runs = (group > 1).then(|| rans::run_histograms(data, k, group));
    let estimate = match &runs {
        Some(h) if data.len() <= O0_SAMPLE => counted_o0_bytes(&sum_histograms(h)),
        _ => estimate_o0_bytes(data),
    };
    encode_estimated(data, k, group, runs.as_deref(), estimate)
}

/// [`encode_plane`] with the histograms of its runs of `group` chunks and
/// of the whole plane already counted.
pub(super) fn encode_plane_counted(
    data: &[u8],
    k: usize,
    group: usize,
    runs: &[[u64; 256]],
    total: &[u64; 256],
) -> PlaneOut {
    if data.is_empty() {
        return stored_plane(data);
    }
    encode_estimated(data, k, group, Some(runs), counted_o0_bytes(total))
}

pub(super) fn stored_plane(data: &[u8]) -> PlaneOut {
    PlaneOut {
        method: plane::STORE,
        orig_len: data.len() as u64,
        payload: data.to_vec(),
    }
}

/// The rANS plane of `data` (tables from `runs` when given, else one per
/// chunk counted here), or the plane stored when its order-0 `estimate`
/// in bytes says rANS cannot win, or when it does not.
fn encode_estimated(
    data: &[u8],
    k: usize,
    group: usize,
    runs: Option<&[[u64; 256]]>,
    estimate: f64,
) -> PlaneOut {
    if estimate >= data.len() as f64 * 0.995 {
        return stored_plane(data);
    }
    let payload = match runs {
        Some(h) => rans::encode_method4_runs(data, k, group, h),
        None => rans::encode_method4(data, k),
    };
    if payload.len() >= data.len() {
        return stored_plane(data);
    }
    PlaneOut {
        method: plane::RANS_ADAPT,
        orig_len: data.len() as u64,
        payload,
    }
}

/// Planes larger than this estimate their entropy from their first bytes.
const O0_SAMPLE: usize = 1 << 20;

/// Order-0 entropy of `data` in bytes, from a sample for large planes.
fn estimate_o0_bytes(data: &[u8]) -> f64 {
    let sample: &[u8] = if data.len() > O0_SAMPLE {
        &data[..O0_SAMPLE]
    } else {
        data
    };
    o0_bytes(sample) * (data.len() as f64 / sample.len().max(1) as f64)
}

/// Order-0 entropy of `data` in bytes.
fn o0_bytes(data: &[u8]) -> f64 {
    hist_o0_bytes(&rans::histogram(data), data.len())
}

/// Order-0 entropy in bytes of `len` bytes with histogram `hist`.
fn hist_o0_bytes(hist: &[u64; 256], len: usize) -> f64 {
    let n = len as f64;
    let bits: f64 = hist
        .iter()
        .filter(|&&c| c > 0)
        .map(|&c| {
            let p = c as f64 / n;
            -(c as f64) * p.log2()
        })
        .sum();
    bits / 8.0
}

/// Shortest rANS chunk in a frame of values. Shorter chunks fill more of
/// the SIMD decoder's 16 lanes in blocks of small tensors: 16 Ki gave
/// MiniLM's 384 x 384 matrices 9 chunks a block, 8 Ki gives 16 (MiniLM fp32
/// decodes about 30% faster, bf16 10%, for under 0.03% more bytes).
pub(super) const MIN_CHUNK: usize = 8 << 10;

/// rANS chunks for `blocks` blocks of `n` elements in total: up to
/// CHUNK_GROUP per block (the SIMD decoder decodes that many at once), none
/// shorter than `min` symbols.
pub(super) fn rans_chunks(n: usize, blocks: usize, min: usize) -> usize {
    let per_block = n / blocks.max(1);
    blocks.max(1) * (per_block / min).clamp(1, rans::CHUNK_GROUP)
}

/// A chunk count k that divides n with chunks of at most `max` and at least
/// `max / 8` elements, so that zstd blocks of n/k elements and rANS chunks
/// `floor(j*n/k)` share their boundaries.
pub(super) fn dividing_chunks(n: usize, max: usize) -> Option<usize> {
    if n <= max {
        return Some(1);
    }
    (n.div_ceil(max)..=n / (max / 8).max(1)).find(|k| n.is_multiple_of(*k))
}

/// The `w` byte planes of `raw`'s whole elements, split block by block in
/// parallel.
pub(super) fn split_planes(raw: &[u8], w: usize) -> Vec<Vec<u8>> {
    let n = raw.len() / w;
    let e = block_elems(w);
    let mut planes: Vec<Vec<u8>> = (0..w).map(|_| vec![0u8; n]).collect();
    {
        // Split block by block in parallel: transpose each plane's chunks.
        let mut per_plane: Vec<Vec<&mut [u8]>> = planes
            .iter_mut()
            .map(|p| p.chunks_mut(e).collect())
            .collect();
        let mut jobs: Vec<(usize, Vec<&mut [u8]>)> = Vec::new();
        let nchunks = n.div_ceil(e);
        for j in (0..nchunks).rev() {
            let parts: Vec<&mut [u8]> = per_plane
                .iter_mut()
                .map(|v| v.pop().expect("chunk"))
                .collect();
            jobs.push((j, parts));
        }
        jobs.into_par_iter().for_each(|(j, mut parts)| {
            let a = j * e * w;
            let b = ((j + 1) * e).min(n) * w;
            transform::byteplane_split_into(&raw[a..b], &mut parts);
        });
    }
    planes
}

/// A plane in zstd blocks of `block` bytes (level 1: the planes it is used
/// for are near-uniform, where Huffman does the work), or stored when that
/// is not smaller.
pub(super) fn zstd_blocks_or_stored(data: &[u8], block: usize) -> PlaneOut {
    let payload = encode_zstd_blocks(data, block, 1);
    if payload.len() >= data.len() {
        PlaneOut {
            method: plane::STORE,
            orig_len: data.len() as u64,
            payload: data.to_vec(),
        }
    } else {
        PlaneOut {
            method: plane::ZSTD_BLOCKS,
            orig_len: data.len() as u64,
            payload,
        }
    }
}

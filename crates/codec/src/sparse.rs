//! Random access into a `ZSP1` sparse frame: its bitmap and its values
//! decoded once ([`SparseFrame::index`]), after which any element range
//! decodes alone ([`SparseIndex::decode_range`]), in time proportional to
//! the range.
//!
//! A `ZSP1` frame cannot be cut into blocks the way a Z4AI frame is: its
//! bitmap is one zstd frame and each value stream another, and the value
//! of an element is found only by counting the set bits before it. The
//! index holds what decoding costs to reach any element: the bitmap, a
//! running count of its set bits every [`RANK_STEP`] elements, and the
//! value streams (at most a quarter of the elements in a frame ckptfs
//! writes). Its size is [`SparseIndex::held_bytes`], so a caller can keep it
//! in a bounded cache.
//!
//! Invariants: the bitmap holds exactly `nnz` set bits and every value
//! stream exactly `nnz` values (checked when the index is built), so a
//! range decode never indexes past a stream.

use super::frame::stream_bytes;
use super::{CodecError, Result};
use crate::frame::DecodeSparseFrame;
use ckptfs_format::frame::SparseFrame;

/// Elements per entry of the running count of set bits.
const RANK_STEP: usize = 512;

/// A `ZSP1` frame decoded for random access (see the module doc).
#[derive(Debug)]
pub struct SparseIndex {
    width: usize,
    count: usize,
    bitmap: Vec<u8>,
    /// Set bits before element `RANK_STEP * i`.
    ranks: Vec<u64>,
    /// The values: `width` byte planes of `nnz` bytes each, or (an opaque
    /// stream) one of `nnz * width` bytes.
    values: Vec<Vec<u8>>,
    byteplane: bool,
    tail: Vec<u8>,
}

/// The rank index of a sparse frame, for range decoding.
pub trait SparseFrameIndex {
    fn index(&self) -> Result<SparseIndex>;
}

impl SparseFrameIndex for SparseFrame<'_> {
    /// Decodes the bitmap and the values once, for [`SparseIndex::decode_range`].
    fn index(&self) -> Result<SparseIndex> {
        let w = self.width as usize;
        let short = || CodecError::invalid("ZSP1 frame", "bitmap has more set bits than values");
        if self.nnz > self.count {
            return Err(short());
        }
        let bitmap = self.decoded_bitmap()?;
        let mut ranks = Vec::with_capacity(bitmap.len().div_ceil(RANK_STEP / 8));
        let mut set = 0u64;
        for group in bitmap.chunks(RANK_STEP / 8) {
            ranks.push(set);
            set += group.iter().map(|b| u64::from(b.count_ones())).sum::<u64>();
        }
        let nnz = self.nnz as usize;
        let mut values = Vec::new();
        let byteplane = match &self.values {
            None if nnz == 0 => false,
            None => return Err(short()),
            Some(v) => {
                let streams = if v.byteplane { w } else { 1 };
                let per_stream = if v.byteplane { nnz } else { nnz * w };
                if v.streams.len() < streams || v.orig_len != (nnz * w) as u64 {
                    return Err(short());
                }
                for s in &v.streams[..streams] {
                    // Checked before decoding (the parser checks it too):
                    // nothing is sized by a length the counts disagree with.
                    if s.orig_len != per_stream as u64 {
                        return Err(short());
                    }
                    let mut buf = Vec::new();
                    let bytes = stream_bytes(s, &mut buf)?;
                    if bytes.len() != per_stream {
                        return Err(short());
                    }
                    values.push(bytes.to_vec());
                }
                v.byteplane
            }
        };
        Ok(SparseIndex {
            width: w,
            count: self.count as usize,
            bitmap,
            ranks,
            values,
            byteplane,
            tail: self.tail.to_vec(),
        })
    }
}

impl SparseIndex {
    /// The bytes this index holds (for a cache's budget).
    pub fn held_bytes(&self) -> usize {
        self.bitmap.len()
            + self.ranks.len() * 8
            + self.values.iter().map(Vec::len).sum::<usize>()
            + self.tail.len()
    }

    /// The frame's decoded length.
    pub fn decoded_len(&self) -> u64 {
        (self.count * self.width + self.tail.len()) as u64
    }

    /// Set bits before element `e`.
    fn rank(&self, e: usize) -> u64 {
        let g = e / RANK_STEP;
        let from = g * RANK_STEP / 8;
        let whole: u64 = self.bitmap[from..e / 8]
            .iter()
            .map(|b| u64::from(b.count_ones()))
            .sum();
        let part = match e % 8 {
            0 => 0,
            k => u64::from((self.bitmap[e / 8] & !(0xFFu8 >> k)).count_ones()),
        };
        self.ranks[g] + whole + part
    }

    /// Writes the decoded bytes `[start, start + out.len())` of the frame
    /// into `out`. `start` must fall on an element boundary, and so must the
    /// end unless it lies in the tail.
    pub fn decode_range(&self, start: u64, out: &mut [u8]) -> Result<()> {
        let w = self.width;
        let body = self.count * w;
        let end = start
            .checked_add(out.len() as u64)
            .filter(|&e| e <= self.decoded_len())
            .ok_or_else(|| CodecError::invalid("ZSP1 range", "past the frame's end"))?;
        let (start, end) = (start as usize, end as usize);
        let body_end = end.min(body);
        if start % w != 0 || (start < body && body_end % w != 0) {
            return Err(CodecError::invalid(
                "ZSP1 range",
                format!("bytes {start}..{end} do not fall on elements of {w} bytes"),
            ));
        }
        out.fill(0);
        if start < body {
            let (e0, e1) = (start / w, body_end / w);
            let mut k = self.rank(e0) as usize;
            let mut e = e0;
            while e < e1 {
                let byte = self.bitmap[e / 8];
                if e % 8 == 0 && byte == 0 && e + 8 <= e1 {
                    e += 8;
                    continue;
                }
                if byte & (0x80 >> (e % 8)) != 0 {
                    let o = &mut out[(e - e0) * w..(e - e0 + 1) * w];
                    if self.byteplane {
                        for (j, b) in o.iter_mut().enumerate() {
                            *b = self.values[j][k];
                        }
                    } else {
                        o.copy_from_slice(&self.values[0][k * w..(k + 1) * w]);
                    }
                    k += 1;
                }
                e += 1;
            }
        }
        if end > body {
            let from = start.max(body);
            out[from - start..].copy_from_slice(&self.tail[from - body..end - body]);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::frame::DecodeFrame;
    use crate::sparse::SparseFrameIndex;
    use ckptfs_format::frame::Frame;
    use ckptfs_format::frame::{render_zsp1, PlaneOut};
    use ckptfs_format::plane;
    use proptest::prelude::*;

    /// A `ZSP1` frame of `body` (elements of `w` bytes) and `tail`, its
    /// values as `w` stored byte planes or one zstd stream.
    fn zsp1(body: &[u8], tail: &[u8], w: usize, byteplane: bool) -> Vec<u8> {
        let n = body.len() / w;
        let mut bitmap = vec![0u8; n.div_ceil(8)];
        let mut planes = vec![Vec::new(); w];
        let mut flat = Vec::new();
        for (i, e) in body.chunks_exact(w).enumerate() {
            if e.iter().any(|&b| b != 0) {
                bitmap[i / 8] |= 0x80 >> (i % 8);
                for (p, &b) in planes.iter_mut().zip(e) {
                    p.push(b);
                }
                flat.extend_from_slice(e);
            }
        }
        let nnz = flat.len() / w;
        let values: Vec<PlaneOut> = if nnz == 0 {
            Vec::new()
        } else if byteplane {
            planes
                .into_iter()
                .map(|p| PlaneOut {
                    method: plane::STORE,
                    orig_len: p.len() as u64,
                    payload: p,
                })
                .collect()
        } else {
            vec![PlaneOut {
                method: plane::ZSTD,
                orig_len: flat.len() as u64,
                payload: crate::zstd::compress(&flat, 3),
            }]
        };
        let bz = crate::zstd::compress(&bitmap, 3);
        let mut v = render_zsp1(w as u8, n as u64, nnz as u64, tail, &bz, &values);
        if !byteplane && nnz > 0 {
            // The renderer writes byte planes; an opaque stream is
            // transform 0. ZRT1 follows the 30-byte head, the tail and the
            // bitmap; its transform byte follows magic, version, width and
            // orig_len.
            let z = 30 + tail.len() + 8 + bz.len();
            assert_eq!(&v[z..z + 4], b"ZRT1");
            v[z + 14] = 0;
        }
        v
    }

    proptest! {
        /// Every element-aligned range decodes to the bytes of the whole
        /// decode, ranges in the tail included.
        #[test]
        fn a_range_decodes_as_the_whole_frame(
            w in prop::sample::select(vec![1usize, 2, 4, 8]),
            n in 0usize..3000,
            density in 0u32..100,
            tail_len in 0usize..7,
            byteplane in any::<bool>(),
            cuts in prop::collection::vec(0usize..3100, 1..6),
            seed in any::<u64>(),
        ) {
            let mut s = seed | 1;
            let mut next = || { s ^= s << 13; s ^= s >> 7; s ^= s << 17; s };
            let mut body = vec![0u8; n * w];
            for e in body.chunks_exact_mut(w) {
                if (next() % 100) < u64::from(density) {
                    e.copy_from_slice(&next().to_le_bytes()[..w]);
                    e[0] |= 1;
                }
            }
            let tail: Vec<u8> = (0..tail_len).map(|_| next() as u8).collect();
            let bytes = zsp1(&body, &tail, w, byteplane);
            let Frame::Sparse(f) = Frame::parse(&bytes).unwrap() else { panic!("not ZSP1") };
            let mut whole = vec![0u8; body.len() + tail.len()];
            Frame::Sparse(f.clone()).decode(&mut whole).unwrap();
            prop_assert_eq!(&whole[..body.len()], &body[..]);
            let ix = f.index().unwrap();
            prop_assert_eq!(ix.decoded_len(), whole.len() as u64);
            // Element boundaries, then the end of the body and the end.
            let mut at: Vec<usize> = cuts.iter().map(|&c| (c.min(n)) * w).collect();
            at.extend([0, body.len(), whole.len()]);
            at.sort();
            at.dedup();
            for r in at.windows(2) {
                let mut out = vec![0xAAu8; r[1] - r[0]];
                ix.decode_range(r[0] as u64, &mut out).unwrap();
                prop_assert_eq!(&out[..], &whole[r[0]..r[1]], "bytes {}..{}", r[0], r[1]);
            }
        }
    }

    #[test]
    fn a_range_off_the_elements_or_past_the_end_is_refused() {
        let body: Vec<u8> = (0..64u8).map(|i| if i % 5 == 0 { i } else { 0 }).collect();
        let bytes = zsp1(&body, &[9, 9], 4, true);
        let Frame::Sparse(f) = Frame::parse(&bytes).unwrap() else {
            panic!("not ZSP1")
        };
        let ix = f.index().unwrap();
        let mut out = vec![0u8; 4];
        assert!(ix.decode_range(2, &mut out).is_err(), "mid-element start");
        assert!(ix.decode_range(64, &mut out).is_err(), "past the end");
        let mut two = vec![0u8; 2];
        ix.decode_range(64, &mut two).unwrap();
        assert_eq!(two, [9, 9]);
    }
}

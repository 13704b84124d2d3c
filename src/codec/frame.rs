//! Decoding of the frames that `format::frame` parses: a whole frame
//! ([`Frame::decode`]), or an element range of a frame whose planes are all
//! block-structured ([`ElementAccess::decode_elements`], with the rANS
//! tables of its planes decoded once per frame by
//! [`ElementAccess::load_tables`]).
//!
//! These are inherent methods of the format's types, written here so that
//! `format` stays pure parsing (no decoder, no rayon) while callers keep
//! writing `frame.decode(out)`.
//!
//! Invariants: output goes into a caller-sized buffer whose length is
//! checked against the parsed structure before anything is decoded; a
//! plane decoder fills exactly its plane; planes are decoded and joined in
//! parallel (rayon) only for large bodies; joins can start at any element,
//! so an element range is rebuilt from the covering blocks only.

use crate::codec::plane::{self, PlaneBlocks};
use crate::codec::{rans, transform, zstd, CodecError, Result};
use crate::format::frame::{
    ElementAccess, Frame, PaletteFrame, PlaneRef, SparseFrame, Transform, Z4aiFrame, Zrt1Frame,
};

impl Frame<'_> {
    /// Decodes the whole frame into `out` (`out.len() == decoded_len()`).
    pub fn decode(&self, out: &mut [u8]) -> Result<()> {
        if out.len() as u64 != self.decoded_len() {
            return Err(CodecError::LengthMismatch {
                what: "frame",
                got: self.decoded_len(),
                expected: out.len() as u64,
            });
        }
        match self {
            Frame::Z4ai(f) => f.decode(out),
            Frame::Sparse(f) => f.decode(out),
            Frame::Palette(f) => f.decode(out),
        }
    }
}

impl Z4aiFrame<'_> {
    fn decode(&self, out: &mut [u8]) -> Result<()> {
        let body_len = self.body_len() as usize;
        let (body, tail) = out.split_at_mut(body_len);
        tail.copy_from_slice(self.tail);
        if body_len == 0 {
            return Ok(());
        }
        match self.transform {
            Transform::Opaque => {
                plane::decode_plane(self.planes[0].method, self.planes[0].payload, body)
            }
            Transform::BytePlane(1) => {
                plane::decode_plane(self.planes[0].method, self.planes[0].payload, body)
            }
            _ => {
                let decoded = decode_planes_parallel(&self.planes)?;
                let refs: Vec<&[u8]> = decoded.iter().map(|p| p.as_slice()).collect();
                self.join_parallel(&refs, body)
            }
        }
    }

    /// Joins whole decoded planes, in parallel over element ranges for large
    /// bodies (a single-threaded join of a 100 MB tensor costs more than
    /// decoding it on two cores).
    fn join_parallel(&self, planes: &[&[u8]], body: &mut [u8]) -> Result<()> {
        use rayon::prelude::*;
        const GROUP: usize = 1 << 20; // elements per job, a multiple of 8
        let eb = self.elem_bytes() as usize;
        let n = body.len() / eb;
        let splittable = match self.transform {
            Transform::BytePlane(_) => true,
            Transform::Bitfield(spec) => spec.mant_planes() == 1,
            Transform::Opaque => false,
        };
        if !splittable || n <= GROUP || planes.iter().any(|p| p.is_empty()) {
            return self.join(planes, 0, body);
        }
        body.par_chunks_mut(GROUP * eb)
            .enumerate()
            .try_for_each(|(g, out)| {
                let a = g * GROUP;
                let b = a + out.len() / eb;
                let parts: Vec<&[u8]> = match self.transform {
                    Transform::Bitfield(_) => vec![
                        &planes[0][a / 8..b.div_ceil(8)],
                        &planes[1][a..b],
                        &planes[2][a..b],
                    ],
                    _ => planes.iter().map(|p| &p[a..b]).collect(),
                };
                self.join(&parts, a as u64, out)
            })
    }

    /// Joins decoded planes (or plane ranges starting at element `first`)
    /// into `body`.
    fn join(&self, planes: &[&[u8]], first: u64, body: &mut [u8]) -> Result<()> {
        match self.transform {
            Transform::Opaque => {
                body.copy_from_slice(planes[0]);
                Ok(())
            }
            Transform::BytePlane(_) => transform::byteplane_join(planes, body),
            Transform::Bitfield(spec) => {
                let n = body.len() / spec.elem_bytes();
                let mants: Vec<&[u8]> = (0..spec.mant_planes())
                    .map(|k| &planes[2][k * n..(k + 1) * n])
                    .collect();
                transform::bitfield_join(
                    spec,
                    planes[0],
                    (first % 8) as usize,
                    planes[1],
                    &mants,
                    body,
                )
            }
        }
    }
}

impl ElementAccess<'_> {
    /// Decodes the frequency tables of every rANS plane (once per frame).
    pub fn load_tables(&self) -> Result<RansTables> {
        let mut v = Vec::with_capacity(self.blocks.len());
        for blk in &self.blocks {
            v.push(match blk {
                PlaneBlocks::Rans(p) => Some(p.freq_tables()?),
                _ => None,
            });
        }
        Ok(RansTables(v))
    }

    /// Decodes body elements `[a, b)` into `out` (`(b-a) * elem_bytes` bytes),
    /// touching only the blocks of each plane that cover them.
    pub fn decode_elements(
        &self,
        a: u64,
        b: u64,
        tables: &RansTables,
        out: &mut [u8],
    ) -> Result<()> {
        let eb = self.frame.elem_bytes();
        if b < a || b > self.elements() || out.len() as u64 != (b - a) * eb {
            return Err(CodecError::invalid(
                "element range",
                format!("[{a}, {b}) out of range"),
            ));
        }
        if a == b {
            return Ok(());
        }
        if self.frame.transform == Transform::Opaque {
            // One plane, bytes are elements: decode straight into the output.
            return self.blocks[0].decode_range(a..b, tables.get(0), out);
        }
        // Stored planes are joined straight from the frame; the others are
        // decoded into per-thread scratch buffers that are reused.
        thread_local! {
            static SCRATCH: std::cell::RefCell<Vec<Vec<u8>>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        SCRATCH.with(|cell| {
            let mut bufs = cell.take();
            bufs.resize_with(self.blocks.len().max(bufs.len()), Vec::new);
            let mut result = Ok(());
            let mut borrowed: Vec<Option<&[u8]>> = vec![None; self.blocks.len()];
            'planes: for (i, blk) in self.blocks.iter().enumerate() {
                let ranges = self.plane_ranges(i, a, b);
                if let (PlaneBlocks::Stored(p), [r]) = (blk, ranges.as_slice()) {
                    borrowed[i] = Some(&p[r.start as usize..r.end as usize]);
                    continue;
                }
                let len: u64 = ranges.iter().map(|r| r.end - r.start).sum();
                if (bufs[i].len() as u64) < len {
                    bufs[i].resize(len as usize, 0);
                }
                let mut at = 0usize;
                for r in ranges {
                    let l = (r.end - r.start) as usize;
                    if let Err(e) = blk.decode_range(r, tables.get(i), &mut bufs[i][at..at + l]) {
                        result = Err(e);
                        break 'planes;
                    }
                    at += l;
                }
            }
            if result.is_ok() {
                let refs: Vec<&[u8]> = (0..self.blocks.len())
                    .map(|i| match borrowed[i] {
                        Some(s) => s,
                        None => {
                            let len: u64 = self
                                .plane_ranges(i, a, b)
                                .iter()
                                .map(|r| r.end - r.start)
                                .sum();
                            &bufs[i][..len as usize]
                        }
                    })
                    .collect();
                result = self.frame.join(&refs, a, out);
            }
            cell.replace(bufs);
            result
        })
    }
}

/// Per-plane frequency tables of a frame's rANS planes.
#[derive(Debug, Default)]
pub struct RansTables(Vec<Option<Vec<rans::FreqTable>>>);

impl RansTables {
    fn get(&self, plane: usize) -> Option<&[rans::FreqTable]> {
        self.0.get(plane).and_then(|t| t.as_deref())
    }
}

fn decode_planes_parallel(planes: &[PlaneRef<'_>]) -> Result<Vec<Vec<u8>>> {
    use rayon::prelude::*;
    let total: u64 = planes.iter().map(|p| p.orig_len).sum();
    let work = |p: &PlaneRef<'_>| -> Result<Vec<u8>> {
        let mut v = vec![0u8; p.orig_len as usize];
        plane::decode_plane(p.method, p.payload, &mut v)?;
        Ok(v)
    };
    if total >= 1 << 20 {
        planes.par_iter().map(work).collect()
    } else {
        planes.iter().map(work).collect()
    }
}

impl SparseFrame<'_> {
    fn decode(&self, out: &mut [u8]) -> Result<()> {
        let w = self.width as usize;
        let body_len = self.count as usize * w;
        let (body, tail) = out.split_at_mut(body_len);
        tail.copy_from_slice(self.tail);
        if self.count == 0 {
            return Ok(());
        }
        let mut bitmap = vec![0u8; self.count.div_ceil(8) as usize];
        zstd::decompress_exact(self.bitmap, &mut bitmap, "ZSP1 bitmap")?;
        let dense = match &self.values {
            Some(v) => v.decode()?,
            None => Vec::new(),
        };
        body.fill(0);
        let mut j = 0usize;
        let n = self.count as usize;
        for (byte_i, &bits) in bitmap.iter().enumerate() {
            if bits == 0 {
                continue;
            }
            for k in 0..8 {
                let i = byte_i * 8 + k;
                if i >= n {
                    break;
                }
                if bits & (0x80 >> k) != 0 {
                    let src = dense.get(j * w..(j + 1) * w).ok_or_else(|| {
                        CodecError::invalid("ZSP1 frame", "bitmap has more set bits than values")
                    })?;
                    body[i * w..(i + 1) * w].copy_from_slice(src);
                    j += 1;
                }
            }
        }
        if j as u64 != self.nnz {
            return Err(CodecError::invalid(
                "ZSP1 frame",
                format!("bitmap has {j} set bits, header says {}", self.nnz),
            ));
        }
        Ok(())
    }
}

impl Zrt1Frame<'_> {
    fn decode(&self) -> Result<Vec<u8>> {
        let mut streams = Vec::with_capacity(self.streams.len());
        for s in &self.streams {
            let mut v = vec![0u8; s.orig_len as usize];
            plane::decode_plane(s.method, s.payload, &mut v)?;
            streams.push(v);
        }
        if !self.byteplane {
            return Ok(streams.pop().unwrap_or_default());
        }
        let mut out = vec![0u8; self.orig_len as usize];
        let refs: Vec<&[u8]> = streams.iter().map(|s| s.as_slice()).collect();
        transform::byteplane_join(&refs, &mut out)?;
        Ok(out)
    }
}

impl PaletteFrame<'_> {
    fn decode(&self, out: &mut [u8]) -> Result<()> {
        let w = self.width as usize;
        let n = self.count as usize;
        let (body, tail) = out.split_at_mut(n * w);
        tail.copy_from_slice(self.tail);
        if n == 0 {
            return Ok(());
        }
        let mut cb = vec![0u8; self.k as usize * w];
        zstd::decompress_exact(self.codebook, &mut cb, "ZPL1 codebook")?;
        let iw = self.index_width as usize;
        let mut idx = vec![0u8; n * iw];
        zstd::decompress_exact(self.index, &mut idx, "ZPL1 index")?;
        let k = self.k as usize;
        for (i, o) in body.chunks_exact_mut(w).enumerate() {
            let e = match iw {
                1 => idx[i] as usize,
                2 => u16::from_le_bytes([idx[2 * i], idx[2 * i + 1]]) as usize,
                _ => u32::from_le_bytes(idx[4 * i..4 * i + 4].try_into().unwrap()) as usize,
            };
            if e >= k {
                return Err(CodecError::invalid(
                    "ZPL1 frame",
                    format!("index {e} at element {i} past the {k}-entry codebook"),
                ));
            }
            o.copy_from_slice(&cb[e * w..(e + 1) * w]);
        }
        Ok(())
    }
}

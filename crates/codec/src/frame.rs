//! Decoding of the frames that `format::frame` parses: a whole frame
//! ([`DecodeFrame::decode`]), or an element range of a frame whose planes
//! are all block-structured ([`DecodeElements::decode_elements`], with the
//! rANS tables of its planes decoded once per frame by
//! [`DecodeElements::load_tables`]).
//!
//! These are traits implemented here on the format's types, so that
//! `ckptfs-format` stays pure parsing (no decoder, no rayon) while callers
//! keep writing `frame.decode(out)` (with the trait in scope).
//!
//! Invariants: output goes into a caller-sized buffer whose length is
//! checked against the parsed structure before anything is decoded; a
//! plane decoder fills exactly its plane; planes are decoded and joined in
//! parallel (rayon) only for large bodies; joins can start at any element,
//! so an element range is rebuilt from the covering blocks only.

use crate::plane::DecodePlaneRange;
use crate::plane::{self, PlaneBlocks};
use crate::rans::adaptive::AdaptiveDecode;
use crate::{rans, transform, zstd, CodecError, Result};
use ckptfs_format::frame::{
    ElementAccess, Frame, PaletteFrame, PlaneRef, SparseFrame, Transform, Z4aiFrame, Zrt1Frame,
};
use std::borrow::Cow;

/// Decoding of a whole [`Frame`].
pub trait DecodeFrame {
    fn decode(&self, out: &mut [u8]) -> Result<()>;
}

impl DecodeFrame for Frame<'_> {
    /// Decodes the whole frame into `out` (`out.len() == decoded_len()`).
    fn decode(&self, out: &mut [u8]) -> Result<()> {
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

trait DecodeZ4ai {
    fn decode(&self, out: &mut [u8]) -> Result<()>;
    fn decode_split(&self, body: &mut [u8]) -> Result<()>;
    fn decode_plane_by_plane(&self, body: &mut [u8]) -> Result<()>;
    fn decode_mantissa_by_blocks(&self, body: &mut [u8]) -> Option<Result<()>>;
    fn join_parallel(&self, planes: &[&[u8]], body: &mut [u8]) -> Result<()>;
    fn join(&self, planes: &[&[u8]], first: u64, body: &mut [u8]) -> Result<()>;
}

impl DecodeZ4ai for Z4aiFrame<'_> {
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
            Transform::Split(_) => self.decode_split(body),
            _ => {
                let unstored: u64 = self
                    .planes
                    .iter()
                    .filter(|p| p.method != plane::STORE)
                    .map(|p| p.orig_len)
                    .sum();
                if unstored > PLANES_TOGETHER_MAX {
                    return self.decode_plane_by_plane(body);
                }
                let decoded = decode_planes_parallel(&self.planes)?;
                let refs: Vec<&[u8]> = decoded.iter().map(|p| &**p).collect();
                self.join_parallel(&refs, body)
            }
        }
    }

    /// A split-float body: block by block (in parallel) through
    /// [`ElementAccess::decode_elements`], which decodes each block's top
    /// bytes and joins them in one pass; planes that are not
    /// block-structured (not written by ckptfs) are decoded whole and joined.
    fn decode_split(&self, body: &mut [u8]) -> Result<()> {
        use rayon::prelude::*;
        let Some(access) = self.element_access()? else {
            let decoded = decode_planes_parallel(&self.planes)?;
            let refs: Vec<&[u8]> = decoded.iter().map(|p| &**p).collect();
            return self.join(&refs, 0, body);
        };
        let grid = access.grid();
        let eb = self.elem_bytes() as usize;
        let tables = RansTables::default();
        let mut outs: Vec<(u64, u64, &mut [u8])> = Vec::with_capacity(grid.len());
        let mut rest = &mut *body;
        for w in grid.windows(2) {
            let (o, r) = rest.split_at_mut((w[1] - w[0]) as usize * eb);
            outs.push((w[0], w[1], o));
            rest = r;
        }
        outs.into_par_iter()
            .try_for_each(|(a, b, o)| access.decode_elements(a, b, &tables, o))
    }

    /// Decodes a large body one plane at a time into one reused buffer,
    /// placing each plane in the output before decoding the next, so that
    /// the output is the only buffer of its size (a plane is at most 3/4 of
    /// it). Stored planes are read in place.
    fn decode_plane_by_plane(&self, body: &mut [u8]) -> Result<()> {
        if let Transform::Split(_) = self.transform {
            // Block by block already holds no whole plane.
            return self.decode_split(body);
        }
        if let Some(r) = self.decode_mantissa_by_blocks(body) {
            return r;
        }
        // The bit-field mantissa writes whole elements; the rest are ORed in.
        let order: Vec<usize> = match self.transform {
            Transform::Bitfield(_) => vec![2, 1, 0],
            _ => (0..self.planes.len()).collect(),
        };
        let mut buf = Vec::new();
        for i in order {
            let p = &self.planes[i];
            let bytes: &[u8] = if p.method == plane::STORE {
                p.payload
            } else {
                super::grow_zeroed(&mut buf, p.orig_len, "decoded plane")?;
                let out = &mut buf[..p.orig_len as usize];
                plane::decode_plane(p.method, p.payload, out)?;
                out
            };
            match self.transform {
                Transform::BytePlane(w) => transform::byteplane_put(bytes, i, w as usize, body)?,
                Transform::Bitfield(spec) => transform::bitfield_put(spec, i, bytes, body)?,
                Transform::Opaque | Transform::Split(_) => {
                    unreachable!("opaque and split frames do not come here")
                }
            }
        }
        Ok(())
    }

    /// A large bf16 (or f16) bit-field body whose mantissa plane is made
    /// of blocks (zstd blocks as z4ai writes them, rANS chunks, or stored):
    /// the sign and exponent planes are decoded whole, then the mantissa a
    /// few blocks at a time, in parallel, each range joined straight into
    /// the output. That holds one plane beside the output, as the
    /// plane-by-plane order does, without its three element-by-element
    /// passes over the output (a quarter of a whole-file unpack of a 131 MB
    /// embedding). `None` when it does not apply.
    fn decode_mantissa_by_blocks(&self, body: &mut [u8]) -> Option<Result<()>> {
        use rayon::prelude::*;
        let Transform::Bitfield(spec) = self.transform else {
            return None;
        };
        if spec.mant_planes() != 1 || self.planes.len() != 3 {
            return None;
        }
        let n = body.len() / spec.elem_bytes();
        let mp = &self.planes[2];
        if mp.orig_len != n as u64 || self.planes[1].orig_len != n as u64 {
            // The join reports the mismatch.
            return None;
        }
        let mant = match PlaneBlocks::parse(mp.method, mp.payload, mp.orig_len) {
            Ok(Some(m)) => m,
            Ok(None) => return None,
            Err(e) => return Some(Err(e)),
        };
        Some((|| {
            let (sign, exp) = (
                decode_whole_plane(&self.planes[0])?,
                decode_whole_plane(&self.planes[1])?,
            );
            let tables = match &mant {
                PlaneBlocks::Rans(r) => Some(r.freq_tables()?),
                _ => None,
            };
            // Element ranges of about GROUP elements that end on the
            // mantissa's block bounds (whole blocks decode in place), at
            // multiples of 8 elements where blocks allow (the sign bytes).
            const GROUP: u64 = 1 << 20;
            let mut ranges = Vec::new();
            let (mut a, mut i) = (0u64, 0usize);
            while a < n as u64 {
                let mut b = a;
                while b < n as u64 && b - a < GROUP {
                    b = match &mant {
                        PlaneBlocks::Stored(_) => (a + GROUP).min(n as u64),
                        m => m.bounds(i).end,
                    };
                    i += 1;
                }
                if b <= a {
                    return Err(CodecError::invalid("mantissa plane", "an empty block"));
                }
                ranges.push(a..b);
                a = b;
            }
            let eb = spec.elem_bytes();
            let mut outs: Vec<&mut [u8]> = Vec::with_capacity(ranges.len());
            let mut rest = &mut *body;
            for r in &ranges {
                let (o, r2) = rest.split_at_mut((r.end - r.start) as usize * eb);
                outs.push(o);
                rest = r2;
            }
            ranges
                .into_par_iter()
                .zip(outs)
                .try_for_each_init(Vec::new, |scratch, (r, out)| {
                    let len = (r.end - r.start) as usize;
                    super::grow_zeroed(scratch, len as u64, "mantissa blocks")?;
                    mant.decode_range(r.clone(), tables.as_deref(), &mut scratch[..len])?;
                    let (a, b) = (r.start as usize, r.end as usize);
                    transform::bitfield_join(
                        spec,
                        &sign[a / 8..b.div_ceil(8)],
                        a % 8,
                        &exp[a..b],
                        &[&scratch[..len]],
                        out,
                    )
                })
        })())
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
            Transform::Opaque | Transform::Split(_) => false,
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
            Transform::Split(w) => {
                let (w, n) = (w as usize, body.len() / w as usize);
                if planes.len() != 2 || planes[0].len() != n || planes[1].len() != n * (w - 1) {
                    return Err(CodecError::invalid(
                        "split-float frame",
                        "plane lengths do not fit the body",
                    ));
                }
                super::split::join(w, planes[0], planes[1], body);
                Ok(())
            }
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

/// Decoding of an element range of a block-structured frame.
pub trait DecodeElements {
    fn load_tables(&self) -> Result<RansTables>;
    fn decode_elements(&self, a: u64, b: u64, tables: &RansTables, out: &mut [u8]) -> Result<()>;
}

impl DecodeElements for ElementAccess<'_> {
    /// Decodes the frequency tables of every rANS plane (once per frame).
    fn load_tables(&self) -> Result<RansTables> {
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
    fn decode_elements(&self, a: u64, b: u64, tables: &RansTables, out: &mut [u8]) -> Result<()> {
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
        if let Transform::Split(w) = self.frame.transform {
            return self.decode_split(w as usize, a, b, out);
        }
        if let Some(r) = self.decode_bf16_fused(a, b, tables, out) {
            return r;
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
                if let Err(e) = super::grow_zeroed(&mut bufs[i], len, "plane scratch") {
                    result = Err(e);
                    break 'planes;
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
            // One large block must not pin its scratch in every thread.
            bufs.retain(|b| b.len() <= super::SCRATCH_KEEP);
            cell.replace(bufs);
            result
        })
    }
}

/// Symbols the split-float decoder decodes before joining them (in L1).
const SPLIT_TILE: usize = 4096;

trait DecodeElementsSplit {
    fn decode_split(&self, w: usize, a: u64, b: u64, out: &mut [u8]) -> Result<()>;
    fn decode_bf16_fused(
        &self,
        a: u64,
        b: u64,
        tables: &RansTables,
        out: &mut [u8],
    ) -> Option<Result<()>>;
}

impl DecodeElementsSplit for ElementAccess<'_> {
    /// Elements `[a, b)` of a split-float frame: the low bytes read in
    /// place (stored) or decoded into scratch; the top bytes, when rANS-32
    /// blocks, decoded a tile at a time and joined into `out` at once
    /// (no plane of top bytes is written to memory); otherwise decoded
    /// into scratch and joined. Every byte of `out` is written.
    fn decode_split(&self, w: usize, a: u64, b: u64, out: &mut [u8]) -> Result<()> {
        use super::rans32;
        struct Scratch {
            table: rans32::Table,
            rest: Vec<u8>,
            top: Vec<u8>,
        }
        thread_local! {
            static SPLIT: std::cell::RefCell<Option<Scratch>> = const { std::cell::RefCell::new(None) };
        }
        let r = w - 1;
        let (ra, rb) = (a * r as u64, b * r as u64);
        SPLIT.with(|cell| {
            let mut slot = cell.borrow_mut();
            let s = slot.get_or_insert_with(|| Scratch {
                table: rans32::Table::default(),
                rest: Vec::new(),
                top: Vec::new(),
            });
            let rest: &[u8] = match &self.blocks[1] {
                PlaneBlocks::Stored(p) => &p[ra as usize..rb as usize],
                blk => {
                    super::grow_zeroed(&mut s.rest, rb - ra, "split-float low bytes")?;
                    let buf = &mut s.rest[..(rb - ra) as usize];
                    blk.decode_range(ra..rb, None, buf)?;
                    buf
                }
            };
            let res = match &self.blocks[0] {
                PlaneBlocks::Rans32(z) => {
                    let blk = &self.blocks[0];
                    let mut tile = [0u8; SPLIT_TILE];
                    (|| -> Result<()> {
                        for j in blk.block_of(a)..=blk.block_of(b - 1) {
                            let bnd = z.bounds(j);
                            let (lo, hi) = (a.max(bnd.start), b.min(bnd.end));
                            let len = (bnd.end - bnd.start) as usize;
                            let mut dec =
                                rans32::BlockDecoder::new(&mut s.table, z.payload(j), len)?;
                            let mut at = bnd.start;
                            while at < hi {
                                let t = SPLIT_TILE.min((bnd.end - at) as usize);
                                dec.next_tile(&mut tile[..t])?;
                                let (x, y) = (at.max(lo), (at + t as u64).min(hi));
                                if x < y {
                                    let (i0, i1) = ((x - a) as usize, (y - a) as usize);
                                    super::split::join(
                                        w,
                                        &tile[(x - at) as usize..(y - at) as usize],
                                        &rest[i0 * r..i1 * r],
                                        &mut out[i0 * w..i1 * w],
                                    );
                                }
                                at += t as u64;
                            }
                            if hi == bnd.end {
                                dec.finish()?;
                            }
                        }
                        Ok(())
                    })()
                }
                blk => (|| -> Result<()> {
                    super::grow_zeroed(&mut s.top, b - a, "split-float top bytes")?;
                    let top = &mut s.top[..(b - a) as usize];
                    blk.decode_range(a..b, None, top)?;
                    super::split::join(w, top, rest, out);
                    Ok(())
                })(),
            };
            if s.rest.len() > super::SCRATCH_KEEP {
                s.rest = Vec::new();
            }
            if s.top.len() > super::SCRATCH_KEEP {
                s.top = Vec::new();
            }
            res
        })
    }

    /// bf16 elements `[a, b)` whose exponent and mantissa planes are rANS
    /// chunks of one chunking, decoded together and joined as they come
    /// out of the vector decoder ([`rans::decode_chunk_pairs`]): neither
    /// plane is written to memory, which is most of the cost of a block
    /// (the planes and the join are memory-bound). `None` when it does not
    /// apply; the planes are then decoded one by one.
    fn decode_bf16_fused(
        &self,
        a: u64,
        b: u64,
        tables: &RansTables,
        out: &mut [u8],
    ) -> Option<Result<()>> {
        let Transform::Bitfield(spec) = self.frame.transform else {
            return None;
        };
        if spec != transform::BFLOAT16 || self.blocks.len() != 3 {
            return None;
        }
        let (PlaneBlocks::Rans(e), PlaneBlocks::Rans(m)) = (&self.blocks[1], &self.blocks[2])
        else {
            return None;
        };
        // Both planes hold one byte per element, so plane bytes [a, b) are
        // elements [a, b); they must be whole chunks of both.
        if e.chunks() != m.chunks() || e.len() != m.len() || b > e.len() {
            return None;
        }
        let js = self.blocks[1].block_of(a)..self.blocks[1].block_of(b - 1) + 1;
        if e.chunk_bounds(js.start).start != a || e.chunk_bounds(js.end - 1).end != b {
            return None;
        }
        let (te, tm) = (tables.get(1)?, tables.get(2)?);
        thread_local! {
            static PAIR: std::cell::RefCell<(rans::DecodeTables, rans::DecodeTables, Vec<u8>, Vec<u64>)> =
                std::cell::RefCell::new(Default::default());
        }
        let signs = self.plane_ranges(0, a, b);
        let sign: Cow<'_, [u8]> = match (&self.blocks[0], signs.as_slice()) {
            (PlaneBlocks::Stored(p), [r]) => {
                Cow::Borrowed(p.get(r.start as usize..r.end as usize)?)
            }
            _ => return None,
        };
        PAIR.with(|cell| {
            let mut pair = cell.borrow_mut();
            let (de, dm, scratch, masks) = &mut *pair;
            let n = (b - a) as usize;
            transform::sign_masks(&sign, (a % 8) as usize, n, masks);
            let r = de
                .rebuild(te, js.clone())
                .and_then(|()| dm.rebuild(tm, js.clone()))
                .and_then(|()| {
                    let sink = Bf16Join {
                        masks,
                        out: &mut *out,
                    };
                    rans::decode_chunk_pairs((e, de), (m, dm), js.clone(), scratch, sink)
                });
            if scratch.len() > super::SCRATCH_KEEP {
                *scratch = Vec::new();
            }
            match r {
                Ok(true) => Some(Ok(())),
                Ok(false) => None,
                Err(e) => Some(Err(e)),
            }
        })
    }
}

/// Joins bf16 elements as the paired rANS decoder hands over their
/// exponents and mantissas; signs from [`transform::sign_masks`].
struct Bf16Join<'a> {
    masks: &'a [u64],
    out: &'a mut [u8],
}

impl rans::PairSink for Bf16Join<'_> {
    fn run(&mut self, offset: u64, exp: &[u8], mant: &[u8]) {
        let o = offset as usize;
        let out = &mut self.out[2 * o..2 * (o + exp.len())];
        transform::bf16_join_masked(self.masks, o, exp, mant, out)
    }

    fn stage(
        &mut self,
        offsets: &[u64; 16],
        chunks: usize,
        exp: &rans::StageRows,
        mant: &rans::StageRows,
    ) -> bool {
        transform::bf16_join_stage(self.masks, offsets, chunks, exp, mant, self.out)
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

/// Decoded planes a whole-frame decode holds at once beside its output; a
/// frame whose planes (stored ones aside) are larger is decoded one plane
/// at a time.
const PLANES_TOGETHER_MAX: u64 = 64 << 20;

/// Every plane of a frame, decoded in parallel (stored planes in place).
fn decode_planes_parallel<'a>(planes: &[PlaneRef<'a>]) -> Result<Vec<Cow<'a, [u8]>>> {
    use rayon::prelude::*;
    let total: u64 = planes.iter().map(|p| p.orig_len).sum();
    if total >= 1 << 20 {
        planes.par_iter().map(decode_whole_plane).collect()
    } else {
        planes.iter().map(decode_whole_plane).collect()
    }
}

/// One whole plane: a stored plane in place, else decoded.
fn decode_whole_plane<'a>(p: &PlaneRef<'a>) -> Result<Cow<'a, [u8]>> {
    if p.method == plane::STORE && p.payload.len() as u64 == p.orig_len {
        return Ok(Cow::Borrowed(p.payload));
    }
    let mut v = super::zeroed(p.orig_len, "decoded plane")?;
    plane::decode_plane(p.method, p.payload, &mut v)?;
    Ok(Cow::Owned(v))
}

pub(crate) trait DecodeSparseFrame {
    fn decode(&self, out: &mut [u8]) -> Result<()>;
    fn decoded_bitmap(&self) -> Result<Vec<u8>>;
}

impl DecodeSparseFrame for SparseFrame<'_> {
    /// Scatters the values to the bitmap's set positions one value stream at
    /// a time, so that besides the output only the bitmap and one stream
    /// are held.
    fn decode(&self, out: &mut [u8]) -> Result<()> {
        let w = self.width as usize;
        let body_len = self.count as usize * w;
        let (body, tail) = out.split_at_mut(body_len);
        tail.copy_from_slice(self.tail);
        if self.count == 0 {
            return Ok(());
        }
        let bitmap = self.decoded_bitmap()?;
        body.fill(0);
        match &self.values {
            Some(v) => v.scatter(&bitmap, w, body),
            None => Ok(()),
        }
    }

    /// The bitmap, decoded, its padding bits cleared, and checked to hold
    /// `nnz` set bits.
    fn decoded_bitmap(&self) -> Result<Vec<u8>> {
        let n = self.count as usize;
        let mut bitmap = super::zeroed(self.count.div_ceil(8), "ZSP1 bitmap")?;
        zstd::decompress_exact(self.bitmap, &mut bitmap, "ZSP1 bitmap")?;
        // Bits past the last element (padding) do not count.
        let pad = bitmap.len() * 8 - n;
        if let Some(last) = bitmap.last_mut() {
            *last &= 0xFFu8.checked_shl(pad as u32).unwrap_or(0);
        }
        let set: u64 = bitmap.iter().map(|b| u64::from(b.count_ones())).sum();
        if set != self.nnz {
            return Err(CodecError::invalid(
                "ZSP1 frame",
                format!("bitmap has {set} set bits, header says {}", self.nnz),
            ));
        }
        Ok(bitmap)
    }
}

/// The element indices of the set bits of `bitmap` (MSB first), in order.
fn set_positions(bitmap: &[u8]) -> impl Iterator<Item = usize> + '_ {
    bitmap
        .iter()
        .enumerate()
        .filter(|(_, &b)| b != 0)
        .flat_map(|(i, &b)| {
            (0..8)
                .filter(move |k| b & (0x80 >> k) != 0)
                .map(move |k| i * 8 + k)
        })
}

trait ScatterZrt1 {
    fn scatter(&self, bitmap: &[u8], w: usize, body: &mut [u8]) -> Result<()>;
}

impl ScatterZrt1 for Zrt1Frame<'_> {
    /// Writes the values (`nnz` elements of `w` bytes, as this frame's
    /// streams hold them) to the set positions of `bitmap` in `body`.
    fn scatter(&self, bitmap: &[u8], w: usize, body: &mut [u8]) -> Result<()> {
        let mut buf = Vec::new();
        let short = || CodecError::invalid("ZSP1 frame", "bitmap has more set bits than values");
        if !self.byteplane {
            let s = self.streams.first().ok_or_else(short)?;
            let values = stream_bytes(s, &mut buf)?;
            if values.len() as u64 != self.orig_len {
                return Err(short());
            }
            for (i, v) in set_positions(bitmap).zip(values.chunks_exact(w)) {
                body[i * w..(i + 1) * w].copy_from_slice(v);
            }
            return Ok(());
        }
        for (j, s) in self.streams.iter().enumerate() {
            let values = stream_bytes(s, &mut buf)?;
            if values.len() as u64 * w as u64 != self.orig_len || j >= w {
                return Err(short());
            }
            for (i, &v) in set_positions(bitmap).zip(values) {
                body[i * w + j] = v;
            }
        }
        Ok(())
    }
}

/// A ZRT1 stream's bytes: in place when stored, else decoded into `buf`.
pub(super) fn stream_bytes<'a>(s: &PlaneRef<'a>, buf: &'a mut Vec<u8>) -> Result<&'a [u8]> {
    if s.method == plane::STORE && s.payload.len() as u64 == s.orig_len {
        return Ok(s.payload);
    }
    super::grow_zeroed(buf, s.orig_len, "ZRT1 stream")?;
    let out = &mut buf[..s.orig_len as usize];
    plane::decode_plane(s.method, s.payload, out)?;
    Ok(out)
}

trait DecodePalette {
    fn decode(&self, out: &mut [u8]) -> Result<()>;
}

impl DecodePalette for PaletteFrame<'_> {
    fn decode(&self, out: &mut [u8]) -> Result<()> {
        let w = self.width as usize;
        let n = self.count as usize;
        let (body, tail) = out.split_at_mut(n * w);
        tail.copy_from_slice(self.tail);
        if n == 0 {
            return Ok(());
        }
        let mut cb = super::zeroed(u64::from(self.k) * w as u64, "ZPL1 codebook")?;
        zstd::decompress_exact(self.codebook, &mut cb, "ZPL1 codebook")?;
        let iw = self.index_width as usize;
        let mut idx = super::zeroed(self.count * iw as u64, "ZPL1 index")?;
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

#[cfg(test)]
mod tests;

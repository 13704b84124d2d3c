//! Codec frames that can stand for one tensor inside a ZSTN container, or a
//! whole file as the z4ai CLI writes it: `Z4AI` v1 (opaque, byte-plane,
//! bit-field), `ZSP1` sparse with its nested `ZRT1`, and `ZPL1` palette.
//!
//! [`Frame::parse`] validates the structure without decoding anything and
//! without allocating from a length field: every length is checked against the
//! bytes that hold it, and [`Frame::decoded_len`] follows from the structure
//! alone. For frames whose planes are all block-structured (methods 0, 2, 4),
//! [`ElementAccess`] and [`block_grid`] describe the blocks and which payload
//! bytes each one reads. [`render_z4ai`] writes a frame.
//!
//! Decoding (`Frame::decode`, `ElementAccess::decode_elements`) lives in
//! `codec::frame`: nothing here decodes a payload or uses rayon, and nothing
//! here depends on `codec` (plane layouts come from `format::plane`).

use crate::cursor::Cursor;
use crate::error::{CodecError, Result};
use crate::plane::{self, PlaneBlocks};
use std::ops::Range;

/// The largest ratio of decoded to stored bytes a frame may claim before we
/// refuse to allocate for it. zstd tops out near 2^15; the margin covers
/// degenerate rANS planes, while a lying length field can no longer make us
/// allocate more than this multiple of bytes that really exist.
pub const MAX_EXPANSION: u64 = 1 << 20;

/// Target decoded size of one block in the frames ckptfs writes.
pub const BLOCK_BYTES: u64 = 1 << 20;

/// The most bytes one block may decode to, and so the largest buffer a
/// reader allocates for one read: 1 GiB. ckptfs's own blocks are about
/// [`BLOCK_BYTES`]; a z4ai frame that cannot be cut (a plane of method 1,
/// 3 or 5, `ZSP1`, `ZPL1`) is one block of the whole tensor, and z4ai's
/// format bounds that only by its u64 lengths (an order-1 plane by its u32
/// count). 1 GiB serves every tensor of models up to 8 B parameters
/// (Llama-3-8B's embedding, the largest, is 1,050,673,152 bytes). A grid
/// with a larger block, or whose blocks would decode a larger piece of a
/// plane at once, is refused by [`block_grid`] before anything is
/// allocated. doc/FORMAT.md explains the choice.
pub const MAX_BLOCK_BYTES: u64 = 1 << 30;

fn too_large(what: String, bytes: u64) -> CodecError {
    CodecError::TooLarge {
        what,
        bytes,
        limit: MAX_BLOCK_BYTES,
    }
}

/// The block grid of a frame that decodes to `decoded_len` bytes: boundaries
/// in decoded bytes (the last equals `decoded_len`; the tail belongs to the
/// last block), the element size (0 when the frame is one whole block), and
/// the element access used to decode sub-blocks. Reader and writer both use
/// this, so checksums computed per block agree.
///
/// Every block is at most [`MAX_BLOCK_BYTES`], and so is every piece of a
/// plane that decoding a block decodes at once (a method-2 zstd block, a
/// method-4 chunk); a frame that breaks this is refused here, so that
/// nothing is ever allocated from its lengths.
pub fn block_grid<'a>(
    frame: &Frame<'a>,
    decoded_len: u64,
) -> Result<(Vec<u64>, u64, Option<ElementAccess<'a>>)> {
    let whole = || -> Result<(Vec<u64>, u64, Option<ElementAccess<'a>>)> {
        if decoded_len > MAX_BLOCK_BYTES {
            return Err(too_large("the frame (one block)".into(), decoded_len));
        }
        Ok((vec![0, decoded_len], 0, None))
    };
    let Some(access) = frame.element_access()? else {
        return whole();
    };
    if decoded_len == 0 {
        return whole();
    }
    let eb = access.frame.elem_bytes();
    let mut bounds: Vec<u64> = access.grid().iter().map(|e| e * eb).collect();
    *bounds.last_mut().expect("grid has two bounds") = decoded_len;
    for (b, w) in bounds.windows(2).enumerate() {
        if w[1] - w[0] > MAX_BLOCK_BYTES {
            return Err(too_large(format!("block {b}"), w[1] - w[0]));
        }
    }
    if let Some((plane, piece)) = access.largest_piece() {
        if piece > MAX_BLOCK_BYTES {
            return Err(too_large(format!("a block of plane {plane}"), piece));
        }
    }
    Ok((bounds, eb, Some(access)))
}

/// A bit-field layout `(total_bits, exp_bits, mantissa_bits)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BitfieldSpec {
    pub name: &'static str,
    pub total_bits: u32,
    pub exp_bits: u32,
    pub mant_bits: u32,
}

pub const BFLOAT16: BitfieldSpec = BitfieldSpec {
    name: "bfloat16",
    total_bits: 16,
    exp_bits: 8,
    mant_bits: 7,
};
pub const FLOAT16: BitfieldSpec = BitfieldSpec {
    name: "float16",
    total_bits: 16,
    exp_bits: 5,
    mant_bits: 10,
};
pub const FLOAT32: BitfieldSpec = BitfieldSpec {
    name: "float32",
    total_bits: 32,
    exp_bits: 8,
    mant_bits: 23,
};

impl BitfieldSpec {
    /// z4ai looks names up without aliasing; so do we.
    pub fn by_name(name: &[u8]) -> Option<BitfieldSpec> {
        [BFLOAT16, FLOAT16, FLOAT32]
            .into_iter()
            .find(|s| s.name.as_bytes() == name)
    }
    pub fn elem_bytes(&self) -> usize {
        (self.total_bits / 8) as usize
    }
    pub fn mant_planes(&self) -> usize {
        self.mant_bits.div_ceil(8) as usize
    }
    /// Sizes of the sign, exponent and mantissa planes for `count` elements.
    pub fn plane_lens(&self, count: usize) -> [usize; 3] {
        [count.div_ceil(8), count, count * self.mant_planes()]
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transform {
    Opaque,
    BytePlane(u8),
    Bitfield(BitfieldSpec),
    /// Transform 3, ckptfs's split-float layout (z4ai 0.2.0 refuses it):
    /// each `w`-byte element rotated left by one bit (the sign moves to
    /// bit 0), plane 0 its top byte (the exponent, or most of it), plane 1
    /// its other `w − 1` bytes, element by element, low byte first.
    Split(u8),
}

#[derive(Debug, Clone, Copy)]
pub struct PlaneRef<'a> {
    pub method: u8,
    pub orig_len: u64,
    pub payload: &'a [u8],
}

/// A parsed `Z4AI` v1 frame.
#[derive(Debug, Clone)]
pub struct Z4aiFrame<'a> {
    /// The whole frame.
    pub bytes: &'a [u8],
    pub transform: Transform,
    pub tail: &'a [u8],
    pub planes: Vec<PlaneRef<'a>>,
    /// Bytes before the first plane record (frame header).
    pub header_len: usize,
}

#[derive(Debug, Clone)]
pub struct SparseFrame<'a> {
    pub width: u8,
    pub count: u64,
    pub nnz: u64,
    pub tail: &'a [u8],
    pub bitmap: &'a [u8],
    pub values: Option<Zrt1Frame<'a>>,
}

#[derive(Debug, Clone)]
pub struct Zrt1Frame<'a> {
    pub width: u8,
    pub orig_len: u64,
    pub byteplane: bool,
    pub streams: Vec<PlaneRef<'a>>,
}

#[derive(Debug, Clone)]
pub struct PaletteFrame<'a> {
    pub width: u8,
    pub index_width: u8,
    pub count: u64,
    pub k: u32,
    pub tail: &'a [u8],
    pub codebook: &'a [u8],
    pub index: &'a [u8],
}

#[derive(Debug, Clone)]
pub enum Frame<'a> {
    Z4ai(Z4aiFrame<'a>),
    Sparse(SparseFrame<'a>),
    Palette(PaletteFrame<'a>),
}

fn ensure_plausible(claimed: u64, stored: usize, what: &'static str) -> Result<()> {
    if claimed > (stored as u64).max(1).saturating_mul(MAX_EXPANSION) {
        return Err(CodecError::invalid(
            what,
            format!("claims {claimed} decoded bytes from {stored} stored bytes"),
        ));
    }
    Ok(())
}

fn check_zstd_size(payload: &[u8], expected: u64, what: &'static str) -> Result<()> {
    if let Ok(Some(n)) = ::zstd::zstd_safe::get_frame_content_size(payload) {
        if n != expected {
            return Err(CodecError::LengthMismatch {
                what,
                got: n,
                expected,
            });
        }
    }
    Ok(())
}

fn parse_plane<'a>(c: &mut Cursor<'a>) -> Result<PlaneRef<'a>> {
    let method = c.u8("plane header")?;
    let orig_len = c.u64("plane header")?;
    let comp_len = c.u64("plane header")?;
    let payload = c.take(comp_len, "plane payload")?;
    match method {
        plane::STORE if comp_len != orig_len => {
            return Err(CodecError::invalid(
                "stored plane",
                format!("{comp_len} stored bytes for a {orig_len}-byte plane"),
            ))
        }
        plane::ZSTD => check_zstd_size(payload, orig_len, "zstd plane")?,
        m if m > plane::RANS32 => {
            return Err(CodecError::invalid(
                "plane",
                format!("unknown plane method {m}"),
            ))
        }
        _ => {}
    }
    ensure_plausible(orig_len, payload.len(), "plane")?;
    Ok(PlaneRef {
        method,
        orig_len,
        payload,
    })
}

impl<'a> Frame<'a> {
    /// Parses a frame that must occupy exactly `bytes`.
    pub fn parse(bytes: &'a [u8]) -> Result<Frame<'a>> {
        match bytes.get(..4) {
            Some(b"ZSP1") => parse_sparse(bytes).map(Frame::Sparse),
            Some(b"ZPL1") => parse_palette(bytes).map(Frame::Palette),
            _ => parse_z4ai(bytes).map(Frame::Z4ai),
        }
    }

    /// The number of bytes this frame decodes to, from its structure alone.
    pub fn decoded_len(&self) -> u64 {
        match self {
            Frame::Z4ai(f) => f.body_len() + f.tail.len() as u64,
            Frame::Sparse(f) => f.count * f.width as u64 + f.tail.len() as u64,
            Frame::Palette(f) => f.count * f.width as u64 + f.tail.len() as u64,
        }
    }

    /// A short tag for histograms: `Z4AI/bitfield/bfloat16`, `ZSP1/w4`, ...
    pub fn kind_tag(&self) -> String {
        match self {
            Frame::Z4ai(f) => {
                let mut s = match f.transform {
                    Transform::Opaque => "Z4AI/opaque".to_string(),
                    Transform::BytePlane(w) => format!("Z4AI/byteplane/w{w}"),
                    Transform::Bitfield(spec) => format!("Z4AI/bitfield/{}", spec.name),
                    Transform::Split(w) => format!("Z4AI/split-float/w{w}"),
                };
                if !f.tail.is_empty() {
                    s.push_str("+tail");
                }
                s
            }
            Frame::Sparse(f) => format!("ZSP1/w{}", f.width),
            Frame::Palette(f) => format!("ZPL1/w{}/idx{}", f.width, f.index_width),
        }
    }

    /// The plane (or stream) methods used, for histograms.
    pub fn plane_methods(&self) -> Vec<u8> {
        match self {
            Frame::Z4ai(f) => f.planes.iter().map(|p| p.method).collect(),
            Frame::Sparse(f) => f
                .values
                .as_ref()
                .map(|v| v.streams.iter().map(|s| s.method).collect())
                .unwrap_or_default(),
            Frame::Palette(_) => vec![],
        }
    }

    /// The element grid for random access, if every plane allows it.
    pub fn element_access(&self) -> Result<Option<ElementAccess<'a>>> {
        match self {
            Frame::Z4ai(f) => f.element_access(),
            _ => Ok(None),
        }
    }
}

fn parse_z4ai(bytes: &[u8]) -> Result<Z4aiFrame<'_>> {
    let mut c = Cursor::new(bytes);
    let magic = c.take(4, "Z4AI frame header")?;
    if magic != b"Z4AI" {
        return Err(CodecError::invalid(
            "frame",
            format!("unknown frame magic {:?}", String::from_utf8_lossy(magic)),
        ));
    }
    let version = c.u8("Z4AI frame header")?;
    if version != 1 {
        return Err(CodecError::invalid(
            "Z4AI frame",
            format!("unsupported version {version}"),
        ));
    }
    let _flags = c.u8("Z4AI frame header")?;
    let transform = c.u8("Z4AI frame header")?;
    let width = c.u8("Z4AI frame header")?;
    let n_planes = c.u8("Z4AI frame header")?;
    let np_len = c.u8("Z4AI frame header")?;
    c.take(np_len as u64, "Z4AI numpy dtype")?;
    let dlen = c.u8("Z4AI frame header")?;
    let dcode = c.take(dlen as u64, "Z4AI bit-field name")?;
    let ndim = c.u8("Z4AI frame header")?;
    c.take(ndim as u64 * 8, "Z4AI shape")?;
    let tail_len = c.u32("Z4AI frame header")?;
    let tail = c.take(tail_len as u64, "Z4AI tail")?;
    let header_len = c.pos();
    let mut planes = Vec::with_capacity(n_planes as usize);
    for _ in 0..n_planes {
        planes.push(parse_plane(&mut c)?);
    }
    if c.remaining() != 0 {
        return Err(CodecError::invalid(
            "Z4AI frame",
            format!("{} bytes after the last plane", c.remaining()),
        ));
    }
    let transform = match transform {
        0 => {
            if n_planes > 1 {
                return Err(CodecError::invalid(
                    "Z4AI frame",
                    "opaque frame with several planes",
                ));
            }
            Transform::Opaque
        }
        1 => {
            if width == 0 || n_planes != width {
                return Err(CodecError::invalid(
                    "Z4AI frame",
                    format!("byte-plane width {width} with {n_planes} planes"),
                ));
            }
            let n = planes[0].orig_len;
            if planes.iter().any(|p| p.orig_len != n) {
                return Err(CodecError::invalid(
                    "Z4AI frame",
                    "byte planes of unequal length",
                ));
            }
            Transform::BytePlane(width)
        }
        2 => {
            let spec = BitfieldSpec::by_name(dcode).ok_or_else(|| {
                CodecError::invalid(
                    "Z4AI frame",
                    format!(
                        "unknown bit-field spec {:?}",
                        String::from_utf8_lossy(dcode)
                    ),
                )
            })?;
            if n_planes != 3 {
                return Err(CodecError::invalid(
                    "Z4AI frame",
                    format!("bit-field with {n_planes} planes"),
                ));
            }
            let count = planes[1].orig_len;
            let want = [
                count.div_ceil(8),
                count,
                count.saturating_mul(spec.mant_planes() as u64),
            ];
            if planes.iter().zip(want).any(|(p, w)| p.orig_len != w) {
                return Err(CodecError::invalid(
                    "Z4AI frame",
                    format!("bit-field plane lengths do not fit {count} elements"),
                ));
            }
            Transform::Bitfield(spec)
        }
        3 => {
            if !(2..=8).contains(&width) || n_planes != 2 {
                return Err(CodecError::invalid(
                    "split-float frame",
                    format!("width {width} with {n_planes} planes"),
                ));
            }
            if planes[0].orig_len.checked_mul(width as u64 - 1) != Some(planes[1].orig_len) {
                return Err(CodecError::invalid(
                    "split-float frame",
                    format!(
                        "a {}-byte low plane for {} elements of {width} bytes",
                        planes[1].orig_len, planes[0].orig_len
                    ),
                ));
            }
            Transform::Split(width)
        }
        t => {
            return Err(CodecError::invalid(
                "Z4AI frame",
                format!("unknown transform {t}"),
            ))
        }
    };
    let f = Z4aiFrame {
        bytes,
        transform,
        tail,
        planes,
        header_len,
    };
    ensure_plausible(f.body_len(), bytes.len(), "Z4AI frame")?;
    Ok(f)
}

impl<'a> Z4aiFrame<'a> {
    /// Decoded bytes excluding the tail.
    pub fn body_len(&self) -> u64 {
        match self.transform {
            Transform::Opaque => self.planes.first().map_or(0, |p| p.orig_len),
            Transform::BytePlane(w) => self.planes[0].orig_len.saturating_mul(w as u64),
            Transform::Bitfield(spec) => self.planes[1]
                .orig_len
                .saturating_mul(spec.elem_bytes() as u64),
            Transform::Split(w) => self.planes[0].orig_len.saturating_mul(w as u64),
        }
    }

    /// Bytes per element of the body (1 for opaque frames).
    pub fn elem_bytes(&self) -> u64 {
        match self.transform {
            Transform::Opaque => 1,
            Transform::BytePlane(w) => w as u64,
            Transform::Bitfield(spec) => spec.elem_bytes() as u64,
            Transform::Split(w) => w as u64,
        }
    }

    pub fn element_access(&self) -> Result<Option<ElementAccess<'a>>> {
        let mut blocks = Vec::with_capacity(self.planes.len());
        for p in &self.planes {
            match PlaneBlocks::parse(p.method, p.payload, p.orig_len)? {
                Some(b) => blocks.push(b),
                None => return Ok(None),
            }
        }
        Ok(Some(ElementAccess {
            frame: self.clone(),
            blocks,
        }))
    }
}

/// Random access by element into a frame whose planes are all
/// block-structured.
pub struct ElementAccess<'a> {
    pub frame: Z4aiFrame<'a>,
    pub blocks: Vec<PlaneBlocks<'a>>,
}

impl<'a> ElementAccess<'a> {
    pub fn elements(&self) -> u64 {
        self.frame.body_len() / self.frame.elem_bytes()
    }

    /// The plane byte ranges that hold elements `[a, b)` of plane `i`: one
    /// range, except for a bit-field mantissa of several byte planes, which
    /// are concatenated in the plane (low byte first).
    pub fn plane_ranges(&self, i: usize, a: u64, b: u64) -> Vec<Range<u64>> {
        match (self.frame.transform, i) {
            (Transform::Bitfield(_), 0) => vec![a / 8..b.div_ceil(8)],
            (Transform::Bitfield(spec), 2) => {
                let n = self.elements();
                (0..spec.mant_planes() as u64)
                    .map(|k| k * n + a..k * n + b)
                    .collect()
            }
            (Transform::Split(w), 1) => {
                let r = w as u64 - 1;
                vec![a * r..b * r]
            }
            _ => vec![a..b],
        }
    }

    /// The largest piece of a plane decoded at once when decoding part of
    /// it (a zstd block or a rANS chunk; stored planes have none), as
    /// (plane, bytes).
    pub fn largest_piece(&self) -> Option<(usize, u64)> {
        self.blocks
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let piece = match b {
                    PlaneBlocks::Stored(_) => 0,
                    // Every block but the last is block_size long.
                    PlaneBlocks::Zstd(z) | PlaneBlocks::Rans32(z) if z.count() > 0 => {
                        z.bounds(0).end - z.bounds(0).start
                    }
                    PlaneBlocks::Zstd(_) | PlaneBlocks::Rans32(_) => 0,
                    // Chunks are [j*n/k, (j+1)*n/k): none is longer than ceil(n/k).
                    PlaneBlocks::Rans(r) => r.len().div_ceil(r.chunks().max(1) as u64),
                };
                (i, piece)
            })
            .max_by_key(|&(_, piece)| piece)
    }

    /// Natural block grid in elements: the boundaries of the first plane that
    /// has more than one block, or one block for the whole body.
    pub fn grid(&self) -> Vec<u64> {
        let n = self.elements();
        if self
            .blocks
            .iter()
            .all(|b| matches!(b, PlaneBlocks::Stored(_)))
        {
            // Stored planes are random-access at any offset: cut them into
            // blocks of about BLOCK_BYTES so caches hold small pieces.
            let step = (BLOCK_BYTES / self.frame.elem_bytes()).max(1);
            let mut g: Vec<u64> = (0..n.div_ceil(step)).map(|j| j * step).collect();
            g.push(n);
            if g.len() == 1 {
                g.insert(0, 0);
            }
            return g;
        }
        // The coarsest grid any plane offers: zstd blocks, or rANS chunks in
        // groups of CHUNK_GROUP (the SIMD decoder takes that many at once).
        let mut best: Option<Vec<u64>> = None;
        for (i, b) in self.blocks.iter().enumerate() {
            let (element_plane, limit) = match self.frame.transform {
                // Not the packed sign bits; a multi-byte mantissa plane
                // carries element boundaries in its first byte plane.
                Transform::Bitfield(_) => (i != 0, n),
                // The low bytes' blocks are those of the top bytes (the
                // writer cuts both at the same elements).
                Transform::Split(_) => (i == 0, n),
                _ => (true, n),
            };
            if !element_plane || b.count() <= 1 {
                continue;
            }
            let step = match b {
                PlaneBlocks::Stored(_) => continue,
                PlaneBlocks::Zstd(_) | PlaneBlocks::Rans32(_) => 1,
                PlaneBlocks::Rans(_) => plane::CHUNK_GROUP,
            };
            let starts: Vec<u64> = (0..b.count())
                .step_by(step)
                .map(|j| b.bounds(j).start)
                .filter(|&s| s < limit)
                .collect();
            if starts.len() > 1 && best.as_ref().is_none_or(|g| starts.len() < g.len()) {
                best = Some(starts);
            }
        }
        match best {
            Some(mut g) => {
                g.push(n);
                g
            }
            None => vec![0, n],
        }
    }

    /// The byte ranges (relative to the frame start) of the compressed
    /// payload that decoding elements `[a, b)` reads, over all planes.
    pub fn payload_ranges(&self, a: u64, b: u64) -> Vec<Range<usize>> {
        let base = self.frame.bytes.as_ptr() as usize;
        let rel = |s: &[u8]| {
            let start = s.as_ptr() as usize - base;
            start..start + s.len()
        };
        let mut out = Vec::new();
        for (i, blk) in self.blocks.iter().enumerate() {
            for r in self.plane_ranges(i, a, b) {
                if r.is_empty() {
                    continue;
                }
                match blk {
                    PlaneBlocks::Stored(p) => out.push(rel(&p[r.start as usize..r.end as usize])),
                    PlaneBlocks::Zstd(z) | PlaneBlocks::Rans32(z) => {
                        for j in blk.block_of(r.start)..=blk.block_of(r.end - 1) {
                            out.push(rel(z.payload(j)));
                        }
                    }
                    PlaneBlocks::Rans(p) => {
                        for j in blk.block_of(r.start)..=blk.block_of(r.end - 1) {
                            out.push(rel(p.chunk_payload(j)));
                        }
                    }
                }
            }
        }
        out
    }
}

/// Bytes read ahead by each step of [`fetch_structure`] (one request
/// usually covers a frame header, or a plane header with its table).
const STRUCTURE_LOOKAHEAD: usize = 16 << 10;

/// Makes valid, through `have`, the bytes of a `Z4AI` frame that parsing
/// its structure reads (the frame header, each plane's header, the zstd
/// block tables and the rANS headers, chunk tables and frequency blobs),
/// without the block payloads, for a frame whose bytes are fetched on
/// demand. `frame` is the whole frame, valid only where `have` was called;
/// each field is read only after `have` covered it, and every offset is
/// checked against `frame.len()` before use.
///
/// Returns false when the frame cannot be read block by block (another
/// magic, a plane of method 1, 3 or 5, or a structure that does not add
/// up): then the caller fetches the whole frame, and parsing it reports
/// any error as usual. `have` may make more bytes valid than asked (it
/// reads ahead [`STRUCTURE_LOOKAHEAD`]); errors of `have` are returned.
pub fn fetch_structure(
    frame: &[u8],
    have: &mut dyn FnMut(Range<usize>) -> std::io::Result<()>,
) -> std::io::Result<bool> {
    let len = frame.len();
    let mut pos = 0usize;
    // Where `n` bytes from `at` end; None past the frame's end.
    let end_of = |at: usize, n: u64| {
        usize::try_from(n)
            .ok()
            .and_then(|n| at.checked_add(n))
            .filter(|&e| e <= len)
    };
    // The next `n` bytes, made valid first; None past the frame's end.
    let mut take = |pos: &mut usize, n: u64| -> std::io::Result<Option<&[u8]>> {
        let Some(end) = end_of(*pos, n) else {
            return Ok(None);
        };
        if end > *pos {
            have(*pos..end.max(*pos + STRUCTURE_LOOKAHEAD).min(len))?;
        }
        let s = &frame[*pos..end];
        *pos = end;
        Ok(Some(s))
    };
    let le = |s: &[u8]| s.iter().rev().fold(0u64, |a, &b| a << 8 | b as u64);
    macro_rules! field {
        ($n:expr) => {
            match take(&mut pos, $n)? {
                Some(s) => s,
                None => return Ok(false),
            }
        };
    }
    let head = field!(10);
    if &head[..4] != b"Z4AI" {
        return Ok(false);
    }
    let n_planes = head[8];
    let np_len = head[9];
    field!(np_len as u64);
    let dlen = field!(1)[0];
    field!(dlen as u64);
    let ndim = field!(1)[0];
    field!(ndim as u64 * 8);
    let tail_len = le(field!(4));
    field!(tail_len);
    for _ in 0..n_planes {
        let h = field!(17);
        let (method, comp_len) = (h[0], le(&h[9..17]));
        let Some(end) = end_of(pos, comp_len) else {
            return Ok(false);
        };
        match method {
            plane::STORE => {}
            plane::ZSTD_BLOCKS | plane::RANS32 => {
                let n = le(&field!(8)[4..8]);
                field!(n.saturating_mul(4));
            }
            plane::RANS_ADAPT => {
                if le(field!(8)) != 0 {
                    let kf = field!(8);
                    let (k, fbl) = (le(&kf[..4]), le(&kf[4..8]));
                    field!((k * 4).saturating_add(fbl));
                }
            }
            _ => return Ok(false),
        }
        if pos > end {
            return Ok(false);
        }
        pos = end;
    }
    Ok(pos == len)
}

fn parse_zrt1(bytes: &[u8]) -> Result<Zrt1Frame<'_>> {
    let mut c = Cursor::new(bytes);
    if c.take(4, "ZRT1 header")? != b"ZRT1" {
        return Err(CodecError::invalid("ZSP1 values", "missing ZRT1 magic"));
    }
    let version = c.u8("ZRT1 header")?;
    if version != 2 {
        return Err(CodecError::invalid(
            "ZRT1 frame",
            format!("unsupported version {version}"),
        ));
    }
    let width = c.u8("ZRT1 header")?;
    let orig_len = c.u64("ZRT1 header")?;
    let transform = c.u8("ZRT1 header")?;
    let n = c.u8("ZRT1 header")?;
    let mut streams = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let p = parse_plane(&mut c)?;
        if p.method > plane::ZSTD {
            return Err(CodecError::invalid(
                "ZRT1 frame",
                format!("stream method {}", p.method),
            ));
        }
        streams.push(p);
    }
    if c.remaining() != 0 {
        return Err(CodecError::invalid("ZRT1 frame", "trailing bytes"));
    }
    let byteplane = match transform {
        0 => {
            if n != 1 || streams[0].orig_len != orig_len {
                return Err(CodecError::invalid(
                    "ZRT1 frame",
                    "opaque stream length mismatch",
                ));
            }
            false
        }
        1 => {
            if width == 0
                || n != width
                || streams
                    .iter()
                    .any(|s| s.orig_len.checked_mul(width as u64) != Some(orig_len))
            {
                return Err(CodecError::invalid(
                    "ZRT1 frame",
                    "byte-plane streams do not fit",
                ));
            }
            true
        }
        t => {
            return Err(CodecError::invalid(
                "ZRT1 frame",
                format!("unknown transform {t}"),
            ))
        }
    };
    Ok(Zrt1Frame {
        width,
        orig_len,
        byteplane,
        streams,
    })
}

fn parse_sparse(bytes: &[u8]) -> Result<SparseFrame<'_>> {
    let mut c = Cursor::new(bytes);
    c.take(4, "ZSP1 header")?;
    let version = c.u8("ZSP1 header")?;
    if version != 1 {
        return Err(CodecError::invalid(
            "ZSP1 frame",
            format!("unsupported version {version}"),
        ));
    }
    let width = c.u8("ZSP1 header")?;
    if !matches!(width, 1 | 2 | 4 | 8) {
        return Err(CodecError::invalid("ZSP1 frame", format!("width {width}")));
    }
    let _flags = c.u8("ZSP1 header")?;
    c.u8("ZSP1 header")?;
    let count = c.u64("ZSP1 header")?;
    let nnz = c.u64("ZSP1 header")?;
    let tail_len = c.u32("ZSP1 header")?;
    let dtype_len = c.u8("ZSP1 header")?;
    let ndim = c.u8("ZSP1 header")?;
    c.take(dtype_len as u64 + ndim as u64 * 8, "ZSP1 numpy metadata")?;
    let tail = c.take(tail_len as u64, "ZSP1 tail")?;
    let bitmap_len = c.u64("ZSP1 header")?;
    let bitmap = c.take(bitmap_len, "ZSP1 bitmap")?;
    let values_bytes = c.rest();
    if nnz > count {
        return Err(CodecError::invalid(
            "ZSP1 frame",
            format!("{nnz} non-zeros in {count} elements"),
        ));
    }
    if count > 0 {
        if bitmap_len == 0 {
            return Err(CodecError::invalid("ZSP1 frame", "empty bitmap"));
        }
        check_zstd_size(bitmap, count.div_ceil(8), "ZSP1 bitmap")?;
        ensure_plausible(
            count.saturating_mul(width as u64),
            bytes.len(),
            "ZSP1 frame",
        )?;
    }
    let values = if nnz > 0 && count > 0 {
        let v = parse_zrt1(values_bytes)?;
        if v.orig_len != nnz * width as u64 || (v.byteplane && v.width != width) {
            return Err(CodecError::invalid(
                "ZSP1 frame",
                "values do not match nnz × width",
            ));
        }
        Some(v)
    } else {
        None
    };
    Ok(SparseFrame {
        width,
        count,
        nnz,
        tail,
        bitmap,
        values,
    })
}

fn parse_palette(bytes: &[u8]) -> Result<PaletteFrame<'_>> {
    let mut c = Cursor::new(bytes);
    c.take(4, "ZPL1 header")?;
    let version = c.u8("ZPL1 header")?;
    if version != 1 {
        return Err(CodecError::invalid(
            "ZPL1 frame",
            format!("unsupported version {version}"),
        ));
    }
    let width = c.u8("ZPL1 header")?;
    let _flags = c.u8("ZPL1 header")?;
    let index_width = c.u8("ZPL1 header")?;
    if !matches!(width, 1 | 2 | 4 | 8) || !matches!(index_width, 1 | 2 | 4) {
        return Err(CodecError::invalid(
            "ZPL1 frame",
            format!("width {width}, index width {index_width}"),
        ));
    }
    let count = c.u64("ZPL1 header")?;
    let k = c.u32("ZPL1 header")?;
    let tail_len = c.u32("ZPL1 header")?;
    let dtype_len = c.u8("ZPL1 header")?;
    let ndim = c.u8("ZPL1 header")?;
    c.take(dtype_len as u64 + ndim as u64 * 8, "ZPL1 numpy metadata")?;
    let tail = c.take(tail_len as u64, "ZPL1 tail")?;
    let cb_len = c.u32("ZPL1 header")?;
    let (codebook, index) = if count == 0 {
        (&[][..], &[][..])
    } else {
        let cb = c.take(cb_len as u64, "ZPL1 codebook")?;
        (cb, c.rest())
    };
    if count > 0 {
        // z4ai writes the distinct values (so k <= count) with the
        // narrowest index that holds k (so no wider than the elements):
        // anything else would let a small frame claim a codebook or an
        // index larger than its output.
        if k == 0
            || u64::from(k) > count
            || (index_width == 1 && k > 256)
            || (index_width == 2 && k > 65536)
        {
            return Err(CodecError::invalid(
                "ZPL1 frame",
                format!("{k} codebook entries for {count} elements"),
            ));
        }
        if index_width > width {
            return Err(CodecError::invalid(
                "ZPL1 frame",
                format!("{index_width}-byte indices for {width}-byte elements"),
            ));
        }
        check_zstd_size(codebook, k as u64 * width as u64, "ZPL1 codebook")?;
        check_zstd_size(
            index,
            count.saturating_mul(index_width as u64),
            "ZPL1 index",
        )?;
        ensure_plausible(
            count.saturating_mul(width as u64),
            bytes.len(),
            "ZPL1 frame",
        )?;
    }
    Ok(PaletteFrame {
        width,
        index_width,
        count,
        k,
        tail,
        codebook,
        index,
    })
}

/// One plane to render: method, decoded length, payload.
pub struct PlaneOut {
    pub method: u8,
    pub orig_len: u64,
    pub payload: Vec<u8>,
}

/// Renders a `Z4AI` v1 frame as z4ai reads it inside a ZSTN: flags 0, no
/// NumPy dtype or shape.
pub fn render_z4ai(transform: Transform, tail: &[u8], planes: &[PlaneOut]) -> Vec<u8> {
    let (t, width, dcode): (u8, u8, &[u8]) = match transform {
        Transform::Opaque => (0, 1, b""),
        Transform::BytePlane(w) => (1, w, b""),
        Transform::Bitfield(spec) => (2, 0, spec.name.as_bytes()),
        Transform::Split(w) => (3, w, b""),
    };
    let total: usize = planes.iter().map(|p| 17 + p.payload.len()).sum();
    let mut v = Vec::with_capacity(16 + dcode.len() + tail.len() + total);
    v.extend_from_slice(b"Z4AI");
    v.extend_from_slice(&[1, 0, t, width, planes.len() as u8, 0, dcode.len() as u8]);
    v.extend_from_slice(dcode);
    v.push(0); // ndim
    v.extend_from_slice(&(tail.len() as u32).to_le_bytes());
    v.extend_from_slice(tail);
    for p in planes {
        v.push(p.method);
        v.extend_from_slice(&p.orig_len.to_le_bytes());
        v.extend_from_slice(&(p.payload.len() as u64).to_le_bytes());
        v.extend_from_slice(&p.payload);
    }
    v
}

/// Renders a `ZSP1` v1 sparse frame as z4ai writes it inside a ZSTN (flags
/// 0, no NumPy dtype or shape): `count` elements of `width` bytes of which
/// `nnz` are not all-zero, `bitmap` one zstd frame (with its content size)
/// of their flags packed MSB first, and `values` the `width` byte-plane
/// streams of the `nnz` non-zero elements in order (method 0 or 1), in a
/// nested `ZRT1` v2 frame, absent when `nnz` is 0.
pub fn render_zsp1(
    width: u8,
    count: u64,
    nnz: u64,
    tail: &[u8],
    bitmap: &[u8],
    values: &[PlaneOut],
) -> Vec<u8> {
    let total: usize = values.iter().map(|p| 17 + p.payload.len()).sum();
    let mut v = Vec::with_capacity(64 + tail.len() + bitmap.len() + total);
    v.extend_from_slice(b"ZSP1");
    v.extend_from_slice(&[1, width, 0, 0]);
    v.extend_from_slice(&count.to_le_bytes());
    v.extend_from_slice(&nnz.to_le_bytes());
    v.extend_from_slice(&(tail.len() as u32).to_le_bytes());
    v.extend_from_slice(&[0, 0]); // dtype_len, ndim
    v.extend_from_slice(tail);
    v.extend_from_slice(&(bitmap.len() as u64).to_le_bytes());
    v.extend_from_slice(bitmap);
    if nnz > 0 {
        v.extend_from_slice(b"ZRT1");
        v.extend_from_slice(&[2, width]);
        v.extend_from_slice(&(nnz * width as u64).to_le_bytes());
        v.extend_from_slice(&[1, values.len() as u8]);
        for p in values {
            v.push(p.method);
            v.extend_from_slice(&p.orig_len.to_le_bytes());
            v.extend_from_slice(&(p.payload.len() as u64).to_le_bytes());
            v.extend_from_slice(&p.payload);
        }
    }
    v
}

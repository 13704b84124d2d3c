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
//!
//! This file holds the frame types and [`Frame::parse`]; `z4ai`, `sparse`
//! and `palette` parse each kind of frame, `blocks` has the block grid and
//! element access, `fetch` reads a remote frame's structure and `render`
//! writes frames.

use crate::cursor::Cursor;
use crate::error::{CodecError, Result};
use crate::plane;

mod blocks;
mod fetch;
mod palette;
mod render;
mod sparse;
mod z4ai;

pub use blocks::{block_grid, ElementAccess};
pub use fetch::fetch_structure;
pub use render::{render_z4ai, render_zsp1, PlaneOut};

use palette::parse_palette;
use sparse::parse_sparse;
use z4ai::parse_z4ai;

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

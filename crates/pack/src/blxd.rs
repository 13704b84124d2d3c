//! BLXD blobs of `.blzdiff` file format 2: `"BLXD"`, one encoding byte,
//! the payload (zstd level 9 where compressed). Decoding of every open
//! encoding (Raw 0, SparseByte 1, SparseU16 2, FullXor 3, ZstdOnly 5);
//! SplitStream (4) is a closed codec (blazex's prebuilt `libblazec`) and is
//! refused. Encoding uses the open ones only, choosing as blazex does
//! except that F16/BF16 get FullXor where blazex uses SplitStream.
//!
//! ckptfs adds two encodings of its own (doc/FORMAT.md §5), which blazex
//! does not read and which `diff` writes only when asked to (or by default
//! when the target is a ckptfs `.blz`), for the blobs they make smaller:
//! CkptfsXor (0x80), a z4ai frame of ckptfs's codec holding the XOR of the
//! base and target tensors, and CkptfsFrame (0x81), one holding the target
//! tensor alone.
//!
//! Decoded sizes are known before anything is allocated: the zstd frame's
//! content size must be present and within the length the result must
//! have, a ckptfs frame's decoded length must equal it, and allocations are
//! fallible.

use ckptfs_codec::frame::DecodeFrame;
use ckptfs_format::blazex::Dtype;

pub const MAGIC: &[u8; 4] = b"BLXD";
pub const ZSTD_LEVEL: i32 = 9;
const TAG_SPARSE_BYTE: u8 = 0x42;
const TAG_SPARSE_U16: u8 = 0x46;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Raw = 0,
    SparseByte = 1,
    SparseU16 = 2,
    FullXor = 3,
    SplitStream = 4,
    ZstdOnly = 5,
    /// ckptfs: a z4ai frame (ckptfs's codec) of base XOR target.
    CkptfsXor = 0x80,
    /// ckptfs: a z4ai frame (ckptfs's codec) of the target.
    CkptfsFrame = 0x81,
}

/// Which encodings [`encode_modified`] and [`encode_added`] may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encodings {
    /// blazex's open encodings only (a patch blazex's `apply` accepts).
    Open,
    /// The open ones and ckptfs's, whichever blob is smallest.
    Ckptfs,
}

impl Encoding {
    fn from_u8(b: u8) -> Option<Encoding> {
        Some(match b {
            0 => Encoding::Raw,
            1 => Encoding::SparseByte,
            2 => Encoding::SparseU16,
            3 => Encoding::FullXor,
            4 => Encoding::SplitStream,
            5 => Encoding::ZstdOnly,
            0x80 => Encoding::CkptfsXor,
            0x81 => Encoding::CkptfsFrame,
            _ => return None,
        })
    }
    pub fn name(self) -> &'static str {
        match self {
            Encoding::Raw => "Raw",
            Encoding::SparseByte => "SparseByte",
            Encoding::SparseU16 => "SparseU16",
            Encoding::FullXor => "FullXor",
            Encoding::SplitStream => "SplitStream",
            Encoding::ZstdOnly => "ZstdOnly",
            Encoding::CkptfsXor => "CkptfsXor",
            Encoding::CkptfsFrame => "CkptfsFrame",
        }
    }
}

/// The encoding of a BLXD blob, if it has a valid prefix.
pub fn encoding_of(blob: &[u8]) -> Option<Encoding> {
    if blob.len() < 5 || &blob[..4] != MAGIC {
        return None;
    }
    Encoding::from_u8(blob[4])
}

fn wrap(e: Encoding, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(5 + payload.len());
    v.extend_from_slice(MAGIC);
    v.push(e as u8);
    v.extend_from_slice(payload);
    v
}

fn zstd(data: &[u8]) -> Vec<u8> {
    ckptfs_codec::zstd::compress(data, ZSTD_LEVEL)
}

/// A modified tensor's blob (base and target of the same dtype).
pub fn encode_modified(base: &[u8], target: &[u8], dtype: Dtype, allowed: Encodings) -> Vec<u8> {
    let open = encode_modified_open(base, target, dtype);
    if allowed == Encodings::Open || base.len() != target.len() {
        return open;
    }
    smallest(
        open,
        ckptfs_frame(Encoding::CkptfsXor, &xor(base, target), dtype),
    )
}

/// Byte-wise base XOR target (equal lengths).
fn xor(base: &[u8], target: &[u8]) -> Vec<u8> {
    base.iter().zip(target).map(|(a, b)| a ^ b).collect()
}

/// `b` when it is smaller than `a`.
fn smallest(a: Vec<u8>, b: Vec<u8>) -> Vec<u8> {
    if b.len() < a.len() {
        b
    } else {
        a
    }
}

/// A blob of encoding `e` holding `data` as a frame of ckptfs's codec.
fn ckptfs_frame(e: Encoding, data: &[u8], dtype: Dtype) -> Vec<u8> {
    use ckptfs_format::safetensors::Dtype as St;
    let st = match dtype {
        Dtype::F32 => Some(St::F32),
        Dtype::F16 => Some(St::F16),
        Dtype::Bf16 => Some(St::BF16),
        _ => None,
    };
    let frame = crate::tensor::encode_tensor(st, data, crate::PackOptions::default());
    wrap(e, &frame)
}

fn encode_modified_open(base: &[u8], target: &[u8], dtype: Dtype) -> Vec<u8> {
    let elem = dtype.size() as usize;
    if base.len() != target.len() || base.is_empty() || !base.len().is_multiple_of(elem) {
        return wrap(Encoding::Raw, target);
    }
    let float = matches!(dtype, Dtype::F32 | Dtype::F16 | Dtype::Bf16);
    let n = base.len() / elem;
    let changed = base
        .chunks_exact(elem)
        .zip(target.chunks_exact(elem))
        .filter(|(a, b)| a != b)
        .count();
    let enc = if !float && (changed as f64) < 0.33 * n as f64 {
        if elem == 2 {
            sparse(base, target, 2, TAG_SPARSE_U16, Encoding::SparseU16)
        } else {
            sparse(base, target, 1, TAG_SPARSE_BYTE, Encoding::SparseByte)
        }
    } else {
        let x = xor(base, target);
        wrap(Encoding::FullXor, &zstd(&x))
    };
    if enc.len() <= target.len() + 5 {
        enc
    } else {
        wrap(Encoding::Raw, target)
    }
}

fn sparse(base: &[u8], target: &[u8], w: usize, tag: u8, e: Encoding) -> Vec<u8> {
    let n = base.len() / w;
    let mut bitmap = vec![0u8; n.div_ceil(8)];
    let mut vals = Vec::new();
    let mut changed = 0u32;
    for i in 0..n {
        let (a, b) = (&base[i * w..i * w + w], &target[i * w..i * w + w]);
        if a != b {
            bitmap[i / 8] |= 1 << (i % 8);
            vals.extend(a.iter().zip(b).map(|(x, y)| x ^ y));
            changed += 1;
        }
    }
    let mut inner = vec![tag];
    inner.extend_from_slice(&(n as u32).to_le_bytes());
    inner.extend_from_slice(&changed.to_le_bytes());
    inner.extend_from_slice(&bitmap);
    inner.extend_from_slice(&vals);
    wrap(e, &zstd(&inner))
}

/// An added tensor's blob: ZstdOnly, or Raw when that is not smaller (or
/// CkptfsFrame, when allowed and smaller still).
pub fn encode_added(target: &[u8], dtype: Dtype, allowed: Encodings) -> Vec<u8> {
    let open = encode_added_open(target);
    if allowed == Encodings::Open || target.is_empty() {
        return open;
    }
    smallest(open, ckptfs_frame(Encoding::CkptfsFrame, target, dtype))
}

fn encode_added_open(target: &[u8]) -> Vec<u8> {
    if target.is_empty() {
        return wrap(Encoding::Raw, target);
    }
    let z = zstd(target);
    if z.len() < target.len() {
        wrap(Encoding::ZstdOnly, &z)
    } else {
        wrap(Encoding::Raw, target)
    }
}

/// Decodes `len` bytes of a zstd frame whose content size must be `len`.
fn unzstd(src: &[u8], len: u64, what: &'static str) -> Result<Vec<u8>, String> {
    match ::zstd::zstd_safe::get_frame_content_size(src) {
        Ok(Some(s)) if s == len => {}
        Ok(Some(s)) => {
            return Err(format!(
                "{what}: zstd frame holds {s} bytes, expected {len}"
            ))
        }
        _ => return Err(format!("{what}: zstd frame without a content size")),
    }
    let mut out = ckptfs_codec::zeroed(len, what).map_err(|e| e.to_string())?;
    ckptfs_codec::zstd::decompress_exact(src, &mut out, what).map_err(|e| e.to_string())?;
    Ok(out)
}

/// Decodes `blob` into a target of `len` bytes (`base`: the base tensor,
/// for Modified entries). The error says what is wrong, without the name.
pub fn decode(blob: &[u8], base: Option<&[u8]>, len: u64) -> Result<Vec<u8>, String> {
    if blob.len() < 5 || &blob[..4] != MAGIC {
        return Err("blob has no BLXD header".into());
    }
    let Some(enc) = Encoding::from_u8(blob[4]) else {
        return Err(format!("unknown BLXD encoding {}", blob[4]));
    };
    let inner = &blob[5..];
    let need_base = || {
        let b = base.ok_or_else(|| format!("{} blob without a base tensor", enc.name()))?;
        if b.len() as u64 != len {
            return Err(format!(
                "{} blob: base tensor has {} bytes, target {len}",
                enc.name(),
                b.len()
            ));
        }
        Ok(b)
    };
    match enc {
        Encoding::Raw => {
            if inner.len() as u64 != len {
                return Err(format!("Raw blob holds {} bytes, expected {len}", inner.len()));
            }
            Ok(inner.to_vec())
        }
        Encoding::ZstdOnly => unzstd(inner, len, "ZstdOnly blob"),
        Encoding::FullXor => {
            let b = need_base()?;
            let mut x = unzstd(inner, len, "FullXor blob")?;
            x.iter_mut().zip(b).for_each(|(x, b)| *x ^= b);
            Ok(x)
        }
        Encoding::CkptfsFrame => unframe(inner, len, "CkptfsFrame"),
        Encoding::CkptfsXor => {
            let b = need_base()?;
            let mut x = unframe(inner, len, "CkptfsXor")?;
            x.iter_mut().zip(b).for_each(|(x, b)| *x ^= b);
            Ok(x)
        }
        Encoding::SparseByte => unsparse(inner, need_base()?, 1, TAG_SPARSE_BYTE, "SparseByte"),
        Encoding::SparseU16 => unsparse(inner, need_base()?, 2, TAG_SPARSE_U16, "SparseU16"),
        Encoding::SplitStream => Err(
            "SplitStream blob: a closed codec (blazex's prebuilt libblazec), not decodable from public information; re-create the patch with `ckptfs diff`".into(),
        ),
    }
}

/// Decodes a ckptfs frame that must hold `len` bytes.
fn unframe(src: &[u8], len: u64, what: &'static str) -> Result<Vec<u8>, String> {
    let f = ckptfs_format::frame::Frame::parse(src).map_err(|e| format!("{what} blob: {e}"))?;
    if f.decoded_len() != len {
        return Err(format!(
            "{what} blob: frame holds {} bytes, expected {len}",
            f.decoded_len()
        ));
    }
    let mut out = ckptfs_codec::zeroed(len, what).map_err(|e| e.to_string())?;
    f.decode(&mut out)
        .map_err(|e| format!("{what} blob: {e}"))?;
    Ok(out)
}

fn unsparse(
    z: &[u8],
    base: &[u8],
    w: usize,
    tag: u8,
    what: &'static str,
) -> Result<Vec<u8>, String> {
    let n = base.len() / w;
    if !base.len().is_multiple_of(w) {
        return Err(format!(
            "{what}: base length {} not a multiple of {w}",
            base.len()
        ));
    }
    let claimed = match ::zstd::zstd_safe::get_frame_content_size(z) {
        Ok(Some(s)) => s,
        _ => return Err(format!("{what}: zstd frame without a content size")),
    };
    let bitmap_len = n.div_ceil(8);
    let max = 9 + bitmap_len as u64 + base.len() as u64;
    if claimed > max {
        return Err(format!(
            "{what}: payload of {claimed} bytes, at most {max} possible"
        ));
    }
    let inner = unzstd(z, claimed, what)?;
    if inner.len() < 9 + bitmap_len || inner[0] != tag {
        return Err(format!("{what}: bad header"));
    }
    let count = u32::from_le_bytes(inner[1..5].try_into().expect("4")) as usize;
    if count != n {
        return Err(format!("{what}: {count} values, base has {n}"));
    }
    let bitmap = &inner[9..9 + bitmap_len];
    let vals = &inner[9 + bitmap_len..];
    let mut out = base.to_vec();
    let mut k = 0;
    for i in 0..n {
        if bitmap[i / 8] >> (i % 8) & 1 != 0 {
            let v = vals
                .get(k..k + w)
                .ok_or_else(|| format!("{what}: XOR values end early"))?;
            out[i * w..i * w + w]
                .iter_mut()
                .zip(v)
                .for_each(|(o, x)| *o ^= x);
            k += w;
        }
    }
    if k != vals.len() {
        return Err(format!("{what}: {} XOR bytes left over", vals.len() - k));
    }
    Ok(out)
}

//! Writing frames: `Z4AI` v1 ([`render_z4ai`]) and `ZSP1` v1
//! ([`render_zsp1`]).

use super::Transform;

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

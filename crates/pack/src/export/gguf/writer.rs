//! GGUF v3's header bytes: the metadata key-value pairs ([`Kv`]) and the
//! tensor infos, rendered in memory as they will be written.
//!
//! Layout (all little-endian): `"GGUF"`, u32 version 3, u64 tensor count,
//! u64 metadata count, the metadata (key string, u32 value type, value),
//! the tensor infos (name, u32 n_dims, u64 dims innermost first, u32 GGML
//! type, u64 offset into the data section), then zero padding to the
//! 32-byte alignment ([`super::types::ALIGN`]). Strings are a u64 length
//! and UTF-8 bytes; arrays a u32 element type, a u64 count and the
//! elements.

use super::types::padded;
use super::Planned;

/// GGUF metadata value types.
mod vt {
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
}

/// Metadata, rendered as it will be written.
#[derive(Default)]
pub(super) struct Kv {
    bytes: Vec<u8>,
    count: u64,
}

impl Kv {
    fn key(&mut self, k: &str, ty: u32) {
        put_str(&mut self.bytes, k);
        self.bytes.extend_from_slice(&ty.to_le_bytes());
        self.count += 1;
    }
    /// A u32 value (`v` saturated to u32).
    pub(super) fn u32(&mut self, k: &str, v: u64) {
        self.key(k, vt::U32);
        self.bytes
            .extend_from_slice(&(v.min(u32::MAX as u64) as u32).to_le_bytes());
    }
    pub(super) fn f32(&mut self, k: &str, v: f32) {
        self.key(k, vt::F32);
        self.bytes.extend_from_slice(&v.to_le_bytes());
    }
    pub(super) fn bool(&mut self, k: &str, v: bool) {
        self.key(k, vt::BOOL);
        self.bytes.push(v as u8);
    }
    pub(super) fn str(&mut self, k: &str, v: &str) {
        self.key(k, vt::STRING);
        put_str(&mut self.bytes, v);
    }
    pub(super) fn strs(&mut self, k: &str, v: &[String]) {
        self.key(k, vt::ARRAY);
        self.bytes.extend_from_slice(&vt::STRING.to_le_bytes());
        self.bytes
            .extend_from_slice(&(v.len() as u64).to_le_bytes());
        for s in v {
            put_str(&mut self.bytes, s);
        }
    }
    pub(super) fn f32s(&mut self, k: &str, v: &[f32]) {
        self.key(k, vt::ARRAY);
        self.bytes.extend_from_slice(&vt::F32.to_le_bytes());
        self.bytes
            .extend_from_slice(&(v.len() as u64).to_le_bytes());
        for x in v {
            self.bytes.extend_from_slice(&x.to_le_bytes());
        }
    }
    pub(super) fn i32s(&mut self, k: &str, v: &[i32]) {
        self.key(k, vt::ARRAY);
        self.bytes.extend_from_slice(&vt::I32.to_le_bytes());
        self.bytes
            .extend_from_slice(&(v.len() as u64).to_le_bytes());
        for x in v {
            self.bytes.extend_from_slice(&x.to_le_bytes());
        }
    }
}

fn put_str(b: &mut Vec<u8>, s: &str) {
    b.extend_from_slice(&(s.len() as u64).to_le_bytes());
    b.extend_from_slice(s.as_bytes());
}

/// The file's first bytes: header, metadata `kv`, the infos of `planned`
/// (offsets already assigned), padded to the data section.
pub(super) fn header(kv: &Kv, planned: &[Planned]) -> Vec<u8> {
    let mut head = Vec::new();
    head.extend_from_slice(b"GGUF");
    head.extend_from_slice(&3u32.to_le_bytes());
    head.extend_from_slice(&(planned.len() as u64).to_le_bytes());
    head.extend_from_slice(&kv.count.to_le_bytes());
    head.extend_from_slice(&kv.bytes);
    for p in planned {
        put_str(&mut head, &p.name);
        head.extend_from_slice(&(p.dims.len() as u32).to_le_bytes());
        for d in &p.dims {
            head.extend_from_slice(&d.to_le_bytes());
        }
        head.extend_from_slice(&(p.ty as u32).to_le_bytes());
        head.extend_from_slice(&p.offset.to_le_bytes());
    }
    head.resize(padded(head.len() as u64) as usize, 0);
    head
}

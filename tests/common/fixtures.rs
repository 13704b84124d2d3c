//! Inputs the tests generate: safetensors files of deterministic tensors
//! and a mount store of the vectors. Everything
//! is a function of its arguments (values come from `Rng`), so a fixture
//! written twice is byte-identical: golden tests depend on that.

use super::{pack, vector_stems, vectors_dir, Rng};
use std::fs;
use std::path::{Path, PathBuf};

/// f32 -> bf16 bits with round-to-nearest-even.
pub fn bf16_bits(x: f32) -> u16 {
    let u = x.to_bits();
    let round = 0x7fff + ((u >> 16) & 1);
    ((u + round) >> 16) as u16
}

/// Builds a safetensors file from (name, dtype, shape, bytes) in order.
pub fn safetensors_file(
    tensors: &[(&str, &str, Vec<u64>, Vec<u8>)],
    metadata: Option<&str>,
) -> Vec<u8> {
    let mut header = String::from("{");
    if let Some(m) = metadata {
        header.push_str(&format!("\"__metadata__\":{m}"));
        if !tensors.is_empty() {
            header.push(',');
        }
    }
    let mut off = 0u64;
    let mut data = Vec::new();
    for (i, (name, dtype, shape, bytes)) in tensors.iter().enumerate() {
        if i > 0 {
            header.push(',');
        }
        let shape: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
        header.push_str(&format!(
            "\"{name}\":{{\"dtype\":\"{dtype}\",\"shape\":[{}],\"data_offsets\":[{off},{}]}}",
            shape.join(","),
            off + bytes.len() as u64
        ));
        off += bytes.len() as u64;
        data.extend_from_slice(bytes);
    }
    header.push('}');
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let mut f = (header.len() as u64).to_le_bytes().to_vec();
    f.extend_from_slice(header.as_bytes());
    f.extend_from_slice(&data);
    f
}

/// N(0, sigma) bf16 bytes.
pub fn gauss_bf16(rng: &mut Rng, n: usize, sigma: f64) -> Vec<u8> {
    let mut v = Vec::with_capacity(n * 2);
    for _ in 0..n {
        v.extend_from_slice(&bf16_bits((rng.normal() * sigma) as f32).to_le_bytes());
    }
    v
}

pub fn gauss_f32(rng: &mut Rng, n: usize, sigma: f64) -> Vec<u8> {
    let mut v = Vec::with_capacity(n * 4);
    for _ in 0..n {
        v.extend_from_slice(&((rng.normal() * sigma) as f32).to_le_bytes());
    }
    v
}

pub fn gauss_f16(rng: &mut Rng, n: usize, sigma: f64) -> Vec<u8> {
    let mut v = Vec::with_capacity(n * 2);
    for _ in 0..n {
        v.extend_from_slice(&f32_to_f16((rng.normal() * sigma) as f32).to_le_bytes());
    }
    v
}

/// f32 -> IEEE half with round-to-nearest-even (finite inputs of small magnitude).
pub fn f32_to_f16(x: f32) -> u16 {
    let u = x.to_bits();
    let sign = ((u >> 16) & 0x8000) as u16;
    let exp = ((u >> 23) & 0xff) as i32;
    let mant = u & 0x7fffff;
    let e = exp - 127 + 15;
    if e >= 31 {
        return sign | 0x7c00;
    }
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        let m = mant | 0x800000;
        let shift = (14 - e) as u32;
        let half = 1u32 << (shift - 1);
        let rem = m & ((1 << shift) - 1);
        let mut r = m >> shift;
        if rem > half || (rem == half && r & 1 == 1) {
            r += 1;
        }
        return sign | r as u16;
    }
    let mut r = ((e as u32) << 10) | (mant >> 13);
    let rem = mant & 0x1fff;
    if rem > 0x1000 || (rem == 0x1000 && r & 1 == 1) {
        r += 1;
    }
    sign | r as u16
}

/// Fills a mount store: every vector archive, ckptfs-packed copies of some
/// originals, a config.json, a symlink and a subdirectory. Returns the
/// (presented name, original path) pairs.
pub fn populate_store(store: &Path) -> Vec<(String, PathBuf)> {
    let vectors = vectors_dir();
    let mut pairs = Vec::new();
    for s in vector_stems() {
        fs::copy(
            vectors.join(format!("{s}.zstn")),
            store.join(format!("{s}.zstn")),
        )
        .unwrap();
        pairs.push((
            format!("{s}.safetensors"),
            vectors.join(format!("{s}.safetensors")),
        ));
    }
    for s in [
        "bf16_dense",
        "fp32_dense",
        "tied",
        "structured",
        "ints",
        "empty_file",
    ] {
        let orig = vectors.join(format!("{s}.safetensors"));
        pack(&orig, &store.join(format!("packed_{s}.safetensors.zstn")));
        pairs.push((format!("packed_{s}.safetensors"), orig));
    }
    fs::write(
        store.join("config.json"),
        b"{\"architectures\": [\"Test\"]}\n",
    )
    .unwrap();
    std::os::unix::fs::symlink("config.json", store.join("config-link.json")).unwrap();
    fs::create_dir(store.join("sub")).unwrap();
    fs::copy(vectors.join("tiny.zstn"), store.join("sub/tiny.zstn")).unwrap();
    pairs.push((
        "sub/tiny.safetensors".into(),
        vectors.join("tiny.safetensors"),
    ));
    pairs
}

//! Test helpers shared by the unit tests of the crates (crates/*) and the
//! integration tests in tests/: each crate that needs them compiles this
//! file under `#[cfg(test)]` with `#[path]`, and tests/common includes it
//! the same way, so there is one copy. It must depend on std only (it is
//! compiled in several crates) and holds no state.

use std::path::{Path, PathBuf};

/// The workspace's root directory (which holds tests/), from whichever
/// crate this file is compiled in.
pub fn workspace_dir() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.ancestors()
        .find(|d| d.join("tests/vectors").is_dir())
        .unwrap_or(here)
        .to_path_buf()
}

/// tests/vectors: the committed test vectors (archives and their originals).
pub fn vectors_dir() -> PathBuf {
    workspace_dir().join("tests/vectors")
}

/// Stems of the vector archives (`STEM.zstn`) that have an original
/// `STEM.safetensors`, sorted.
pub fn vector_stems() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(vectors_dir())
        .unwrap()
        .filter_map(|e| {
            let n = e.unwrap().file_name().into_string().unwrap();
            n.strip_suffix(".zstn").map(str::to_string)
        })
        .filter(|s| vectors_dir().join(format!("{s}.safetensors")).exists())
        .collect();
    v.sort();
    v
}

/// One zstd frame of `len` copies of `byte`, written by hand as RLE blocks
/// of 128 KiB (4 bytes each): a 2 GiB bomb is 64 KiB. The frame carries its
/// content size and a 128 KiB window, as z4ai's frames do.
pub fn zstd_rle_frame(len: u64, byte: u8) -> Vec<u8> {
    const BLOCK: u64 = 128 << 10;
    let mut v = vec![0x28, 0xB5, 0x2F, 0xFD];
    // Frame header: 8-byte content size, window descriptor, no checksum.
    v.push(0xC0);
    v.push((17 - 10) << 3);
    v.extend_from_slice(&len.to_le_bytes());
    let mut left = len;
    loop {
        let n = left.min(BLOCK);
        left -= n;
        let last = u32::from(left == 0);
        let header = last | (1 << 1) | ((n as u32) << 3);
        v.extend_from_slice(&header.to_le_bytes()[..3]);
        v.push(byte);
        if left == 0 {
            return v;
        }
    }
}

/// A `Z4AI` v1 opaque frame with one plane of `method` (flags 0, no NumPy
/// metadata, no tail), as z4ai writes for integer tensors.
pub fn z4ai_opaque_frame(method: u8, orig_len: u64, payload: &[u8]) -> Vec<u8> {
    let mut v = b"Z4AI".to_vec();
    v.extend_from_slice(&[1, 0, 0, 1, 1, 0, 0, 0]);
    v.extend_from_slice(&0u32.to_le_bytes());
    v.push(method);
    v.extend_from_slice(&orig_len.to_le_bytes());
    v.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    v.extend_from_slice(payload);
    v
}

/// A z4ai-style indexed `.zstn` (no checksum block) of U8 tensors, one
/// frame each: `(name, decoded length, frame)`, tiling the data buffer.
pub fn zstn_of_frames(tensors: &[(&str, u64, Vec<u8>)]) -> Vec<u8> {
    let mut header = String::from("{");
    let mut at = 0u64;
    for (i, (name, len, _)) in tensors.iter().enumerate() {
        if i > 0 {
            header.push(',');
        }
        header.push_str(&format!(
            "\"{name}\":{{\"dtype\":\"U8\",\"shape\":[{len}],\"data_offsets\":[{at},{}]}}",
            at + len
        ));
        at += len;
    }
    header.push('}');
    zstn_with_header(&header, tensors)
}

/// [`zstn_of_frames`] with another header JSON (padded to 8 bytes): the
/// index still lists `tensors`.
pub fn zstn_with_header(header: &str, tensors: &[(&str, u64, Vec<u8>)]) -> Vec<u8> {
    let mut header = header.to_string();
    while !header.len().is_multiple_of(8) {
        header.push(' ');
    }
    let at: u64 = tensors.iter().map(|t| t.1).sum();
    let mut v = b"ZSTN".to_vec();
    v.extend_from_slice(&[3, 1]);
    v.extend_from_slice(&(header.len() as u64).to_le_bytes());
    v.extend_from_slice(header.as_bytes());
    v.extend_from_slice(&at.to_le_bytes());
    let mut index = (tensors.len() as u32).to_le_bytes().to_vec();
    let mut begin = 0u64;
    for (name, len, frame) in tensors {
        index.extend_from_slice(&(name.len() as u16).to_le_bytes());
        index.extend_from_slice(name.as_bytes());
        index.extend_from_slice(&begin.to_le_bytes());
        index.extend_from_slice(&(begin + len).to_le_bytes());
        index.push(0);
        index.extend_from_slice(&(v.len() as u64).to_le_bytes());
        index.extend_from_slice(&(frame.len() as u64).to_le_bytes());
        v.extend_from_slice(frame);
        begin += len;
    }
    let index_offset = v.len() as u64;
    v.extend_from_slice(&index);
    v.extend_from_slice(&index_offset.to_le_bytes());
    v.extend_from_slice(&(index.len() as u64).to_le_bytes());
    v.extend_from_slice(b"ZSTN");
    v
}

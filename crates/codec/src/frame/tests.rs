use super::*;
use crate::test_support::{vector_stems, vectors_dir};
use ckptfs_archive::ZstnArchive;
use ckptfs_format::safetensors::Dtype;
use ckptfs_pack::{tensor::encode_tensor, PackOptions};

/// Decodes a frame both ways: planes together, and one at a time.
fn both_ways(bytes: &[u8]) -> Option<(Vec<u8>, Vec<u8>)> {
    let f = Frame::parse(bytes).unwrap();
    let Frame::Z4ai(z) = &f else { return None };
    if matches!(z.transform, Transform::Opaque | Transform::BytePlane(1)) {
        return None;
    }
    let mut together = vec![0u8; f.decoded_len() as usize];
    f.decode(&mut together).unwrap();
    let mut one = vec![0xA5u8; together.len()];
    let body = z.body_len() as usize;
    one[body..].copy_from_slice(z.tail);
    z.decode_plane_by_plane(&mut one[..body]).unwrap();
    Some((together, one))
}

#[test]
fn planes_one_at_a_time_decode_like_planes_together() {
    let mut frames: Vec<Vec<u8>> = Vec::new();
    for stem in vector_stems() {
        let a = ZstnArchive::open(&vectors_dir().join(format!("{stem}.zstn"))).unwrap();
        for u in 0..ckptfs_archive::ArchiveView::units(&a) as u32 {
            frames.push(a.frame_bytes(u).to_vec());
        }
    }
    // What ckptfs writes: bit-field bfloat16 and float32, byte-plane w2, w8.
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut raw = vec![0u8; 3 << 20];
    for c in raw.chunks_exact_mut(4) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let v = ((x % 2000) as f32 - 1000.0) * 1e-5;
        c.copy_from_slice(&v.to_le_bytes());
    }
    for d in [Dtype::BF16, Dtype::F16, Dtype::F32, Dtype::F64] {
        frames.push(encode_tensor(
            Some(d),
            &raw[..(3 << 20) - 6],
            PackOptions::default(),
        ));
    }
    let (mut checked, mut by_blocks) = (0, 0);
    for bytes in &frames {
        if let Some((together, one)) = both_ways(bytes) {
            assert!(together == one, "frame of {} bytes", bytes.len());
            checked += 1;
        }
        if let Ok(Frame::Z4ai(z)) = Frame::parse(bytes) {
            let mut out = vec![0u8; z.body_len() as usize];
            if let Some(r) = z.decode_mantissa_by_blocks(&mut out) {
                r.unwrap();
                by_blocks += 1;
            }
        }
    }
    assert!(checked >= 20, "{checked} frames checked");
    // ckptfs's bf16 frame (a mantissa of rANS chunks) took the
    // block-by-block mantissa path.
    assert!(by_blocks >= 1, "{by_blocks} frames by mantissa blocks");
}

#[test]
fn a_palette_larger_than_its_output_is_refused_before_allocating() {
    // Found by the `frame` fuzz target: 103,184 elements, a codebook of
    // 2^29 two-byte entries (1 GiB).
    let mut f = b"ZPL1\x01\x02\x00\x04".to_vec();
    f.extend_from_slice(&103_184u64.to_le_bytes());
    f.extend_from_slice(&0x2000_00FEu32.to_le_bytes());
    f.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x2a]);
    let e = Frame::parse(&f).unwrap_err().to_string();
    assert!(e.contains("codebook entries"), "{e}");
}

#[test]
fn decoder_buffers_above_the_block_limit_are_errors() {
    use ckptfs_format::frame::MAX_BLOCK_BYTES;
    let e = crate::zeroed(MAX_BLOCK_BYTES + 1, "t").unwrap_err();
    assert!(matches!(e, CodecError::TooLarge { .. }), "{e}");
    assert_eq!(crate::zeroed(5, "t").unwrap(), vec![0; 5]);
}

//! Golden bytes of the on-disk format ckptfs writes (ZSTN v3 + CKX1 v1).
//! If this fails after a change, the bytes on disk changed: if that was
//! intended, bump the CKX1 version (src/format/ckx.rs, doc/FORMAT.md) and
//! update the expected digest; readers must keep reading the old version.

mod common;
use ckptfs::pack::{pack, PackOptions};
use common::*;
use xxhash_rust::xxh3::xxh3_64;

fn fixture() -> Vec<u8> {
    let mut rng = Rng(42);
    safetensors_file(
        &[
            ("w", "BF16", vec![64, 64], gauss_bf16(&mut rng, 4096, 0.02)),
            ("b", "F32", vec![256], gauss_f32(&mut rng, 256, 0.02)),
            (
                "ids",
                "I32",
                vec![100],
                (0..100u32).flat_map(|i| (i % 10).to_le_bytes()).collect(),
            ),
            (
                "w_tied",
                "BF16",
                vec![64, 64],
                gauss_bf16(&mut Rng(42), 4096, 0.02),
            ),
        ],
        Some(r#"{"format":"pt"}"#),
    )
}

#[test]
fn packed_bytes_are_stable() {
    let mut out = Vec::new();
    pack(&fixture(), &mut out, PackOptions::default(), &|_| {}).unwrap();
    // Structure, field by field, as doc/FORMAT.md describes it.
    assert_eq!(&out[..4], b"ZSTN");
    assert_eq!(out[4], 3, "ZSTN version");
    assert_eq!(out[5], 1, "contiguous");
    let n = out.len();
    assert_eq!(&out[n - 4..], b"ZSTN");
    let index_offset = u64::from_le_bytes(out[n - 20..n - 12].try_into().unwrap()) as usize;
    // The CKX1 block ends right before the index.
    assert_eq!(&out[index_offset - 4..index_offset], b"CKX1");
    let ext_len =
        u64::from_le_bytes(out[index_offset - 12..index_offset - 4].try_into().unwrap()) as usize;
    let ext = &out[index_offset - ext_len..index_offset];
    assert_eq!(&ext[..4], b"CKX1");
    assert_eq!(u16::from_le_bytes([ext[4], ext[5]]), 1, "CKX1 version");
    assert_eq!(
        u32::from_le_bytes(ext[8..12].try_into().unwrap()),
        3,
        "three unique frames"
    );
    let body_digest = u64::from_le_bytes(ext[ext_len - 20..ext_len - 12].try_into().unwrap());
    assert_eq!(body_digest, xxh3_64(&ext[..ext_len - 20]));
    let hlen = u64::from_le_bytes(out[6..14].try_into().unwrap()) as usize;
    let frames_start = 14 + hlen + 8;
    assert_eq!(
        u64::from_le_bytes(ext[12..20].try_into().unwrap()),
        xxh3_64(&out[..frames_start]),
        "head digest"
    );
    assert_eq!(
        u64::from_le_bytes(ext[20..28].try_into().unwrap()),
        xxh3_64(&out[index_offset..]),
        "index digest"
    );
    let digest = xxh3_64(&out);
    assert_eq!(
        (out.len(), format!("{digest:016x}")),
        (GOLDEN_LEN, GOLDEN_DIGEST.to_string()),
        "the bytes ckptfs writes changed: bump the CKX1 format version if intended"
    );
}

const GOLDEN_LEN: usize = 7380;
const GOLDEN_DIGEST: &str = "2c77464e47612b4b";

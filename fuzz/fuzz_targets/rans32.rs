//! Plane method 6 (rANS-32 blocks, `codec::rans32`): any bytes decode to
//! an error or to some symbols, never a panic or an out-of-bounds access;
//! and the same bytes as symbols round-trip through the encoder.
#![no_main]
use ckptfs::codec::rans32::{decode_block_here, encode_block};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let n = u16::from_le_bytes([data[0], data[1]]) as usize;
    let payload = &data[2..];
    let mut out = vec![0u8; n];
    let _ = decode_block_here(payload, &mut out);
    if !payload.is_empty() {
        let enc = encode_block(payload);
        let mut back = vec![0u8; payload.len()];
        decode_block_here(&enc, &mut back).expect("own block decodes");
        assert_eq!(back, payload);
    }
});

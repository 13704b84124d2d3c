//! safetensors header parsing and validation.
#![no_main]
use ckptfs::format::safetensors::split_file;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok((h, body)) = split_file(data) {
        let _ = h.tiles(body.len() as u64);
        let _ = h.data_order();
    }
});

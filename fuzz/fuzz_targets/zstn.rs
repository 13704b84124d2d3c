//! Whole-container fuzzing: open, build every grid, decode every block and
//! random ranges. Any panic, hang or unbounded allocation is a bug.
#![no_main]
use ckptfs::archive::{ArchiveView, ZstnArchive};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(a) = ZstnArchive::from_bytes(data.to_vec(), std::path::Path::new("fuzz.zstn")) else {
        return;
    };
    // Decoded sizes are bounded by 2^20 x the input; keep the fuzzer's memory small.
    if a.len() > 64 << 20 {
        return;
    }
    for u in 0..a.units() as u32 {
        let _ = a.verify_unit(u, 0);
        let _ = a.decode_unit(u);
    }
    let mut buf = vec![0u8; a.len() as usize];
    let _ = a.read_at(0, 0, &mut buf);
    let _ = a.read_at(0, a.len() / 3, &mut buf[..(a.len() / 2) as usize]);
});

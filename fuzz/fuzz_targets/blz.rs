//! `.blz` model archives: open arbitrary bytes; for an archive that opens,
//! read every file whole and at a few offsets, every tensor on its own, and
//! verify. Errors are the expected answer to damaged input; any panic, hang
//! or unbounded allocation is a bug. Random bytes rarely get past the JSON
//! header: seed with real archives,
//! `cargo +nightly fuzz run blz fuzz/corpus/blz tests/data/golden`.
#![no_main]
use ckptfs::archive::{verify, ArchiveView, BlzArchive};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(a) = BlzArchive::from_bytes(data.to_vec(), std::path::Path::new("fuzz.blz")) else {
        return;
    };
    let n = a.files();
    // Decoded sizes are bounded by a multiple of the input, not by the
    // input; keep the fuzzer's memory small.
    let total = (0..n)
        .map(|i| a.logical_len(i))
        .fold(0u64, u64::saturating_add);
    if total > 64 << 20 {
        return;
    }
    let _ = a.directories();
    for i in 0..n {
        let len = a.logical_len(i);
        let mut buf = vec![0u8; len as usize];
        let _ = a.read_at(i, 0, &mut buf);
        let mut small = [0u8; 300];
        for off in [1, len / 3, len / 2, len.saturating_sub(7), len, len + 1] {
            let _ = a.read_at(i, off, &mut small);
        }
        let tensors = a.entries()[i].tensors().len();
        for t in 0..tensors {
            let _ = a.tensor_bytes(i, t);
        }
    }
    let _ = a.verify_header();
    let _ = verify(&a, &|_| {});
});

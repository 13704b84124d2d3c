//! BLAZE-X `.blz` archives (the `blazex` tool's layout): open arbitrary
//! bytes; for an archive that opens, read every presented file whole and at
//! a few offsets, every tensor on its own, and verify. Errors are the
//! expected answer to damaged input; any panic, hang or unbounded
//! allocation is a bug. Seed with archives from tests/blazex_tool.py:
//! `cargo +nightly fuzz run blazex fuzz/corpus/blazex`.
#![no_main]
use ckptfs::archive::{verify, ArchiveView, BlazexArchive};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(a) = BlazexArchive::from_bytes(data.to_vec(), std::path::Path::new("fuzz.blz")) else {
        return;
    };
    let n = a.files();
    let total = (0..n)
        .map(|i| a.logical_len(i))
        .fold(0u64, u64::saturating_add);
    // Presented sizes are bounded by the input (tensors lie in it, the
    // rest is decoded from the header), so this only keeps runs quick.
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
    }
    for t in 0..a.tensors().len() {
        let _ = a.tensor_bytes(t);
    }
    let _ = verify(&a, &|_| {});
});

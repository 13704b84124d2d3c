//! Frame parser and decoders (Z4AI with ckptfs's split-float transform, ZSP1/ZRT1, ZPL1, every plane method, rANS-32 included).
#![no_main]
use ckptfs::format::frame::{block_grid, Frame};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(f) = Frame::parse(data) else { return };
    let n = f.decoded_len();
    if n > 64 << 20 {
        return;
    }
    let mut out = vec![0u8; n as usize];
    let _ = f.decode(&mut out);
    if let Ok((bounds, eb, Some(acc))) = block_grid(&f, n) {
        if let Ok(tables) = acc.load_tables() {
            for w in bounds.windows(2) {
                if eb == 0 {
                    break;
                }
                let body = acc.frame.body_len();
                let (a, b) = (w[0].min(body) / eb, w[1].min(body) / eb);
                let mut part = vec![0u8; ((b - a) * eb) as usize];
                let _ = acc.decode_elements(a, b, &tables, &mut part);
            }
        }
    }
});

//! Opens archives as the mount does (`archive::open` + `logical_len`) and
//! prints the time taken and the process's peak anonymous memory, to
//! measure per-archive metadata: `cargo run --release --example open_rss -- FILE...`.
use std::time::Instant;

fn status(key: &str) -> String {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(key))
        .map(|l| l[key.len()..].trim().to_string())
        .unwrap_or_default()
}

fn main() {
    let mut keep = Vec::new();
    for p in std::env::args().skip(1) {
        let t = Instant::now();
        match ckptfs::archive::open(std::path::Path::new(&p)) {
            Ok(a) => {
                let len: u64 = (0..a.files()).map(|i| a.logical_len(i)).sum();
                println!(
                    "{p}: {} units, {len} bytes, opened in {:.2?}",
                    a.units(),
                    t.elapsed()
                );
                keep.push(a);
            }
            Err(e) => println!("{p}: {e} ({:.2?})", t.elapsed()),
        }
    }
    println!(
        "VmHWM {}  VmRSS {}  RssAnon {}",
        status("VmHWM:"),
        status("VmRSS:"),
        status("RssAnon:")
    );
}

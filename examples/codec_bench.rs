//! In-memory codec benchmark: `cargo run --release --example codec_bench -- [--runs N] FILE...`
//!
//! For each safetensors file: pack into memory, then decode the archive back
//! into memory (all blocks, in parallel, in file order), checking the bytes.
//! Prints one JSON object per file with the ratio and the median MB/s (of
//! original bytes) over N runs. Threads: RAYON_NUM_THREADS (default: all).
use ckptfs::archive::ZstnArchive;
use ckptfs::commands::unpack_to;
use ckptfs::pack::{pack, PackOptions};
use std::time::Instant;

/// Process CPU time in seconds (all threads).
fn cpu() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    ckptfs::tune_allocator();
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut runs = 5;
    if args.first().map(|s| s.as_str()) == Some("--runs") {
        runs = args[1].parse().unwrap();
        args.drain(..2);
    }
    for path in args {
        let input = std::fs::read(&path).unwrap();
        let mb = input.len() as f64 / 1e6;
        let mut packed = vec![0u8; input.len()];
        let (mut ct, mut ccpu) = (Vec::new(), Vec::new());
        for _ in 0..runs {
            packed.clear();
            let (t, c) = (Instant::now(), cpu());
            pack(&input, &mut packed, PackOptions::default(), &|_| {}).unwrap();
            ct.push(mb / t.elapsed().as_secs_f64());
            ccpu.push(mb / (cpu() - c));
        }
        let a = ZstnArchive::from_bytes(packed.clone(), std::path::Path::new(&path)).unwrap();
        let (mut dt, mut dcpu) = (Vec::new(), Vec::new());
        let druns: usize = std::env::var("DECODE_RUNS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(runs);
        // One output buffer for every run, touched once before timing: on
        // this VM the first touch of fresh guest memory costs more than the
        // decoding (clear_page dominated a profile of a 1 GB decode).
        let mut out = vec![0u8; input.len()];
        for _ in 0..druns {
            out.clear();
            let (t, c) = (Instant::now(), cpu());
            unpack_to(&a, &mut out).unwrap();
            dt.push(mb / t.elapsed().as_secs_f64());
            dcpu.push(mb / (cpu() - c));
            assert!(out == input, "{path}: decoded bytes differ");
        }
        println!(
            "{{\"file\": \"{path}\", \"codec\": \"ckptfs\", \"raw\": {}, \"stored\": {}, \"ratio\": {:.4}, \"comp_mbs\": {:.0}, \"decomp_mbs\": {:.0}, \"comp_mb_per_cpu_s\": {:.0}, \"decomp_mb_per_cpu_s\": {:.0}}}",
            input.len(),
            packed.len(),
            input.len() as f64 / packed.len() as f64,
            median(ct),
            median(dt),
            median(ccpu),
            median(dcpu)
        );
    }
}

//! Real-mount test: the daemon's memory stays within the cache budget plus
//! about 100 MiB while a file four times larger than the cache streams
//! through it.

use crate::common;

use common::{pack, Mount, Rng};
use std::io::{Read, Write};

const MIB: u64 = 1 << 20;

/// A llama-like bf16 safetensors file of `tensors` x `tensor_mib` MiB.
fn write_bf16_safetensors(path: &std::path::Path, tensors: usize, tensor_mib: u64) {
    let elems = tensor_mib * MIB / 2;
    let mut header = String::from("{");
    for i in 0..tensors {
        let (b, e) = (
            i as u64 * tensor_mib * MIB,
            (i as u64 + 1) * tensor_mib * MIB,
        );
        if i > 0 {
            header.push(',');
        }
        header.push_str(&format!(
            "\"layers.{i}.weight\":{{\"dtype\":\"BF16\",\"shape\":[{},{}],\"data_offsets\":[{b},{e}]}}",
            elems / 1024,
            1024
        ));
    }
    header.push('}');
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    f.write_all(&(header.len() as u64).to_le_bytes()).unwrap();
    f.write_all(header.as_bytes()).unwrap();
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let mut buf = vec![0u8; MIB as usize];
    for _ in 0..tensors as u64 * tensor_mib {
        for c in buf.chunks_exact_mut(8) {
            let r = rng.next();
            for k in 0..4 {
                // Roughly N(0, 0.02) in bf16: random sign and mantissa,
                // exponent 2^-9..2^-5.
                let x = (r >> (16 * k)) as u16;
                let v = (x & 0x8000) | ((0x76 + (x >> 7) % 5) << 7) | (x & 0x7f);
                c[2 * k..2 * k + 2].copy_from_slice(&v.to_le_bytes());
            }
        }
        f.write_all(&buf).unwrap();
    }
    f.flush().unwrap();
}

fn status_kib(pid: u32, field: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[test]
fn resident_memory_stays_within_cache_budget_while_streaming_a_larger_file() {
    let cache = 64 * MIB;
    let m = Mount::new(
        |store| {
            let src = store.join("../big.safetensors");
            write_bf16_safetensors(&src, 64, 4); // 256 MiB: 4x the cache
            pack(&src, &store.join("big.safetensors.zstn"));
            std::fs::remove_file(&src).unwrap();
        },
        &["--cache-size", "64M"],
    );
    let pid = m.pid();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let (mut anon, mut rss) = (0u64, 0u64);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                anon = anon.max(status_kib(pid, "RssAnon:"));
                rss = rss.max(status_kib(pid, "VmRSS:"));
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            (anon, rss)
        })
    };
    let mut f = std::fs::File::open(m.path("big.safetensors")).unwrap();
    let mut buf = vec![0u8; MIB as usize];
    let mut total = 0u64;
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        total += n as u64;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (anon_kib, rss_kib) = sampler.join().unwrap();
    assert!(total >= 256 * MIB);
    eprintln!(
        "streamed {} MiB; daemon peak RssAnon {} MiB, VmRSS {} MiB (cache {} MiB)",
        total >> 20,
        anon_kib >> 10,
        rss_kib >> 10,
        cache >> 20
    );
    // Anonymous memory is what the daemon holds: the cache, blocks in
    // flight, buffers. (VmRSS also counts clean pages of the mapped
    // archive, which the kernel reclaims like page cache.)
    assert!(anon_kib > 0, "could not read /proc/{pid}/status");
    assert!(
        anon_kib * 1024 <= cache + 100 * MIB,
        "RssAnon {} MiB exceeds cache {} MiB + 100 MiB",
        anon_kib >> 10,
        cache >> 20
    );
}
